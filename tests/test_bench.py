"""``daskpri bench``: the protocol's decisions on hand-made records.

The decisions (which runs, learning-rate pick, targets, times to target,
speedups, efficiencies, tables) are pure functions of records, tested without
a cluster. No test asserts that any strategy is faster than another. The
report is in test_bench_report.py, the validation in test_bench_config.py,
the baselines and real runs in test_bench_runs.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from _bench_records import (
    LOSS,
    MACHINE,
    SIZES,
    _config,
    _pairs,
    _record,
    _simulate,
    _slow_and_high_fast_and_lower,
)

from daskpri.bench import count_runs, next_runs, pick_learning_rates, targets
from daskpri.bench.analysis import (
    Ratio,
    Spread,
    accuracy_at,
    efficiency,
    speedup,
    speedup_interval,
    spread,
    steps_to_target,
    summarize,
    time_to_target,
)
from daskpri.bench.config import strategy_of
from daskpri.bench.figures import accuracy_lines
from daskpri.bench.protocol import (
    best_median_accuracy,
    count_done,
    gradients_per_step,
    make_arms,
)
from daskpri.bench.records import Arm, Curve
from daskpri.bench.report import fmt_ratio, render_markdown
from daskpri.cli import main

# -- one run -----------------------------------------------------------------------


def test_time_and_steps_to_target_take_the_first_evaluation_that_reached_it():
    c = Curve([1.0, 2.0, 3.0, 4.0], [10, 20, 30, 40], [0.5, np.nan, 0.8, 0.9], [1.0] * 4)
    assert time_to_target(c, 0.8) == 3.0
    assert steps_to_target(c, 0.8) == 30.0


def test_time_to_target_is_inf_when_the_target_is_missed():
    c = Curve([1.0, 2.0], [1, 2], [0.5, 0.6], [1.0, 1.0])
    assert math.isinf(time_to_target(c, 0.7))
    assert math.isinf(steps_to_target(c, 0.7))


def test_accuracy_at_a_budget_is_the_last_evaluation_up_to_the_step_that_crossed_it():
    c = Curve([1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4], [0.5, np.nan, 0.7, 0.8], [1.0] * 4)
    assert accuracy_at(c, 2.0) == 0.5  # the step at 2.0 s was not evaluated
    assert accuracy_at(c, 2.5) == 0.7  # a 2.5 s run stops after the step ending at 3.0 s
    assert accuracy_at(c, 100.0) == 0.8


# -- over seeds ---------------------------------------------------------------------


def test_spread_keeps_missed_targets_as_inf_and_drops_nan():
    assert spread([2.0, math.inf, 1.0, math.nan]) == Spread(2.0, 1.0, math.inf, 3, 2)
    assert math.isinf(spread([1.0, math.inf, math.inf]).median)


@pytest.mark.parametrize(
    ("baseline", "arm", "expected"),
    [
        (30.0, 20.0, Ratio(1.5, "exact")),
        (20.0, 40.0, Ratio(0.5, "exact")),
        (math.inf, 20.0, Ratio(3.0, "at least")),  # budget 60 / 20
    ],
)
def test_speedup_is_the_baselines_time_over_the_arms(baseline, arm, expected):
    assert speedup(baseline, arm, 60.0) == expected


def test_speedup_is_not_claimed_when_the_arm_missed_the_target():
    assert speedup(30.0, math.inf, 60.0).kind == "not reached"
    assert speedup(math.inf, math.inf, 60.0).kind == "n/a"
    assert fmt_ratio(speedup(30.0, math.inf, 60.0)) == "n.r."


def test_efficiency_is_t1_over_n_tn():
    assert efficiency(40.0, 20.0, 1, 2) == 1.0
    assert efficiency(40.0, 25.0, 1, 2) == pytest.approx(0.8)
    assert math.isnan(efficiency(40.0, math.inf, 1, 2))


# -- decisions ----------------------------------------------------------------------


def test_targets_are_fractions_of_tuned_uniforms_median_best_accuracy():
    records = [
        _record(accuracy=[0.5, 0.80, 0.70], seed=0),
        _record(accuracy=[0.6, 0.90], seed=1),
        _record(accuracy=[0.85, 0.6], seed=2),
        _record(accuracy=[0.99], lr=0.1),  # an untuned learning rate: worse final, ignored
        _record(accuracy=[0.1], lr=0.1, seed=1),
        _record(accuracy=[0.1], lr=0.1, seed=2),
        _record(LOSS, accuracy=[0.99]),  # another arm: ignored
    ]
    picks = pick_learning_rates(records)
    assert picks[("mnist1d", "mlp", "uniform")] == 0.05
    got = targets(records, "mnist1d", "mlp", picks, [0.97, 0.99])
    assert got == pytest.approx({0.97: 0.97 * 0.85, 0.99: 0.99 * 0.85})


def test_count_done_leaves_out_kept_runs_at_a_learning_rate_no_longer_picked():
    cfg = _config(seeds=1, workers=(2,), learning_rates=(0.05, 0.1), strategies=("uniform",))
    specs = next_runs(cfg, SIZES, [])
    assert [s.learning_rate for s in specs] == [0.05, 0.1]
    sweep = [_record(spec=specs[0], accuracy=[0.9]), _record(spec=specs[1], accuracy=[0.5])]
    assert count_done(cfg, SIZES, sweep[:1]) == 1
    overhead = next_runs(cfg, SIZES, sweep)
    assert overhead and {s.learning_rate for s in overhead} == {0.05}  # uniform's pick
    made = [_record(spec=s) for s in overhead]
    # runs at 0.1, as a resumed file holds them from before the pick moved
    stale = [_record(spec=dataclasses.replace(s, learning_rate=0.1)) for s in overhead]
    records = sweep + stale + made
    assert count_done(cfg, SIZES, records) == count_runs(cfg, SIZES) == 2 + len(overhead)
    assert next_runs(cfg, SIZES, records) == []


def test_learning_rate_pick_is_the_best_median_final_accuracy_over_seeds():
    records = [
        _record(accuracy=[0.9, 0.5], lr=0.025, seed=0),  # best single run, poor final
        _record(accuracy=[0.6], lr=0.025, seed=1),
        _record(accuracy=[0.7], lr=0.05, seed=0),
        _record(accuracy=[0.7], lr=0.05, seed=1),
        _record(accuracy=[0.9], lr=0.1, seed=0),
        _record(accuracy=[0.1], lr=0.1, seed=1),
    ]
    assert pick_learning_rates(records) == {("mnist1d", "mlp", "uniform"): 0.05}


def test_learning_rate_pick_breaks_ties_toward_the_smaller_rate_and_avoids_nan():
    records = [_record(accuracy=[0.7], lr=0.1), _record(accuracy=[0.7], lr=0.05),
               _record(accuracy=[np.nan], lr=0.025)]
    assert pick_learning_rates(records)[("mnist1d", "mlp", "uniform")] == 0.05


def test_a_rate_that_diverged_in_most_seeds_neither_sets_the_targets_nor_is_picked():
    records = [_record(accuracy=[0.8, 0.9], lr=0.05, seed=seed) for seed in range(3)]
    records += [_record(accuracy=[0.9, 0.99], lr=0.1, seed=0)]  # the seed that survived it
    for seed in (1, 2):
        failed = _record(accuracy=[np.nan], lr=0.1, seed=seed)
        failed.info["error"] = "diverged: the training loss became nan at step 3"
        records.append(failed)
    assert best_median_accuracy(records, "mnist1d", "mlp") == 0.9
    assert targets(records, "mnist1d", "mlp", {}, [0.99], by="time") == {0.99: 0.99 * 0.9}
    for by in ("final", "time"):
        assert pick_learning_rates(records, by=by)[("mnist1d", "mlp", "uniform")] == 0.05
    # every run failed: no target
    assert math.isnan(best_median_accuracy(records[-2:], "mnist1d", "mlp"))


def test_time_pick_takes_each_arms_rate_that_reaches_the_highest_target_soonest():
    records = _slow_and_high_fast_and_lower()
    # by final accuracy uniform keeps 0.05, which reaches 99% of 0.90 only at 30 s
    assert pick_learning_rates(records)[("mnist1d", "mlp", "uniform")] == 0.05
    # 99% of 0.90 (0.891): only 0.05 reaches it (at 30 s), so it is kept
    picks = pick_learning_rates(records, by="time", fraction=0.99)
    assert picks[("mnist1d", "mlp", "uniform")] == 0.05
    # 97% (0.873): 0.1 reaches it at 10 s, 0.05 at 30 s
    picks = pick_learning_rates(records, by="time", fraction=0.97)
    assert picks[("mnist1d", "mlp", "uniform")] == 0.1
    # loss reaches neither target at any rate: it keeps its best final accuracy
    assert picks[("mnist1d", "mlp", "loss")] == 0.05


def test_time_pick_targets_come_from_uniforms_best_rate_not_its_pick():
    records = _slow_and_high_fast_and_lower()
    picks = pick_learning_rates(records, by="time", fraction=0.97)
    got = targets(records, "mnist1d", "mlp", picks, [0.97], by="time")
    assert got == pytest.approx({0.97: 0.97 * 0.90})  # lr 0.05's best, though 0.1 is picked
    got = targets(records, "mnist1d", "mlp", picks, [0.97])  # by="final": the pick's best
    assert got == pytest.approx({0.97: 0.97 * 0.89})


def test_time_pick_breaks_ties_toward_the_better_final_accuracy():
    records = [_record(accuracy=[0.9, 0.8], lr=0.1), _record(accuracy=[0.9, 0.85], lr=0.2)]
    assert pick_learning_rates(records, by="time")[("mnist1d", "mlp", "uniform")] == 0.2
    with pytest.raises(ValueError, match="by should be one of 'time', 'final', but got 'fast'"):
        pick_learning_rates(records, by="fast")


def test_projection_gets_a_uniform_baseline_of_equal_gradient_budget():
    assert gradients_per_step("projection", 64, [8000, 8000]) == 64 + 80
    assert gradients_per_step("projection", 64, [8000], k=32, renew=0.0) == 32
    cfg = _config(strategies=("projection", "length", "selective-backprop"), workers=(1, 2))
    arms = make_arms(cfg, 16000)
    assert [a.label for a in arms] == [
        "uniform", "uniform@144", "projection", "length", "selective-backprop"
    ]
    assert arms[1] == Arm("uniform@144", "uniform", 144, 144)


def test_strategy_options_reach_their_arms_and_the_equal_gradient_baseline():
    cfg = _config(strategies=("projection", "loss"), workers=(1, 2),
                  strategy_options=(("projection", "k", 32), ("projection", "renew", 0.0)))
    arms = make_arms(cfg, 16000)
    assert [a.label for a in arms] == ["uniform", "uniform@32", "projection", "loss"]
    assert arms[2].options == (("k", 32), ("renew", 0.0)) and arms[3].options == ()
    with pytest.raises(ValueError, match="takes the options .*fraction.*but got --strategy-"
                       "option fractio"):
        _config(strategies=("selective-backprop",),
                strategy_options=(("selective-backprop", "fractio", 0.3),))
    with pytest.raises(ValueError, match=r"strategy_options entry \('projection', 'k', 3\) names "
                       r"strategy 'projection', which is not among the strategies compared"):
        _config(strategies=("loss",), strategy_options=(("projection", "k", 3),))
    with pytest.raises(ValueError, match="local_steps should be a positive integer"):
        _config(local_steps=0)


def test_strategy_options_that_would_be_lost_are_refused():
    # a strategy's batch_size would collide with every arm's (the config's batch_size)
    with pytest.raises(ValueError, match=r"strategy_options entry \('loss', 'batch_size', 32\) "
                       r"sets batch_size, .* give batch_size=32 instead"):
        _config(strategy_options=(("loss", "batch_size", 32),))
    # one option given twice for the same arms: one of them would be dropped
    with pytest.raises(ValueError, match=r"entry \('loss', 'epsilon', 0\.3\) gives option epsilon "
                       r"of loss a second time, after strategy_options entry \('loss', "
                       r"'epsilon', 0\.1\): give each option of an arm \(on a model\) once"):
        _config(strategy_options=(("loss", "epsilon", 0.1), ("loss", "epsilon", 0.3)))
    # once for every model and once for one: the one model's wins, as documented
    cfg = _config(strategy_options=(("loss", "epsilon", 0.1), ("loss", "epsilon", 0.3, "mlp")))
    assert cfg.options_of("loss", "mlp") == (("epsilon", 0.3),)


def test_strategy_options_given_for_one_model_reach_only_its_arms():
    cfg = _config(strategies=("projection",), models=("mlp", "cnn"), workers=(2,),
                  strategy_options=(("projection", "k", 32), ("projection", "renew", 0.0),
                                    ("projection", "k", 16, "cnn")))
    mlp, cnn = make_arms(cfg, 16000, "mlp"), make_arms(cfg, 16000, "cnn")
    assert [a.label for a in mlp] == ["uniform", "uniform@32", "projection"]
    assert [a.label for a in cnn] == ["uniform", "uniform@16", "projection"]
    assert mlp[2].options == (("k", 32), ("renew", 0.0))
    assert cnn[2].options == (("k", 16), ("renew", 0.0))
    runs = {(s.model, s.arm.label): s.arm.options
            for s in next_runs(cfg, {d: 16000 for d in cfg.datasets}, [])}
    assert runs[("cnn", "projection")] == (("k", 16), ("renew", 0.0))
    assert ("cnn", "uniform@32") not in runs and ("mlp", "uniform@16") not in runs
    with pytest.raises(ValueError, match="names model 'resnet' in its fourth place, which is "
                       r"not among the models compared \(mlp\)"):
        _config(strategies=("projection",), models=("mlp",),
                strategy_options=(("projection", "k", 3, "resnet"),))
    with pytest.raises(ValueError, match="k should be a positive integer"):
        _config(strategies=("projection",), models=("mlp", "cnn"),
                strategy_options=(("projection", "k", 0, "cnn"),))
    with pytest.raises(SystemExit):
        main(["bench", "--strategy-option", "projection@:k=3", "--out", "x"])


def test_a_second_arm_of_a_strategy_runs_it_with_its_own_options():
    cfg = _config(strategies=("selective-backprop", "selective-backprop+stale"), workers=(2,),
                  strategy_options=(("selective-backprop", "fraction", 0.25),
                                    ("selective-backprop+stale", "refresh", 4),
                                    ("selective-backprop+stale", "beta", 1.0, "mlp")))
    arms = make_arms(cfg, 16000, "mlp")
    assert [(a.label, a.strategy, a.options) for a in arms] == [
        ("uniform", "uniform", ()),
        ("selective-backprop", "selective-backprop", (("fraction", 0.25),)),
        ("selective-backprop+stale", "selective-backprop", (("refresh", 4), ("beta", 1.0))),
    ]
    labels = {s.arm.label for s in next_runs(cfg, {d: 16000 for d in cfg.datasets}, [])}
    assert labels == {"uniform", "selective-backprop", "selective-backprop+stale"}
    assert strategy_of("selective-backprop+stale") == "selective-backprop"
    # a bad option of the second arm names it
    with pytest.raises(ValueError, match=r"entry \('selective-backprop\+x', 'refresh', 0\): "
                       "refresh should be a positive integer"):
        _config(strategies=("selective-backprop+x",),
                strategy_options=(("selective-backprop+x", "refresh", 0),))
    for bad, match in [("loss+", "its label made of letters"), ("loss+a b", "label made of"),
                       ("nope+x", "should be among"), ("uniform+big", "takes no second arm")]:
        with pytest.raises(ValueError, match=match):
            _config(strategies=(bad,))
    # options go to the arm named, not to the other arms of its strategy
    with pytest.raises(ValueError, match="names strategy 'loss', which is not among the "
                       "strategies compared"):
        _config(strategies=("loss+a",), strategy_options=(("loss", "epsilon", 0.1),))


def test_sweep_interleaves_the_arms_for_each_seed_and_learning_rate():
    cfg = _config(seeds=2, learning_rates=(0.05, 0.1), strategies=("uniform", "projection"))
    specs = next_runs(cfg, SIZES, [])
    assert [(s.seed, s.learning_rate, s.arm.label) for s in specs[:6]] == [
        (0, 0.05, "uniform"), (0, 0.05, "uniform@144"), (0, 0.05, "projection"),
        (0, 0.1, "uniform"), (0, 0.1, "uniform@144"), (0, 0.1, "projection"),
    ]
    assert {(s.phase, s.n_workers, s.budget) for s in specs} == {("sweep", 2, cfg.budget)}


def test_first_seed_moves_every_phase_to_its_seeds_and_the_report_says_which():
    shifted = _config(seeds=2, first_seed=5, learning_rates=(0.05, 0.1), workers=(1, 2), ddp=True)
    records = _simulate(shifted)
    assert {r.spec.seed for r in records} == {5, 6}
    assert {r.spec.phase for r in records} == {"sweep", "scaling", "overhead"}
    assert len(records) == count_runs(shifted, SIZES) == count_runs(
        _config(seeds=2, learning_rates=(0.05, 0.1), workers=(1, 2), ddp=True), SIZES)
    md = render_markdown(shifted, MACHINE, summarize(shifted, records, SIZES), [])
    assert "Seeds: 5–6 (each seeds" in md
    # the plots draw the first seed's run of each arm solid and name it in the legend
    lines = accuracy_lines(shifted, records, "mnist1d", "mlp")
    assert sorted(line.arm for line in lines if line.first) == sorted({line.arm for line in lines})
    assert all(line.first == (line.seed == 5) for line in lines)
    with pytest.raises(ValueError, match="first_seed should be a non-negative integer, "
                                         "but got first_seed=-1"):
        _config(first_seed=-1)


def test_scaling_and_overhead_runs_use_the_picked_learning_rate():
    cfg = _config(seeds=2, learning_rates=(0.05, 0.1), workers=(1, 2), ddp=True)
    records = _simulate(cfg)
    assert len(records) == count_runs(cfg, SIZES)
    later = [r.spec for r in records if r.spec.phase != "sweep"]
    assert {s.learning_rate for s in later} == {0.1}
    assert sorted({(s.phase, s.kind, s.n_workers) for s in later}) == [
        ("overhead", "daskpri", 1), ("overhead", "daskpri", 2), ("overhead", "ddp", 2),
        ("overhead", "loops", 2), ("overhead", "torch", 1), ("scaling", "daskpri", 1),
        ("scaling", "daskpri", 2),
    ]
    assert next_runs(cfg, SIZES, records) == []


def test_scaling_runs_every_worker_count_side_by_side_reversing_the_order_each_seed():
    cfg = _config(seeds=3, workers=(1, 2, 4), strategies=("uniform", "projection"))
    specs = [r.spec for r in _simulate(cfg) if r.spec.phase == "scaling"]
    # the equal-gradient baseline uniform@144 is for the sweep's comparison only
    assert [(s.seed, s.n_workers, s.arm.label) for s in specs] == [
        (seed, n, arm)
        for seed, order in ((0, (1, 2, 4)), (1, (4, 2, 1)), (2, (1, 2, 4)))
        for n in order
        for arm in ("uniform", "projection")
    ]
    assert {s.budget for s in specs} == {cfg.budget}
    # one worker count: nothing to scale against
    assert not [r for r in _simulate(_config(workers=(2,))) if r.spec.phase == "scaling"]


def test_overhead_pairs_each_baseline_with_a_daskpri_run_of_its_seed_and_budget():
    cfg = _config(seeds=2, workers=(4,), ddp=True, baseline_budget=3.0)
    specs = [r.spec for r in _simulate(cfg) if r.spec.phase == "overhead"]
    assert [(s.seed, s.kind, s.n_workers) for s in specs] == [
        (0, "daskpri", 1), (0, "torch", 1), (0, "daskpri", 2), (0, "ddp", 2),
        (1, "torch", 1), (1, "daskpri", 1), (1, "ddp", 2), (1, "daskpri", 2),
    ]
    assert {s.budget for s in specs} == {3.0} and {s.arm.label for s in specs} == {"uniform"}
    # with several worker counts, as many plain loops at once after the plain loop alone
    cfg = _config(seeds=1, workers=(1, 2, 4), ddp=False)
    specs = [r.spec for r in _simulate(cfg) if r.spec.phase == "overhead"]
    assert [(s.kind, s.n_workers) for s in specs] == [
        ("daskpri", 1), ("torch", 1), ("loops", 2), ("loops", 4)]


def test_summary_compares_each_arm_with_uniform_and_with_uniform_of_equal_gradients():
    cfg = _config(seeds=1, workers=(2,), strategies=("uniform", "projection"), budget=20.0)
    proj = Arm("projection", "projection", 64, 144)
    u144 = Arm("uniform@144", "uniform", 144, 144)
    records = [
        _record(accuracy=[0.5, 0.9, 1.0], times=[10.0, 20.0, 30.0]),
        _record(u144, accuracy=[0.98, 1.0, 1.0], times=[10.0, 20.0, 30.0]),
        _record(proj, accuracy=[0.99, 1.0], times=[5.0, 10.0]),
    ]
    summary = summarize(cfg, records, SIZES)
    rows = {(r["arm"], r["fraction"]): r for r in summary["time_to_target"]}
    row = rows[("projection", 0.97)]  # target 0.97: uniform 30 s, uniform@144 10 s, projection 5 s
    assert row["seconds"].median == 5.0
    assert row["vs_uniform"] == Ratio(6.0, "exact")
    assert row["equal_gradients"] == "uniform@144"
    assert row["vs_equal_gradients"] == Ratio(2.0, "exact")
    assert row["vs_uniform_paired"].median == 6.0  # one seed: its own ratio
    budgets = {r["arm"]: r for r in summary["budgets"]}
    assert budgets["projection"]["grads_per_step"] == 144
    assert budgets["uniform"]["at"][0.5].median == 0.5  # at 10 s of 20


def test_paired_speedup_sets_each_seed_against_its_own_uniform_run():
    # the arm takes half uniform's time in each seed's pair but one: seed 0 runs fast,
    # seed 2 at a third of the speed, and in seed 1 the machine slowed between uniform's
    # run and the arm's. The ratio of the medians (20 s over 30 s) says 0.67x; the
    # seeds' own ratios (2.0, 0.67, 2.0) say 2.0x, the one disturbed seed at the bottom
    cfg = _config(seeds=3, workers=(2,), strategies=("uniform", "projection"), budget=100.0)
    proj = Arm("projection", "projection", 64, 144)
    records = []
    for seed, (t_u, t_p) in enumerate([(20.0, 10.0), (20.0, 30.0), (60.0, 30.0)]):
        records += [
            _record(accuracy=[0.5, 1.0], times=[t_u / 2, t_u], seed=seed),
            _record(proj, accuracy=[0.5, 1.0], times=[t_p / 2, t_p], seed=seed),
        ]
    summary = summarize(cfg, records, SIZES)
    row = {(r["arm"], r["fraction"]): r for r in summary["time_to_target"]}[("projection", 0.99)]
    assert row["vs_uniform"].value == pytest.approx(20.0 / 30.0)
    paired = row["vs_uniform_paired"]
    assert (paired.median, paired.high, paired.n) == (2.0, 2.0, 3)
    assert paired.low == pytest.approx(20.0 / 30.0)
    md = render_markdown(cfg, MACHINE, summary, [])
    assert "| paired by seed |" in md and "| 2.00x [0.67x–2.00x] |" in md


def test_speedup_interval_holds_the_ratio_of_medians_and_widens_with_the_seeds_spread():
    steady = [(20.0, 10.0 + 0.1 * i) for i in range(10)]  # every seed about 2x
    scattered = [(20.0, t) for t in (5.0, 8.0, 9.0, 10.0, 10.0, 10.0, 11.0, 12.0, 18.0, 25.0)]
    narrow = speedup_interval(*_pairs(steady), 0.99, 100.0)
    wide = speedup_interval(*_pairs(scattered), 0.99, 100.0)
    assert narrow is not None and wide is not None
    assert narrow.n == wide.n == 10 and narrow.confidence == 0.95
    assert narrow.low <= 20.0 / 10.45 <= narrow.high and narrow.high - narrow.low < 0.1
    assert wide.low <= 2.0 <= wide.high and wide.high - wide.low > 0.3
    # the draws are seeded: the same runs give the same interval
    assert speedup_interval(*_pairs(scattered), 0.99, 100.0) == wide
    assert speedup_interval(*_pairs(scattered), 0.99, 100.0, confidence=0.5).high < wide.high


def test_speedup_interval_counts_a_missed_target_as_no_speedup_and_needs_three_seeds():
    # the arm misses the target in 6 seeds of 10: its median misses it, and so do most draws
    times = [(20.0, 10.0)] * 4 + [(20.0, math.inf)] * 6
    ci = speedup_interval(*_pairs(times), 0.99, 100.0)
    assert ci is not None and ci.low == 0.0
    # seeds the baseline ran but the arm did not are left out of the pairs
    ours, theirs = _pairs([(20.0, 10.0)] * 4)
    assert speedup_interval(ours[:2], theirs, 0.99, 100.0) is None
    assert speedup_interval(ours[:3], theirs, 0.99, 100.0).n == 3  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"confidence should be between 0 and 1, but got "
                                         r"confidence=1\.5"):
        speedup_interval(ours, theirs, 0.99, 100.0, confidence=1.5)
    with pytest.raises(ValueError, match="resamples should be a positive integer, but got "
                                         "resamples=0"):
        speedup_interval(ours, theirs, 0.99, 100.0, resamples=0)


def test_scaling_rows_give_throughput_and_time_efficiency():
    cfg = _config(seeds=1, workers=(1, 2))
    records = [
        _record(accuracy=[0.5, 1.0], times=[10.0, 40.0], n_workers=1, phase="scaling",
                samples_per_step=64),
        _record(accuracy=[0.5, 1.0], times=[10.0, 25.0], phase="scaling",
                samples_per_step=128),
        # the sweep's runs on 2 workers do not enter the scaling table
        _record(accuracy=[0.5, 1.0], times=[10.0, 20.0], samples_per_step=512),
    ]
    summary = summarize(cfg, records, SIZES)
    two = next(r for r in summary["scaling"] if r["arm"] == "uniform" and r["n_workers"] == 2)
    assert two["time_efficiency"].median == pytest.approx(40.0 / (2 * 25.0))
    # samples/s: 64*20/40 = 32 on 1 worker, 128*20/25 = 102.4 on 2
    assert two["vs_n0"].median == pytest.approx(102.4 / 32)
    assert two["throughput_efficiency"] == pytest.approx(102.4 / (2 * 32))
    assert two["samples_per_second"].median == pytest.approx(102.4)


def test_scaling_time_efficiency_pairs_the_seeds_and_counts_a_miss_as_zero():
    # the sweep's best accuracy is 1.0: the first target is 0.97
    cfg = _config(seeds=4, workers=(1, 2), ddp=False)
    records = [_record(accuracy=[0.5, 1.0])]
    # seconds to target, (1 worker, 2 workers) by seed: the machine slows over the
    # seeds; seed 2's two workers miss the target, seed 3's one worker does
    for seed, (t1, t2) in enumerate([(10.0, 5.0), (20.0, 12.5), (40.0, None), (None, 50.0)]):
        for n, t in ((1, t1), (2, t2)):
            accuracy = [0.5, 1.0] if t is not None else [0.5, 0.6]
            records.append(_record(accuracy=accuracy, times=[1.0, t or 60.0], seed=seed,
                                   n_workers=n, phase="scaling"))
    summary = summarize(cfg, records, SIZES)
    two = next(r for r in summary["scaling"] if r["n_workers"] == 2)
    # per seed 10/(2*5) = 1.0, 20/(2*12.5) = 0.8, a miss 0.0; seed 3 left out
    eff = two["time_efficiency"]
    assert (eff.median, eff.low, eff.high, eff.n) == (pytest.approx(0.8), 0.0, 1.0, 3)


def test_scaling_and_overhead_ratios_pair_the_runs_of_each_seed():
    # the machine slows down over the seeds (1 worker: 1000, 500, 250 samples/s) while
    # 2 workers process 1.8x, 1.6x, 1.7x one: the ratio of the medians would say 1.6x
    cfg = _config(seeds=3, workers=(1, 2), ddp=False)
    records = [_record(accuracy=[0.5, 1.0])]  # the sweep: picks lr 0.05
    for seed, (sps, two, ours) in enumerate([(1000, 1.8, 0.95), (500, 1.6, 0.8),
                                             (250, 1.7, 0.9)]):
        for n, factor in ((1, 1.0), (2, two)):
            records.append(_record(accuracy=[0.5, 1.0], times=[1.0, 20.0], seed=seed,
                                   n_workers=n, phase="scaling",
                                   samples_per_step=round(sps * factor)))
        for kind, factor in (("daskpri", ours), ("torch", 1.0)):
            records.append(_record(accuracy=[0.5, 1.0], times=[1.0, 20.0], seed=seed,
                                   kind=kind, n_workers=1, phase="overhead",
                                   samples_per_step=round(sps * factor)))
        # two plain loops at once: 2.0x one alone, then 1.8x, 1.9x
        records.append(_record(accuracy=[0.5, 1.0], times=[1.0, 20.0], seed=seed,
                               kind="loops", n_workers=2, phase="overhead",
                               samples_per_step=round(sps * (2.0, 1.8, 1.9)[seed])))
    records.append(_record(accuracy=[0.5, 1.0], seed=3, n_workers=1, phase="scaling"))
    summary = summarize(cfg, records, SIZES)
    two = next(r for r in summary["scaling"] if r["n_workers"] == 2)
    assert (two["vs_n0"].median, two["vs_n0"].low, two["vs_n0"].high) == pytest.approx(
        (1.7, 1.6, 1.8))
    assert two["vs_n0"].n == 3  # seed 3 ran on 1 worker only: no pair
    assert two["throughput_efficiency"] == pytest.approx(0.85)
    loops = two["plain_loops_vs_n0"]
    assert (loops.median, loops.low, loops.high) == pytest.approx((1.9, 1.8, 2.0))
    assert two["of_plain_loops"] == pytest.approx(1.7 / 1.9)
    (plain,) = summary["overhead"]  # daskpri: 0.95x, 0.8x, 0.9x; the medians' ratio 0.8x
    ratio = plain["daskpri_over_baseline"]
    assert (ratio.median, ratio.low, ratio.high) == pytest.approx((0.9, 0.8, 0.95))
    md = render_markdown(cfg, MACHINE, summary, [])
    assert "| 1.70 [1.60–1.80] | 0.85 | 1.90 [1.80–2.00] | 0.89 |" in md
    assert "| 0.90 [0.80–0.95] |" in md
