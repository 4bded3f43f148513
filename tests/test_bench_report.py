"""``daskpri bench``'s records and report, from hand-made records.

A record's JSON round trip, the printed spreads, and what the Markdown
report says (edges of the sweep, intervals, where the time goes).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from _bench_records import (
    LOSS,
    MACHINE,
    SIZES,
    UNIFORM,
    _config,
    _pairs,
    _record,
    _simulate,
    _slow_and_high_fast_and_lower,
)

from daskpri.bench import BenchConfig
from daskpri.bench.analysis import (
    Spread,
    summarize,
)
from daskpri.bench.figures import speedup_bars
from daskpri.bench.records import Arm, Curve, RunRecord
from daskpri.bench.report import fmt_spread, render_markdown, write_report


def _with_filler(records: list[RunRecord], rates: Sequence[float]) -> list[RunRecord]:
    """``records`` and, at each of ``rates``, runs of both arms that stay at 0.1."""
    return records + [_record(accuracy=[0.1], lr=lr, seed=seed, arm=arm)
                      for lr in rates for seed in range(3) for arm in (UNIFORM, LOSS)]


def test_report_says_when_a_pick_is_at_the_edge_of_the_sweep(tmp_path: Path):
    cfg = _config(seeds=3, workers=(2,), learning_rates=(0.05, 0.1), target_fractions=(0.97,))
    records = _slow_and_high_fast_and_lower()
    summary = summarize(cfg, records, SIZES)
    sweep = {(r["arm"], r["learning_rate"]): r for r in summary["lr_sweep"]}
    assert sweep[("uniform", 0.1)]["picked"] and sweep[("uniform", 0.1)]["edge"] == "largest"
    assert sweep[("loss", 0.05)]["edge"] == "smallest"
    assert sweep[("uniform", 0.05)]["edge"] is None  # not picked
    assert sweep[("uniform", 0.05)]["seconds"].median == 30.0  # to 97% of 0.90: 0.873
    md = render_markdown(cfg, MACHINE, summary, [])
    assert ("**uniform's learning rate 0.1 is the largest swept: its best may lie outside "
            "the sweep; widen --learning-rates.**") in md
    assert "soonest" in md and "at the learning rate swept where it is highest" in md
    # a pick inside the grid is not flagged
    wide = _config(seeds=3, workers=(2,), learning_rates=(0.025, 0.05, 0.1, 0.2),
                   target_fractions=(0.97,))
    assert "is the largest swept" not in render_markdown(
        wide, MACHINE, summarize(wide, _with_filler(records, (0.025, 0.2)), SIZES), [])


def test_report_says_when_the_baselines_pick_sits_between_rates_far_apart():
    records = _slow_and_high_fast_and_lower()  # uniform picks 0.1, loss 0.05 (97% target)
    coarse = _config(seeds=3, workers=(2,), learning_rates=(0.025, 0.05, 0.1, 0.2),
                     target_fractions=(0.97,))
    summary = summarize(coarse, _with_filler(records, (0.025, 0.2)), SIZES)
    sweep = {(r["arm"], r["learning_rate"]): r for r in summary["lr_sweep"]}
    assert sweep[("uniform", 0.1)]["picked"] and sweep[("uniform", 0.1)]["edge"] is None
    assert sweep[("uniform", 0.1)]["coarse"] == (0.05, 0.2)
    # only the baseline is flagged: the speedups are against it
    assert sweep[("loss", 0.05)]["picked"] and sweep[("loss", 0.05)]["coarse"] == ()
    md = render_markdown(coarse, MACHINE, summary, [])
    assert ("**uniform's learning rate 0.1 has 0.05 and 0.2 next to it in the sweep, more "
            "than 1.5x away: the baseline's best may lie between") in md
    assert "loss's learning rate 0.05 has" not in md
    # rates 1.25x apart around the pick: not flagged
    fine = _config(seeds=3, workers=(2,), learning_rates=(0.05, 0.08, 0.1, 0.125),
                   target_fractions=(0.97,))
    summary = summarize(fine, _with_filler(records, (0.08, 0.125)), SIZES)
    assert next(r for r in summary["lr_sweep"] if r["picked"] and r["arm"] == "uniform")[
        "coarse"] == ()
    assert "next to it in the sweep" not in render_markdown(fine, MACHINE, summary, [])


def test_the_report_gives_each_speedup_its_bootstrap_interval():
    cfg = _config(seeds=4, workers=(2,), strategies=("uniform", "loss"), budget=100.0)
    ours, theirs = _pairs([(20.0, 10.0), (22.0, 10.0), (18.0, 10.0), (20.0, 11.0)])
    summary = summarize(cfg, ours + theirs, SIZES)
    row = {(r["arm"], r["fraction"]): r for r in summary["time_to_target"]}[("loss", 0.99)]
    ci = row["vs_uniform_interval"]
    assert ci.low <= row["vs_uniform"].value <= ci.high
    md = render_markdown(cfg, MACHINE, summary, [])
    assert "| speedup vs uniform | 95% interval | paired by seed |" in md
    assert f"| {ci.low:.2f}x–{ci.high:.2f}x |" in md
    assert "bootstrap over seeds" in md
    # two seeds: no interval
    summary = summarize(_config(seeds=2, workers=(2,)), ours[:2] + theirs[:2], SIZES)
    loss_rows = [r for r in summary["time_to_target"] if r["arm"] == "loss"]
    assert {r["vs_uniform_interval"] for r in loss_rows} == {None}


def test_the_report_says_when_uniform_was_still_climbing_at_the_end_of_its_budget():
    cfg = _config(seeds=3, workers=(2,), strategies=("uniform", "loss"))  # 10 s budgets
    times = [2.0, 4.0, 6.0, 8.0, 10.0]
    climbing = [0.5, 0.6, 0.7, 0.8, 0.9]  # best at 10 s: after 3/4 of the budget
    levelled = [0.5, 0.9, 0.85, 0.88, 0.87]  # best at 4 s
    def runs(curves: Sequence[Sequence[float]]) -> list[RunRecord]:
        return [_record(arm, list(c), times=times, seed=seed)
                for seed, c in enumerate(curves) for arm in (UNIFORM, LOSS)]

    summary = summarize(cfg, runs([climbing, climbing, levelled]), SIZES)
    assert {t["uniform_late"] for t in summary["targets"]} == {(2, 3)}
    md = render_markdown(cfg, MACHINE, summary, [])
    assert ("**uniform's best accuracy came in the last 25% of the budget in 2 of its 3 runs: "
            "it was still climbing") in md
    # once in three runs is what a run that levelled off gives by chance: no warning
    summary = summarize(cfg, runs([climbing, levelled, levelled]), SIZES)
    assert "still climbing" not in render_markdown(cfg, MACHINE, summary, [])
    # runs that failed (a learning rate that diverged) neither climbed nor levelled off
    diverged = [_record(accuracy=[math.nan], lr=0.1, seed=seed) for seed in range(3)]
    for r in diverged:
        r.info["error"] = "diverged: the training loss became nan at step 3"
    summary = summarize(_config(seeds=3, workers=(2,), learning_rates=(0.05, 0.1)),
                        runs([climbing, climbing, levelled]) + diverged, SIZES)
    assert {t["uniform_late"] for t in summary["targets"]} == {(2, 3)}


def test_the_report_says_where_each_arms_training_time_goes():
    cfg = _config(seeds=2, workers=(2,), strategies=("uniform", "loss"))
    records = []
    for seed, selection in enumerate([0.5, 1.5]):  # of 10 s of step time
        for arm, parts, ahead in (
            (UNIFORM, {"compute": 8.0, "selection": 0.0, "optimizer": 1.0,
                       "communication": 1.0}, 0.9),
            (LOSS, {"compute": 8.0 - selection, "selection": selection, "optimizer": 1.0,
                    "communication": 1.0}, 0.0),
        ):
            r = _record(arm, seed=seed)
            r.info.update(time_parts=parts, selected_ahead=ahead)
            records.append(r)
    summary = summarize(cfg, records, SIZES)
    loss = next(r for r in summary["budgets"] if r["arm"] == "loss")
    assert loss["time_shares"]["selection"] == Spread(0.1, 0.05, 0.15, 2, 2)
    assert loss["selected_ahead"].median == 0.0
    md = render_markdown(cfg, MACHINE, summary, [])
    assert "### Where the training time goes" in md
    assert "| arm | compute | communication | selection | optimizer | rounds selected ahead |" in md
    assert ("| uniform | 80.0% [80.0–80.0%] | 10.0% [10.0–10.0%] | 0.0% [0.0–0.0%] "
            "| 10.0% [10.0–10.0%] | 90.0% [90.0–90.0%] |") in md
    assert ("| loss | 70.0% [65.0–75.0%] | 10.0% [10.0–10.0%] | 10.0% [5.0–15.0%] "
            "| 10.0% [10.0–10.0%] | 0.0% [0.0–0.0%] |") in md
    # results written before the time parts were kept: no table, nothing made up
    for r in records:
        r.info.clear()
    md = render_markdown(cfg, MACHINE, summarize(cfg, records, SIZES), [])
    assert "Where the training time goes" not in md
    # a run without a round writes NaN, which results.json reads back as null
    for r in records:
        r.info.update(time_parts={}, selected_ahead=None)
    back = [RunRecord.from_dict(json.loads(json.dumps(r.to_dict()))) for r in records]
    loss = next(r for r in summarize(cfg, back, SIZES)["budgets"] if r["arm"] == "loss")
    assert loss["selected_ahead"].n == 0 and loss["time_shares"]["selection"].n == 0


def test_a_record_round_trips_through_json():
    rec = _record(Arm("projection", "projection", 64, 144, (("k", 32),)), [np.nan, 0.5])
    back = RunRecord.from_dict(json.loads(json.dumps(rec.to_dict(), allow_nan=False)))
    assert back.spec == rec.spec
    np.testing.assert_array_equal(back.curve.accuracy, rec.curve.accuracy)


def test_spreads_print_median_range_and_misses():
    assert fmt_spread(Spread(12.0, 10.0, math.inf, 3, 2)) == "12.0 [10.0–n.r.] (2/3 reached)"
    assert fmt_spread(Spread(math.inf, math.inf, math.inf, 1, 0)) == "n.r."
    # no seed reached it: said so, not as a range of misses
    assert fmt_spread(Spread(math.inf, math.inf, math.inf, 3, 0)) == "n.r. (0/3 reached)"
    from daskpri.bench.report import _paired

    assert _paired(Spread(0.0, 0.0, 0.0, 3, 3)) == "n.r. (0/3 reached)"


def test_report_is_written_from_records_alone(tmp_path: Path):
    cfg = _config(seeds=3, workers=(1, 2), learning_rates=(0.05, 0.1), ddp=True)
    records = _simulate(cfg)
    summary = write_report(tmp_path, cfg, MACHINE, SIZES, records)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert len(doc["runs"]) == len(records)
    assert doc["summary"]["time_to_target"]
    md = (tmp_path / "results.md").read_text()
    assert md == render_markdown(cfg, MACHINE, summary, ["accuracy_mnist1d_mlp.png",
                                                         "speedup.png", "scaling.png"])
    assert "## Scaling" in md and "Learning-rate sweep" in md and "PyTorch DDP" in md
    # three seeds: each speedup has its interval, in the tables, the JSON and the plots
    bars = [b for rows in speedup_bars(summary).values() for b in rows]
    assert bars and all(b["low"] <= b["high"] for b in bars)
    stored = [r["vs_uniform_interval"] for r in doc["summary"]["time_to_target"]]
    assert all(set(i) == {"low", "high", "confidence", "n"} for i in stored)
    assert '"name":"Whisker"' in (tmp_path / "results.html").read_text()


def test_the_report_says_when_every_run_clips_its_gradients(tmp_path: Path):
    cfg = _config(seeds=1, max_grad_norm=1.0)
    write_report(tmp_path, cfg, MACHINE, SIZES, _simulate(cfg))
    md = (tmp_path / "results.md").read_text()
    assert "SGD with momentum 0.9, gradients clipped to L2 norm 1 (in every run and baseline)" in md
    stored = json.loads((tmp_path / "results.json").read_text())["config"]
    assert BenchConfig.from_dict(stored) == cfg
    write_report(tmp_path, _config(seeds=1), MACHINE, SIZES, _simulate(_config(seeds=1)))
    assert "clipped" not in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize(("option", "said", "absent", "differ"), [
    # label smoothing, and a results.json from before the option: made without smoothing
    ({"label_smoothing": 0.1}, "label smoothing 0.1 in every run's and baseline's training loss",
     "label smoothing", r"other options \(label_smoothing: 0\.0 there, 0\.1 here\)"),
    # bfloat16, and a results.json from before the option: float32
    ({"precision": "bfloat16"},
     "the training passes in bfloat16 (torch.autocast, in every run and baseline)",
     "bfloat16", r"other options \(precision: 'float32' there, 'bfloat16' here\)"),
])
def test_the_report_says_an_option_of_every_run_and_older_results_resume(
    tmp_path: Path, option, said, absent, differ,
):
    from daskpri.bench.stored import previous_runs

    cfg = _config(seeds=1, **option)
    write_report(tmp_path, cfg, MACHINE, SIZES, _simulate(cfg))
    assert said in (tmp_path / "results.md").read_text()
    path = tmp_path / "results.json"
    assert BenchConfig.from_dict(json.loads(path.read_text())["config"]) == cfg
    plain = _config(seeds=1)
    write_report(tmp_path, plain, MACHINE, SIZES, _simulate(plain))
    assert absent not in (tmp_path / "results.md").read_text()
    doc = json.loads(path.read_text())
    (key,) = option
    del doc["config"][key]
    path.write_text(json.dumps(doc))
    assert len(previous_runs(path, plain, SIZES)) == len(doc["runs"])
    with pytest.raises(ValueError, match=differ):
        previous_runs(path, cfg, SIZES)


def test_the_plain_loop_trains_its_forward_pass_in_the_precision_asked():
    from daskpri.bench.baselines import train_plain
    from daskpri.models import build_model

    x = np.random.default_rng(0).normal(size=(512, 16)).astype(np.float32)
    y = np.arange(512) % 4
    first = {}
    for precision in ("float32", "bfloat16"):
        model = build_model("mlp", {"x_shape": (16,), "n_classes": 4}, seed=0)
        r = train_plain(model, (x, y), (x, y), batch_size=64, learning_rate=0.05, momentum=0.9,
                        budget=0.05, eval_seconds=1.0, seed=0, precision=precision)
        first[precision] = float(r.curve.loss[0])  # the same model, batch and step
    assert first["bfloat16"] != first["float32"]
    assert first["bfloat16"] == pytest.approx(first["float32"], rel=0.02)


def test_a_partial_report_leaves_the_arms_and_baselines_not_yet_run_blank():
    # --report-only of a benchmark stopped after its first run: loss and the
    # baselines have no runs, hence no learning rate, gradients or budget to print
    cfg = _config(seeds=2, workers=(1, 2), learning_rates=(0.05, 0.1), ddp=True)
    summary = summarize(cfg, [_record(accuracy=[0.5, 0.7, 0.9])], SIZES)
    md = render_markdown(cfg, {**MACHINE, "partial": {"done": 1, "planned": 30}}, summary, [])
    assert "| loss | — | 97% (0.8730) | — |" in md
    assert "| mnist1d/mlp | plain PyTorch loop, 1 process | — | — |" in md
    assert "nan" not in md.lower()
    # every uniform run failed: no target either
    failed = _record(accuracy=[math.nan])
    md = render_markdown(cfg, MACHINE, summarize(cfg, [failed], SIZES), [])
    assert "97% (—)" in md and "nan" not in md.lower()


def test_the_budgets_table_counts_the_steps_and_gradients_of_the_runs_that_trained():
    cfg = _config(seeds=3, workers=(2,))
    records = [_record(arm, seed=seed) for seed in range(3) for arm in (UNIFORM, LOSS)]
    for r in records[2:]:  # seeds 1 and 2 diverged: no curve, no steps
        r.curve, r.samples, r.grad_samples = Curve([], [], [], []), 0, 0
        r.info["error"] = "diverged: the training loss became nan at step 3"
    rows = summarize(cfg, records, SIZES)["budgets"]
    assert [(r["arm"], r["steps"].median, r["steps"].n, r["grads_per_step"]) for r in rows] == [
        ("uniform", 30.0, 1, 64.0), ("loss", 30.0, 1, 64.0)]
