"""The tasks that score and predict a chunk of samples where Dask computes.

``Trainer.evaluate(chunked=True)``, ``Trainer.predict`` and a fit's
``eval_chunked`` send these functions to the cluster in their graphs.
distributed's scheduler unpickles each graph it is given, and each
function in it by reference: it imports the function's module. So this
module imports no torch (nor xarray): its functions import them as they
run, on a worker (:mod:`daskpri.replicas.tasks` does the same for a run's
own tasks). Their functions living with ``Trainer.evaluate`` had a
scheduler import torch at the first chunked evaluation (seconds of its
event loop, some 200 MiB), and the model's weights, in the graph, with it
(now scattered, see ``_inference._model_in_graph``).
"""

from __future__ import annotations

import copy
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import nn

#: Samples a forward pass of :meth:`~daskpri.training._inference.InferenceMixin.predict`
#: takes at most, on a CPU and on another device (as
#: :class:`~daskpri.training.evaluation.EvalSet` scores)
PREDICT_BATCH = 256
PREDICT_BATCH_ACCELERATED = 4096


class Sent:
    """A model as the chunks' tasks receive it, pickled whole.

    distributed serializes a bare ``torch.nn.Module`` with a serializer of
    its own, which rebuilds a module whose hooks it cannot send on again:
    the built-in CNN's (its 1-D weights' ``load_state_dict`` pre-hook)
    failed to reach a second worker ("You are trying to revive the hook of a
    dead Module!"). Wrapped, the module is pickled as pickle does, on every
    hop.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model


def run_device(device: str | None = None) -> torch.device:
    """The device this process runs a model on for :meth:`~InferenceMixin.predict`.

    ``device`` where given (checked against the GPUs this process sees: a
    ``ValueError`` names them, raised where the task runs);
    else, on a Dask worker, the device its replicas train on
    (:func:`~daskpri.replicas.devices.worker_device`: ``cuda:0`` where the
    worker has a ``GPU`` resource and CUDA, else the CPU), and elsewhere
    (the driver, the threads of Dask's local scheduler) the driver's
    evaluation device, ``daskpri.trainer.eval-device`` (its GPU where it
    has one).

    >>> run_device("cpu")
    device(type='cpu')
    """
    import torch
    from distributed import get_worker

    from daskpri.replicas.devices import lacking_gpu, worker_device
    from daskpri.training.evaluation import eval_device

    try:
        worker: Any = get_worker()
    except ValueError:  # not in a Dask worker's task
        worker = None
    if device is None:
        return worker_device(worker) if worker is not None else eval_device(None)
    lacking = lacking_gpu(device, "this process" if worker is None else f"worker {worker.address}")
    if lacking is not None:  # (bad input: a ValueError, one line from the command line)
        raise ValueError(f"{lacking}; leave device unset to run on its GPU where it has one, "
                         "else on its CPU")
    return torch.device(device)


#: the copies of each model on a device other than the CPU, made once in a process (the
#: tasks of one call share the model that Dask sent the process)
_ON_DEVICE: weakref.WeakKeyDictionary[nn.Module, dict[torch.device, nn.Module]] = (
    weakref.WeakKeyDictionary())
_ON_DEVICE_LOCK = threading.Lock()


def _model_on(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` (on the CPU) itself, or its copy on ``device``, made once for this process."""
    import torch

    if device.type == "cpu":
        return model
    with _ON_DEVICE_LOCK, torch.no_grad():
        copies = _ON_DEVICE.setdefault(model, {})
        if device not in copies:
            copies[device] = copy.deepcopy(model).to(device)
        return copies[device]


def _logits(x: np.ndarray, sent: Sent, batch_size: int | None,
            device: str | None = None) -> np.ndarray:
    """The logits of ``sent``'s model for the samples ``x`` (samples first), in batches, float32.

    Run on :func:`run_device` (``device`` where given); ``batch_size`` of
    ``None`` takes 256 samples a pass on the CPU, 4096 elsewhere.
    """
    import torch

    where = run_device(device)
    on = _model_on(sent.model, where)
    batch = batch_size or (PREDICT_BATCH if where.type == "cpu" else PREDICT_BATCH_ACCELERATED)
    xs = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32))
    with torch.no_grad():
        out = [on(xs[i : i + batch].to(where)).float().cpu()
               for i in range(0, xs.shape[0], batch)]
    return torch.cat(out).numpy() if out else np.empty((0, 0), np.float32)


def _scored(
    x: np.ndarray, y: np.ndarray, start: np.ndarray, sent: Sent, batch_size: int | None,
    n_classes: int, device: str | None = None, name: str = "data",
) -> np.ndarray:
    """``[[correct, loss_sum, samples]]`` of ``model`` on one chunk, its values checked.

    ``start`` holds the index of the chunk's first sample, and ``name`` the
    argument the data was given as, for the message of a bad value. Scored
    by :meth:`~daskpri.training.evaluation.EvalSet.totals`, as the driver
    scores a whole set, on :func:`run_device`.
    """
    import xarray as xr

    from daskpri.data.io import check_values
    from daskpri.training.evaluation import EvalSet

    check_values(x, y, n_classes=n_classes, where=name, offset=int(start[0]))
    dims = ("sample", *(f"dim_{i}" for i in range(1, x.ndim)))
    chunk = xr.Dataset({"x": (dims, x), "y": ("sample", y)})
    where = run_device(device)
    scores = EvalSet(chunk, batch_size=batch_size, device=where)
    correct, loss, n = scores.totals(_model_on(sent.model, where))
    return np.array([[correct, loss, n]], dtype=np.float64)
