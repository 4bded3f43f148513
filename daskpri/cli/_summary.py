"""What a run prints of itself: where its dashboard is, and its history in one line."""

from __future__ import annotations

import math

import numpy as np
import xarray as xr
from distributed import Client


def _dashboard(client: Client) -> str:
    try:
        link = client.dashboard_link
    except KeyError:  # a scheduler without an HTTP server reports no dashboard port
        link = None
    return link or "none (the scheduler runs without one)"


def _summary(history: xr.Dataset) -> str:
    """One line: strategy, steps, final and best accuracy, time, samples/s."""
    name = history.attrs.get("strategy", "run")
    if history.sizes["step"] == 0:
        return f"{name}: 0 steps"
    # a record per step, or per round of local steps: its last step is numbered
    steps = int(history["step"].values[-1]) + 1
    acc = history["accuracy"].values
    seen = acc[~np.isnan(acc)]
    final = seen[-1] if seen.size else math.nan
    best = seen.max() if seen.size else math.nan
    seconds = float(history["time"].values[-1])
    rate = float(history["samples"].values[-1]) / seconds if seconds > 0 else math.nan
    return (
        f"{name}: {steps} steps, final accuracy {final:.4f}, best accuracy {best:.4f}, "
        f"{seconds:.1f} s training, {rate:,.0f} samples/s"
    )
