"""Measures of a run and the benchmark's tables, as pure functions of records.

A target never reached counts as ``inf`` seconds (or steps), so the median
over seeds is ``inf`` when half or more of them missed it: a speedup is then
not claimed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from daskpri.bench.config import BenchConfig
from daskpri.bench.protocol import (
    coarse_neighbours,
    equal_gradient_label,
    grid_edges,
    make_arms,
    pick_learning_rates,
    targets,
)
from daskpri.bench.records import Curve, RunRecord, time_to_target
from daskpri.training.history import TIME_PARTS

#: the confidence of the speedups' bootstrap intervals in the report
CONFIDENCE = 0.95

#: the share of the budget after which uniform's best accuracy comes "late": where
#: it does in over half its runs, the report says it was still climbing
LATE = 0.75

#: the parts of a step's time that the report gives the share of, as a record keeps them
PARTS = tuple(name.removesuffix("_time") for name in TIME_PARTS)

__all__ = [
    "Interval",
    "Ratio",
    "Spread",
    "accuracy_at",
    "best_came_late",
    "efficiency",
    "paired_efficiencies",
    "paired_ratios",
    "paired_speedups",
    "speedup",
    "speedup_interval",
    "spread",
    "steps_to_target",
    "summarize",
    "time_to_target",
]


# -- one run -----------------------------------------------------------------------


def steps_to_target(curve: Curve, target: float) -> float:
    """Steps done at the first evaluation that reached ``target`` (else inf).

    Examples
    --------
    >>> c = Curve([1.0, 2.0], [10, 20], [0.5, 0.9], [1.0, 1.0])
    >>> steps_to_target(c, 0.8)
    20.0
    """
    _, steps, acc = curve.evaluated()
    hit = np.flatnonzero(acc >= target)
    return float(steps[hit[0]]) if hit.size and math.isfinite(target) else math.inf


def accuracy_at(curve: Curve, seconds: float) -> float:
    """Accuracy of a run stopped at ``seconds`` of training: the last evaluation up
    to the step that crossed ``seconds`` (where a run with that budget stops).

    Examples
    --------
    >>> c = Curve([1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4], [0.5, 0.6, 0.7, 0.8], [1.0] * 4)
    >>> accuracy_at(c, 2.5), accuracy_at(c, 10.0), accuracy_at(c, 0.5)
    (0.7, 0.8, 0.5)
    """
    crossed = np.flatnonzero(curve.time >= seconds)
    end = int(crossed[0]) + 1 if crossed.size else curve.time.size
    acc = curve.accuracy[:end]
    acc = acc[~np.isnan(acc)]
    return float(acc[-1]) if acc.size else math.nan


def best_came_late(curve: Curve, budget: float, late: float = LATE) -> bool:
    """Whether the run's best accuracy came after ``late`` of its ``budget`` seconds.

    A run still climbing at the end of its budget has it there in every
    seed; one that levelled off, in about ``1 - late`` of them (its
    evaluations then take turns at the top).

    Examples
    --------
    >>> c = Curve([1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4], [0.5, 0.8, 0.7, 0.9], [1.0] * 4)
    >>> best_came_late(c, 4.0), best_came_late(c, 4.0, late=1.0)
    (True, False)
    """
    t, _, acc = curve.evaluated()
    return bool(acc.size) and float(t[int(np.argmax(acc))]) > late * budget


def final_accuracy(curve: Curve) -> float:
    """The last measured accuracy (NaN if none)."""
    acc = curve.evaluated()[2]
    return float(acc[-1]) if acc.size else math.nan


def best_accuracy(curve: Curve) -> float:
    """The best measured accuracy (NaN if none)."""
    acc = curve.evaluated()[2]
    return float(acc.max()) if acc.size else math.nan


def samples_per_second(record: RunRecord) -> float:
    """Samples processed per second of training."""
    t = record.train_seconds
    return record.samples / t if t > 0 else math.nan


def time_share(record: RunRecord, part: str) -> float:
    """Share of the run's step time spent in ``part`` ("compute", "selection", ...).

    NaN where the record does not keep its time parts (results written
    before they were kept).

    Examples
    --------
    >>> from daskpri.bench.records import Arm, RunSpec
    >>> spec = RunSpec("compare", "daskpri", "d", "mlp", Arm("uniform", "uniform", 64, 64),
    ...                0.1, 0, 2, 10.0)
    >>> r = RunRecord(spec, Curve([4.0], [1], [0.5], [1.0]), 64, 64, 5.0,
    ...               info={"time_parts": {"compute": 3.0, "selection": 1.0}})
    >>> time_share(r, "selection"), time_share(r, "optimizer")
    (0.25, 0.0)
    """
    parts = record.info.get("time_parts") or {}
    total = sum(parts.values())
    return parts.get(part, 0.0) / total if total > 0 else math.nan


# -- over seeds ----------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """Median, min and max of a measure over seeds; ``reached`` counts finite values."""

    median: float
    low: float
    high: float
    n: int
    reached: int


def spread(values: Iterable[float]) -> Spread:
    """Median and range of ``values``, NaNs left out, ``inf`` kept (a target missed).

    Examples
    --------
    >>> spread([3.0, 1.0, math.inf])
    Spread(median=3.0, low=1.0, high=inf, n=3, reached=2)
    >>> spread([]).n
    0
    """
    arr = np.asarray(list(values), dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    if not arr.size:
        return Spread(math.nan, math.nan, math.nan, 0, 0)
    return Spread(float(np.median(arr)), float(arr.min()), float(arr.max()), int(arr.size),
                  int(np.isfinite(arr).sum()))


def paired_ratios(numerators: Sequence[RunRecord], denominators: Sequence[RunRecord]) -> Spread:
    """Samples/s of each seed's run in ``numerators`` over the same seed's in ``denominators``.

    The protocol runs the two side by side for every seed, so the ratio of a
    pair is not moved by drift between runs made far apart, as a ratio of
    medians would be. Seeds missing from either side are left out.

    Examples
    --------
    >>> from daskpri.bench.records import Arm, Curve, RunSpec
    >>> def run(seed, n, samples):
    ...     spec = RunSpec("scaling", "daskpri", "d", "mlp", Arm("uniform", "uniform", 64, 64),
    ...                    0.1, seed, n, 10.0)
    ...     return RunRecord(spec, Curve([10.0], [1], [0.5], [1.0]), samples, samples, 11.0)
    >>> two = [run(0, 2, 1800), run(1, 2, 1500), run(2, 2, 900)]
    >>> one = [run(0, 1, 1000), run(1, 1, 1000)]
    >>> paired_ratios(two, one)
    Spread(median=1.65, low=1.5, high=1.8, n=2, reached=2)
    """
    by_seed = {r.spec.seed: samples_per_second(r) for r in denominators}
    return spread(
        samples_per_second(r) / by_seed[r.spec.seed]
        for r in numerators
        if by_seed.get(r.spec.seed, 0) > 0
    )


def paired_speedups(
    runs: Sequence[RunRecord], baseline: Sequence[RunRecord], target: float
) -> Spread:
    """Each seed's speedup to ``target``: the baseline's seconds over the arm's, paired by seed.

    The protocol runs every arm of a seed in turn, so a seed's pair shares
    the machine's speed of the moment, where the ratio of two medians over
    seeds may set a fast seed's time against a slow one's. A seed whose arm
    missed the target where the baseline reached it counts as 0; one whose
    baseline missed it is left out (its speedup is not known), as are seeds
    missing from either side.

    Examples
    --------
    >>> from daskpri.bench.records import Arm, Curve, RunSpec
    >>> def run(label, seed, seconds):
    ...     spec = RunSpec("sweep", "daskpri", "d", "mlp", Arm(label, label, 64, 64),
    ...                    0.1, seed, 2, 60.0)
    ...     return RunRecord(spec, Curve([seconds], [1], [0.9], [1.0]), 64, 64, 61.0)
    >>> ours = [run("sb", 0, 10.0), run("sb", 1, 20.0), run("sb", 2, math.inf)]
    >>> theirs = [run("uniform", 0, 20.0), run("uniform", 1, 30.0), run("uniform", 2, 40.0)]
    >>> paired_speedups(ours, theirs, 0.9)
    Spread(median=1.5, low=0.0, high=2.0, n=3, reached=3)
    """
    return spread(t0 / t if math.isfinite(t) and t > 0 else 0.0
                  for t0, t in _paired_times(runs, baseline, target))


def paired_efficiencies(
    runs_n: Sequence[RunRecord], runs_n0: Sequence[RunRecord], target: float, n0: int, n: int
) -> Spread:
    """Each seed's time efficiency ``T_n0 / ((n/n0) T_n)`` to ``target``, paired by seed.

    A seed whose ``n`` workers missed the target where its ``n0`` reached it
    counts as 0; one whose ``n0`` missed it is left out (its efficiency is
    not known), as are seeds missing from either side.

    Examples
    --------
    >>> from daskpri.bench.records import Arm, Curve, RunSpec
    >>> def run(seed, n, seconds):
    ...     spec = RunSpec("scaling", "daskpri", "d", "mlp", Arm("uniform", "uniform", 64, 64),
    ...                    0.1, seed, n, 60.0)
    ...     return RunRecord(spec, Curve([seconds], [1], [0.9], [1.0]), 64, 64, 61.0)
    >>> two = [run(0, 2, 25.0), run(1, 2, 20.0), run(2, 2, 30.0)]
    >>> one = [run(0, 1, 40.0), run(1, 1, 40.0), run(2, 1, 45.0)]
    >>> paired_efficiencies(two, one, 0.9, 1, 2)
    Spread(median=0.8, low=0.75, high=1.0, n=3, reached=3)
    """
    return spread(efficiency(t0, t_n, n0, n) if math.isfinite(t_n) else 0.0
                  for t0, t_n in _paired_times(runs_n, runs_n0, target))


def _paired_times(
    runs: Sequence[RunRecord], baseline: Sequence[RunRecord], target: float
) -> list[tuple[float, float]]:
    """(baseline's seconds, run's seconds) to ``target`` for each seed of ``runs``
    whose baseline run reached it (``inf``: the run missed it)."""
    base = {r.spec.seed: time_to_target(r.curve, target) for r in baseline}
    pairs = ((base.get(r.spec.seed, math.inf), time_to_target(r.curve, target)) for r in runs)
    return [(t0, t) for t0, t in pairs if math.isfinite(t0)]


@dataclass(frozen=True)
class Ratio:
    """A speedup: ``kind`` is ``"exact"``, ``"at least"`` (the baseline missed the
    target within its budget), ``"not reached"`` (the arm missed it) or ``"n/a"``."""

    value: float
    kind: str


def speedup(baseline: float, arm: float, budget: float) -> Ratio:
    """``baseline / arm`` of two median times to target.

    Examples
    --------
    >>> speedup(30.0, 20.0, 60.0)
    Ratio(value=1.5, kind='exact')
    >>> speedup(math.inf, 20.0, 60.0)
    Ratio(value=3.0, kind='at least')
    >>> speedup(30.0, math.inf, 60.0).kind
    'not reached'
    """
    if math.isnan(baseline) or math.isnan(arm):
        return Ratio(math.nan, "n/a")
    if math.isinf(arm):
        return Ratio(math.nan, "not reached" if math.isfinite(baseline) else "n/a")
    if math.isinf(baseline):
        return Ratio(budget / arm, "at least")
    return Ratio(baseline / arm, "exact")


@dataclass(frozen=True)
class Interval:
    """A bootstrap confidence interval: ``low`` and ``high`` at ``confidence``, from
    ``n`` seeds."""

    low: float
    high: float
    confidence: float
    n: int


def speedup_interval(
    runs: Sequence[RunRecord],
    baseline: Sequence[RunRecord],
    target: float,
    budget: float,
    *,
    confidence: float = CONFIDENCE,
    resamples: int = 2000,
    seed: int = 0,
) -> Interval | None:
    """A bootstrap confidence interval of :func:`speedup` over the seeds.

    The seeds that both sides ran are drawn with replacement ``resamples``
    times, each time as a pair (an arm's run and the baseline's of one seed
    share the machine's speed of the moment), and the speedup of the two
    medians is taken again; the interval holds the middle ``confidence`` of
    those speedups (percentile bootstrap, the outer order statistics, so a
    missed target, counted as 0x, never gets interpolated away). A resample
    whose baseline median missed the target counts as the budget over the
    arm's time, as :func:`speedup` says "at least". It measures how far the
    spread of the seeds and the machine's noise leave the ratio uncertain;
    it does not count the choice of each arm's learning rate from the sweep.

    Returns ``None`` where fewer than 3 seeds are paired.

    Parameters
    ----------
    runs, baseline : sequence of RunRecord
        One run per seed for the arm and for its baseline.
    target : float
        The accuracy whose time is compared.
    budget : float
        The runs' budget in seconds (the bound where the baseline missed).
    confidence : float
        Between 0 and 1.
    resamples : int
        Bootstrap draws.
    seed : int
        Seeds the draws (:func:`numpy.random.default_rng`): a report made
        twice from the same runs says the same.

    Examples
    --------
    >>> from daskpri.bench.records import Arm, Curve, RunSpec
    >>> def run(label, seed, seconds):
    ...     spec = RunSpec("sweep", "daskpri", "d", "mlp", Arm(label, label, 64, 64),
    ...                    0.1, seed, 2, 60.0)
    ...     return RunRecord(spec, Curve([seconds], [1], [0.9], [1.0]), 64, 64, 61.0)
    >>> ours = [run("sb", s, t) for s, t in enumerate([10.0, 12.0, 11.0, 9.0, 30.0])]
    >>> theirs = [run("uniform", s, 20.0) for s in range(5)]
    >>> ci = speedup_interval(ours, theirs, 0.9, 60.0)
    >>> ci.low < 20.0 / 11.0 < ci.high, ci.n
    (True, 5)
    >>> speedup_interval(ours[:2], theirs, 0.9, 60.0) is None
    True
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence should be between 0 and 1, but got confidence={confidence!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples should be a positive integer, but got resamples={resamples!r}")
    base = {r.spec.seed: time_to_target(r.curve, target) for r in baseline}
    pairs = [(base[r.spec.seed], time_to_target(r.curve, target))
             for r in runs if r.spec.seed in base]
    if len(pairs) < 3:
        return None
    t0, t = (np.asarray(side, dtype=np.float64) for side in zip(*pairs, strict=True))
    draws = np.random.default_rng(seed).integers(0, len(pairs), size=(resamples, len(pairs)))
    m0, m = np.median(t0[draws], axis=1), np.median(t[draws], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(np.isinf(m0), budget / m, m0 / m)
    ratio = np.where(np.isinf(m), np.where(np.isinf(m0), np.nan, 0.0), ratio)
    ratio = ratio[~np.isnan(ratio)]
    if not ratio.size:
        return None
    tail = (1.0 - confidence) / 2
    return Interval(float(np.quantile(ratio, tail, method="lower")),
                    float(np.quantile(ratio, 1.0 - tail, method="higher")),
                    confidence, len(pairs))


def efficiency(t_base: float, t_n: float, n_base: int, n: int) -> float:
    """Parallel efficiency of ``n`` workers against ``n_base``: ``T_base / ((n/n_base) T_n)``.

    With ``n_base=1`` this is ``T1 / (n Tn)``; for throughputs pass ``1/S``.

    Examples
    --------
    >>> efficiency(40.0, 25.0, 1, 2)
    0.8
    """
    if not (math.isfinite(t_base) and math.isfinite(t_n)) or t_n <= 0:
        return math.nan
    return t_base / ((n / n_base) * t_n)


# -- tables ---------------------------------------------------------------------------


def _select(records: Sequence[RunRecord], **want: Any) -> list[RunRecord]:
    def get(r: RunRecord, key: str) -> Any:
        if key == "label":
            return r.spec.arm.label
        return getattr(r.spec, key)

    return [r for r in records if all(get(r, k) == v for k, v in want.items())]


def summarize(config: BenchConfig, records: Sequence[RunRecord],
              sizes: dict[str, int]) -> dict[str, Any]:
    """Every table of the report, as lists of row dicts.

    Returns
    -------
    dict
        ``targets``, ``lr_sweep``, ``time_to_target``, ``budgets``,
        ``scaling``, ``overhead`` and ``failed`` (the runs that failed or
        diverged, with why): lists of rows (dicts of plain values,
        :class:`Spread` and :class:`Ratio`).
    """
    picks = pick_learning_rates(records, config.pick, max(config.target_fractions))
    out: dict[str, list[dict[str, Any]]] = {
        k: [] for k in ("targets", "lr_sweep", "time_to_target", "budgets", "scaling",
                        "overhead")
    }
    out["failed"] = [
        {"dataset": r.spec.dataset, "model": r.spec.model, "run": r.spec.name,
         "error": r.info["error"]}
        for r in records if "error" in r.info
    ]
    main = config.main_workers
    for dataset in config.datasets:
        for model in config.models:
            arms = make_arms(config, sizes[dataset], model)
            dm = {"dataset": dataset, "model": model}
            goal = targets(records, dataset, model, picks, config.target_fractions,
                           config.pick)
            best = next(iter(goal.values())) / config.target_fractions[0]
            # the runs that trained: one that failed has no best accuracy, early or late
            uniform = [r for r in _select(records, phase="sweep", dataset=dataset, model=model,
                                          label="uniform") if "error" not in r.info]
            late = sum(best_came_late(r.curve, r.spec.budget) for r in uniform)
            for f, t in goal.items():
                out["targets"].append({**dm, "fraction": f, "target": t, "uniform_best": best,
                                       "uniform_late": (late, len(uniform))})
            tuned: dict[str, list[RunRecord]] = {}
            edges = grid_edges(picks, config.learning_rates)
            headline = goal[max(goal)]
            for arm in arms:
                lr = picks.get((dataset, model, arm.label), math.nan)
                for rate in config.learning_rates:
                    runs = _select(records, phase="sweep", dataset=dataset, model=model,
                                   label=arm.label, learning_rate=rate)
                    out["lr_sweep"].append({
                        **dm, "arm": arm.label, "learning_rate": rate, "picked": rate == lr,
                        "final": spread(final_accuracy(r.curve) for r in runs),
                        "seconds": spread(time_to_target(r.curve, headline) for r in runs),
                        "edge": edges.get((dataset, model, arm.label)) if rate == lr else None,
                        # the speedups are against uniform's pick: say where it may be coarse
                        "coarse": (coarse_neighbours(lr, config.learning_rates)
                                   if rate == lr and arm.label == "uniform" else ()),
                    })
                tuned[arm.label] = _select(records, phase="sweep", dataset=dataset, model=model,
                                           label=arm.label, learning_rate=lr, n_workers=main)
            _comparison(config, arms, tuned, goal, dm, out)
            _scaling(config, arms, records, picks, goal, dm, out)
            _overhead(config, records, picks, goal, dm, out)
    return out


def _comparison(config: BenchConfig, arms: Sequence[Any], tuned: dict[str, list[RunRecord]],
                goal: dict[float, float], dm: dict[str, str],
                out: dict[str, list[dict[str, Any]]]) -> None:
    budget = config.budget
    for arm in arms:
        runs = tuned[arm.label]
        equal = equal_gradient_label(arm)
        for f, t in goal.items():
            times = spread(time_to_target(r.curve, t) for r in runs)
            base = spread(time_to_target(r.curve, t) for r in tuned.get("uniform", []))
            same = spread(time_to_target(r.curve, t) for r in tuned.get(equal, []))
            out["time_to_target"].append({
                **dm, "arm": arm.label, "fraction": f, "target": t,
                "learning_rate": runs[0].spec.learning_rate if runs else math.nan,
                "seconds": times,
                "steps": spread(steps_to_target(r.curve, t) for r in runs),
                "vs_uniform": speedup(base.median, times.median, budget),
                "vs_uniform_paired": paired_speedups(runs, tuned.get("uniform", []), t),
                "vs_uniform_interval": speedup_interval(runs, tuned.get("uniform", []), t,
                                                        budget),
                "equal_gradients": equal,
                "vs_equal_gradients": speedup(same.median, times.median, budget),
            })
        # a run that failed kept no steps (its curve is empty): not a run of 0 steps
        trained = [r for r in runs if "error" not in r.info]
        grads = [r.grad_samples / max(r.steps, 1) / r.spec.n_workers for r in trained]
        out["budgets"].append({
            **dm, "arm": arm.label,
            "at": {f: spread(accuracy_at(r.curve, f * budget) for r in runs)
                   for f in config.budget_fractions},
            "final": spread(final_accuracy(r.curve) for r in runs),
            "best": spread(best_accuracy(r.curve) for r in runs),
            "steps": spread(r.steps for r in trained),
            "samples_per_second": spread(samples_per_second(r) for r in runs),
            "grads_per_step": float(np.median(grads)) if grads else math.nan,
            "time_shares": {part: spread(time_share(r, part) for r in runs)
                            for part in PARTS},
            "selected_ahead": spread(r.info.get("selected_ahead", math.nan) for r in runs),
        })


def _scaling(config: BenchConfig, arms: Sequence[Any], records: Sequence[RunRecord],
             picks: dict[tuple[str, str, str], float], goal: dict[float, float],
             dm: dict[str, str], out: dict[str, list[dict[str, Any]]]) -> None:
    if len(config.workers) < 2:
        return
    target = next(iter(goal.values()))
    n0 = config.workers[0]
    for arm in arms:
        if "@" in arm.label:
            continue
        lr = picks.get((dm["dataset"], dm["model"], arm.label), math.nan)
        runs = {
            n: _select(records, phase="scaling", dataset=dm["dataset"], model=dm["model"],
                       label=arm.label, learning_rate=lr, n_workers=n)
            for n in config.workers
        }
        for n in config.workers:
            sps = spread(samples_per_second(r) for r in runs[n])
            tta = spread(time_to_target(r.curve, target) for r in runs[n])
            ratio = paired_ratios(runs[n], runs[n0])
            loops = _plain_loops(records, dm, lr, n0, n) if arm.label == "uniform" else None
            out["scaling"].append({
                **dm, "arm": arm.label, "n_workers": n, "target": target,
                "samples_per_second": sps, "vs_n0": ratio,
                "throughput_efficiency": ratio.median / (n / n0),
                "plain_loops_vs_n0": loops,
                "of_plain_loops": ratio.median / loops.median
                if loops is not None and loops.median > 0 else math.nan,
                "seconds": tta,
                "time_efficiency": paired_efficiencies(runs[n], runs[n0], target, n0, n),
            })


def _plain_loops(records: Sequence[RunRecord], dm: dict[str, str], lr: float, n0: int,
                 n: int) -> Spread | None:
    """``n`` plain loops at once over ``n0`` (one plain loop alone for ``n0 = 1``), paired."""
    def plain(m: int) -> list[RunRecord]:
        return _select(records, kind="torch" if m == 1 else "loops", dataset=dm["dataset"],
                       model=dm["model"], learning_rate=lr, n_workers=m)

    top, base = plain(n), plain(n0)
    return paired_ratios(top, base) if top and base else None


def _overhead(config: BenchConfig, records: Sequence[RunRecord],
              picks: dict[tuple[str, str, str], float], goal: dict[float, float],
              dm: dict[str, str], out: dict[str, list[dict[str, Any]]]) -> None:
    lr = picks.get((dm["dataset"], dm["model"], "uniform"), math.nan)
    target = next(iter(goal.values()))
    pairs = [("torch", 1, "plain PyTorch loop, 1 process")]
    if config.ddp:
        pairs.append(("ddp", 2, "PyTorch DDP (gloo), 2 processes"))
    for kind, n, name in pairs:
        theirs = _select(records, kind=kind, dataset=dm["dataset"], model=dm["model"],
                         learning_rate=lr, n_workers=n)
        ours = _select(records, phase="overhead", kind="daskpri", dataset=dm["dataset"],
                       model=dm["model"], label="uniform", learning_rate=lr, n_workers=n)
        out["overhead"].append({
            **dm, "baseline": name, "n_workers": n, "target": target,
            "baseline_samples_per_second": spread(samples_per_second(r) for r in theirs),
            "daskpri_samples_per_second": spread(samples_per_second(r) for r in ours),
            "daskpri_over_baseline": paired_ratios(ours, theirs),
            "baseline_seconds": spread(time_to_target(r.curve, target) for r in theirs),
            "daskpri_seconds": spread(time_to_target(r.curve, target) for r in ours),
            "baseline_budget": theirs[0].spec.budget if theirs else math.nan,
            "errors": [r.info["error"] for r in theirs if "error" in r.info],
        })
