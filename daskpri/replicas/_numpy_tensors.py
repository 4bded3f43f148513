"""CPU tensors through pickle as numpy arrays.

torch pickles a tensor's storage through ``torch.save`` (a copy into a zip
archive), while a numpy array under pickle protocol 5 travels out of band,
without a copy. The numpy arrays of distributed's RPC messages are in
:mod:`daskpri._wire`, which the scheduler imports without torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class _AsNumpy:
    """Pickles as the tensor it wraps, rebuilt from a numpy array."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray]]:
        return _tensor, (self.tensor.detach().numpy(),)


def _tensor(a: np.ndarray) -> torch.Tensor:
    # frames may arrive read-only; the receiver writes into these tensors
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def numpy_tensors(obj: Any) -> Any:
    """``obj`` with its CPU tensors (inside dicts, lists, tuples) set to pickle as numpy.

    Unpickled, they are tensors again. Tensors on other devices, needing
    gradients, or of a dtype numpy lacks pickle as torch pickles them.

    Examples
    --------
    >>> import pickle
    >>> state = {"w": torch.arange(3.0), "step": 2}
    >>> pickle.loads(pickle.dumps(numpy_tensors(state), protocol=5))
    {'w': tensor([0., 1., 2.]), 'step': 2}
    """
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "cpu" and not obj.requires_grad and obj.dtype in _NUMPY_DTYPES:
            return _AsNumpy(obj)
        return obj
    if isinstance(obj, dict):
        return {k: numpy_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(numpy_tensors(v) for v in obj)
    return obj


class TensorsAsNumpy:
    """Mixin: an object whose tensors pickle as numpy arrays (see `numpy_tensors`).

    For the dataclasses a training step sends between the driver and the workers.
    """

    __slots__ = ()

    def __getstate__(self) -> dict[str, Any]:
        return numpy_tensors(self.__dict__)


_NUMPY_DTYPES = {
    torch.float64,
    torch.float32,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}
