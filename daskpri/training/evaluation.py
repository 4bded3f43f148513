"""Evaluation of the master model on held-out data, on the driver."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr
from torch import nn

from daskpri import _config
from daskpri.data.io import check_values
from daskpri.replicas.devices import lacking_gpu


class EvalSet:
    """Held-out samples, loaded once onto the evaluation device, scored in batches.

    Parameters
    ----------
    ds : xarray.Dataset
        With ``x`` and ``y`` along ``sample``.
    batch_size : int, optional
        Samples per forward pass: 256 on the CPU, where larger batches
        outgrow the caches (a thousand MNIST images through the built-in
        CNN took 240-360 ms in one batch and 140-240 ms in batches of 256
        on this project's machine; 630-680 ms and 330-500 ms with
        contiguous weights; the MLPs' time does not change), 4096 on a GPU.
    device : str or torch.device, optional
        Where to score: ``None`` takes the ``daskpri.trainer.eval-device``
        setting, whose ``null`` means this process's GPU where it has CUDA,
        else its CPU. On a device other than the CPU the data is moved there
        once, and the model is copied there for each evaluation (its
        parameters and buffers; the caller's model stays where it is).
    """

    def __init__(self, ds: xr.Dataset, batch_size: int | None = None,
                 device: str | torch.device | None = None) -> None:
        self.device = eval_device(device)
        on_cpu = self.device.type == "cpu"
        self.batch_size = batch_size or (256 if on_cpu else 4096)
        self.x = torch.as_tensor(np.asarray(ds["x"].values, dtype=np.float32)).to(self.device)
        self.y = torch.as_tensor(np.asarray(ds["y"].values, dtype=np.int64)).to(self.device)
        self._copy: nn.Module | None = None

    def check(self, n_classes: int) -> None:
        """Raise ``ValueError`` on NaN/inf features or labels out of range."""
        check_values(self.x.cpu().numpy(), self.y.cpu().numpy(), n_classes=n_classes,
                     where="eval_data")

    def _on_device(self, model: nn.Module) -> nn.Module:
        """``model`` itself where it is on this set's device, else a copy updated to it."""
        first = next(itertools.chain(model.parameters(), model.buffers()), None)
        if first is None or first.device == self.device:
            return model
        with torch.no_grad():
            if self._copy is None:
                self._copy = copy.deepcopy(model).to(self.device)
            else:
                mine = self._copy.state_dict()
                for name, value in model.state_dict().items():
                    mine[name].copy_(value, non_blocking=True)
        self._copy.train(model.training)
        return self._copy

    def evaluate(self, model: nn.Module) -> tuple[float, float]:
        """Accuracy and mean loss of ``model``."""
        correct, loss, n = self.totals(model)
        return correct / max(n, 1), loss / max(n, 1)

    def totals(self, model: nn.Module) -> tuple[int, float, int]:
        """``model``'s correct predictions, summed loss and samples: sums that add up.

        Each batch's cross-entropy is summed in its dtype, the batches in
        float64 (``evaluate(chunked=True)`` adds up a set's per chunk).
        """
        scored = self._on_device(model)
        was_training = scored.training
        scored.eval()
        n = self.x.shape[0]
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        with torch.no_grad():
            for i in range(0, n, self.batch_size):
                xb, yb = self.x[i : i + self.batch_size], self.y[i : i + self.batch_size]
                out = scored(xb)
                loss += F.cross_entropy(out, yb, reduction="sum").double()
                correct += (out.argmax(1) == yb).sum()
        scored.train(was_training)
        return int(correct), float(loss), n


def eval_device(device: str | torch.device | None = None) -> torch.device:
    """The device :class:`EvalSet` scores on (see its ``device``), checked.

    >>> eval_device("cpu")
    device(type='cpu')
    >>> eval_device("abacus")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: daskpri.trainer.eval-device should name a torch device ..., but got 'abacus'
    """
    if device is None:
        device = _config.get("trainer.eval-device")
    if device is None:
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(
            "daskpri.trainer.eval-device should name a torch device like 'cpu' or 'cuda:0' "
            "(or be null: the driver's GPU where it has one, else its CPU), but got "
            f"{device!r}"
        ) from None
    if found.type == "cuda" and found.index is None and torch.cuda.is_available():
        found = torch.device("cuda", torch.cuda.current_device())
    lacking = lacking_gpu(str(found), "this process")
    if lacking is not None:  # (its "device=...": the setting's name instead)
        raise ValueError(f"daskpri.trainer.eval-device is {device!r}, "
                         f"{lacking.split(', ', 1)[1]}; set it to 'cpu' or null")
    return found
