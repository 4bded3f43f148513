"""Snapshots: what the dashboard draws of one run, as a plain dict.

A snapshot is built from a run's table and metrics, either in the
scheduler's process (:func:`snapshot_from_run`, for the ``/daskpri`` page) or
through the scheduler's ``daskpri_*`` RPC handlers (:func:`snapshot_from_rpc`,
for the standalone app). Both return the same shape, so the components never
know where the data came from. Everything here is numpy and plain Python:
it is tested without a cluster and without Bokeh.

Metrics are incremental: a snapshot carries only the steps after its
``cursor`` argument, and its ``"cursor"`` entry is the one to pass next time.
The priority histogram of the run's start is the one the scheduler's table
plugin kept of the run's first priorities; for a run without one it is kept
the same way as the cursor: pass a snapshot's ``"start_histogram"`` back as
``start_histogram``.
"""

from __future__ import annotations

from collections.abc import Mapping, Reversible
from typing import Any

import numpy as np

from daskpri._wire import pack_tree, unpack_tree
from daskpri.dashboard.measures import N_BINS, priority_histogram
from daskpri.table.plugin import PLUGIN_NAME, TableRun

#: Per-step scalar metrics a snapshot carries (NaN where a step lacks one).
METRIC_COLUMNS: tuple[str, ...] = (
    "step",
    "time",
    "loss",
    "accuracy",
    "eval_loss",
    "samples",
    "samples_per_second",
    "step_time",
    "compute_time",
    "communication_time",
    "selection_time",
    "optimizer_time",
    "n_workers",
    "priority_mean",
    "priority_max",
)
#: Per-step, per-worker-slot metrics (lists of lists).
WORKER_COLUMNS: tuple[str, ...] = ("worker_samples", "worker_compute_time")
#: The strategy whose runs serve as baselines.
BASELINE_STRATEGY = "uniform"


def new_cursor() -> dict[str, Any]:
    """A cursor before the first step: the same as passing None.

    A cursor holds the last step whose metrics were sent (``step``), how
    many rows the run's metrics held then (``index``), that step's
    training time (``time``) and the samples processed by then (``samples``).
    """
    return {"step": -1, "index": 0, "time": float("nan"), "samples": 0.0}


def snapshot_from_run(
    run: TableRun,
    start_histogram: dict[str, Any] | None = None,
    *,
    name: str = "",
    cursor: Mapping[str, Any] | None = None,
    baseline: TableRun | None = None,
    baseline_name: str | None = None,
    baseline_cursor: Mapping[str, Any] | None = None,
    n_bins: int = N_BINS,
) -> dict[str, Any]:
    """What the dashboard draws of ``run``, read from its table in-process.

    Parameters
    ----------
    run : TableRun
        The run, as held by :class:`daskpri.table.plugin.TablePlugin`.
    start_histogram : dict, optional
        The ``"start_histogram"`` of an earlier snapshot of this run, for a
        run whose first priorities the scheduler did not keep (``run.start``,
        which is used where it is there); when None, the current priorities
        become the start (if any is computed).
    name : str
        The run's name (its key in the plugin's ``runs``).
    cursor, baseline_cursor : dict, optional
        The ``"cursor"`` of the previous snapshot (of ``run``, of
        ``baseline``): only later steps' metrics are included. None: all.
    baseline, baseline_name : TableRun and str, optional
        A run to compare with (see :func:`choose_baseline`).
    n_bins : int
        Bins of the priority histogram.

    Returns
    -------
    dict
        ``run``, ``closed`` (the trainer closed the run; the scheduler keeps
        it for the dashboard), ``strategy``, ``params``, ``n_workers`` (those
        holding its partitions now), ``n_samples``,
        ``step`` (last selected), ``table_step`` (last step whose priorities
        reached the table, -1 before any), ``n_updates``, ``elapsed``,
        ``partitions`` (per-partition ``sum``, ``max``, ``count``, ``seen``,
        ``staleness``, ``owner``), ``chosen`` (partitions updated at
        ``table_step``), ``seen_fraction``, ``staleness_mean``,
        ``staleness_max``, ``selection_seconds``, ``histogram``,
        ``start_histogram``, ``metrics`` (new steps, by column), ``cursor``
        and ``baseline`` (None, or ``run``, ``strategy``, ``metrics`` and
        ``cursor`` of the baseline).

    Examples
    --------
    >>> import collections, numpy as np
    >>> from daskpri.table.table import PriorityTable
    >>> from daskpri.strategies import get_strategy
    >>> table = PriorityTable([2, 2])
    >>> table.update(np.array([0, 3]), np.array([1.0, 3.0]), step=0)
    >>> run = TableRun(table=table, strategy=get_strategy("uniform"),
    ...                rng=np.random.default_rng(0), owner=np.array([0, 1]),
    ...                batch_size=2, info={"strategy": "uniform"}, last_step=1)
    >>> run.metrics.append({"step": 0, "time": 0.1, "loss": 2.3})
    >>> snap = snapshot_from_run(run, name="a")
    >>> snap["partitions"]["sum"].tolist(), snap["chosen"].tolist()
    ([1.0, 3.0], [0, 1])
    >>> snap["metrics"]["loss"].tolist(), snap["cursor"]
    ([2.3], {'step': 0, 'index': 1, 'time': 0.1, 'samples': nan})
    """
    table = run.table
    summary = dict(table.summaries(max(run.last_step, 0)), owner=run.owner)
    snap = _assemble(
        name=name,
        info=run.info,
        last_step=run.last_step,
        n_updates=table.n_updates,
        selection_seconds=run.selection_seconds,
        summary=summary,
        view=_run_view(run, start_histogram, n_bins),
        rows=_rows_since(run.metrics, cursor),
        cursor=cursor,
        n_metrics=len(run.metrics),
        closed=run.closed,
    )
    if baseline is not None:
        snap["baseline"] = _baseline(
            baseline_name or "",
            baseline.info,
            _rows_since(baseline.metrics, baseline_cursor),
            baseline_cursor,
            len(baseline.metrics),
        )
    return snap


async def snapshot_from_rpc(
    scheduler: Any,
    run: str,
    start_histogram: dict[str, Any] | None = None,
    *,
    cursor: Mapping[str, Any] | None = None,
    baseline: str | None = None,
    baseline_cursor: Mapping[str, Any] | None = None,
    n_bins: int = N_BINS,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """:func:`snapshot_from_run` through the scheduler's ``daskpri_*`` handlers.

    Costs one RPC for the summary, one for the new metrics (two more with a
    baseline) and, where the table changed since ``previous``, one for what
    the plots draw of the per-sample priorities (``daskpri_view``: the
    histogram and the partitions just computed, a few kilobytes, computed on
    the scheduler). A scheduler without that handler (an older daskpri)
    sends the priorities themselves, 16 bytes a sample. Metrics are fetched
    from the cursor's ``index`` on; should the run's metrics deque overflow
    (100,000 steps), some steps are skipped.

    Parameters
    ----------
    scheduler : rpc
        The scheduler's RPC handle, ``client.scheduler``.
    run, baseline : str
        Names of the run and of its baseline (optional).
    start_histogram, cursor, baseline_cursor, n_bins
        As in :func:`snapshot_from_run`.
    previous : dict, optional
        The previous snapshot of ``run``: while the table has taken no update
        since (the same ``n_updates`` and ``step``), its histogram and chosen
        partitions are drawn again, and the scheduler is not asked for them.

    Examples
    --------
    >>> run = "uniform-1a2b3c4d"
    >>> snap = client.sync(snapshot_from_rpc, client.scheduler, run)  # doctest: +SKIP
    """
    summary = unpack_tree(await scheduler.daskpri_summary(run=run))
    start = summary.get("start") or start_histogram
    if (
        previous is not None
        and previous["run"] == run
        and previous["n_updates"] == int(summary["n_updates"])
        and previous["step"] == int(summary["last_step"])
    ):
        view = {k: previous[k] for k in _VIEW}
    else:
        view = await _remote_view(scheduler, run, start, summary["count"], n_bins)
    rows, n_metrics = await _remote_rows(scheduler, run, cursor)
    snap = _assemble(
        name=run,
        info=summary["info"],
        last_step=int(summary["last_step"]),
        n_updates=int(summary["n_updates"]),
        selection_seconds=float(summary["selection_seconds"]),
        summary=summary,
        view=view,
        rows=rows,
        cursor=cursor,
        n_metrics=n_metrics,
        closed=bool(summary.get("closed", False)),
    )
    if baseline is not None:
        info = unpack_tree(await scheduler.daskpri_summary(run=baseline))["info"]
        b_rows, b_n = await _remote_rows(scheduler, baseline, baseline_cursor)
        snap["baseline"] = _baseline(baseline, info, b_rows, baseline_cursor, b_n)
    return snap


def priority_view(
    priority: np.ndarray,
    version: np.ndarray,
    count: np.ndarray,
    start_histogram: dict[str, Any] | None = None,
    n_bins: int = N_BINS,
) -> dict[str, Any]:
    """What the plots draw of the per-sample priorities: small, whatever the table's size.

    ``table_step`` (the newest version, -1 before any), ``chosen`` (the
    partitions computed then; ``count`` holds each partition's samples),
    ``histogram`` and ``start_histogram`` (see
    :func:`~daskpri.dashboard.measures.priority_histogram`).

    Examples
    --------
    >>> v = priority_view(np.array([1.0, np.nan, 2.0]), np.array([0, -1, 1]), np.array([2, 1]))
    >>> v["table_step"], v["chosen"].tolist(), v["histogram"]["n_seen"]
    (1, [1], 2)
    """
    version = np.asarray(version)
    table_step = int(version.max()) if version.size else -1
    if table_step >= 0:
        offsets = np.concatenate([[0], np.cumsum(count)])
        fresh = np.flatnonzero(version == table_step)
        chosen = np.unique(np.searchsorted(offsets, fresh, side="right") - 1)
    else:
        chosen = np.empty(0, dtype=np.int64)
    hist, start = priority_histogram(priority, start_histogram, step=table_step, n_bins=n_bins)
    return {
        "table_step": table_step,
        "chosen": chosen.astype(np.int64),
        "histogram": hist,
        "start_histogram": start,
    }


#: A snapshot's entries that :func:`priority_view` makes.
_VIEW = ("table_step", "chosen", "histogram", "start_histogram")


def add_view_handler(scheduler: Any) -> None:
    """Answer ``daskpri_view`` on ``scheduler``: :func:`priority_view` of a run, made there.

    The standalone page (:mod:`daskpri.dashboard.remote`) asks it at each
    refresh where the table changed, rather than for every sample's
    priority. It reads the runs of the scheduler's table plugin; the page
    module's :func:`~daskpri.dashboard.page.install` adds it as the plugin
    starts, whether or not the scheduler serves a dashboard.
    """

    def view(run: str, start: Any = None, n_bins: int = N_BINS) -> dict:
        plugin = scheduler.plugins.get(PLUGIN_NAME)
        runs = getattr(plugin, "runs", {})
        if run not in runs:
            raise KeyError(f"no daskpri run {run!r} on this scheduler")
        tr = runs[run]
        given = None if start is None else unpack_tree(start)
        return pack_tree(_run_view(tr, given, int(n_bins)))

    scheduler.handlers["daskpri_view"] = view


def _run_view(run: TableRun, start_histogram: dict[str, Any] | None, n_bins: int) -> dict:
    """:func:`priority_view` of ``run``'s table, in the process that holds it."""
    table = run.table
    start = start_histogram if run.start is None else run.start
    return priority_view(table.priority, table.version, np.diff(table.offsets), start, n_bins)


async def _remote_view(
    scheduler: Any, run: str, start: dict[str, Any] | None, count: np.ndarray, n_bins: int
) -> dict[str, Any]:
    answer = await scheduler.daskpri_view(
        run=run, start=None if start is None else pack_tree(start), n_bins=n_bins
    )
    if answer is not None:
        return dict(unpack_tree(answer))
    # distributed answers None to a handler it lacks: an older daskpri's scheduler
    arrays = unpack_tree(await scheduler.daskpri_priorities(run=run))
    return priority_view(arrays["priority"], arrays["version"], count, start, n_bins)


class NoPlugin(KeyError):
    """The scheduler has no ``daskpri_*`` handlers (no run has loaded the table plugin)."""


async def run_strategies(scheduler: Any, known: Mapping[str, str] | None = None) -> dict[str, str]:
    """The strategy of each run on the scheduler, through RPC, oldest first.

    ``daskpri_runs`` lists runs by name, not by age, so the order is that
    of ``known`` (name to strategy, from the previous call), then the runs
    that appeared since; ``known`` runs are not asked for again.
    """
    known = dict(known or {})
    names = await scheduler.daskpri_runs()
    if names is None:  # distributed answers an unknown handler so
        raise NoPlugin("the scheduler has no daskpri table yet: no run has started there, and "
                       "it was not started with --preload daskpri.table.plugin")
    out = {name: known[name] for name in known if name in names}
    for name in names:
        if name not in out:
            summary = unpack_tree(await scheduler.daskpri_summary(run=name))
            out[name] = str(summary["info"].get("strategy", ""))
    return out


def choose_baseline(strategies: Mapping[str, str], run: str | None) -> str | None:
    """The newest run other than ``run`` whose strategy is ``"uniform"``, or None.

    Examples
    --------
    >>> choose_baseline({"u1": "uniform", "p": "projection", "u2": "uniform"}, "p")
    'u2'
    >>> choose_baseline({"p": "projection"}, "p") is None
    True
    """
    for name in reversed(list(strategies)):
        if name != run and strategies[name] == BASELINE_STRATEGY:
            return name
    return None


# -- internals -----------------------------------------------------------------------


def _assemble(
    *,
    name: str,
    info: Mapping[str, Any],
    last_step: int,
    n_updates: int,
    selection_seconds: float,
    summary: Mapping[str, Any],
    view: Mapping[str, Any],
    rows: list[dict[str, Any]],
    cursor: Mapping[str, Any] | None,
    n_metrics: int,
    closed: bool,
) -> dict[str, Any]:
    """The snapshot, from a run's summary, :func:`priority_view` and new metrics."""
    count = np.asarray(summary["count"], dtype=np.int64)
    seen = np.asarray(summary["seen"], dtype=np.int64)
    staleness = np.asarray(summary["staleness"], dtype=np.float64)
    owner = np.asarray(summary["owner"], dtype=np.int64)
    # the workers holding the run's partitions now: the count the run set out
    # with (info's) is stale once a worker leaves or joins and its partitions move
    n_workers = int(np.unique(owner).size) if owner.size else int(info.get("n_workers", 0))
    n_seen = int(seen.sum())
    weighted = np.where(seen > 0, np.nan_to_num(staleness) * seen, 0.0)
    metrics = _columns(rows)
    next_cursor = _advance(cursor, rows, n_metrics)
    return {
        "run": name,
        "closed": bool(closed),
        "strategy": str(info.get("strategy", "")),
        "params": str(info.get("params", "")),
        "n_workers": n_workers,
        "n_samples": int(info.get("n_samples", int(count.sum()))),
        "step": int(last_step),
        "table_step": int(view["table_step"]),
        "n_updates": int(n_updates),
        "elapsed": next_cursor["time"],
        "epoch": next_cursor.get("samples", 0.0) / max(int(count.sum()), 1),
        "partitions": {
            "sum": np.asarray(summary["sum"], dtype=np.float64),
            "max": np.asarray(summary["max"], dtype=np.float64),
            "count": count,
            "seen": seen,
            "staleness": staleness,
            "owner": owner,
        },
        "chosen": np.asarray(view["chosen"], dtype=np.int64),
        "seen_fraction": n_seen / max(int(count.sum()), 1),
        "staleness_mean": float(weighted.sum() / n_seen) if n_seen else float("nan"),
        "staleness_max": float(np.nanmax(staleness)) if n_seen else float("nan"),
        "selection_seconds": float(selection_seconds),
        "histogram": view["histogram"],
        "start_histogram": view["start_histogram"],
        "metrics": metrics,
        "cursor": next_cursor,
        "baseline": None,
    }


def _baseline(
    name: str,
    info: Mapping[str, Any],
    rows: list[dict[str, Any]],
    cursor: Mapping[str, Any] | None,
    n_metrics: int,
) -> dict[str, Any]:
    return {
        "run": name,
        "strategy": str(info.get("strategy", "")),
        "metrics": _columns(rows),
        "cursor": _advance(cursor, rows, n_metrics),
    }


def _rows_since(
    metrics: Reversible[dict[str, Any]], cursor: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """Rows after the cursor's step, read from the newest end (the deque may be long)."""
    after = -1 if cursor is None else int(cursor["step"])
    rows = []
    for row in reversed(metrics):
        if int(row.get("step", -1)) <= after:
            break
        rows.append(row)
    rows.reverse()
    return rows


async def _remote_rows(
    scheduler: Any, run: str, cursor: Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]], int]:
    start = 0 if cursor is None else int(cursor["index"])
    after = -1 if cursor is None else int(cursor["step"])
    fetched = await scheduler.daskpri_metrics(run=run, start=start)
    rows = [r for r in fetched if int(r.get("step", -1)) > after]
    return rows, start + len(fetched)


def _advance(
    cursor: Mapping[str, Any] | None, rows: list[dict[str, Any]], n_metrics: int
) -> dict[str, Any]:
    out = dict(new_cursor() if cursor is None else cursor, index=int(n_metrics))
    if rows:
        out.update(
            step=int(rows[-1]["step"]),
            time=_float(rows[-1].get("time")),
            samples=_float(rows[-1].get("samples")),
        )
    return out


def _columns(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows of metrics as columns: float arrays, NaN where a row lacks a value."""
    out: dict[str, Any] = {
        k: np.array([_float(r.get(k)) for r in rows], dtype=np.float64) for k in METRIC_COLUMNS
    }
    for k in WORKER_COLUMNS:
        out[k] = [[float(v) for v in (r.get(k) or ())] for r in rows]
    return out


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")
