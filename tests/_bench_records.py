"""Hand-made bench records and configurations for the tests of ``daskpri bench``'s decisions."""

from __future__ import annotations

from collections.abc import Sequence

from daskpri.bench import BenchConfig, next_runs
from daskpri.bench.records import Arm, Curve, RunRecord, RunSpec

UNIFORM = Arm("uniform", "uniform", 64, 64)
LOSS = Arm("loss", "loss", 64, 64)
SIZES = {"mnist1d": 16000}
MACHINE = {"cores": 2, "processor": "x", "platform": "p", "python": "3", "torch": "t",
           "dask": "d", "distributed": "d", "command": "daskpri bench"}


def _record(
    arm: Arm = UNIFORM,
    accuracy: Sequence[float] = (0.5, 0.7, 0.8),
    *,
    times: Sequence[float] | None = None,
    lr: float = 0.05,
    seed: int = 0,
    phase: str = "sweep",
    kind: str = "daskpri",
    n_workers: int = 2,
    samples_per_step: int = 128,
    spec: RunSpec | None = None,
) -> RunRecord:
    n = len(accuracy)
    times = list(times) if times is not None else [float(i + 1) for i in range(n)]
    steps = [10 * (i + 1) for i in range(n)]
    spec = spec or RunSpec(phase, kind, "mnist1d", "mlp", arm, lr, seed, n_workers, 10.0)
    return RunRecord(spec, Curve(times, steps, list(accuracy), [1.0] * n),
                     samples=samples_per_step * steps[-1],
                     grad_samples=arm.grads_per_step * n_workers * steps[-1],
                     wall_seconds=times[-1] + 1.0)


def _config(**kw: object) -> BenchConfig:
    base: dict[str, object] = {"models": ("mlp",), "seeds": 3, "ddp": False,
                               "strategies": ("uniform", "loss"), "learning_rates": (0.05,)}
    return BenchConfig(**{**base, **kw})  # type: ignore[arg-type]


def _slow_and_high_fast_and_lower() -> list[RunRecord]:
    """lr 0.05 ends at 0.90 after 30 s; lr 0.1 reaches 0.89 at 10 s and ends at 0.85."""
    return [
        rec
        for seed in range(3)
        for rec in (
            _record(accuracy=[0.6, 0.8, 0.90], times=[10.0, 20.0, 30.0], lr=0.05, seed=seed),
            _record(accuracy=[0.89, 0.88, 0.85], times=[10.0, 20.0, 30.0], lr=0.1, seed=seed),
            _record(LOSS, accuracy=[0.5, 0.6, 0.7], lr=0.05, seed=seed),  # never reaches 0.891
            _record(LOSS, accuracy=[0.5, 0.6, 0.65], lr=0.1, seed=seed),
        )
    ]


def _simulate(cfg: BenchConfig) -> list[RunRecord]:
    """Run the protocol to the end with made-up results (lr 0.1 always best)."""
    records: list[RunRecord] = []
    for _ in range(10):  # phases; a loop that never ends would be a bug
        specs = next_runs(cfg, SIZES, records)
        if not specs:
            return records
        for s in specs:
            final = 0.8 if s.learning_rate == 0.1 else 0.6
            records.append(_record(s.arm, [0.5, final], spec=s))
    raise AssertionError("next_runs never finished")


def _pairs(times: Sequence[tuple[float, float]]) -> tuple[list[RunRecord], list[RunRecord]]:
    """(arm's runs, uniform's runs), one per seed, reaching accuracy 1.0 at the times given."""
    ours = [_record(LOSS, accuracy=[0.5, 1.0], times=[t / 2, t], seed=seed)
            for seed, (_, t) in enumerate(times)]
    theirs = [_record(accuracy=[0.5, 1.0], times=[t0 / 2, t0], seed=seed)
              for seed, (t0, _) in enumerate(times)]
    return ours, theirs
