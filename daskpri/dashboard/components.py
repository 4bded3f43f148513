"""The dashboard's plots, one class each, built as distributed's own are.

Each component has a ``source`` (its main ``ColumnDataSource``), a ``root``
(the Bokeh model to lay out) and ``update(snapshot)``, which draws a
snapshot from :mod:`daskpri.dashboard.snapshot`. Unlike distributed's,
``update`` keeps Bokeh's property validation on: Bokeh's switch for it
(``without_property_validation``) is one flag for the whole process, and
two threads that draw pages (the scheduler's page and a standalone one in
the same process) can leave it off for good, after which Bokeh no longer
converts what it converts when validating (a figure's title, given as a
string, stays one). Snapshots carry only the
steps after the previous one, so components append (``stream``) what
accumulates and replace what is small (a histogram, a status table). A
snapshot of another run than the last one clears what was drawn.

Examples
--------
>>> from daskpri.dashboard.components import RunStatus
>>> status = RunStatus()
>>> status.source.data["field"][:3]
['run', 'state', 'strategy']
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
from bokeh.models import (
    BasicTicker,
    CDSView,
    ColumnDataSource,
    GroupFilter,
    HoverTool,
    LinearColorMapper,
)
from bokeh.models.annotations import ColorBar
from bokeh.models.widgets import Div
from bokeh.palettes import Viridis256
from distributed.dashboard.components import DashboardComponent

from daskpri.dashboard._plotting import (
    RUN_COLOR,
    empty,
    fit_ranges,
    new_figure,
    replace_data,
)
from daskpri.dashboard.progress import Speedup, TrainingCurves, Workers

__all__ = [
    "PartitionHeatmap",
    "PriorityHistogram",
    "RunStatus",
    "Speedup",
    "TrainingCurves",
    "Workers",
]


class PriorityHistogram(DashboardComponent):
    """The current priorities' histogram beside the one at the run's start.

    Both are fractions of the samples computed then, on the same bins: on
    log10 of the priority when the spread calls for it (see
    :data:`daskpri.dashboard.measures.LOG_SPREAD`), priorities of exactly 0
    then in a bar of their own at the left.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.source = ColumnDataSource(
            {"left": [], "right": [], "current": [], "start": [], "label": []},
            name="daskpri-histogram",
        )
        fig = new_figure("Priority distribution", **kwargs)
        fig.quad(
            source=self.source,
            left="left",
            right="right",
            bottom=0,
            top="start",
            fill_color="#bbbbbb",
            fill_alpha=0.6,
            line_color=None,
            legend_label="at the start",
        )
        fig.quad(
            source=self.source,
            left="left",
            right="right",
            bottom=0,
            top="current",
            fill_color=RUN_COLOR,
            fill_alpha=0.55,
            line_color=RUN_COLOR,
            legend_label="now",
        )
        fig.yaxis.axis_label = "fraction of computed samples"
        fig.xaxis.axis_label = "priority"
        fig.legend.location = "top_right"
        fig.legend.click_policy = "hide"
        fig.add_tools(
            HoverTool(
                tooltips=[
                    ("priority", "@label"),  # not the bin's edges: on log10 they read wrong
                    ("now", "@current{0.000}"),
                    ("start", "@start{0.000}"),
                ]
            )
        )
        self.root = fig
        self.scale = "linear"
        fit_ranges([fig], y_start=0)

    def update(self, snapshot: dict[str, Any]) -> None:
        h = snapshot["histogram"]
        data = {
            "left": np.asarray(h["left"]),
            "right": np.asarray(h["right"]),
            "current": np.asarray(h["current"]),
            "start": np.asarray(h["start"]),
            "label": list(h["label"]),
        }
        replace_data(self.source, data, [self.root], y_start=0)
        # list(): through RPC, msgpack gives the labels as a tuple
        scale = h["scale"] + (" with zeros" if list(h["label"][:1]) == ["0"] else "")
        if scale != self.scale:
            self.scale = scale
            self.root.xaxis.axis_label = {
                "linear": "priority",
                "log": "log10(priority)",
                "log with zeros": "log10(priority); the bar at the left: priority 0",
            }[scale]
        start = f", start: step {h['start_step']}" if h["start_step"] >= 0 else ""
        self.root.title.text = (
            f"Priority distribution: {h['n_seen']:,} of {snapshot['n_samples']:,} "
            f"samples computed (step {snapshot['table_step']}{start})"
        )
        fit_ranges([self.root], y_start=0)


class PartitionHeatmap(DashboardComponent):
    """Summed priority by partition and step, in a rolling window of steps.

    One column per snapshot whose table moved on; a column spans the steps
    since the previous one, and its hover names them ("steps 3–5"); the sums
    are those after its newest step. Partitions whose priorities were
    computed in that newest step (the ones chosen) carry a dot.
    """

    def __init__(self, window: int = 150, **kwargs: Any) -> None:
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window should be a positive integer, but got window={window!r}")
        self.window = window
        self.source = ColumnDataSource(
            {"step": [], "steps": [], "x": [], "width": [], "partition": [], "value": [],
             "chosen": []},
            name="daskpri-heatmap",
        )
        self.mapper = LinearColorMapper(palette=Viridis256, low=0.0, high=1.0)
        fig = new_figure("Summed priority by partition", **kwargs)
        fig.rect(
            source=self.source,
            x="x",
            y="partition",
            width="width",
            height=1,
            fill_color={"field": "value", "transform": self.mapper},
            line_color=None,
        )
        # A column spans the steps since the previous one; its dots mark the
        # partitions computed in its newest step, so they sit at that step.
        fig.scatter(
            source=self.source,
            x="step",
            y="partition",
            view=CDSView(filter=GroupFilter(column_name="chosen", group="yes")),
            marker="circle",
            size=4,
            color="#d62728",
        )
        fig.add_layout(ColorBar(color_mapper=self.mapper, width=8), "right")
        fig.xaxis.axis_label = "step"
        fig.yaxis.axis_label = "partition"
        fig.yaxis.ticker = BasicTicker(min_interval=1, num_minor_ticks=0)
        fig.add_tools(
            HoverTool(
                tooltips=[
                    ("steps", "@steps"),
                    ("partition", "@partition"),
                    ("sum after the newest", "@value{0.000g}"),
                    ("chosen in the newest", "@chosen"),
                ]
            )
        )
        self.root = fig
        self.run: str | None = None
        self.last_step = -1
        self.n_partitions = 0
        fit_ranges([fig])

    def update(self, snapshot: dict[str, Any]) -> None:
        try:
            self._draw(snapshot)
        finally:  # a new run may have cleared the plot, drawing nothing yet
            fit_ranges([self.root])

    def _draw(self, snapshot: dict[str, Any]) -> None:
        step = int(snapshot["table_step"])
        sums = np.asarray(snapshot["partitions"]["sum"], dtype=np.float64)
        if snapshot["run"] != self.run or sums.size != self.n_partitions:
            replace_data(self.source, empty(self.source), [self.root])
            self.run, self.last_step, self.n_partitions = snapshot["run"], -1, sums.size
        if step <= self.last_step:
            return
        width = step - self.last_step if self.last_step >= 0 else 1
        chosen = np.zeros(sums.size, dtype=bool)
        chosen[np.asarray(snapshot["chosen"], dtype=np.int64)] = True
        n = sums.size
        steps = str(step) if width == 1 else f"{step - width + 1}\u2013{step}"
        self.source.stream(
            {
                "step": np.full(n, step),
                "steps": [steps] * n,
                "x": np.full(n, step - (width - 1) / 2),
                "width": np.full(n, width),
                "partition": np.arange(n),
                "value": sums,
                "chosen": np.where(chosen, "yes", "no"),
            },
            rollover=self.window * n,
        )
        self.last_step = step
        values = np.asarray(self.source.data["value"], dtype=np.float64)
        lo, hi = float(values.min()), float(values.max())
        self.mapper.update(low=lo, high=hi if hi > lo else lo + 1.0)
        self.root.title.text = (
            f"Summed priority by partition (step {step}, {int(chosen.sum())} chosen)"
        )


class RunStatus(DashboardComponent):
    """The run at a glance: step, time, strategy, table staleness."""

    FIELDS = (
        "run",
        "state",
        "strategy",
        "parameters",
        "step",
        "epoch (samples processed / dataset)",
        "training time",
        "best accuracy",
        "workers",
        "samples computed",
        "staleness (mean steps)",
        "stalest partition (steps)",
        "table updates",
        "selection time",
        "baseline",
    )

    NO_RUN = "no daskpri run yet"
    #: The state of a run shown that the scheduler no longer holds.
    GONE = "closed, dropped from the scheduler (daskpri.table.keep-closed)"

    def __init__(self, **kwargs: Any) -> None:
        self._run = self.NO_RUN  # the run row's text while the scheduler answers
        #: the run's best accuracy so far and its step, over the snapshots drawn
        #: (each carries the steps after the last one): the early stopping's figure
        self._best: tuple[float, int] | None = None
        self.source = ColumnDataSource(
            {
                "field": list(self.FIELDS),
                "value": [self.NO_RUN] + [""] * (len(self.FIELDS) - 1),
            },
            name="daskpri-status",
        )
        # A Div, not a DataTable: Bokeh 3.9.1-3.9.2's DataTable does not redraw
        # when its source changes (bokeh/bokeh#15328).
        opts: dict[str, Any] = {"width": 560, "name": "daskpri-status-table"}
        opts.update(kwargs)
        self.root = Div(text=self._html(), **opts)

    def _html(self) -> str:
        rows = "".join(
            f"<tr><th style='{_TH}'>{html.escape(str(k))}</th>"
            f"<td style='{_TD}'>{html.escape(str(v))}</td></tr>"
            for k, v in zip(self.source.data["field"], self.source.data["value"], strict=True)
        )
        return f"<table style='border-collapse: collapse; width: 100%'>{rows}</table>"

    def unreachable(self, why: str | None) -> None:
        """Say in the run's row that the scheduler cannot be reached, and ``why``.

        ``None``: it answers again, and the row shows the run (or that there
        is none yet) as before.
        """
        text = self._run if why is None else f"the scheduler cannot be reached: {why}"
        if self.source.data["value"][0] != text:
            self.source.patch({"value": [(0, text)]})
            self.root.text = self._html()

    def gone(self, run: str) -> None:
        """Say that ``run``, the run shown, is no longer on the scheduler.

        Its last snapshot stays on the page (the user may be reading it);
        only its state says that nothing more will come.
        """
        if self._run == run and self.source.data["value"][1] != self.GONE:
            self.source.patch({"value": [(1, self.GONE)]})
            self.root.text = self._html()

    def update(self, snapshot: dict[str, Any]) -> None:
        if snapshot["run"] != self._run:
            self._best = None
        self._run = snapshot["run"]
        self._best = _best(snapshot["metrics"], self._best)
        base = snapshot.get("baseline")
        values = (
            snapshot["run"],
            "closed (kept for the dashboard)" if snapshot.get("closed") else "live",
            snapshot["strategy"],
            snapshot["params"],
            f"{snapshot['step']:,}",
            f"{snapshot.get('epoch', 0.0):.2f}",
            _seconds(snapshot["elapsed"]),
            "-" if self._best is None else f"{self._best[0]:.4f} at step {self._best[1]:,}",
            str(snapshot["n_workers"]),
            f"{snapshot['seen_fraction']:.1%} of {snapshot['n_samples']:,}",
            _number(snapshot["staleness_mean"]),
            _number(snapshot["staleness_max"]),
            f"{snapshot['n_updates']:,}",
            f"{snapshot['selection_seconds'] * 1e3:.1f} ms",
            "none (no other uniform run)" if base is None else base["run"],
        )
        old = self.source.data["value"]
        changed = [(i, v) for i, v in enumerate(values) if old[i] != v]
        if changed:
            self.source.patch({"value": changed})
            self.root.text = self._html()


_TH = "text-align: left; font-weight: normal; color: #555; padding: 3px 8px; width: 170px"
_TD = "padding: 3px 8px; border-bottom: 1px solid #eee; word-break: break-all"


def _best(metrics: dict[str, Any], best: tuple[float, int] | None) -> tuple[float, int] | None:
    """The best accuracy and its step over ``best`` and the new steps' ``metrics`` (the earliest
    step of a tie, as the early stopping keeps it).

    >>> _best({"accuracy": np.array([np.nan, 0.7, 0.8, 0.8]), "step": np.arange(4)}, (0.75, 0))
    (0.8, 2)
    """
    acc = np.asarray(metrics["accuracy"], dtype=float)
    ok = np.isfinite(acc)
    if not ok.any():
        return best
    i = int(np.argmax(np.where(ok, acc, -np.inf)))
    if best is not None and acc[i] <= best[0]:
        return best
    return float(acc[i]), int(metrics["step"][i])


def _seconds(t: float) -> str:
    if not math.isfinite(t):
        return "-"
    minutes, seconds = divmod(t, 60.0)
    return f"{int(minutes)} min {seconds:.1f} s" if minutes else f"{seconds:.1f} s"


def _number(x: float) -> str:
    return f"{x:.1f}" if math.isfinite(x) else "-"
