"""The training's plots: loss and accuracy curves, speedup, workers.

See :mod:`daskpri.dashboard.components` for the contract they follow.
"""

from __future__ import annotations

import collections
import math
from typing import Any

import numpy as np
from bokeh.layouts import row
from bokeh.models import BasicTicker, ColumnDataSource, HoverTool
from bokeh.models.annotations import Span
from distributed.dashboard.components import DashboardComponent

from daskpri.dashboard._plotting import (
    BASELINE_COLOR,
    RUN_COLOR,
    TIME_COLORS,
    empty,
    fit_ranges,
    new_figure,
    replace_data,
)
from daskpri.dashboard.measures import speedup_curve
from daskpri.training.history import TIME_PARTS


class TrainingCurves(DashboardComponent):
    """Loss and accuracy against training time, for the run and its baseline.

    ``source`` holds the run's loss; ``accuracy``, ``baseline`` and
    ``baseline_accuracy`` the other curves.
    """

    def __init__(self, **kwargs: Any) -> None:
        def curve(y: str, name: str) -> ColumnDataSource:
            return ColumnDataSource({"time": [], y: [], "step": []}, name=name)

        self.source = curve("loss", "daskpri-loss")
        self.accuracy = curve("accuracy", "daskpri-accuracy")
        self.baseline = curve("loss", "daskpri-baseline-loss")
        self.baseline_accuracy = curve("accuracy", "daskpri-baseline-accuracy")
        self.loss_figure = new_figure("Training loss", **kwargs)
        self.accuracy_figure = new_figure("Accuracy", x_range=self.loss_figure.x_range, **kwargs)
        for fig, y, (run_src, base_src) in (
            (self.loss_figure, "loss", (self.source, self.baseline)),
            (self.accuracy_figure, "accuracy", (self.accuracy, self.baseline_accuracy)),
        ):
            fig.line(
                source=base_src,
                x="time",
                y=y,
                color=BASELINE_COLOR,
                line_width=2,
                legend_label="uniform baseline",
            )
            fig.line(
                source=run_src,
                x="time",
                y=y,
                color=RUN_COLOR,
                line_width=2,
                legend_label="this run",
            )
            if y == "accuracy":
                fig.scatter(source=run_src, x="time", y=y, color=RUN_COLOR, size=5)
                fig.scatter(source=base_src, x="time", y=y, color=BASELINE_COLOR, size=5)
            fig.xaxis.axis_label = "training time (s)"
            fig.yaxis.axis_label = y
            fig.legend.location = "top_right" if y == "loss" else "bottom_right"
            fig.legend.click_policy = "hide"
            fig.add_tools(
                HoverTool(
                    tooltips=[("step", "@step"), (y, f"@{y}{{0.000}}"), ("time", "@time{0.00} s")]
                )
            )
        self.root = row(self.loss_figure, self.accuracy_figure)
        self.run: str | None = None
        self.baseline_run: str | None = None
        fit_ranges([self.loss_figure, self.accuracy_figure])

    def update(self, snapshot: dict[str, Any]) -> None:
        figs = [self.loss_figure, self.accuracy_figure]
        if snapshot["run"] != self.run:
            for src in (self.source, self.accuracy):
                replace_data(src, empty(src), figs)
            self.run = snapshot["run"]
        _stream_curves(snapshot["metrics"], self.source, self.accuracy)
        base = snapshot.get("baseline")
        name = None if base is None else base["run"]
        if name != self.baseline_run:
            for src in (self.baseline, self.baseline_accuracy):
                replace_data(src, empty(src), figs)
            self.baseline_run = name
        if base is not None:
            _stream_curves(base["metrics"], self.baseline, self.baseline_accuracy)
        # The baseline's name says its strategy already ("uniform-1a2b3c4d"), and a
        # uniform run's baseline is another uniform run: "vs uniform uniform-..."
        # read as if the run were compared with itself.
        label = f"{snapshot['strategy']} run" + (f" vs baseline {name}" if name else "")
        self.loss_figure.title.text = f"Training loss: {label}"
        self.accuracy_figure.title.text = f"Accuracy: {label}"
        fit_ranges(figs)


def _stream_curves(
    metrics: dict[str, Any], loss: ColumnDataSource, accuracy: ColumnDataSource
) -> None:
    t, step = metrics["time"], metrics["step"]
    if not len(t):
        return
    ok = np.isfinite(metrics["loss"])
    if ok.any():
        loss.stream({"time": t[ok], "loss": metrics["loss"][ok], "step": step[ok]})
    ok = np.isfinite(metrics["accuracy"])
    if ok.any():
        accuracy.stream({"time": t[ok], "accuracy": metrics["accuracy"][ok], "step": step[ok]})


class Speedup(DashboardComponent):
    """Baseline time over the run's time to each accuracy level reached so far."""

    def __init__(self, **kwargs: Any) -> None:
        self.source = ColumnDataSource(
            {"level": [], "speedup": [], "run_time": [], "baseline_time": []},
            name="daskpri-speedup",
        )
        fig = new_figure("Speedup over the uniform baseline", **kwargs)
        fig.line(source=self.source, x="level", y="speedup", color=RUN_COLOR, line_width=2)
        fig.scatter(source=self.source, x="level", y="speedup", color=RUN_COLOR, size=5)
        fig.add_layout(
            Span(location=1.0, dimension="width", line_dash="dashed", line_color="#888888")
        )
        fig.xaxis.axis_label = "accuracy reached"
        fig.yaxis.axis_label = "baseline time / run time"
        fig.add_tools(
            HoverTool(
                tooltips=[
                    ("accuracy", "@level{0.00}"),
                    ("speedup", "@speedup{0.00}x"),
                    ("run", "@run_time{0.0} s"),
                    ("baseline", "@baseline_time{0.0} s"),
                ]
            )
        )
        self.root = fig
        fit_ranges([fig])
        self.run: str | None = None
        self.baseline_run: str | None = None
        self._run_points: tuple[list[float], list[float]] = ([], [])
        self._base_points: tuple[list[float], list[float]] = ([], [])

    def update(self, snapshot: dict[str, Any]) -> None:
        if snapshot["run"] != self.run:
            self.run, self._run_points = snapshot["run"], ([], [])
        base = snapshot.get("baseline")
        name = None if base is None else base["run"]
        if name != self.baseline_run:
            self.baseline_run, self._base_points = name, ([], [])
        _collect(snapshot["metrics"], self._run_points)
        if base is not None:
            _collect(base["metrics"], self._base_points)
        curve = speedup_curve(*self._run_points, *self._base_points)
        if len(curve["level"]) != len(self.source.data["level"]) or not np.array_equal(
            curve["speedup"], self.source.data["speedup"]
        ):
            replace_data(self.source, curve, [self.root])
        if name is None:
            self.root.title.text = "Speedup: no other uniform run on this scheduler to compare with"
        elif len(curve["level"]):
            self.root.title.text = (
                f"Speedup over {name}: {curve['speedup'][-1]:.2f}x "
                f"to accuracy {curve['level'][-1]:.2f}"
            )
        else:
            self.root.title.text = f"Speedup over {name}: no common accuracy level yet"
        fit_ranges([self.root])


def _collect(metrics: dict[str, Any], points: tuple[list[float], list[float]]) -> None:
    ok = np.isfinite(metrics["accuracy"]) & np.isfinite(metrics["time"])
    points[0].extend(metrics["time"][ok].tolist())
    points[1].extend(metrics["accuracy"][ok].tolist())


class Workers(DashboardComponent):
    """Samples per second of each worker slot, and each step's time split.

    ``source`` holds the throughput per slot (a worker holding partitions
    of the run now) over the last ``recent`` steps since the run's workers
    last changed;
    ``times`` the compute / communication / selection / optimizer split of
    the last ``window`` steps.
    """

    def __init__(self, recent: int = 20, window: int = 150, **kwargs: Any) -> None:
        self.window = window
        self._recent: collections.deque = collections.deque(maxlen=recent)
        self.source = ColumnDataSource(
            {"slot": [], "samples_per_second": []}, name="daskpri-throughput"
        )
        self.times = ColumnDataSource(
            {"step": [], **{k: [] for k in TIME_PARTS}}, name="daskpri-step-times"
        )
        self.throughput_figure = new_figure("Samples/s per worker slot", **kwargs)
        self.throughput_figure.vbar(
            source=self.source, x="slot", top="samples_per_second", width=0.8, color=RUN_COLOR
        )
        self.throughput_figure.xaxis.axis_label = "worker slot"
        self.throughput_figure.xaxis.ticker = BasicTicker(min_interval=1, num_minor_ticks=0)
        self.throughput_figure.yaxis.axis_label = "samples / s"
        self.times_figure = new_figure("Step time", **kwargs)
        self.times_figure.vbar_stack(
            list(TIME_PARTS),
            x="step",
            width=0.9,
            source=self.times,
            color=list(TIME_COLORS),
            legend_label=[k.replace("_time", "") for k in TIME_PARTS],
        )
        self.times_figure.xaxis.axis_label = "step"
        self.times_figure.yaxis.axis_label = "seconds"
        self.times_figure.add_layout(self.times_figure.legend[0], "right")  # off the bars
        self.root = row(self.throughput_figure, self.times_figure)
        self.run: str | None = None
        self._owner: np.ndarray | None = None  # the slot of each partition, at the last update
        fit_ranges([self.throughput_figure, self.times_figure], y_start=0)

    def update(self, snapshot: dict[str, Any]) -> None:
        try:
            self._draw(snapshot)
        finally:  # a new run may have cleared the plots, drawing nothing yet
            fit_ranges([self.throughput_figure, self.times_figure], y_start=0)

    def _draw(self, snapshot: dict[str, Any]) -> None:
        if snapshot["run"] != self.run:
            self.run, self._owner = snapshot["run"], None
            self._recent.clear()
            figs = [self.throughput_figure, self.times_figure]
            replace_data(self.times, empty(self.times), figs, y_start=0)
            replace_data(self.source, empty(self.source), figs, y_start=0)
        m = snapshot["metrics"]
        if len(m["step"]):
            self.times.stream(
                {"step": m["step"], **{k: np.nan_to_num(m[k]) for k in TIME_PARTS}},
                rollover=self.window,
            )
        # The slots are the workers holding the run's partitions now, numbered
        # afresh when one leaves or joins: steps before that count other workers
        # (or one gone), so the window starts again, and a row with more slots
        # than there are now is from before.
        # (a history's snapshot, drawn in a report, has no table, hence no owners)
        owner = np.asarray(snapshot.get("partitions", {}).get("owner", ()), dtype=np.int64)
        n_now = int(owner.max()) + 1 if owner.size else None
        moved = self._owner is not None and not np.array_equal(owner, self._owner)
        self._owner = owner
        if moved:
            self._recent.clear()
        elif not len(m["step"]):
            return
        for samples, seconds in zip(m["worker_samples"], m["step_time"], strict=True):
            if samples and math.isfinite(seconds) and (n_now is None or len(samples) <= n_now):
                self._recent.append((samples, seconds))
        n_slots = max((len(s) for s, _ in self._recent), default=0) if n_now is None else n_now
        total = np.zeros(n_slots)
        for samples, _ in self._recent:
            total[: len(samples)] += samples
        seconds = sum(t for _, t in self._recent)
        rate = total / seconds if seconds > 0 else total
        replace_data(self.source, {"slot": np.arange(n_slots), "samples_per_second": rate},
                     [self.throughput_figure, self.times_figure], y_start=0)
        self.throughput_figure.title.text = (
            f"Samples/s per worker slot (last {len(self._recent)} steps, "
            f"{float(rate.sum()):,.0f} in all)"
        )
