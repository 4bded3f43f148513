"""The runner: executes the protocol's runs on clusters, one at a time.

It only executes: which runs, in which order, with which learning rate, comes
from :func:`daskpri.bench.protocol.next_runs`. Runs never overlap (two
training jobs on two cores slow each other by 1.2-2.7x), and the LocalCluster
is closed before the plain PyTorch and DDP baselines, which then have the
machine to themselves.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import dask
import numpy as np
import xarray as xr
from distributed import Client, LocalCluster

from daskpri.bench.analysis import best_accuracy, final_accuracy, samples_per_second
from daskpri.bench.baselines import train_ddp, train_plain, train_plain_loops
from daskpri.bench.config import BenchConfig
from daskpri.bench.protocol import DDP_PROCESSES, count_done, count_runs, make_arms, next_runs
from daskpri.bench.records import RunRecord, RunSpec, record_from_history
from daskpri.bench.report import RESULTS_JSON, write_json, write_report
from daskpri.training.cluster import connect, local_cluster, one_torch_thread, stop_heartbeats
from daskpri.training.placement import all_have_gpus, cluster_workers

__all__ = ["check_sizes", "describe", "machine_info", "merge_results", "previous_runs",
           "run_bench"]



def machine_info() -> dict[str, Any]:
    """Cores, platform and the versions that matter, with the current load average."""
    import dask
    import distributed
    import torch

    import daskpri

    cpuinfo = _cpuinfo()
    return {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        # float results, so a seed's run, can differ between CPUs of one name
        "cpu": _cpu_model(cpuinfo),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # what a ``score_dtype`` below float32 runs on
        "cpu_low_precision": _cpu_flags(cpuinfo, _LOW_PRECISION_FLAGS),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "numpy": np.__version__,
        "daskpri": daskpri.__version__,
        "cuda": torch.cuda.is_available(),
        # the driver's; the workers of a --scheduler may have others
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average_start": _load(),
    }


#: /proc/cpuinfo flags of bfloat16 and float16 arithmetic
_LOW_PRECISION_FLAGS = ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of Linux's ``/proc/cpuinfo`` (none elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if not line.strip():
            break  # the first processor's block
        fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_flags(fields: Mapping[str, str], wanted: tuple[str, ...]) -> list[str] | None:
    """Which of ``wanted`` the CPU's flags (``fields``: :func:`_cpuinfo`) list, or ``None``."""
    if "flags" not in fields:
        return None
    flags = set(fields["flags"].split())
    return [f for f in wanted if f in flags]


def _cpu_model(fields: Mapping[str, str]) -> str | None:
    """The CPU's model name, family and model (``fields``: :func:`_cpuinfo`), or ``None``."""
    if "model name" not in fields:
        return None
    family = [f"{k} {fields[k]}" for k in ("cpu family", "model") if k in fields]
    return ", ".join([fields["model name"], *family])


def _load() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:  # not on every platform
        return None


class _Clusters:
    """One cluster at a time: a LocalCluster per worker count, or the given scheduler."""

    def __init__(self, scheduler: str | None) -> None:
        self.scheduler = scheduler
        self._cluster: LocalCluster | None = None
        self._client: Client | None = None
        self._n = 0

    def client(self, n_workers: int, *, for_ddp: bool = False) -> Client:
        """A client of ``n_workers`` workers (``for_ddp``: DDP's runs are what need that many)."""
        if self.scheduler is not None:
            if self._client is None:
                # a server that accepts and never answers would hold Client(...) for good
                self._client = connect(self.scheduler)
            have = len(cluster_workers(self._client))
            if have < n_workers:
                raise ValueError(
                    f"the benchmark needs {n_workers} workers"
                    + (" (DDP's overhead runs pair 2 processes with 2 workers)" if for_ddp else "")
                    + f", but the scheduler at {self.scheduler} has {have}; start more or pass "
                    f"--workers up to {have}" + (" and --no-ddp" if for_ddp else "")
                )
            return self._client
        if self._client is None or self._n != n_workers:
            self.close()
            self._cluster = local_cluster(n_workers)
            self._client = Client(self._cluster)
            self._n = n_workers
        return self._client

    def device(self) -> str:
        """Where the plain PyTorch loop trains to compare with this cluster's workers.

        ``"cuda"`` where the given scheduler's workers all have a ``GPU``
        resource and this process has CUDA: the trainer then asks for
        ``GPU=1`` and its replicas train on the workers' GPUs. The
        LocalClusters the benchmark starts have no GPU resource, so their
        workers, and the loop, use the CPU.
        """
        import torch

        if self.scheduler is None or not torch.cuda.is_available():
            return "cpu"
        return "cuda" if all_have_gpus(cluster_workers(self.client(1))) else "cpu"

    def close(self) -> None:
        """Close a LocalCluster we started (a given scheduler's client stays)."""
        if self._cluster is not None:
            if self._client is not None:
                stop_heartbeats(self._client)
                self._client.close()
            self._cluster.close()
            self._cluster = self._client = None

    def __enter__(self) -> _Clusters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        if self._client is not None:
            self._client.close()
            self._client = None


def _arrays(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(ds["x"].values, dtype=np.float32), np.asarray(ds["y"].values)


def _execute(
    spec: RunSpec,
    config: BenchConfig,
    data: Mapping[str, tuple[xr.Dataset, xr.Dataset]],
    clusters: _Clusters,
) -> RunRecord:
    """Make one run."""
    from daskpri.models import build_model
    from daskpri.training.trainer import Trainer

    train, test = data[spec.dataset]
    # The same seed gives every arm the same initial weights: only the sampling differs.
    model = build_model(spec.model, train, seed=spec.seed)
    t0 = time.perf_counter()
    if spec.kind == "daskpri":
        from daskpri.strategies import STRATEGIES

        client = clusters.client(spec.n_workers)
        fresh = STRATEGIES[spec.arm.strategy].needs_fresh_priorities
        try:
            # partitions cut as the trainer cuts them by default, as many for every
            # worker (the largest from the config, as the benchmark was given it)
            with one_torch_thread(), dask.config.set(
                {"daskpri.trainer.partition-size": config.partition_size}
            ), Trainer(
                model, strategy=spec.arm.strategy, client=client, seed=spec.seed,
                n_workers=spec.n_workers, batch_size=spec.arm.batch_size,
                learning_rate=spec.learning_rate, momentum=config.momentum,
                max_grad_norm=config.max_grad_norm, eval_every=config.eval_every,
                local_steps=1 if fresh else config.local_steps,
                staleness=config.staleness, **dict(spec.arm.options),
            ) as trainer:
                history = trainer.fit(train, eval_data=test, max_time=spec.budget,
                                      progress=False)
        except FloatingPointError as e:
            # a learning rate of the sweep too high for the model: the run counts as one that
            # never reaches a target and has no final accuracy, and the benchmark goes on
            return _failed(spec, f"diverged: {e}", time.perf_counter() - t0)
        return record_from_history(spec, history, time.perf_counter() - t0)
    clusters.close()  # the baselines have the machine to themselves
    options: dict[str, Any] = {
        "batch_size": spec.arm.batch_size,
        "learning_rate": spec.learning_rate,
        "momentum": config.momentum,
        "max_grad_norm": config.max_grad_norm,
        "budget": spec.budget,
        "eval_seconds": config.baseline_eval_seconds,
        "seed": spec.seed,
    }
    info: dict[str, Any] = {}
    if spec.kind == "torch":
        info["device"] = clusters.device()
        result = train_plain(model, _arrays(train), _arrays(test), device=info["device"],
                             **options)
    else:
        spawn = train_ddp if spec.kind == "ddp" else train_plain_loops
        try:
            result = spawn(model, _arrays(train), _arrays(test), processes=spec.n_workers,
                           **options)
        except RuntimeError as e:  # reported, not fatal: the rest of the benchmark stands
            return _failed(spec, str(e), time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    return RunRecord(spec, result.curve, result.samples, result.samples, wall, info=info)


def _failed(spec: RunSpec, error: str, wall: float) -> RunRecord:
    from daskpri.bench.records import Curve

    return RunRecord(spec, Curve([], [], [], []), 0, 0, wall, info={"error": error})


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


def _read_results(path: Path, what: str) -> dict[str, Any]:
    """``path``'s results.json as a dict, or an error naming what is wrong with it."""
    import json

    if not path.exists():
        raise FileNotFoundError(f"{what}: {path} does not exist")
    try:
        doc = json.loads(path.read_text())
        doc["config"], doc["machine"] = dict(doc["config"]), dict(doc["machine"])
        doc["train_samples"], doc["runs"] = dict(doc["train_samples"]), list(doc["runs"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{what}: {path} is not a daskpri bench results.json ({e})") from None
    doc["config"].setdefault("first_seed", 0)
    return doc


def previous_runs(path: Path, config: BenchConfig,
                  sizes: Mapping[str, int]) -> list[RunRecord]:
    """The runs that ``path`` (a ``results.json``) holds, made with ``config``.

    Empty where ``path`` does not exist (the benchmark stopped before its
    first run ended). Its seeds may be fewer than ``config``'s: a benchmark
    of seeds 0-9 resumed with 20 seeds keeps its runs and adds seeds 10-19
    (each seed's arms still run side by side), for a narrower interval. A
    file made with other options (the scheduler's address aside), with a
    seed that ``config`` does not run, or with other datasets is refused,
    naming what differs: its runs would not be the ones this benchmark
    asks for.
    """
    import json

    if not path.exists():
        return []
    doc = _read_results(path, "--resume")
    theirs, runs = doc["config"], doc["runs"]
    ours = json.loads(json.dumps(config.to_dict()))  # as write_json stored it
    # more seeds may be added: a file whose seeds this benchmark runs too keeps its runs
    seeds = ("seeds", "first_seed")
    try:
        first, n = int(theirs["first_seed"]), int(theirs["seeds"])
        grown = set(range(first, first + n)) <= set(config.seed_range)
    except (KeyError, TypeError, ValueError):
        grown = False  # named below as an option that differs
    differ = [f"{k}: {theirs.get(k)!r} there, {ours.get(k)!r} here"
              for k in sorted(ours.keys() | theirs.keys())
              if k != "scheduler" and ours.get(k) != theirs.get(k)
              and not (grown and k in seeds)]
    if doc.get("train_samples") != dict(sizes):
        differ.append(f"samples per dataset: {doc.get('train_samples')!r} there, "
                      f"{dict(sizes)!r} here")
    if differ:
        raise ValueError(
            f"--resume: {path} was made with other options ({'; '.join(differ)}); resume with "
            "the options it was made with, or give another --out"
        )
    return [RunRecord.from_dict(r) for r in runs]


#: What two benchmarks' machines must share for their times to be pooled.
_SAME_MACHINE = ("cores", "processor", "cpu", "torch_cpu_capability", "cuda", "gpu",
                 "python", "torch", "dask", "distributed")


def merge_results(
    sources: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    strategies: Sequence[str] | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Pool the seeds of several benchmarks into one report, making no runs.

    For a benchmark whose seeds were run in parts: in several sessions, or
    on a machine lent for a while. Each source directory holds the
    ``results.json`` of a benchmark made with the same options, on the same
    kind of machine, with seeds of its own; together its seeds must be
    consecutive (``--first-seed 10 --seeds 10`` and ``--first-seed 20
    --seeds 10`` make seeds 10-29). The arms compared are ``strategies``
    (uniform always among them; each must be in every source), or those
    that every source ran: an arm that only one part ran is dropped, with
    its options. ``out`` gets ``results.json``, ``results.md``, the PNGs and
    ``results.html``, as ``daskpri bench`` writes them; its report names
    each part's command, seeds, time and load.

    Anything that would make the runs of one part not comparable to the
    other's is refused, naming it: another option, another machine (CPU
    model, GPU, core count or versions), another dataset size, a seed in
    two parts, a gap between the parts' seeds.

    Returns
    -------
    dict
        The summary, as ``out``'s ``results.json`` holds it.
    """
    what = "--merge"
    if len(sources) < 2:
        raise ValueError(f"{what} pools two benchmarks or more, but got {len(sources)}")
    paths = [Path(s) / RESULTS_JSON for s in sources]
    if len({p.resolve() for p in paths}) < len(paths):
        raise ValueError(f"{what} names a directory twice: {', '.join(map(str, sources))}")
    docs = [_read_results(p, what) for p in paths]
    configs, runs = [], []
    for doc, path in zip(docs, paths, strict=True):
        try:  # every field checked, before any is compared
            configs.append(BenchConfig.from_dict(doc["config"]))
            runs.append([RunRecord.from_dict(r) for r in doc["runs"]])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{what}: {path} is not a daskpri bench results.json ({e})") \
                from None
    # in the order of their seeds: the report lists the parts, and holds the runs, in it
    order = sorted(range(len(docs)), key=lambda i: configs[i].first_seed)
    docs, paths = [docs[i] for i in order], [paths[i] for i in order]
    configs, runs = [configs[i] for i in order], [runs[i] for i in order]
    common = [a for a in docs[0]["config"]["strategies"]
              if all(a in d["config"]["strategies"] for d in docs[1:])]
    if strategies is not None:
        for arm in strategies:
            for doc, path in zip(docs, paths, strict=True):
                if arm != "uniform" and arm not in doc["config"]["strategies"]:
                    raise ValueError(f"{what}: {path} has no arm {arm!r}; the arms every part "
                                     f"ran are {', '.join(common)}")
        common = ["uniform", *(a for a in strategies if a != "uniform")]

    def projected(doc: dict[str, Any]) -> dict[str, Any]:
        cfg = dict(doc["config"])
        cfg["strategies"] = common
        cfg["strategy_options"] = [o for o in cfg.get("strategy_options") or () if o[0] in common]
        for k in ("seeds", "first_seed", "scheduler"):
            cfg.pop(k, None)
        return cfg

    base = projected(docs[0])
    for doc, path in zip(docs[1:], paths[1:], strict=True):
        cfg = projected(doc)
        differ = [f"{k}: {base.get(k)!r} in {paths[0]}, {cfg.get(k)!r} in {path}"
                  for k in sorted(base.keys() | cfg.keys()) if base.get(k) != cfg.get(k)]
        if doc["train_samples"] != docs[0]["train_samples"]:
            differ.append(f"samples per dataset: {docs[0]['train_samples']!r} in {paths[0]}, "
                          f"{doc['train_samples']!r} in {path}")
        machines = [f"{k}: {docs[0]['machine'].get(k)!r} in {paths[0]}, "
                    f"{doc['machine'].get(k)!r} in {path}"
                    for k in _SAME_MACHINE if docs[0]["machine"].get(k) != doc["machine"].get(k)]
        if differ:
            raise ValueError(f"{what}: the parts were made with other options ({'; '.join(differ)})"
                             "; only their seeds may differ")
        if machines:
            raise ValueError(f"{what}: the parts ran on other machines ({'; '.join(machines)}); "
                             "their times do not pool")
    for (c, p), (d, q) in pairwise(zip(configs, paths, strict=True)):
        if d.first_seed != c.seed_range.stop:
            kind = ("share seeds" if d.first_seed < c.seed_range.stop
                    else "leave a gap between their seeds")
            raise ValueError(
                f"{what}: {p} (seeds {c.seed_span}) and {q} (from seed {d.first_seed}) "
                f"{kind}; the parts' seeds should follow on, each part's --first-seed the "
                "seed after the last of another's"
            )
    config_dict = {**docs[0]["config"], "strategies": common,
                   "strategy_options": base["strategy_options"],
                   "first_seed": configs[0].first_seed, "seeds": sum(c.seeds for c in configs),
                   "scheduler": None}
    config = BenchConfig.from_dict(config_dict)
    records = [r for part in runs for r in part]
    sizes = dict(docs[0]["train_samples"])
    # the arms the pooled benchmark compares: the equal-gradient baselines of its
    # strategies are kept, those of the strategies dropped are not
    arms = {(d, m): set(make_arms(config, sizes[d], m))
            for d in config.datasets for m in config.models}
    records = [r for r in records if r.spec.arm in arms.get((r.spec.dataset, r.spec.model), ())]
    machine = {k: v for k, v in docs[0]["machine"].items()
               if k not in ("command", "bench_seconds", "load_average_start",
                            "load_average_end", "resumed_runs", "partial", "merged",
                            "earlier")}
    machine["command"] = command
    machine["merged"] = [
        {"path": str(p), "command": d["machine"].get("command"),
         "seeds": c.seed_span,
         "bench_seconds": d["machine"].get("bench_seconds"),
         "load_average_start": d["machine"].get("load_average_start"),
         "load_average_end": d["machine"].get("load_average_end")}
        for d, c, p in zip(docs, configs, paths, strict=True)
    ]
    seconds = [m["bench_seconds"] for m in machine["merged"]]
    if all(s is not None for s in seconds):
        machine["bench_seconds"] = round(sum(seconds), 1)
    done, planned = count_done(config, sizes, records), count_runs(config, sizes)
    if done < planned:
        machine["partial"] = {"done": done, "planned": planned}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = write_report(out, config, machine, sizes, records)
    print(f"daskpri bench: {done} runs of {len(docs)} benchmarks pooled, seeds "
          f"{config.seed_span}; report in {out / 'results.md'}", flush=True)
    return summary


def _invocation(machine: Mapping[str, Any], runs: int) -> dict[str, Any]:
    """What a resumed benchmark's report keeps of an earlier invocation.

    Its own command, CPU, load and seconds: ``machine["bench_seconds"]``
    counts the invocations before it too (``machine["earlier"]``).
    """
    earlier = machine.get("earlier") or ()
    total = machine.get("bench_seconds")
    own = None if total is None else round(
        total - sum(e.get("bench_seconds") or 0.0 for e in earlier), 1)
    return {"command": machine.get("command"), "cpu": machine.get("cpu"),
            "bench_seconds": own, "runs": runs,
            "load_average_start": machine.get("load_average_start"),
            "load_average_end": machine.get("load_average_end")}


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
    accuracies measured on a handful of samples.

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


def run_bench(
    config: BenchConfig,
    out: str | os.PathLike[str],
    *,
    progress: bool = True,
    command: str | None = None,
    resume: bool = False,
    root: str | os.PathLike[str] | None = None,
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
        with _Clusters(config.scheduler) as clusters:
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


def report_only(out: str | os.PathLike[str]) -> dict[str, Any]:
    """Write the report of ``out``'s ``results.json`` as it stands, making no runs.

    For a benchmark that stopped before its end (a time limit, a lost
    machine): the report is of the runs it made, under the options it was
    made with (stored in the file), and says how many of the runs planned
    those are. A complete benchmark's report is written again as it was.

    Returns
    -------
    dict
        The summary, as ``results.json`` now holds it.
    """
    path = Path(out) / RESULTS_JSON
    if not path.exists():
        raise FileNotFoundError(
            f"--report-only: {path} does not exist; it is written by `daskpri bench --out "
            f"{out}` after each run"
        )
    doc = _read_results(path, "--report-only")
    try:
        config = BenchConfig.from_dict(doc["config"])
        records = [RunRecord.from_dict(r) for r in doc["runs"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--report-only: {path} is not a daskpri bench results.json ({e})") \
            from None
    machine, sizes = doc["machine"], doc["train_samples"]
    done, planned = count_done(config, sizes, records), count_runs(config, sizes)
    machine.pop("partial", None)
    if done < planned:
        machine["partial"] = {"done": done, "planned": planned}
    summary = write_report(Path(out), config, machine, sizes, records)
    print(f"daskpri bench: report of {done} of {planned} runs in {Path(out) / 'results.md'}",
          flush=True)
    return summary
