"""The benchmark's report: ``results.json``, ``results.md``, PNG plots and ``results.html``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from daskpri.bench._cells import (
    _cuda,
    _interval,
    _num,
    _paired,
    _parts,
    _pct,
    _seconds,
    _seeds,
    _share,
    _table,
    fmt_ratio,
    fmt_spread,
)
from daskpri.bench.analysis import (
    CONFIDENCE,
    LATE,
    PARTS,
    summarize,
)
from daskpri.bench.config import BenchConfig
from daskpri.bench.protocol import COARSE_RATIO
from daskpri.bench.records import RunRecord
from daskpri.data.store import write_atomic

__all__ = [
    "check_report_files", "fmt_ratio", "fmt_spread", "render_markdown", "report_files",
    "write_json", "write_report",
]


#: the file of every run and the tables, in the output directory
RESULTS_JSON = "results.json"


def _jsonable(obj: Any) -> Any:
    """Plain JSON values: dataclasses as dicts, non-finite floats as ``null``."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item"):  # numpy scalars
        return _jsonable(obj.item())
    return obj


def write_json(
    path: Path,
    config: BenchConfig,
    machine: Mapping[str, Any],
    sizes: Mapping[str, int],
    records: Sequence[RunRecord],
    summary: Mapping[str, Any] | None = None,
) -> None:
    """Write every run's curve, the config, the machine and (at the end) the tables."""
    doc = {
        "config": config.to_dict(),
        "machine": dict(machine),
        "train_samples": dict(sizes),
        "summary": summary,
        "runs": [r.to_dict() for r in records],
    }
    # atomic: results.json may hold hours of runs, which a half-written one loses
    write_atomic(path, json.dumps(_jsonable(doc), allow_nan=False))


def _time_parts(summary: Mapping[str, Any], dm: tuple[str, str]) -> list[str]:
    """The table of where each arm's step time goes (none for results that lack it)."""
    rows = _rows(summary, "budgets", dm)
    if all(r["time_shares"]["compute"].n == 0 for r in rows):
        return []
    lines = ["### Where the training time goes", "",
             "Share of the step time, median [min–max] over seeds: the slowest worker's "
             "computation; communication; selection (the table's update and the next "
             "samples' selection, where the workers wait for it); the optimizer. Rounds selected "
             "ahead were selected while the workers computed the round before; the others "
             "were selected after it, while the workers waited (a strategy that reads a "
             "priority still in flight).", ""]
    table = [
        [r["arm"], *(_share(r["time_shares"][part]) for part in PARTS),
         _share(r["selected_ahead"])]
        for r in rows
    ]
    return lines + _table(["arm", *PARTS, "rounds selected ahead"], table)


def render_markdown(config: BenchConfig, machine: Mapping[str, Any],
                    summary: Mapping[str, Any], pngs: Sequence[str]) -> str:
    """The report's tables and protocol, as markdown."""
    lines = ["# daskpri bench", ""]
    if machine.get("command"):
        lines += [f"Command: `{machine['command']}`", ""]
    load = tuple(machine.get(k) or "—" for k in ("load_average_start", "load_average_end"))
    cpu = f"{machine['cpu']}; " if machine.get("cpu") else ""
    if machine.get("torch_cpu_capability"):
        cpu += f"torch's CPU kernels {machine['torch_cpu_capability']}; "
    if machine.get("cpu_low_precision") is not None:
        flags = ", ".join(machine["cpu_low_precision"]) or "none"
        cpu += f"bfloat16/float16 instructions {flags}; "
    lines += [
        f"Machine: {machine['cores']} cores ({machine['processor']}; {cpu}{machine['platform']}), "
        f"CUDA {_cuda(machine)}; Python {machine['python']}, "
        f"torch {machine['torch']}, dask {machine['dask']}, distributed "
        f"{machine['distributed']}. "
        + ("" if machine.get("merged") else
           f"Load average (1/5/15 min) at start {load[0]}, at end {load[1]}. ")
        + f"Benchmark time: {machine.get('bench_seconds', '?')} s"
        + (f" (resumed: {machine['resumed_runs']} runs kept from an earlier invocation, "
           "whose machine and time are not the ones above)." if machine.get("resumed_runs")
           and not machine.get("earlier") else "."),
        "",
        *([f"Resumed (`--resume`): the benchmark time is that of {len(machine['earlier']) + 1}"
           " invocations together; the runs of the earlier ones, with their machine and load:",
           "",
           *(f"- `{e['command'] or 'daskpri bench'}`: {e['runs']} runs, "
             f"{'?' if e.get('bench_seconds') is None else e['bench_seconds']} s, "
             f"{e.get('cpu') or 'CPU not recorded'}, load average (1/5/15 min) at start "
             f"{e.get('load_average_start') or '—'}, at end {e.get('load_average_end') or '—'}"
             + _parts(e.get("merged"))
             for e in machine["earlier"]), ""]
          if machine.get("earlier") else []),
        *([f"Merged (`--merge`, no runs made) from {len(machine['merged'])} benchmarks of the "
           "same options on this kind of machine, each with seeds of its own; the benchmark "
           "time is theirs together:", "",
           *(f"- {_seeds(m['seeds'])}: `{m['command'] or m['path']}`; "
             f"{m.get('bench_seconds', '?')} s, load average (1/5/15 min) at start "
             f"{m.get('load_average_start') or '—'}, at end {m.get('load_average_end') or '—'}"
             + (f"; left out: its runs of {', '.join(m['left_out'])} (only the arms "
                "that every part ran, or that --strategies names, are pooled)"
                if m.get("left_out") else "")
             for m in machine["merged"]), ""]
          if machine.get("merged") else []),
        *([f"**Partial: {machine['partial']['done']} of the {machine['partial']['planned']} "
           "runs planned.** "
           + ("A benchmark merged here stopped before its end: " if machine.get("merged") else
              "The benchmark stopped before its end, and this report was written from its "
              "results.json by `--report-only`: ")
           + "phases and seeds it had not reached are missing from the tables, and the targets "
           "and learning rates come from the runs it made. `--resume` with the same options "
           "makes the rest.", ""]
          if machine.get("partial") else []),
        f"Protocol: every run trains for the same budget of {config.budget:g} s of training "
        "time (the history's `time`: it charges every cost of a strategy — scoring passes, "
        "per-sample gradients, table updates, selection, communication — and excludes only "
        f"the evaluations), evaluating on the test set {_evaluations(config)}. "
        f"Comparison on {config.main_workers} worker(s), batch {config.batch_size} per worker, "
        f"partitions of at most {config.partition_size} samples, as many for every worker, "
        f"SGD with momentum {config.momentum:g}"
        + (f", gradients clipped to L2 norm {config.max_grad_norm:g} (in every run and "
           "baseline)" if config.max_grad_norm is not None else "")
        + (f", label smoothing {config.label_smoothing:g} in every run's and baseline's "
           "training loss (the losses ranked stay the plain cross-entropy)"
           if config.label_smoothing else "")
        + (f", the training passes in {config.precision} (torch.autocast, in every run and "
           "baseline)" if config.precision != "float32" else "")
        + (
            f", {config.local_steps} local steps per round trip (local SGD; projection and "
            "length take 1)"
            if config.local_steps > 1
            else ", synchronous (one round trip per step)"
        )
        + (
            f", the table's staleness model {config.staleness}"
            if config.staleness != "keep"
            else ""
        )
        + (
            ", strategy options "
            + ", ".join(f"{n}{'' if m is None else '@' + m}:{k}={v}"
                        for n, k, v, m in config.strategy_options)
            if config.strategy_options
            else ""
        )
        + ". One torch thread in each worker and in the driver. "
        f"Seeds: {config.seed_span} (each seeds the weights and the selections; the data "
        "split is fixed); "
        "values are medians over seeds with [min–max]. Arms run interleaved "
        "(for each dataset, model, seed and learning rate, every arm in turn). "
        "Targets: " + ", ".join(_pct(f) for f in config.target_fractions)
        + (" of uniform's median (over seeds) best accuracy, at the learning rate swept "
           "where it is highest. " if config.pick == "time" else
           " of the median (over seeds) best accuracy of the tuned uniform baseline. ")
        + "`n.r.`: not reached within the budget (a median of `n.r.` means half the seeds or "
        "more missed it); `≥`: uniform missed the target, so the speedup is at least the "
        "budget over the arm's time. `uniform@G`: uniform with batch G, as many gradients "
        "per step as the strategies that compute G. The speedup is uniform's median time "
        f"over the arm's; its {_pct(CONFIDENCE)} interval is a bootstrap over seeds (the "
        "seeds drawn with replacement, each arm's run with uniform's of its seed; a missed "
        "target counts as 0x; at least 3 seeds), which does not count the choice of each "
        "arm's learning rate from the sweep. samples/s counts every sample "
        "processed (forward passes for scoring included); grads/step/worker, measured, the "
        "samples backpropagated.",
        "",
    ]
    if len(config.learning_rates) == 1:
        lines += [f"**Single learning rate {config.learning_rates[0]:g}: no sweep"
                  + (" (--quick)" if config.quick else "") + ".**", ""]
    else:
        rule = (f"the one that reaches {_pct(max(config.target_fractions))} soonest "
                "(median seconds; the one of best median final accuracy where none does)"
                if config.pick == "time" else "the one of best median final accuracy")
        lines += ["Learning rates " + ", ".join(f"{lr:g}" for lr in config.learning_rates)
                  + f" swept for every arm; each keeps {rule}.", ""]
    if config.quick:
        lines += ["**--quick: small budgets and seeds; a smoke test of the protocol, "
                  "not a measurement to quote.**", ""]
    for dm in _pairs(summary):
        lines += _section(config, summary, dm)
    lines += _scaling_section(summary) + _overhead_section(config, summary)
    if pngs:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in pngs]
        lines += ["", "Interactive: [results.html](results.html).", ""]
    return "\n".join(lines)


def _evaluations(config: BenchConfig) -> str:
    """How often the daskpri runs evaluate, as the protocol line says it.

    Examples
    --------
    >>> _evaluations(BenchConfig(local_steps=16))
    'at the end of every round (16 steps)'
    >>> _evaluations(BenchConfig(local_steps=16, eval_every=32))
    'every 32 steps (every 2 rounds)'
    >>> _evaluations(BenchConfig())
    'every 20 steps'
    """
    every, k = config.eval_every, config.local_steps
    assert every is not None  # resolved on construction
    if k == 1:
        return f"every {every} steps"
    if every <= k:
        return f"at the end of every round ({k} steps)"
    return f"every {every} steps (every {every // k} rounds)"


def _pairs(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((r["dataset"], r["model"]) for r in summary["targets"]))


def _rows(summary: Mapping[str, Any], table: str, dm: tuple[str, str]) -> list[dict[str, Any]]:
    return [r for r in summary[table] if (r["dataset"], r["model"]) == dm]


def _section(config: BenchConfig, summary: Mapping[str, Any],
             dm: tuple[str, str]) -> list[str]:
    targets = _rows(summary, "targets", dm)
    lines = [f"## {dm[0]} / {dm[1]}", ""]
    if targets and math.isnan(targets[0]["uniform_best"]):
        lines += ["Targets: none: uniform has no accuracy at any learning rate swept (its runs "
                  "failed, see \"Failed runs\" below).", ""]
    elif targets:
        best = targets[0]["uniform_best"]
        lines += ["Targets: " + ", ".join(
            f"{_pct(t['fraction'])} → {t['target']:.4f}" for t in targets
        ) + f" (tuned uniform's median best accuracy {best:.4f}).", ""]
        late, runs = targets[0].get("uniform_late", (0, 0))
        if runs and late > runs / 2:
            lines += [f"**uniform's best accuracy came in the last {_pct(1 - LATE)} of the "
                      f"budget in {late} of its {runs} runs: it was still climbing, so the "
                      "targets are fractions of an accuracy it had not finished reaching. A "
                      "longer --budget measures against where it levels off.**", ""]
    n = config.main_workers
    lines += [f"### Time to target ({n} worker{'' if n == 1 else 's'})", ""]
    rows = [
        [r["arm"], _num(r["learning_rate"], "g"),
         f"{_pct(r['fraction'])} ({_num(r['target'], '.4f')})",
         fmt_spread(r["seconds"]), fmt_spread(r["steps"], 0),
         "—" if r["arm"] == "uniform" else fmt_ratio(r["vs_uniform"]),
         "—" if r["arm"] == "uniform" else _interval(r.get("vs_uniform_interval")),
         "—" if r["arm"] == "uniform" else _paired(r.get("vs_uniform_paired")),
         "—" if r["arm"] == r["equal_gradients"]
         else f"{fmt_ratio(r['vs_equal_gradients'])} (vs {r['equal_gradients']})"]
        for r in _rows(summary, "time_to_target", dm)
    ]
    lines += _table(["arm", "lr", "target", "seconds", "steps", "speedup vs uniform",
                     f"{_pct(CONFIDENCE)} interval", "paired by seed",
                     "speedup vs uniform of equal gradients"], rows)
    fractions = list(config.budget_fractions)
    lines += ["### Accuracy at equal wall-clock budgets", ""]
    rows = [
        [r["arm"], *(fmt_spread(r["at"][f], 4) for f in fractions), fmt_spread(r["best"], 4),
         fmt_spread(r["steps"], 0), fmt_spread(r["samples_per_second"], 0),
         _num(r["grads_per_step"], ".0f")]
        for r in _rows(summary, "budgets", dm)
    ]
    header = [f"{_pct(f)} ({f * config.budget:g} s)" for f in fractions]
    header[-1] += " = final"
    lines += _table(["arm", *header, "best", "steps", "samples/s", "grads/step/worker"], rows)
    lines += _time_parts(summary, dm)
    sweep = _rows(summary, "lr_sweep", dm)
    if len(config.learning_rates) > 1:
        headline = _pct(max(config.target_fractions))
        lines += [f"### Learning-rate sweep (final accuracy; seconds to {headline}; **picked**)",
                  ""]
        arms = list(dict.fromkeys(r["arm"] for r in sweep))
        rows = []
        for arm in arms:
            cells = []
            for r in (r for r in sweep if r["arm"] == arm):
                cell = f"{fmt_spread(r['final'], 4)}; {_seconds(r['seconds'].median)}"
                cells.append(f"**{cell}**" if r["picked"] else cell)
            rows.append([arm, *cells])
        lines += _table(["arm", *(f"lr {lr:g}" for lr in config.learning_rates)], rows)
        for r in sweep:
            if r.get("edge"):
                lines += [f"**{r['arm']}'s learning rate {r['learning_rate']:g} is the "
                          f"{r['edge']} swept: its best may lie outside the sweep; widen "
                          "--learning-rates.**", ""]
            if r.get("coarse"):
                rates = " and ".join(f"{x:g}" for x in r["coarse"])
                lines += [f"**{r['arm']}'s learning rate {r['learning_rate']:g} has {rates} "
                          f"next to it in the sweep, more than {COARSE_RATIO:g}x away: the "
                          "baseline's best may lie between, and the speedups are against "
                          "the best rate swept; add rates between to --learning-rates.**", ""]
    failed = _rows(summary, "failed", dm)
    if failed:
        lines += ["### Failed runs", "",
                  "Counted as never reaching a target, with no final accuracy (a run that "
                  "diverged stopped at the step whose loss was not finite).", ""]
        lines += [f"- {r['run']}: {r['error'].strip().splitlines()[-1]}" for r in failed]
        lines += [""]
    return lines


def _scaling_section(summary: Mapping[str, Any]) -> list[str]:
    rows = summary["scaling"]
    if not rows:
        return []
    target = rows[0]["target"]
    n0 = min(r["n_workers"] for r in rows)
    lines = ["## Scaling", "",
             "Every worker count ran side by side for each seed (in turn, the order reversed "
             "on every other seed). `vs n0`: each seed's samples/s over the same seed's on "
             f"the smallest worker count n0 = {n0}, median [min–max] over seeds; "
             "efficiency: its median over n/n0. `plain loops`: n plain PyTorch loops "
             "processing at once (one thread each, no communication) over n0 of them (one "
             "alone for n0 = 1), paired by seed likewise: what this machine gives n "
             "one-thread processes that share nothing (a reference, not a strict bound: "
             "a daskpri worker's step is not the plain loop's); "
             "`of plain loops`: daskpri's ratio over theirs (uniform only). Time efficiency: "
             "each seed's T_n0 / ((n/n0) T_n) to the first target, paired like the "
             "samples/s, median [min–max] (0 where n workers missed a target that n0 "
             "reached; seeds where n0 missed it are left out).", ""]
    body = [
        [f"{r['dataset']}/{r['model']}", r["arm"], str(r["n_workers"]),
         fmt_spread(r["samples_per_second"], 0), fmt_spread(r["vs_n0"], 2),
         _num(r["throughput_efficiency"]),
         "—" if r.get("plain_loops_vs_n0") is None else fmt_spread(r["plain_loops_vs_n0"], 2),
         _num(r.get("of_plain_loops", math.nan)),
         fmt_spread(r["seconds"]), fmt_spread(r["time_efficiency"], 2)]
        for r in rows
    ]
    return lines + _table(["dataset/model", "arm", "workers", "samples/s", "samples/s vs n0",
                           "efficiency", "plain loops vs n0", "of plain loops",
                           f"seconds to {_num(target, '.4f')}", "efficiency"], body)


def _overhead_section(config: BenchConfig, summary: Mapping[str, Any]) -> list[str]:
    rows = summary["overhead"]
    lines = ["## Overhead: daskpri against plain PyTorch", "",
             "Same model, SGD learning rate and momentum, batch per process; one torch thread "
             "per process. Baselines are evaluated every "
             f"{config.baseline_eval_seconds:g} s of training time. For each seed the "
             "baseline and a daskpri uniform run of as many processes and the same budget "
             "ran one after the other; `daskpri / baseline` is each seed's ratio of "
             "samples/s, median [min–max].", ""]
    k = config.local_steps
    lines += [f"daskpri's runs take {k} local step{'' if k == 1 else 's'} per round trip "
              "(--local-steps): each round pays a round trip between the driver and the "
              "workers, which the plain loop does not"
              + (", and on a small model it can cost more than the step itself; "
                 "--local-steps 512 measures the engine with it spread over many steps "
                 "(as the README's overhead figures are)." if k < 512 else "."), ""]
    if not config.ddp:
        lines += ["PyTorch DDP: not run (--no-ddp).", ""]
    body = [
        [f"{r['dataset']}/{r['model']}", r["baseline"], _num(r["baseline_budget"], "g", " s"),
         fmt_spread(r["baseline_samples_per_second"], 0),
         fmt_spread(r["daskpri_samples_per_second"], 0),
         fmt_spread(r["daskpri_over_baseline"], 2),
         _num(r["target"], ".4f"), fmt_spread(r["baseline_seconds"]),
         fmt_spread(r["daskpri_seconds"])]
        + ([f"failed: {r['errors'][0]}"] if r.get("errors") else [""])
        for r in rows
    ]
    return lines + _table(
        ["dataset/model", "baseline", "its budget", "baseline samples/s",
         "daskpri uniform samples/s (same processes)", "daskpri / baseline", "target",
         "baseline seconds", "daskpri seconds", "note"], body)


def report_files(config: BenchConfig) -> list[str]:
    """The names of the files :func:`write_report` writes into its directory for ``config``."""
    from daskpri.bench.png import png_names

    return [RESULTS_JSON, "results.md", "results.html", *png_names(config)]


def check_report_files(
    out: str | os.PathLike[str], config: BenchConfig, flag: str = "--out"
) -> None:
    """Refuse ``out`` if it holds a file of :func:`report_files` but no ``results.json``.

    With its results.json, ``out`` is a benchmark's directory and the
    report's files are that benchmark's; without, a ``speedup.png`` or an
    ``accuracy_mnist1d_mlp.png`` there is someone else's, which the report
    would replace after the benchmark ran. ``flag`` names the directory's
    parameter in the error.
    """
    directory = Path(out)
    if (directory / RESULTS_JSON).exists():
        return
    found = [name for name in report_files(config) if (directory / name).exists()]
    if found:
        raise ValueError(
            f"{flag} {os.fspath(out)!r} holds files the benchmark's report would replace "
            f"({', '.join(found)}), without a {RESULTS_JSON} beside them; give another {flag} "
            "(or remove those files)"
        )


def write_report(out: Path, config: BenchConfig, machine: dict[str, Any],
                 sizes: Mapping[str, int], records: Sequence[RunRecord]) -> dict[str, Any]:
    """Write results.json (with the tables), the PNGs, results.html and results.md."""
    from daskpri.bench import bokeh_page, png

    summary = summarize(config, records, dict(sizes))
    write_json(out / RESULTS_JSON, config, machine, sizes, records, summary)
    pngs = png.write_pngs(out, config, records, summary)
    bokeh_page.write_html(out / "results.html", config, records, summary)
    write_atomic(out / "results.md", render_markdown(config, machine, summary, pngs))
    return summary
