"""Evaluation of the master model on held-out data, on the driver."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr
from torch import nn

from daskpri.data.io import check_values


class EvalSet:
    """Held-out samples, loaded once, scored in batches.

    Parameters
    ----------
    ds : xarray.Dataset
        With ``x`` and ``y`` along ``sample``.
    batch_size : int
        Samples per forward pass. Larger batches outgrow the CPU's caches:
        a thousand MNIST images through the built-in CNN took 240-360 ms in
        one batch and 140-240 ms in batches of 256 on this project's machine
        (630-680 ms and 330-500 ms with contiguous weights; the MLPs' time
        does not change).
    """

    def __init__(self, ds: xr.Dataset, batch_size: int = 256) -> None:
        self.x = torch.as_tensor(np.asarray(ds["x"].values, dtype=np.float32))
        self.y = torch.as_tensor(np.asarray(ds["y"].values, dtype=np.int64))
        self.batch_size = batch_size

    def check(self, n_classes: int) -> None:
        """Raise ``ValueError`` on NaN/inf features or labels out of range."""
        check_values(self.x.numpy(), self.y.numpy(), n_classes=n_classes, where="eval_data")

    def evaluate(self, model: nn.Module) -> tuple[float, float]:
        """Accuracy and mean loss of ``model``."""
        was_training = model.training
        model.eval()
        correct, loss = 0, 0.0
        with torch.no_grad():
            for i in range(0, self.x.shape[0], self.batch_size):
                xb, yb = self.x[i : i + self.batch_size], self.y[i : i + self.batch_size]
                out = model(xb)
                loss += float(F.cross_entropy(out, yb, reduction="sum"))
                correct += int((out.argmax(1) == yb).sum())
        model.train(was_training)
        n = max(self.x.shape[0], 1)
        return correct / n, loss / n
