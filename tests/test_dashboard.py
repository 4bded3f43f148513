"""The dashboard: snapshots and components from hand-made runs (the page on real clusters
is in test_dashboard_pages.py)."""

from __future__ import annotations

import asyncio
import logging
import re

import dask
import numpy as np
import pytest
from bokeh.server.server import BokehTornado
from distributed import Scheduler
from distributed.protocol import pickle

from daskpri._wire import pack
from daskpri.dashboard.components import (
    PartitionHeatmap,
    PriorityHistogram,
    RunStatus,
    Speedup,
    TrainingCurves,
    Workers,
)
from daskpri.dashboard.measures import priority_histogram, speedup_curve
from daskpri.dashboard.page import DaskpriDashboard, install, refresh_from_runs
from daskpri.dashboard.snapshot import choose_baseline, snapshot_from_run
from daskpri.strategies import get_strategy
from daskpri.table.plugin import TablePlugin, TableRun
from daskpri.table.table import PriorityTable

# -- hand-made runs -------------------------------------------------------------------


def make_run(strategy: str = "projection", sizes=(4, 4, 4), n_workers: int = 2) -> TableRun:
    table = PriorityTable(list(sizes), n_bins=8)
    return TableRun(
        table=table,
        strategy=get_strategy("uniform"),
        rng=np.random.default_rng(0),
        owner=np.arange(len(sizes)) % n_workers,
        batch_size=2,
        info={
            "strategy": strategy,
            "params": f"{strategy}()",
            "n_workers": n_workers,
            "n_samples": int(sum(sizes)),
        },
    )


def add_step(
    run: TableRun,
    step: int,
    indices,
    priorities,
    *,
    loss=1.0,
    accuracy=None,
    time_=None,
    workers=(2, 2),
) -> None:
    """Record step ``step`` as the trainer and plugin would."""
    run.table.update(np.asarray(indices), np.asarray(priorities, dtype=float), step)
    run.last_step = step + 1
    row = {
        "step": step,
        "time": float(step + 1) if time_ is None else time_,
        "loss": loss,
        "samples": 4 * (step + 1),
        "samples_per_second": 4.0,
        "step_time": 1.0,
        "compute_time": 0.5,
        "communication_time": 0.3,
        "selection_time": 0.1,
        "optimizer_time": 0.1,
        "n_workers": len(workers),
        "worker_samples": list(workers),
        "worker_compute_time": [0.5] * len(workers),
    }
    if accuracy is not None:
        row["accuracy"] = accuracy
    run.metrics.append(row)


def test_snapshot_summarizes_the_table_and_marks_chosen_partitions():
    run = make_run()
    add_step(run, 0, [0, 1, 4], [1.0, 2.0, 3.0])
    add_step(run, 1, [8, 9], [4.0, 5.0])
    snap = snapshot_from_run(run, name="r")
    assert snap["run"] == "r" and snap["strategy"] == "projection" and snap["step"] == 2
    assert snap["table_step"] == 1 and snap["n_updates"] == 5
    assert snap["partitions"]["sum"].tolist() == [3.0, 3.0, 9.0]
    assert snap["partitions"]["seen"].tolist() == [2, 1, 2]
    assert snap["chosen"].tolist() == [2]  # only partition 2 was computed at step 1
    assert snap["seen_fraction"] == pytest.approx(5 / 12)
    # steps since computed, at step 2: 2, 2, 2, 1, 1
    assert snap["staleness_mean"] == pytest.approx(8 / 5)
    assert snap["staleness_max"] == pytest.approx(2.0)
    h = snap["histogram"]
    assert h["scale"] == "linear" and h["n_seen"] == 5 and len(h["left"]) == 40
    assert h["current"].sum() == pytest.approx(1.0)
    assert h["left"][0] == 1.0 and h["right"][-1] == 5.0


def test_snapshot_metrics_are_incremental_through_the_cursor():
    run = make_run()
    add_step(run, 0, [0], [1.0], loss=2.0)
    add_step(run, 1, [1], [1.0], loss=1.5, accuracy=0.4)
    first = snapshot_from_run(run, name="r")
    assert first["metrics"]["loss"].tolist() == [2.0, 1.5]
    assert np.isnan(first["metrics"]["accuracy"][0]) and first["metrics"]["accuracy"][1] == 0.4
    assert first["cursor"]["step"] == 1 and first["elapsed"] == 2.0
    again = snapshot_from_run(run, name="r", cursor=first["cursor"])
    assert again["metrics"]["step"].size == 0 and again["elapsed"] == 2.0
    add_step(run, 2, [2], [1.0], loss=1.0)
    later = snapshot_from_run(run, name="r", cursor=again["cursor"])
    assert later["metrics"]["step"].tolist() == [2.0] and later["metrics"]["worker_samples"] == [
        [2.0, 2.0]
    ]


def test_start_histogram_is_the_first_with_data_and_rebinned_beside_the_current():
    run = make_run()
    empty = snapshot_from_run(run, name="r")
    assert empty["start_histogram"] is None and empty["histogram"]["n_seen"] == 0
    add_step(run, 0, [0, 1, 2, 3], [1.0, 1.0, 2.0, 2.0])
    first = snapshot_from_run(run, empty["start_histogram"], name="r")
    start = first["start_histogram"]
    assert start["step"] == 0 and start["n"] == 4
    add_step(run, 1, [4, 5, 6, 7], [3.0, 3.0, 3.0, 3.0])
    second = snapshot_from_run(run, start, name="r")
    assert second["start_histogram"] is start
    h = second["histogram"]
    assert h["start_step"] == 0
    # Now 1..3 in 40 bins: the start's mass sits at 1 and 2, all of it on the plot.
    assert h["start"].sum() == pytest.approx(1.0)
    assert h["start"][h["left"] >= 2.9].sum() == 0
    assert h["current"][h["left"] >= 2.9].sum() == pytest.approx(0.5)


def test_histogram_goes_to_log10_bins_when_priorities_spread_widely():
    hist, start = priority_histogram(np.array([1e-3, 1e-2, 1.0, 10.0, np.nan]), n_bins=4)
    assert hist["scale"] == "log"
    assert hist["left"][0] == pytest.approx(-3.0) and hist["right"][-1] == pytest.approx(1.0)
    assert hist["current"].tolist() == [0.25, 0.25, 0.0, 0.5]
    assert hist["label"][0] == "0.001 to 0.01"
    # losses of exactly 0 keep the log axis: they have a bar of their own, one bin's
    # gap left of the others, beside the start's zeros
    start = {"step": 0, "n": 4, "sample": np.array([0.0, 0.0, 1e-3, 10.0])}
    hist, _ = priority_histogram(np.array([0.0, 1e-3, 1e-2, 1.0, 10.0]), start, n_bins=4)
    assert hist["scale"] == "log" and hist["label"][0] == "0"
    assert hist["left"].tolist() == pytest.approx([-5.0, -3.0, -2.0, -1.0, 0.0])
    assert hist["right"].tolist() == pytest.approx([-4.0, -2.0, -1.0, 0.0, 1.0])
    assert hist["current"].tolist() == [0.2, 0.2, 0.2, 0.0, 0.4]
    assert hist["start"].tolist() == [0.5, 0.25, 0.0, 0.0, 0.25]
    # a negative priority (projection) keeps a linear axis
    hist, _ = priority_histogram(np.array([-1.0, 1e-3, 100.0]), n_bins=4)
    assert hist["scale"] == "linear"


def test_baseline_is_the_newest_other_uniform_run():
    strategies = {"u1": "uniform", "p1": "projection", "u2": "uniform", "p2": "loss"}
    assert choose_baseline(strategies, "p2") == "u2"
    assert choose_baseline(strategies, "u2") == "u1"
    assert choose_baseline({"p": "projection"}, "p") is None


def test_speedup_curve_compares_time_to_each_level():
    s = speedup_curve([1.0, 2.0, 3.0], [0.3, np.nan, 0.6], [2.0, 4.0, 9.0], [0.3, 0.5, 0.6])
    # 0.01 to 0.3: both at their first evaluation, kept once
    assert s["level"][0] == 0.3 and s["level"][-1] == 0.6 and s["level"].size == 31
    at = dict(zip(np.round(s["level"], 2).tolist(), s["speedup"].tolist(), strict=True))
    assert at[0.3] == 2.0 and at[0.5] == pytest.approx(4 / 3) and at[0.6] == 3.0


# -- components -----------------------------------------------------------------------


def test_priority_histogram_component_draws_and_changes():
    run = make_run()
    comp = PriorityHistogram()
    add_step(run, 0, [0, 1, 2, 3], [1.0, 1.0, 2.0, 2.0])
    snap = snapshot_from_run(run, name="r")
    comp.update(snap)
    before = {k: np.asarray(v).copy() for k, v in comp.source.data.items()}
    np.testing.assert_array_equal(before["current"], snap["histogram"]["current"])
    np.testing.assert_array_equal(before["start"], before["current"])  # the start is now
    add_step(run, 1, [0, 1, 2, 3, 4], [1e-3, 1e-2, 0.1, 1.0, 10.0])
    snap = snapshot_from_run(run, snap["start_histogram"], name="r")
    comp.update(snap)
    after = comp.source.data
    assert not np.array_equal(after["current"], before["current"])
    assert not np.array_equal(after["start"], after["current"])
    assert comp.root.xaxis[0].axis_label == "log10(priority)"
    assert "5 of 12 samples" in comp.root.title.text
    add_step(run, 2, [5], [0.0])  # a loss of exactly 0
    comp.update(snapshot_from_run(run, snap["start_histogram"], name="r"))
    data = comp.source.data
    assert data["label"][0] == "0" and data["current"][0] == pytest.approx(1 / 6)
    assert comp.root.xaxis[0].axis_label == "log10(priority); the bar at the left: priority 0"


def test_heatmap_streams_a_column_per_step_in_a_bounded_window():
    run = make_run()
    comp = PartitionHeatmap(window=2)
    for step, idx in enumerate(([0, 1], [4, 5], [8, 9])):
        add_step(run, step, idx, [1.0 + step, 1.0])
        comp.update(snapshot_from_run(run, name="r"))
    comp.update(snapshot_from_run(run, name="r"))  # nothing new: nothing streamed
    data = comp.source.data
    assert list(data["step"]) == [1, 1, 1, 2, 2, 2]  # step 0 rolled out of the window
    assert list(data["steps"]) == ["1"] * 3 + ["2"] * 3
    assert list(data["partition"]) == [0, 1, 2] * 2
    assert list(data["value"]) == [2.0, 3.0, 0.0, 2.0, 3.0, 4.0]
    assert list(data["chosen"]) == ["no", "yes", "no", "no", "no", "yes"]
    assert (comp.mapper.low, comp.mapper.high) == (0.0, 4.0)
    # a column spanning steps 3 to 5: its cells cover them, its dots sit at step 5,
    # where their partitions were computed
    for step in (3, 4, 5):
        add_step(run, step, [step % 3 * 4], [1.0])
    comp.update(snapshot_from_run(run, name="r"))
    [cell] = [r.glyph for r in comp.root.renderers if type(r.glyph).__name__ == "Rect"]
    [dot] = [r.glyph for r in comp.root.renderers if type(r.glyph).__name__ == "Scatter"]
    data = {k: list(v[-3:]) for k, v in comp.source.data.items()}
    assert data["chosen"] == ["no", "no", "yes"]  # partition 2, at step 5
    assert data["steps"] == ["3\u20135"] * 3  # what the hover names
    [hover] = [t for t in comp.root.tools if type(t).__name__ == "HoverTool"]
    assert ("steps", "@steps") in hover.tooltips
    x, width = data[cell.x][2], data[cell.width][2]
    assert (x - width / 2, x + width / 2) == (2.5, 5.5)
    assert data[dot.x][2] == 5
    with pytest.raises(ValueError, match="window should be a positive integer, but got window=0"):
        PartitionHeatmap(window=0)


def test_training_curves_stream_run_and_baseline():
    run, base = make_run("projection"), make_run("uniform")
    for step in range(3):
        add_step(run, step, [step], [1.0], loss=2.0 - step / 2, accuracy=0.2 * (step + 1))
        add_step(base, step, [step], [1.0], loss=2.0 - step / 4, time_=2.0 * (step + 1))
    comp = TrainingCurves()
    snap = snapshot_from_run(run, name="p", baseline=base, baseline_name="u")
    comp.update(snap)
    assert list(comp.source.data["loss"]) == [2.0, 1.5, 1.0]
    assert list(comp.accuracy.data["accuracy"]) == pytest.approx([0.2, 0.4, 0.6])
    assert list(comp.baseline.data["time"]) == [2.0, 4.0, 6.0]
    assert len(comp.baseline_accuracy.data["time"]) == 0  # the baseline never evaluated
    add_step(run, 3, [3], [1.0], loss=0.5)
    snap = snapshot_from_run(
        run,
        name="p",
        cursor=snap["cursor"],
        baseline=base,
        baseline_name="u",
        baseline_cursor=snap["baseline"]["cursor"],
    )
    comp.update(snap)
    assert list(comp.source.data["loss"]) == [2.0, 1.5, 1.0, 0.5]
    assert len(comp.baseline.data["time"]) == 3
    assert comp.loss_figure.title.text == "Training loss: projection run vs baseline u"
    # a uniform run's baseline is another uniform run, whose name says "uniform" already
    comp.update(snapshot_from_run(base, name="uniform-2", baseline=make_run("uniform"),
                                  baseline_name="uniform-1"))
    assert comp.loss_figure.title.text == "Training loss: uniform run vs baseline uniform-1"
    assert comp.accuracy_figure.title.text == "Accuracy: uniform run vs baseline uniform-1"
    comp.update(snapshot_from_run(make_run(), name="other"))  # another run: start afresh
    assert len(comp.source.data["loss"]) == 0 and len(comp.baseline.data["loss"]) == 0


def test_speedup_component_accumulates_evaluations():
    run, base = make_run("projection"), make_run("uniform")
    comp = Speedup()
    comp.update(snapshot_from_run(run, name="p"))
    # "other": the same words are said of a uniform run, which is not its own baseline
    assert comp.root.title.text == "Speedup: no other uniform run on this scheduler to compare with"
    add_step(run, 0, [0], [1.0], accuracy=0.5, time_=1.0)
    add_step(base, 0, [0], [1.0], accuracy=0.5, time_=2.0)
    snap = snapshot_from_run(run, name="p", baseline=base, baseline_name="u")
    comp.update(snap)
    assert comp.source.data["speedup"][-1] == 2.0 and comp.source.data["level"][-1] == 0.5
    add_step(run, 1, [1], [1.0], accuracy=0.7, time_=2.0)
    add_step(base, 1, [1], [1.0], accuracy=0.7, time_=5.0)
    comp.update(
        snapshot_from_run(
            run,
            name="p",
            cursor=snap["cursor"],
            baseline=base,
            baseline_name="u",
            baseline_cursor=snap["baseline"]["cursor"],
        )
    )
    assert comp.source.data["level"][-1] == 0.7 and comp.source.data["speedup"][-1] == 2.5
    assert "2.50x to accuracy 0.70" in comp.root.title.text


def test_workers_component_shows_throughput_per_slot_and_time_split():
    run = make_run()
    comp = Workers(window=2)
    for step in range(3):
        add_step(run, step, [step], [1.0], workers=(3, 1))
    comp.update(snapshot_from_run(run, name="r"))
    assert list(comp.source.data["slot"]) == [0, 1]
    assert list(comp.source.data["samples_per_second"]) == [3.0, 1.0]  # 1 s per step
    assert list(comp.times.data["step"]) == [1.0, 2.0]
    assert list(comp.times.data["compute_time"]) == [0.5, 0.5]
    assert list(comp.times.data["communication_time"]) == [0.3, 0.3]
    # worker 1 leaves: its partitions move to the one left, now the only slot; the page
    # drops its bar at once, before the next step, not once its steps leave the window
    dash = DaskpriDashboard()
    assert refresh_from_runs(dash, {"r": run})
    assert list(dash.workers.source.data["slot"]) == [0, 1]
    run.set_owner(np.zeros(3, dtype=np.int64))
    assert refresh_from_runs(dash, {"r": run})
    assert list(dash.workers.source.data["slot"]) == [0]
    add_step(run, 3, [3], [1.0], workers=(2,))
    refresh_from_runs(dash, {"r": run})
    assert list(dash.workers.source.data["samples_per_second"]) == [2.0]  # the one left's
    later = Workers()  # a page opened since: the gone worker's steps are not its
    later.update(snapshot_from_run(run, name="r"))
    assert list(later.source.data["slot"]) == [0]


def test_run_status_lists_the_run():
    run, base = make_run("projection"), make_run("uniform")
    add_step(run, 0, [0, 1], [1.0, 2.0], time_=75.5)
    comp = RunStatus()
    comp.update(snapshot_from_run(run, name="p", baseline=base, baseline_name="u"))
    status = dict(zip(comp.source.data["field"], comp.source.data["value"], strict=True))
    assert status["run"] == "p" and status["strategy"] == "projection"
    assert status["step"] == "1" and status["training time"] == "1 min 15.5 s"
    assert status["samples computed"] == "16.7% of 12" and status["baseline"] == "u"
    assert status["staleness (mean steps)"] == "1.0"
    assert status["epoch (samples processed / dataset)"] == "0.33"  # 4 samples of 12
    assert "<td style=" in comp.root.text and ">projection<" in comp.root.text
    assert status["best accuracy"] == "-"  # none evaluated yet
    # the best accuracy and its step, over the snapshots (each of the steps since the last)
    add_step(run, 1, [2], [1.0], accuracy=0.5)
    add_step(run, 2, [3], [1.0], accuracy=0.625)
    snap = snapshot_from_run(run, name="p")
    comp.update(snap)
    add_step(run, 3, [4], [1.0], accuracy=0.6)
    comp.update(snapshot_from_run(run, name="p", cursor=snap["cursor"]))
    status = dict(zip(comp.source.data["field"], comp.source.data["value"], strict=True))
    assert status["best accuracy"] == "0.6250 at step 2"
    comp.update(snapshot_from_run(make_run("uniform"), name="other"))  # another run: its own
    status = dict(zip(comp.source.data["field"], comp.source.data["value"], strict=True))
    assert status["best accuracy"] == "-"


def test_dashboard_follows_the_newest_run_until_one_is_picked():
    runs = {"u": make_run("uniform"), "p": make_run("projection")}
    for r in runs.values():
        add_step(r, 0, [0], [1.0], accuracy=0.5)
    dash = DaskpriDashboard()
    assert refresh_from_runs(dash, runs) and dash.run == "p" and dash.baseline == "u"
    assert not refresh_from_runs(dash, runs)  # nothing moved
    assert list(dash.select.options) == ["u", "p"] and dash.select.value == "p"
    assert len(dash.curves.baseline.data["loss"]) == 1
    runs["p2"] = make_run("loss")
    refresh_from_runs(dash, runs)
    assert dash.run == "p2"
    dash.select.value = "p"  # the user picks an older run: stay on it
    runs["p3"] = make_run("loss")
    assert refresh_from_runs(dash, runs) and dash.run == "p"
    del runs["p"]  # closed: still shown, still listed
    refresh_from_runs(dash, runs)
    assert dash.run == "p" and list(dash.select.options) == ["u", "p2", "p3", "p"]
    assert dash.status.source.data["value"][0] == "p"


def test_figures_have_ranges_before_their_data_comes():
    """BokehJS cannot fit a data range to nothing, and warns at each draw (the browser
    test reads its console): such figures get fixed ranges until their data comes."""
    from bokeh.document import Document
    from bokeh.models import DataRange1d, Plot, Range1d

    def ranges(dash):
        return {p.title.text.split(":")[0].split(" (")[0]: (type(p.x_range), type(p.y_range))
                for p in dash.root.select({"type": Plot})}

    def unfit(plots) -> list[str]:  # figures with a data range and nothing to fit it to
        def rows(p):
            return sum(len(next(iter(r.data_source.data.values()), ())) for r in p.renderers)

        return [f"{p.title.text} {dim}" for p in plots for dim in ("x_range", "y_range")
                if isinstance(getattr(p, dim), DataRange1d)
                and not sum(rows(q) for q in plots if getattr(q, dim) is getattr(p, dim))]

    dash = DaskpriDashboard()
    assert set(ranges(dash).values()) == {(Range1d, Range1d)}, ranges(dash)
    # The server sends each change on its own, and the browser may draw between two:
    # at none may a figure have a data range without data.
    doc, seen = Document(), []
    doc.add_root(dash.root)
    plots = list(dash.root.select({"type": Plot}))
    doc.on_change(lambda event: seen.extend(unfit(plots)))
    runs = {"p": make_run("projection")}
    add_step(runs["p"], 0, [0], [1.0])
    refresh_from_runs(dash, runs)
    drawn = ranges(dash)
    assert drawn.pop("Speedup") == (Range1d, Range1d)  # no baseline: nothing to draw
    assert drawn.pop("Accuracy") == (DataRange1d, Range1d)  # time shared with the loss's
    assert set(drawn.values()) == {(DataRange1d, DataRange1d)}, drawn
    assert dash.histogram.root.y_range.start == 0
    runs["q"] = make_run("loss")  # the newest run, not a step yet: cleared, fixed again
    refresh_from_runs(dash, runs)
    assert set(ranges(dash).values()) == {(Range1d, Range1d)}, ranges(dash)
    assert not seen, seen


def test_drawing_leaves_bokehs_validation_on():
    """Bokeh's switch for it is one for the process: a page drawing in one thread while
    another draws (the scheduler's page, a standalone one) could leave it off for good."""
    from bokeh.core.property.bases import validation_on

    dash = DaskpriDashboard()
    seen = []
    for comp in dash.components:
        comp.source.on_change("data", lambda attr, old, new: seen.append(validation_on()))
    runs = {"p": make_run("projection")}
    add_step(runs["p"], 0, [0], [1.0])
    refresh_from_runs(dash, runs)
    assert len(seen) >= 5 and all(seen), seen


def plugin_with(**runs: TableRun) -> TablePlugin:
    plugin = TablePlugin()
    plugin.runs.update(runs)
    return plugin


def test_a_closed_run_stays_on_the_scheduler_read_only():
    run = make_run("uniform")
    add_step(run, 0, [0, 1], [1.0, 2.0], accuracy=0.5)
    plugin = plugin_with(u=run)
    plugin._close("u")
    assert plugin._runs() == ["u"] and run.closed
    assert plugin._metrics("u")[0]["step"] == 0  # the dashboard can still read it
    assert bool(plugin._summary("u")["closed"]) is True
    for write in (
        lambda: plugin._step("u", 1),
        lambda: plugin._update("u", []),
        lambda: plugin._unselect("u"),
        lambda: plugin._set_owner("u", {}),
        lambda: plugin._load("u", {}),
    ):
        with pytest.raises(KeyError, match="run 'u' is closed.*keep-closed"):
            write()
    plugin._close("u")  # closing twice, or a run never made, changes nothing
    plugin._close("nope")
    assert plugin._runs() == ["u"]


def test_only_the_newest_closed_runs_are_kept():
    plugin = plugin_with(**{name: make_run() for name in ("a", "b", "live", "c", "d")})
    with dask.config.set({"daskpri.table.keep-closed": 2}):
        for name in ("a", "b", "c", "d"):
            plugin._close(name)
    assert plugin._runs() == ["live", "c", "d"]  # the live run stays, whatever its age
    with dask.config.set({"daskpri.table.keep-closed": 0}):
        plugin._close("live")
    assert plugin._runs() == []


@pytest.mark.parametrize("value", [-1, 1.5, True, "4"])
def test_keep_closed_is_checked(value):
    plugin = plugin_with(a=make_run())
    with (
        dask.config.set({"daskpri.table.keep-closed": value}),
        pytest.raises(ValueError, match=rf"keep-closed should be a non-negative integer.*"
                                        rf"{re.escape(repr(value))}"),
    ):
        plugin._close("a")


def test_a_bad_keep_closed_fails_the_plugins_registration():
    async def main():
        async with Scheduler(
            dashboard=False, dashboard_address="127.0.0.1:0", host="127.0.0.1", port=0
        ) as s:
            with (
                dask.config.set({"daskpri.table.keep-closed": -1}),
                pytest.raises(ValueError, match="keep-closed should be a non-negative integer"),
            ):
                await s.register_scheduler_plugin(TablePlugin(), idempotent=False)
            assert "daskpri_close" not in s.handlers

    asyncio.run(main())


def test_a_run_made_again_becomes_the_newest():
    plugin = plugin_with(a=make_run(), b=make_run())
    plugin._close("a")
    plugin._create(
        "a", pack(np.array([4, 4])), pack(np.array([0, 1])), pickle.dumps(get_strategy("uniform")),
        seed=0, batch_size=2, staleness="keep", n_bins=8, info={"strategy": "uniform"},
    )
    assert plugin._runs() == ["b", "a"] and not plugin.runs["a"].closed


def test_the_start_histogram_is_the_runs_first_priorities_kept_by_the_scheduler():
    plugin = TablePlugin()

    def create() -> None:  # as the trainer makes a run, and makes it again on new data
        plugin._create(
            "u", pack(np.array([4, 4])), pack(np.array([0, 1])),
            pickle.dumps(get_strategy("uniform")), seed=0, batch_size=2, staleness="keep",
            n_bins=8, info={"strategy": "uniform"},
        )

    def update(step: int, priorities: list[float]) -> None:
        plugin._update("u", [{"indices": pack(np.arange(len(priorities))),
                              "priorities": pack(np.array(priorities)), "step": step}])

    create()
    update(0, [1.0, 2.0])
    update(1, [1.5, 2.5, 1.0])
    dash = DaskpriDashboard()  # a page opened at step 1 shows step 0's as the start
    refresh_from_runs(dash, plugin.runs)
    hist = dash.histogram.source.data
    assert "start: step 0)" in dash.histogram.root.title.text
    assert sum(hist["start"]) == pytest.approx(1.0) and sum(hist["current"]) == pytest.approx(1.0)
    create()  # the run made again: the open page takes the new table's start
    update(2, [9.0])
    refresh_from_runs(dash, plugin.runs)
    assert "start: step 2)" in dash.histogram.root.title.text


def test_the_status_says_whether_the_run_is_closed():
    run = make_run("uniform")
    add_step(run, 0, [0], [1.0])
    comp = RunStatus()
    comp.update(snapshot_from_run(run, name="u"))
    assert comp.source.data["value"][1] == "live"
    assert comp.source.data["value"][-1] == "none (no other uniform run)"  # it is one
    run.closed = True
    comp.update(snapshot_from_run(run, name="u"))
    assert comp.source.data["value"][1] == "closed (kept for the dashboard)"


def test_an_open_page_says_when_its_run_closes_and_when_it_is_dropped():
    run = make_run("uniform")
    add_step(run, 0, [0], [1.0], accuracy=0.5)
    plugin = plugin_with(u=run)
    dash = DaskpriDashboard()
    assert refresh_from_runs(dash, plugin.runs)
    state = lambda: dash.status.source.data["value"][1]  # noqa: E731
    assert state() == "live"
    plugin._close("u")  # the trainer closes it after its last step: nothing else moves
    assert refresh_from_runs(dash, plugin.runs) and state() == "closed (kept for the dashboard)"
    with dask.config.set({"daskpri.table.keep-closed": 0}):
        plugin._close("u")
    assert not refresh_from_runs(dash, plugin.runs)  # gone: its last plots stay
    assert state() == "closed, dropped from the scheduler (daskpri.table.keep-closed)"
    assert dash.status.source.data["value"][0] == "u" and len(dash.curves.source.data["loss"]) == 1
    assert "dropped from the scheduler" in dash.status.root.text


def test_install_skips_a_scheduler_without_dashboard(caplog):
    async def main():
        async with Scheduler(
            dashboard=False, dashboard_address="127.0.0.1:0", host="127.0.0.1", port=0
        ) as s:
            with caplog.at_level(logging.DEBUG, logger="daskpri"):
                await s.register_scheduler_plugin(TablePlugin(), idempotent=False)
            assert "daskpri_summary" in s.handlers
            assert install(s) is False
            assert not any(isinstance(a, BokehTornado) for a in s.http_application.applications)

    asyncio.run(main())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "dashboard is off" in caplog.text
