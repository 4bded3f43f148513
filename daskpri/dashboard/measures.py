"""What the dashboard measures: priority histograms and speedups, in numpy.

Examples
--------
>>> import numpy as np
>>> hist, start = priority_histogram(np.array([1.0, 2.0, np.nan, 2.0]), n_bins=2)
>>> hist["current"].tolist(), hist["n_seen"]
([0.3333333333333333, 0.6666666666666666], 3)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

#: A priority spread (max / min, all positive) from which the histogram is drawn on log10.
LOG_SPREAD = 100.0
#: Order statistics kept of the start's priorities, to re-bin them beside the current ones.
START_SAMPLE = 1001
#: Histogram bins.
N_BINS = 40


def speedup_curve(
    run_time: Sequence[float] | np.ndarray,
    run_accuracy: Sequence[float] | np.ndarray,
    base_time: Sequence[float] | np.ndarray,
    base_accuracy: Sequence[float] | np.ndarray,
    levels: Iterable[float] | None = None,
) -> dict[str, np.ndarray]:
    """Baseline time over run time to each accuracy level both runs reached.

    Parameters
    ----------
    run_time, run_accuracy, base_time, base_accuracy : array-like
        Evaluations of the run and of the baseline (NaN accuracies ignored).
    levels : iterable of float, optional
        Accuracy levels; by default every multiple of 0.01.

    Returns
    -------
    dict
        ``level``, ``run_time``, ``baseline_time`` and ``speedup`` over the
        levels both reached. Of the levels both reached at their first
        evaluation, only the highest is kept: the others would repeat it.

    Examples
    --------
    >>> s = speedup_curve([1, 2], [0.5, 0.8], [2, 5], [0.5, 0.8], levels=[0.5, 0.8, 0.9])
    >>> s["level"].tolist(), s["speedup"].tolist()
    ([0.5, 0.8], [2.0, 2.5])
    """
    grid = (
        np.round(np.arange(1, 101) / 100, 2)
        if levels is None
        else np.asarray(list(levels), dtype=np.float64)
    )
    t_run, first_run = _time_to(run_time, run_accuracy, grid)
    t_base, first_base = _time_to(base_time, base_accuracy, grid)
    ok = np.isfinite(t_run) & np.isfinite(t_base) & (t_run > 0)
    # Levels both runs had at their first evaluation tell only when that was:
    # keep the highest of them.
    both_first = ok & first_run & first_base
    ok &= ~both_first
    if both_first.any():
        ok[np.flatnonzero(both_first)[-1]] = True
    return {
        "level": grid[ok],
        "run_time": t_run[ok],
        "baseline_time": t_base[ok],
        "speedup": t_base[ok] / t_run[ok],
    }


def priority_histogram(
    priority: np.ndarray,
    start: dict[str, Any] | None = None,
    *,
    step: int = -1,
    n_bins: int = N_BINS,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The histogram of the computed priorities, with the start's on the same bins.

    ``priority`` holds NaN for samples never computed. The bins are on log10
    of the priorities when none is negative and the positive ones spread
    over more than ``LOG_SPREAD``; priorities of exactly 0 (a loss that
    reached it) then have a bin of their own, left of the others with a
    bin's gap, whose ``label`` is ``"0"``. Returns ``(histogram, start)``:
    ``start`` is the given one, or when None a new one from these priorities
    (None if none is computed yet).

    Examples
    --------
    >>> hist, _ = priority_histogram(np.array([0.0, 0.01, 1.0, 10.0]), n_bins=3)
    >>> hist["scale"], hist["label"][0], hist["current"].tolist()
    ('log', '0', [0.25, 0.25, 0.0, 0.5])
    """
    values = np.asarray(priority, dtype=np.float64)
    values = values[np.isfinite(values)]
    empty = {
        "left": np.empty(0),
        "right": np.empty(0),
        "current": np.empty(0),
        "start": np.empty(0),
        "label": [],
        "scale": "linear",
        "n_seen": 0,
        "start_step": -1 if start is None else int(start["step"]),
    }
    if values.size == 0:
        return empty, start
    if start is None:
        start = _order_statistics(values, step)
    positive = values[values > 0]
    # zeros do not rule out a log axis: they get a bin of their own (a loss of
    # exactly 0 is common once samples are learnt)
    log = (
        positive.size > 0
        and float(values.min()) >= 0
        and float(positive.max()) / float(positive.min()) >= LOG_SPREAD
    )
    sample = np.asarray(start["sample"], dtype=np.float64)
    n_start = max(len(start["sample"]), 1)
    # Start mass outside the current range is off the plot; fractions stay of all samples.
    if log:
        shown = np.log10(positive)
        edges = _edges(shown, n_bins)
        current = np.histogram(shown, edges)[0] / values.size
        start_counts = np.histogram(np.log10(sample[sample > 0]), edges)[0] / n_start
        labels = [f"{10**a:.3g} to {10**b:.3g}" for a, b in zip(edges[:-1], edges[1:], strict=True)]
        n_zero = values.size - positive.size
        if n_zero:
            width = edges[1] - edges[0]
            left = np.concatenate([[edges[0] - 2 * width], edges[:-1]])
            right = np.concatenate([[edges[0] - width], edges[1:]])
            current = np.concatenate([[n_zero / values.size], current])
            start_counts = np.concatenate([[np.count_nonzero(sample == 0) / n_start],
                                           start_counts])
            labels = ["0", *labels]
        else:
            left, right = edges[:-1], edges[1:]
    else:
        edges = _edges(values, n_bins)
        left, right = edges[:-1], edges[1:]
        current = np.histogram(values, edges)[0] / values.size
        start_counts = np.histogram(sample, edges)[0] / n_start
        labels = [f"{a:.3g} to {b:.3g}" for a, b in zip(left, right, strict=True)]
    hist = dict(
        empty,
        left=left,
        right=right,
        current=current,
        start=start_counts,
        label=labels,
        scale="log" if log else "linear",
        n_seen=int(values.size),
        start_step=int(start["step"]),
    )
    return hist, start


def start_sample(priority: np.ndarray, step: int) -> dict[str, Any] | None:
    """What :func:`priority_histogram` keeps of a start: ``START_SAMPLE`` order statistics.

    ``None`` where no priority is computed (all NaN). The scheduler's table
    plugin keeps one of each run's first priorities, so that every page,
    whenever opened, shows the same start.

    Examples
    --------
    >>> start_sample(np.array([3.0, np.nan, 1.0]), step=0)["sample"].tolist()
    [1.0, 3.0]
    """
    values = np.asarray(priority, dtype=np.float64)
    values = values[np.isfinite(values)]
    return _order_statistics(values, step) if values.size else None


def _order_statistics(values: np.ndarray, step: int) -> dict[str, Any]:
    """:func:`start_sample` of ``values``, finite and not empty."""
    ordered = np.sort(values)
    picks = np.unique(np.linspace(0, ordered.size - 1, START_SAMPLE).round().astype(np.int64))
    return {"step": int(step), "n": int(values.size), "sample": ordered[picks]}


def _edges(values: np.ndarray, n_bins: int) -> np.ndarray:
    lo, hi = float(values.min()), float(values.max())
    if hi <= lo:  # one value: a bin of width one around it
        lo, hi = lo - 0.5, hi + 0.5
    return np.linspace(lo, hi, n_bins + 1)


def _time_to(
    time: Sequence[float] | np.ndarray, accuracy: Sequence[float] | np.ndarray, levels: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """First time at which ``accuracy`` reached each level (NaN where never).

    Also returns where that was the first evaluation.
    """
    t = np.asarray(time, dtype=np.float64)
    a = np.asarray(accuracy, dtype=np.float64)
    ok = np.isfinite(t) & np.isfinite(a)
    t, a = t[ok], a[ok]
    out = np.full(levels.shape, np.nan)
    first = np.zeros(levels.shape, dtype=bool)
    if not t.size:
        return out, first
    order = np.argsort(t, kind="stable")
    t, best = t[order], np.maximum.accumulate(a[order])
    pos = np.searchsorted(best, levels, side="left")
    hit = pos < t.size
    out[hit] = t[pos[hit]]
    return out, hit & (pos == 0)
