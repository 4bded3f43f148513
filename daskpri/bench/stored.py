"""A benchmark's ``results.json`` read back, making no runs.

The runs a resumed benchmark keeps (``--resume``) and what its report keeps
of the invocations before, and the report of a benchmark as it stands
(``--report-only``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from daskpri.bench.config import BenchConfig
from daskpri.bench.protocol import count_done, count_runs
from daskpri.bench.records import RunRecord
from daskpri.bench.report import RESULTS_JSON, write_report


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
    lacking = [k for k in _MACHINE_NAMED if k not in doc["machine"]]
    if lacking:  # else a KeyError as the report is written, its results.json already replaced
        raise ValueError(f"{what}: {path} is not a daskpri bench results.json (its machine has "
                         f"no {', '.join(map(repr, lacking))})")
    doc["config"].setdefault("first_seed", 0)
    doc["config"].setdefault("label_smoothing", 0.0)  # a file from before the option: none
    doc["config"].setdefault("precision", "float32")  # the same
    return doc


#: what the report says of the machine, which every results.json records
_MACHINE_NAMED = ("cores", "processor", "platform", "python", "torch", "dask", "distributed")


def _clusters(scheduler: object) -> str:
    """Where a benchmark's daskpri runs trained, as a ``--resume`` or ``--merge`` error names it.

    The scheduler's address may change between invocations (a cluster
    started again), but runs on the LocalClusters the benchmark starts (CPU
    workers on this machine) and runs on a given scheduler's workers (other
    machines, GPUs) do not measure the same thing: their times do not pool.

    Examples
    --------
    >>> _clusters(None)
    'LocalClusters (no --scheduler)'
    >>> _clusters("tcp://10.0.0.5:8786")
    'the workers of --scheduler tcp://10.0.0.5:8786'
    """
    if scheduler is None:
        return "LocalClusters (no --scheduler)"
    # (merge compares "" for any address)
    return f"the workers of --scheduler {scheduler}" if scheduler else (
        "the workers of a --scheduler")


def _parsed(doc: Mapping[str, Any], path: Path, what: str) -> tuple[BenchConfig, list[RunRecord]]:
    """The config and the runs of ``doc`` (read by :func:`_read_results` from ``path``).

    A field of the config, or a run, that does not parse is an error naming
    the file (and the run), not a ``KeyError`` from deep in a record.
    """
    try:
        config = BenchConfig.from_dict(doc["config"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{what}: {path} is not a daskpri bench results.json ({e})") from None
    records = []
    for i, run in enumerate(doc["runs"]):
        try:
            records.append(RunRecord.from_dict(run))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            detail = f"no {e}" if isinstance(e, KeyError) else str(e)
            raise ValueError(f"{what}: {path} is not a daskpri bench results.json (its run "
                             f"{i + 1} of {len(doc['runs'])}: {detail})") from None
    return config, records


def previous_runs(path: Path, config: BenchConfig,
                  sizes: Mapping[str, int]) -> list[RunRecord]:
    """The runs that ``path`` (a ``results.json``) holds, made with ``config``.

    Empty where ``path`` does not exist (the benchmark stopped before its
    first run ended). Its seeds may be fewer than ``config``'s: a benchmark
    of seeds 0-9 resumed with 20 seeds keeps its runs and adds seeds 10-19
    (each seed's arms still run side by side), for a narrower interval. A
    file made with other options (the scheduler's address aside, not whether
    there was one), with a
    seed that ``config`` does not run, or with other datasets is refused,
    naming what differs: its runs would not be the ones this benchmark
    asks for.
    """
    import json

    if not path.exists():
        return []
    doc = _read_results(path, "--resume")
    theirs = doc["config"]
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
    if (theirs.get("scheduler") is None) != (config.scheduler is None):  # its address may change
        differ.append(f"clusters: {_clusters(theirs.get('scheduler'))} there, "
                      f"{_clusters(config.scheduler)} here")
    if doc.get("train_samples") != dict(sizes):
        differ.append(f"samples per dataset: {doc.get('train_samples')!r} there, "
                      f"{dict(sizes)!r} here")
    if differ:
        raise ValueError(
            f"--resume: {path} was made with other options ({'; '.join(differ)}); resume with "
            f"the options it was made with{_as_made(doc['machine'])}, or give another --out"
        )
    return _parsed(doc, path, "--resume")[1]


def _as_made(machine: Mapping[str, Any]) -> str:
    """The command that resumes the benchmark whose results.json holds ``machine``, to quote.

    Its recorded command (``--resume`` added where it lacks it), where one
    ``daskpri bench`` made its runs; empty for a ``--merge``'s pool or a
    file that recorded none.

    Examples
    --------
    >>> _as_made({"command": "daskpri bench --quick --out b"})
    ' (`daskpri bench --quick --out b --resume`)'
    >>> _as_made({"command": "daskpri bench --out b --resume"}), _as_made({"command": None})
    (' (`daskpri bench --out b --resume`)', '')
    """
    import shlex

    command = machine.get("command")
    if not isinstance(command, str) or machine.get("merged"):
        return ""
    try:
        resumes = "--resume" in shlex.split(command)
    except ValueError:  # not a command line as shlex.join writes one
        return ""
    return f" (`{command if resumes else command + ' --resume'}`)"


def _invocation(machine: Mapping[str, Any], runs: int) -> dict[str, Any]:
    """What a resumed benchmark's report keeps of an earlier invocation.

    Its own command, CPU, load and seconds: ``machine["bench_seconds"]``
    counts the invocations before it too (``machine["earlier"]``). A
    ``--merge``'s pool keeps its parts (``machine["merged"]``): the report
    of the benchmark that resumes it names them, as the pool's report did.
    """
    earlier = machine.get("earlier") or ()
    total = machine.get("bench_seconds")
    own = None if total is None else round(
        total - sum(e.get("bench_seconds") or 0.0 for e in earlier), 1)
    return {"command": machine.get("command"), "cpu": machine.get("cpu"),
            "bench_seconds": own, "runs": runs,
            "load_average_start": machine.get("load_average_start"),
            "load_average_end": machine.get("load_average_end"),
            **({"merged": machine["merged"]} if machine.get("merged") else {})}


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
    config, records = _parsed(doc, path, "--report-only")
    machine, sizes = doc["machine"], doc["train_samples"]
    done, planned = count_done(config, sizes, records), count_runs(config, sizes)
    machine.pop("partial", None)
    if done < planned:
        machine["partial"] = {"done": done, "planned": planned}
    summary = write_report(Path(out), config, machine, sizes, records)
    print(f"daskpri bench: report of {done} of {planned} runs in {Path(out) / 'results.md'}",
          flush=True)
    return summary
