"""Arrays and tensors on the wire.

Numpy arrays through distributed's RPC messages (msgpack carries bytes), and
CPU tensors through pickle as numpy arrays: torch pickles a tensor's storage
through ``torch.save`` (a copy into a zip archive), while a numpy array under
pickle protocol 5 travels out of band, without a copy.
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


def pack(a: np.ndarray) -> dict[str, Any]:
    """A msgpack-friendly form of ``a``, its shape kept (0-d arrays too).

    Examples
    --------
    >>> unpack(pack(np.asarray(64))).shape, unpack(pack(np.arange(6).reshape(2, 3).T)).tolist()
    ((), [[0, 3], [1, 4], [2, 5]])
    """
    a = np.asarray(a, order="C")  # not ascontiguousarray, which makes a 0-d array 1-d
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.tobytes()}


def unpack(d: dict[str, Any]) -> np.ndarray:
    """The array that :func:`pack` packed (a writable copy)."""
    return np.frombuffer(d["data"], dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


def pack_tree(obj: Any) -> Any:
    """Pack every array inside nested dicts and lists."""
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": pack(obj)}
    if isinstance(obj, dict):
        return {
            str(k) if not isinstance(k, int) else f"__int__{k}": pack_tree(v)
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [pack_tree(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, int) and not isinstance(obj, bool) and not -(2**63) <= obj < 2**63:
        # msgpack stops at 64 bits; random generator states go beyond.
        return {"__bigint__": str(obj)}
    return obj


def unpack_tree(obj: Any) -> Any:
    """Invert :func:`pack_tree`."""
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return unpack(obj["__ndarray__"])
        if "__bigint__" in obj:
            return int(obj["__bigint__"])
        return {
            (int(k[7:]) if isinstance(k, str) and k.startswith("__int__") else k): unpack_tree(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [unpack_tree(v) for v in obj]
    return obj
