"""``daskpri bench --merge``: the seeds of several benchmarks pooled into one report."""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from daskpri.bench.config import BenchConfig
from daskpri.bench.protocol import count_done, count_runs, make_arms
from daskpri.bench.report import RESULTS_JSON, check_report_files, write_report
from daskpri.bench.stored import _clusters, _parsed, _read_results

#: What two benchmarks' machines must share for their times to be pooled.
_SAME_MACHINE = ("cores", "processor", "cpu", "torch_cpu_capability", "cuda", "gpu",
                 "python", "torch", "dask", "distributed", "numpy", "daskpri")


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
    model, GPU, core count, or the versions of Python, torch, dask, distributed,
    numpy and daskpri), another dataset size, a seed in
    two parts, a gap between the parts' seeds, runs on the LocalClusters
    of one part against runs on a ``--scheduler``'s workers in another (the
    scheduler's address may differ).

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
    # every field checked, before any is compared
    parsed = [_parsed(doc, path, what) for doc, path in zip(docs, paths, strict=True)]
    configs, runs = [c for c, _ in parsed], [r for _, r in parsed]
    # in the order of their seeds: the report lists the parts, and holds the runs, in it
    order = sorted(range(len(docs)), key=lambda i: configs[i].first_seed)
    docs, paths = [docs[i] for i in order], [paths[i] for i in order]
    configs, runs = [configs[i] for i in order], [runs[i] for i in order]
    # of the configs read (a field a file lacks takes its default, as --report-only has it)
    common = [a for a in configs[0].strategies if all(a in c.strategies for c in configs[1:])]
    if strategies is not None:
        for arm in strategies:
            for c, path in zip(configs, paths, strict=True):
                if arm != "uniform" and arm not in c.strategies:
                    raise ValueError(f"{what}: {path} has no arm {arm!r}; the arms every part "
                                     f"ran are {', '.join(common)}")
        common = ["uniform", *(a for a in strategies if a != "uniform")]

    def projected(doc: dict[str, Any]) -> dict[str, Any]:
        cfg = dict(doc["config"])
        cfg["strategies"] = common
        cfg["strategy_options"] = [o for o in cfg.get("strategy_options") or () if o[0] in common]
        for k in ("seeds", "first_seed"):
            cfg.pop(k, None)
        # the address may differ, not whether the runs were on a scheduler's workers
        cfg["scheduler"] = _clusters(None if cfg.get("scheduler") is None else "")
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
                   "scheduler": configs[0].scheduler}
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
         "load_average_end": d["machine"].get("load_average_end"),
         # its arms not pooled (another part lacks them, or --strategies left them out)
         "left_out": [a for a in c.strategies if a not in common]}
        for d, c, p in zip(docs, configs, paths, strict=True)
    ]
    seconds = [m["bench_seconds"] for m in machine["merged"]]
    if all(s is not None for s in seconds):
        machine["bench_seconds"] = round(sum(seconds), 1)
    done, planned = count_done(config, sizes, records), count_runs(config, sizes)
    if done < planned:
        machine["partial"] = {"done": done, "planned": planned}
    check_report_files(out, config)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = write_report(out, config, machine, sizes, records)
    print(f"daskpri bench: {done} runs of {len(docs)} benchmarks pooled, seeds "
          f"{config.seed_span}; report in {out / 'results.md'}", flush=True)
    return summary
