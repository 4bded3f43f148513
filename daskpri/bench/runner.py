"""The runner: executes the protocol's runs on clusters, one at a time.

It only executes: which runs, in which order, with which learning rate, comes
from :func:`daskpri.bench.protocol.next_runs`. Runs never overlap (two
training jobs on two cores slow each other by 1.2-2.7x), and the LocalCluster
is closed before the plain PyTorch and DDP baselines, which then have the
machine to themselves.

Its parts: :mod:`~daskpri.bench.machine` (what the report records of the
machine), :mod:`~daskpri.bench.stored` (a ``results.json`` read back, for
``--resume`` and ``--report-only``), :mod:`~daskpri.bench.merge`
(``--merge``), and the private modules that hold the clusters and make one
run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from distributed.security import Security

from daskpri.bench._clusters import _Clusters
from daskpri.bench._single_run import _execute
from daskpri.bench.analysis import best_accuracy, final_accuracy, samples_per_second
from daskpri.bench.config import BenchConfig
from daskpri.bench.machine import _load, machine_info
from daskpri.bench.merge import merge_results
from daskpri.bench.protocol import (
    DDP_PROCESSES,
    count_done,
    count_runs,
    group_sizes,
    make_arms,
    next_runs,
)
from daskpri.bench.records import RunRecord, RunSpec
from daskpri.bench.report import RESULTS_JSON, write_json, write_report
from daskpri.bench.stored import _invocation, _read_results, previous_runs

# Re-exported: defined here before the module was split (``daskpri bench``'s
# command imports it from here).
from daskpri.bench.stored import report_only as report_only

__all__ = ["check_sizes", "describe", "machine_info", "merge_results", "previous_runs",
           "run_bench"]


def describe(record: RunRecord) -> str:
    """One line about a finished run.

    Examples
    --------
    >>> from daskpri.bench.records import Arm, Curve, RunSpec
    >>> spec = RunSpec("sweep", "daskpri", "d", "mlp", Arm("uniform", "uniform", 64, 64),
    ...                0.05, 0, 2, 10.0)
    >>> describe(RunRecord(spec, Curve([5.0, 10.0], [100, 200], [0.5, 0.6], [1.0, 0.9]),
    ...                    25600, 25600, 12.0))  # doctest: +NORMALIZE_WHITESPACE
    'd/mlp sweep: uniform lr=0.05 seed=0 workers=2: 200 steps in 10.0 s, final accuracy
    0.6000 (best 0.6000), 2,560 samples/s, 64 grads/step/worker [wall 12.0 s]'
    """
    if "error" in record.info:
        return f"{record.spec.name}: FAILED: {record.info['error'].strip().splitlines()[-1]}"
    grads = record.grad_samples / max(record.steps, 1) / record.spec.n_workers
    final, best = final_accuracy(record.curve), best_accuracy(record.curve)
    sps = samples_per_second(record)
    return (
        f"{record.spec.name}: {record.steps} steps in {record.train_seconds:.1f} s, "
        f"final accuracy {final:.4f} (best {best:.4f}), "
        f"{sps:,.0f} samples/s, {grads:.0f} grads/step/worker "
        f"[wall {record.wall_seconds:.1f} s]"
    )

def workers_needed(config: BenchConfig) -> tuple[int, bool]:
    """The most workers any run of ``config`` needs, and whether DDP's runs set that number.

    Examples
    --------
    >>> workers_needed(BenchConfig(workers=(1,))), workers_needed(BenchConfig(workers=(1, 4)))
    ((2, True), (4, False))
    """
    largest = max(config.workers)
    if config.ddp and DDP_PROCESSES > largest:
        return DDP_PROCESSES, True
    return largest, False


def check_sizes(config: BenchConfig, sizes: Mapping[str, int]) -> None:
    """Refuse a dataset too small for a batch on every worker of the largest count.

    A smaller one would give each worker a partition short of a batch, the
    plain loop and DDP batches of what is there, and targets from
    accuracies measured on a handful of samples. So too a strategy whose
    gradients per step (its options', e.g. projection's ``k``) pass a
    worker's share: its uniform baseline of equal gradients trains a batch
    of as many, which the Trainer refuses.

    Examples
    --------
    >>> check_sizes(BenchConfig(workers=(1, 2), ddp=False), {"mnist1d": 100})
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --n-samples: mnist1d has 100 training samples, fewer than a batch of 64 on ...
    """
    n, _ = workers_needed(config)
    for name, size in sizes.items():
        if size < config.batch_size * n:
            raise ValueError(
                f"--n-samples: {name} has {size} training samples, fewer than a batch of "
                f"{config.batch_size} on each of {n} workers ({config.batch_size * n}); give a "
                "larger --n-samples, or a smaller --batch-size"
            )
    for name, size in sizes.items():
        # a strategy's gradients per step is the batch of its uniform baseline of equal
        # gradients, which the Trainer refuses past a worker's share: at that arm's first
        # run, after the runs before it
        share = int(group_sizes(size, config.main_workers, config.partition_size).min())
        for model in config.models:
            for arm in make_arms(config, size, model):
                if not arm.is_uniform and arm.grads_per_step > share:
                    options = ", ".join(f"{k}={v}" for k, v in arm.options)
                    raise ValueError(
                        f"--strategies: arm {arm.label}"
                        + (f" ({options})" if options else "") + f" on {model} computes "
                        f"{arm.grads_per_step} gradients a step on each worker, the batch of "
                        f"its baseline uniform@{arm.grads_per_step}, but a worker of "
                        f"{config.main_workers} "
                        f"holds as few as {share} samples of {name}; give its "
                        "--strategy-option fewer, or a larger --n-samples"
                    )


def run_bench(
    config: BenchConfig,
    out: str | os.PathLike[str],
    *,
    progress: bool = True,
    command: str | None = None,
    resume: bool = False,
    root: str | os.PathLike[str] | None = None,
    security: Security | None = None,
    on_interrupt: Callable[[], None] | None = None,
) -> list[RunRecord]:
    """Run the whole benchmark and write its report into ``out``.

    Parameters
    ----------
    config : BenchConfig
    out : path
        Directory for ``results.json``, ``results.md``, the PNG plots and
        ``results.html`` (created if missing, and removed again if the
        benchmark fails before it wrote anything there). ``results.json``
        is rewritten after every run, so an interrupted benchmark keeps
        what it measured, and the seconds it had taken.
    progress : bool
        Show a progress bar over the runs (a line per run is printed anyway).
    command : str, optional
        The command line, recorded in the report.
    resume : bool
        Keep the runs that ``out``'s ``results.json`` holds (see
        :func:`previous_runs`) and make only the rest: a benchmark stopped
        part way goes on where it stopped. The report keeps the earlier
        invocations' commands and times; its benchmark time is theirs and
        this one's together. Without it an earlier ``results.json`` there
        is replaced (``daskpri bench`` refuses to).
    root : path, optional
        The directory of the files of ``"mnist"`` and ``"cifar10"``, where
        ``config.datasets`` has them (see :func:`daskpri.datasets.load`).
    security : distributed.security.Security, optional
        The TLS credentials of ``config.scheduler``; ``None`` takes those of
        Dask's config, as :class:`distributed.Client` does.
    on_interrupt : callable, optional
        Called with no arguments, in a thread of its own, at the first
        interrupt (Ctrl-C) while a LocalCluster of the benchmark starts:
        the interrupt itself is raised once the cluster has started, seconds
        later (``daskpri bench`` says at once that it heard it).

    Returns
    -------
    list of RunRecord
    """
    from tqdm.auto import tqdm

    from daskpri.data.datasets import TAKES_ROOT, load

    out = Path(out)
    started = time.perf_counter()
    data = {name: load(name, root=root if name in TAKES_ROOT else None,
                       n_samples=config.n_samples, seed=0) for name in config.datasets}
    sizes = {name: int(train.sizes["sample"]) for name, (train, _) in data.items()}
    check_sizes(config, sizes)
    results = out / RESULTS_JSON
    records, earlier = [], []
    if resume:
        records = previous_runs(results, config, sizes)
        if results.exists():
            before = _read_results(results, "--resume")["machine"]
            earlier = [*(before.get("earlier") or ()), _invocation(before, len(records))]
    machine = machine_info()
    machine["command"] = command
    if earlier:
        machine["earlier"] = earlier
    seconds_before = sum(e["bench_seconds"] or 0.0 for e in earlier)
    attempted: set[RunSpec] = {r.spec for r in records}
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    if resume:
        machine["resumed_runs"] = len(records)
        print(f"daskpri bench: {len(records)} runs kept from {results}" if results.exists()
              else f"daskpri bench: no {RESULTS_JSON} in {out} yet; the benchmark starts "
                   "from its first run", flush=True)
    total = count_runs(config, sizes)
    bar = tqdm(total=total, initial=count_done(config, sizes, records), unit="run",
               desc="daskpri bench",
               disable=not progress)
    try:
        with _Clusters(config.scheduler, security, on_interrupt) as clusters:
            if config.scheduler is not None:  # every worker the runs need, before the first
                n, for_ddp = workers_needed(config)
                clusters.client(n, for_ddp=for_ddp)
            while specs := next_runs(config, sizes, records):
                for spec in specs:
                    if spec in attempted:  # a protocol bug; never loop forever on it
                        raise RuntimeError(f"the protocol asked twice for the run {spec.name}")
                    attempted.add(spec)
                    bar.set_postfix_str(spec.name, refresh=True)
                    record = _execute(spec, config, data, clusters)
                    records.append(record)
                    # counted here, not read off the bar: a disabled bar (--no-progress)
                    # keeps its count where it started
                    done = count_done(config, sizes, records)
                    bar.update(done - bar.n)
                    bar.write(f"[{done}/{total}] {describe(record)}")
                    machine["bench_seconds"] = round(
                        seconds_before + time.perf_counter() - started, 1)
                    write_json(results, config, machine, sizes, records)
    except BaseException:
        if created and not any(out.iterdir()):  # nothing measured: no directory left behind
            out.rmdir()
        raise
    finally:
        bar.close()
    machine["load_average_end"] = _load()
    machine["bench_seconds"] = round(seconds_before + time.perf_counter() - started, 1)
    write_report(out, config, machine, sizes, records)
    print(f"daskpri bench: {len(records)} runs in {time.perf_counter() - started:.0f} s"
          + (f" ({machine['bench_seconds']:.0f} s with the earlier invocations)"
             if earlier else "") + f"; report in {out / 'results.md'}", flush=True)
    return records

