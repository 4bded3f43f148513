"""The protocol's decisions, as pure functions of the config and the records so far.

Like dask-ml's ``additional_calls``, :func:`next_runs` looks at what has been
measured and says what to run next; the runner only executes. Nothing here
touches a cluster, so every decision is tested on hand-made records.

The protocol, in order:

1. **sweep** — on the largest worker count, for each dataset, model and seed,
   every arm (uniform, the uniform baselines of equal gradient budget, the
   strategies) at each learning rate, interleaved (A B A B ...), each for the
   same training-time budget.
2. **scaling** — each arm except the equal-gradient baselines at its chosen
   learning rate, on every worker count side by side: for each seed the
   worker counts in turn, in the opposite order on every other seed (1 2, 2 1,
   1 2, ...), so that drift of a shared machine between two worker counts
   cancels over seeds rather than entering their ratio.
3. **overhead** — a plain single-process PyTorch loop (and PyTorch DDP on 2
   processes) with uniform's learning rate, each next to the daskpri uniform
   run of as many workers and the same budget that it is compared with, the
   pair's order alternating over seeds like the worker counts'. After the
   plain loop, with several worker counts, ``n`` plain loops at once for each
   count ``n`` > 1 (``loops``: no communication at all): what this machine
   gives ``n`` one-thread processes that share nothing, over one.

The ratios of the scaling and overhead tables pair the runs of one seed,
which ran minutes apart at most, rather than dividing medians of runs made
in different phases.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from daskpri.bench.config import BenchConfig, strategy_of
from daskpri.bench.records import Arm, RunRecord, RunSpec, time_to_target

__all__ = [
    "best_median_accuracy",
    "coarse_neighbours",
    "count_done",
    "count_runs",
    "equal_gradient_label",
    "gradients_per_step",
    "grid_edges",
    "group_sizes",
    "make_arms",
    "next_runs",
    "pick_learning_rates",
    "targets",
]

#: (dataset, model, arm label) -> learning rate
Picks = dict[tuple[str, str, str], float]

#: How the sweep chooses each arm's learning rate (:func:`pick_learning_rates`).
PICKS = ("time", "final")

DDP_PROCESSES = 2

T = TypeVar("T")


def group_sizes(n_samples: int, n_workers: int, partition_size: int) -> np.ndarray:
    """Samples each worker holds, as the trainer cuts and places in-memory data.

    ``partition_size`` is the largest partition (``daskpri.trainer.partition-size``).

    Examples
    --------
    >>> group_sizes(16000, 2, 1000).tolist()
    [8000, 8000]
    >>> group_sizes(2500, 2, 1000).tolist()
    [1250, 1250]
    """
    from daskpri.training.placement import assign_owners, even_bounds

    sizes = np.diff(even_bounds(n_samples, partition_size, n_workers))
    owner = assign_owners(sizes, n_workers)
    return np.bincount(owner, weights=sizes, minlength=n_workers).astype(np.int64)


def gradients_per_step(
    strategy: str, batch_size: int, samples_per_worker: Sequence[int], **options: object
) -> int:
    """Gradients one worker computes per step under a strategy's options (rounded mean).

    ``projection`` and ``length`` backpropagate their top-``k`` plus the
    round-robin renew of ``ceil(renew * samples)`` (when ``train_on_renew``);
    ``loss`` and ``selective-backprop`` backpropagate ``batch_size`` (their
    extra forward passes are paid in time, not in gradients).

    Examples
    --------
    >>> gradients_per_step("projection", 64, [8000, 8000])
    144
    >>> gradients_per_step("selective-backprop", 64, [8000, 8000])
    64
    """
    from daskpri.strategies import get_strategy

    s = get_strategy(strategy, **options)
    return round(float(np.mean([s.gradients_per_step(batch_size, g) for g in samples_per_worker])))


def make_arms(config: BenchConfig, n_train: int, model: str | None = None) -> list[Arm]:
    """Uniform, the uniform baselines of equal gradient budget, then the strategies.

    The strategies take their options for ``model`` (see
    :meth:`BenchConfig.options_of`).

    Examples
    --------
    >>> cfg = BenchConfig(strategies=("uniform", "projection", "loss"), workers=(2,))
    >>> [a.label for a in make_arms(cfg, 16000)]
    ['uniform', 'uniform@144', 'projection', 'loss']
    """
    sizes = group_sizes(n_train, config.main_workers, config.partition_size).tolist()
    b = config.batch_size
    strategies = []
    for name in config.strategies:
        if name != "uniform":
            options = config.options_of(name, model)
            grads = gradients_per_step(strategy_of(name), b, sizes, **dict(options))
            strategies.append(Arm(name, strategy_of(name), b, grads, options))
    equal = sorted({a.grads_per_step for a in strategies} - {b})
    return [
        Arm("uniform", "uniform", b, b),
        *(Arm(f"uniform@{g}", "uniform", g, g) for g in equal),
        *strategies,
    ]


def equal_gradient_label(arm: Arm) -> str:
    """The uniform arm that computes as many gradients per step as ``arm``.

    Examples
    --------
    >>> equal_gradient_label(Arm("projection", "projection", 64, 144))
    'uniform@144'
    >>> equal_gradient_label(Arm("loss", "loss", 64, 64))
    'uniform'
    """
    if arm.is_uniform:
        return arm.label
    return "uniform" if arm.grads_per_step == arm.batch_size else f"uniform@{arm.grads_per_step}"


def _sweep(config: BenchConfig, sizes: Mapping[str, int]) -> list[RunSpec]:
    out = []
    for dataset in config.datasets:
        for model in config.models:
            arms = make_arms(config, sizes[dataset], model)
            for seed in config.seed_range:
                for lr in config.learning_rates:
                    for arm in arms:  # interleaved: drift hits every arm alike
                        out.append(
                            RunSpec("sweep", "daskpri", dataset, model, arm, lr, seed,
                                    config.main_workers, config.budget)
                        )
    return out


def _alternate(items: Sequence[T], seed: int) -> list[T]:
    """``items`` in order on even seeds, reversed on odd ones (A B, B A, A B, ...)."""
    return list(items) if seed % 2 == 0 else list(reversed(items))


def _scaling(config: BenchConfig, sizes: Mapping[str, int], picks: Picks) -> list[RunSpec]:
    if len(config.workers) < 2:
        return []
    out = []
    for dataset in config.datasets:
        for model in config.models:
            arms = [a for a in make_arms(config, sizes[dataset], model) if "@" not in a.label]
            for seed in config.seed_range:
                for n in _alternate(config.workers, seed):
                    for arm in arms:
                        lr = picks[(dataset, model, arm.label)]
                        out.append(
                            RunSpec("scaling", "daskpri", dataset, model, arm, lr, seed, n,
                                    config.budget)
                        )
    return out


def _overhead(config: BenchConfig, sizes: Mapping[str, int], picks: Picks) -> list[RunSpec]:
    out = []
    seconds = config.baseline_seconds
    for dataset in config.datasets:
        uniform = make_arms(config, sizes[dataset])[0]
        for model in config.models:
            lr = picks[(dataset, model, "uniform")]
            for seed in config.seed_range:
                runs = [("torch", 1)] + ([("ddp", DDP_PROCESSES)] if config.ddp else [])
                for kind, n in runs:
                    for k in _alternate(("daskpri", kind), seed):
                        out.append(RunSpec("overhead", k, dataset, model, uniform, lr, seed, n,
                                           seconds))
                    if kind == "torch" and len(config.workers) > 1:  # what the machine gives n
                        out += [RunSpec("overhead", "loops", dataset, model, uniform, lr, seed,
                                        m, seconds) for m in config.workers if m > 1]
    return out


def next_runs(
    config: BenchConfig, sizes: Mapping[str, int], records: Sequence[RunRecord]
) -> list[RunSpec]:
    """The runs to make next, in order; empty when the benchmark is complete.

    Parameters
    ----------
    config : BenchConfig
    sizes : mapping
        Training samples of each dataset.
    records : sequence of RunRecord
        The runs made so far.

    Examples
    --------
    >>> cfg = BenchConfig(strategies=("uniform", "loss"), models=("mlp",), seeds=1,
    ...                   workers=(1, 2), learning_rates=(0.05,), ddp=False)
    >>> [(s.phase, s.arm.label, s.n_workers) for s in next_runs(cfg, {"mnist1d": 16000}, [])]
    [('sweep', 'uniform', 2), ('sweep', 'loss', 2)]
    """
    done = {r.spec for r in records}
    todo = [s for s in _sweep(config, sizes) if s not in done]
    if todo:
        return todo
    picks = pick_learning_rates(records, config.pick, max(config.target_fractions))
    for phase in (_scaling, _overhead):
        todo = [s for s in phase(config, sizes, picks) if s not in done]
        if todo:
            return todo
    return []


def count_runs(config: BenchConfig, sizes: Mapping[str, int]) -> int:
    """How many runs the whole benchmark makes (for a progress bar).

    Examples
    --------
    >>> cfg = BenchConfig(strategies=("uniform", "loss"), models=("mlp",), seeds=1,
    ...                   workers=(1, 2), learning_rates=(0.05,), ddp=True)
    >>> count_runs(cfg, {"mnist1d": 16000})  # 2 sweep, 2 x 2 scaling, 2 + 1 + 2 overhead
    11
    """
    picks: Picks = defaultdict(lambda: config.learning_rates[0])
    return sum(
        len(specs)
        for specs in (
            _sweep(config, sizes),
            _scaling(config, sizes, picks),
            _overhead(config, sizes, picks),
        )
    )


def count_done(
    config: BenchConfig, sizes: Mapping[str, int], records: Sequence[RunRecord]
) -> int:
    """How many of ``records`` are runs the benchmark's plan asks for (for a progress bar).

    A ``results.json`` taken on with ``--resume`` may hold runs the plan
    no longer asks for: the scaling and overhead runs at the learning rate
    the sweep picked before more seeds were added. Those are kept, and not
    counted here, so the count never passes :func:`count_runs`.
    """
    done = {r.spec for r in records}
    plan = set(_sweep(config, sizes))
    if plan <= done:
        picks = pick_learning_rates(records, config.pick, max(config.target_fractions))
        plan.update(_scaling(config, sizes, picks), _overhead(config, sizes, picks))
    return len(plan & done)


def _final_accuracy(record: RunRecord) -> float:
    """The last accuracy measured; ``-inf`` for a run that failed (diverged), below any."""
    if "error" in record.info:
        return -math.inf
    acc = record.curve.accuracy[~np.isnan(record.curve.accuracy)]
    return float(acc[-1]) if acc.size else math.nan


def _median(values: Sequence[float]) -> float:
    """Median of the non-NaN ``values``; ``-inf`` when there is none."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    return float(np.median(arr)) if arr.size else -math.inf


def pick_learning_rates(records: Iterable[RunRecord], by: str = "final",
                        fraction: float = 0.99) -> Picks:
    """For each (dataset, model, arm): the learning rate the sweep chose for it.

    ``by="final"``: the one of best median final accuracy. ``by="time"``:
    the one that reaches ``fraction`` times uniform's best accuracy (the
    median over seeds, at the learning rate where it is highest, see
    :func:`best_median_accuracy`) in the fewest median seconds, so that
    uniform is tuned for the speed it is compared on; a learning rate
    whose median misses the target loses to any that reaches it, and an
    arm that never reaches it keeps its final-accuracy pick. Ties go to
    the better final accuracy, then to the smaller learning rate; a
    learning rate whose runs have no accuracy at all is never picked unless
    every one is so, and a run that failed (diverged) counts below any final
    accuracy in its rate's median.

    Examples
    --------
    >>> from daskpri.bench.records import Arm, Curve, RunRecord, RunSpec
    >>> arm = Arm("uniform", "uniform", 64, 64)
    >>> def rec(lr, times, accs):
    ...     spec = RunSpec("sweep", "daskpri", "d", "m", arm, lr, 0, 2, 10.0)
    ...     n = len(accs)
    ...     return RunRecord(spec, Curve(times, range(n), accs, [0.5] * n), 64, 64, 1.0)
    >>> records = [rec(0.05, [1.0, 9.0], [0.5, 0.9]), rec(0.1, [1.0, 9.0], [0.89, 0.8])]
    >>> pick_learning_rates(records)  # the better final accuracy
    {('d', 'm', 'uniform'): 0.05}
    >>> pick_learning_rates(records, by="time", fraction=0.97)  # 0.873 at 1 s against 9 s
    {('d', 'm', 'uniform'): 0.1}
    """
    if by not in PICKS:
        raise ValueError(f"by should be one of {', '.join(map(repr, PICKS))}, but got {by!r}")
    records = list(records)
    finals: dict[tuple[str, str, str], dict[float, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    times: dict[tuple[str, str, str], dict[float, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    goals: dict[tuple[str, str], float] = {}
    for r in records:
        if r.spec.phase == "sweep":
            s = r.spec
            key = (s.dataset, s.model, s.arm.label)
            finals[key][s.learning_rate].append(_final_accuracy(r))
            if by == "time":
                if (s.dataset, s.model) not in goals:
                    goals[(s.dataset, s.model)] = fraction * best_median_accuracy(
                        records, s.dataset, s.model
                    )
                times[key][s.learning_rate].append(
                    time_to_target(r.curve, goals[(s.dataset, s.model)])
                )
    picks = {}
    for key, by_lr in finals.items():
        def final(lr: float, by_lr: dict[float, list[float]] = by_lr) -> tuple[float, float]:
            return (_median(by_lr[lr]), -lr)

        seconds = {lr: float(np.median(t)) for lr, t in times[key].items()}
        if seconds and math.isfinite(min(seconds.values())):
            picks[key] = min(by_lr, key=lambda lr: (seconds[lr], *(-v for v in final(lr))))
        else:
            picks[key] = max(by_lr, key=final)
    return picks


def grid_edges(picks: Mapping[tuple[str, str, str], float],
               learning_rates: Sequence[float]) -> dict[tuple[str, str, str], str]:
    """The arms whose pick is the sweep's ``"largest"`` or ``"smallest"`` learning rate.

    Their best may lie outside the grid: a baseline tuned at the grid's
    edge is not tuned. Empty for a sweep of one learning rate (no sweep).

    Examples
    --------
    >>> grid_edges({("d", "m", "uniform"): 0.1, ("d", "m", "loss"): 0.05}, [0.025, 0.05, 0.1])
    {('d', 'm', 'uniform'): 'largest'}
    """
    if len(learning_rates) < 2:
        return {}
    low, high = min(learning_rates), max(learning_rates)
    return {key: "largest" if lr == high else "smallest"
            for key, lr in picks.items() if lr in (low, high)}


#: a baseline's pick with a neighbour in the sweep more than this many times away is flagged
COARSE_RATIO = 1.5


def coarse_neighbours(lr: float, learning_rates: Sequence[float],
                      ratio: float = COARSE_RATIO) -> tuple[float, ...]:
    """The rates next to ``lr`` in the sweep that lie more than ``ratio`` times away.

    A baseline picked between two rates twice apart may be best between
    them: on this project's MLPs uniform's best rate was 0.3 where the
    sweep had 0.2 and 0.4, and every speedup measured against 0.2 or 0.4
    was measured against a slower baseline than uniform can be. Empty
    where the neighbours are close enough, or for a sweep of one rate.

    Examples
    --------
    >>> coarse_neighbours(0.2, [0.1, 0.2, 0.4])
    (0.1, 0.4)
    >>> coarse_neighbours(0.3, [0.2, 0.25, 0.3, 0.4])
    ()
    >>> coarse_neighbours(0.1, [0.05, 0.1])  # the edge, flagged by grid_edges
    (0.05,)
    """
    rates = sorted(set(learning_rates))
    if lr not in rates or len(rates) < 2:
        return ()
    i = rates.index(lr)
    near = rates[max(i - 1, 0): i] + rates[i + 1: i + 2]
    return tuple(r for r in near if max(r, lr) / min(r, lr) > ratio)


def best_median_accuracy(records: Iterable[RunRecord], dataset: str, model: str,
                         picks: Mapping[tuple[str, str, str], float] | None = None) -> float:
    """Median over seeds of uniform's best accuracy in the sweep.

    At uniform's chosen learning rate (``picks``), or with ``picks=None``
    at the learning rate where that median is highest. A run that failed
    (diverged) counts below any accuracy; NaN where every run failed.

    Examples
    --------
    >>> from daskpri.bench.records import Arm, Curve, RunRecord, RunSpec
    >>> arm = Arm("uniform", "uniform", 64, 64)
    >>> def rec(seed, accs):
    ...     spec = RunSpec("sweep", "daskpri", "d", "m", arm, 0.05, seed, 2, 10.0)
    ...     n = len(accs)
    ...     return RunRecord(spec, Curve(range(n), range(n), accs, [0.0] * n), 64, 64, 1.0)
    >>> rs = [rec(0, [0.5, 0.8, 0.7]), rec(1, [0.9, 0.6]), rec(2, [0.6, 0.7])]
    >>> best_median_accuracy(rs, "d", "m", {("d", "m", "uniform"): 0.05})
    0.8
    """
    lr = None if picks is None else picks.get((dataset, model, "uniform"))
    best: dict[float, list[float]] = defaultdict(list)
    for r in records:
        if (
            r.spec.phase == "sweep"
            and (r.spec.dataset, r.spec.model, r.spec.arm.label) == (dataset, model, "uniform")
            and (picks is None or r.spec.learning_rate == lr)
        ):
            if "error" in r.info:
                # below any accuracy: a rate that diverged in most seeds does not set the
                # targets from the seeds that survived it
                best[r.spec.learning_rate].append(-math.inf)
            elif not np.isnan(r.curve.accuracy).all():
                best[r.spec.learning_rate].append(float(np.nanmax(r.curve.accuracy)))
    top = max((float(np.median(v)) for v in best.values()), default=math.nan)
    return top if math.isfinite(top) else math.nan  # every run failed: no target


def targets(records: Sequence[RunRecord], dataset: str, model: str, picks: Picks,
            fractions: Sequence[float], by: str = "final") -> dict[float, float]:
    """The target accuracies: ``fraction`` times uniform's median best accuracy.

    That accuracy is taken at uniform's chosen learning rate where the
    sweep picks ``by="final"``, and at the learning rate where it is
    highest where the sweep picks ``by="time"`` (the picks then depend on
    the target, not the target on them).

    Examples
    --------
    >>> targets([], "d", "m", {}, [0.97])
    {0.97: nan}
    """
    best = best_median_accuracy(records, dataset, model, None if by == "time" else picks)
    return {float(f): float(f) * best for f in fractions}
