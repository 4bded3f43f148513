"""``daskpri bench --merge``: the seeds of benchmarks run in parts, pooled into one report.

The parts are real ``results.json`` files, written by the report's own
writer from records of the protocol's runs with made-up curves (the merge
makes no runs, so no cluster is needed to test it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from daskpri.bench import BenchConfig, count_runs, next_runs
from daskpri.bench.analysis import summarize
from daskpri.bench.protocol import count_done
from daskpri.bench.records import Curve, RunRecord
from daskpri.bench.report import write_json
from daskpri.bench.runner import merge_results
from daskpri.cli import main

SIZES = {"mnist1d": 16000}
MACHINE = {"cores": 2, "processor": "x86_64", "cpu": "AMD EPYC", "platform": "p",
           "python": "3.11", "torch": "2.13.0", "dask": "2026.8.0",
           "distributed": "2026.8.0", "numpy": "2.3.0", "daskpri": "0.1.0", "cuda": False,
           "gpu": None}


def _config(**kw: object) -> BenchConfig:
    base: dict[str, object] = {
        "models": ("mlp",), "seeds": 2, "ddp": False, "learning_rates": (0.05, 0.1),
        "strategies": ("uniform", "loss"), "budget": 10.0,
        "strategy_options": (("loss", "epsilon", 0.5),),
    }
    return BenchConfig(**{**base, **kw})  # type: ignore[arg-type]


def _curve(spec) -> Curve:
    """Seconds that grow with the seed, faster for loss and at lr 0.1."""
    pace = (1.0 + 0.25 * spec.seed) * (0.5 if spec.arm.label == "loss" else 1.0)
    pace *= 1.0 if spec.learning_rate == 0.1 else 2.0
    times = [pace * i for i in (1.0, 2.0, 3.0, 4.0)]
    return Curve(times, [10, 20, 30, 40], [0.5, 0.7, 0.8, 0.9], [1.0] * 4)


def _simulate(cfg: BenchConfig) -> list[RunRecord]:
    """Run the protocol to the end, each run's curve made up from its spec."""
    records: list[RunRecord] = []
    while specs := next_runs(cfg, SIZES, records):
        for s in specs:
            records.append(RunRecord(s, _curve(s), samples=128 * 40,
                                     grad_samples=s.arm.grads_per_step * s.n_workers * 40,
                                     wall_seconds=_curve(s).time[-1] + 1.0))
        assert len(records) <= count_runs(cfg, SIZES)
    return records


def _part(path: Path, cfg: BenchConfig) -> Path:
    """A benchmark's directory as ``daskpri bench`` leaves it (its results.json is all
    a merge reads; the rest of the report is left out, to keep the tests fast)."""
    path.mkdir()
    command = f"daskpri bench --out {path} --first-seed {cfg.first_seed}"
    write_json(path / "results.json", cfg, {**MACHINE, "command": command,
                                            "bench_seconds": 100.0,
                                            "load_average_start": [1.0, 1.0, 1.0]},
               SIZES, _simulate(cfg))
    return path


def _edit(path: Path, change) -> None:
    doc = json.loads((path / "results.json").read_text())
    change(doc)
    (path / "results.json").write_text(json.dumps(doc))


def test_merge_pools_the_parts_seeds_as_one_benchmark_of_them_all_would(tmp_path: Path):
    # on a scheduler each, whose address changed between them
    a = _part(tmp_path / "a", _config(first_seed=0, scheduler="tcp://10.0.0.5:8786"))
    # the second part ran one more arm, which the first did not: it is left out
    b = _part(tmp_path / "b", _config(first_seed=2, strategies=("uniform", "loss", "length"),
                                      scheduler="tcp://10.0.0.6:8786"))
    out = tmp_path / "merged"
    summary = merge_results([b, a], out, command="daskpri bench --merge b,a")
    doc = json.loads((out / "results.json").read_text())
    whole = _config(seeds=4)
    assert BenchConfig.from_dict(doc["config"]) == whole
    assert doc["config"]["scheduler"] == "tcp://10.0.0.5:8786"  # a --resume takes one again
    assert {r["spec"]["arm"]["label"] for r in doc["runs"]} == {"uniform", "loss"}
    # the runs of the part of the first seeds first, whatever the order named
    first = [r["spec"]["seed"] < 2 for r in doc["runs"]]
    assert first == sorted(first, reverse=True) and any(first) and not all(first)
    # the same tables as one benchmark of seeds 0-3 would have given
    assert summary == summarize(whole, _simulate(whole), SIZES)
    assert summary != summarize(_config(), _simulate(_config()), SIZES)
    md = (out / "results.md").read_text()
    assert "Command: `daskpri bench --merge b,a`" in md
    assert "Seeds: 0–3 (each seeds" in md
    assert "Benchmark time: 200.0 s" in md
    assert md.index(f"- seeds 0–1: `daskpri bench --out {a} --first-seed 0`; 100.0 s") < md.index(
        f"- seeds 2–3: `daskpri bench --out {b} --first-seed 2`; 100.0 s")
    assert "Partial" not in md
    # the arm only one part ran is left out of the tables, and the report says so
    assert "| length |" not in md and "Targets" in md
    assert md.index("- seeds 0–1: ") < md.index(
        "- seeds 2–3: ") < md.index("; left out: its runs of length (only the arms that every "
                                    "part ran, or that --strategies names, are pooled)")
    assert md.count("left out: its runs of") == 1
    assert (out / "results.html").exists() and (out / "accuracy_mnist1d_mlp.png").exists()
    # each run as its part stored it, every field kept
    runs = [r for p in (a, b) for r in json.loads((p / "results.json").read_text())["runs"]
            if r["spec"]["arm"]["label"] in ("uniform", "loss")]
    assert doc["runs"] == runs


def test_merge_takes_the_arms_asked_for_and_says_what_a_part_lacks(tmp_path: Path):
    three = ("uniform", "loss", "projection")
    a = _part(tmp_path / "a", _config(first_seed=0, strategies=three))
    b = _part(tmp_path / "b", _config(first_seed=2, strategies=three))
    merge_results([a, b], tmp_path / "projection", strategies=["projection"])
    doc = json.loads((tmp_path / "projection" / "results.json").read_text())
    assert doc["config"]["strategies"] == ["uniform", "projection"]
    assert doc["config"]["strategy_options"] == []  # loss's, with loss
    # projection's baseline of equal gradients stays with it
    assert {r["spec"]["arm"]["label"] for r in doc["runs"]} == {
        "uniform", "uniform@144", "projection"}
    assert "uniform@144" in (tmp_path / "projection" / "results.md").read_text()
    c = _part(tmp_path / "c", _config(first_seed=4))
    with pytest.raises(ValueError, match=f"--merge: {c / 'results.json'} has no arm 'projection'; "
                                         "the arms every part ran are uniform, loss"):
        merge_results([a, b, c], tmp_path / "x", strategies=["projection"])
    assert not (tmp_path / "x").exists()


def test_a_part_that_stopped_early_makes_a_partial_report(tmp_path: Path):
    a = _part(tmp_path / "a", _config(first_seed=0))
    b = _part(tmp_path / "b", _config(first_seed=2))
    _edit(b, lambda d: d.update(runs=d["runs"][:3]))
    merge_results([a, b], tmp_path / "out")
    md = (tmp_path / "out" / "results.md").read_text()
    runs = [RunRecord.from_dict(r) for p in (a, b)
            for r in json.loads((p / "results.json").read_text())["runs"]]
    done = count_done(_config(seeds=4), SIZES, runs)
    assert 0 < done < count_runs(_config(seeds=4), SIZES)
    assert (f"**Partial: {done} of the {count_runs(_config(seeds=4), SIZES)} runs planned.** "
            "A benchmark merged here stopped before its end") in md


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["config"].update(budget=20.0),
     r"the parts were made with other options \(budget: 10.0 in .*a/results.json, 20.0 in "
     r".*b/results.json\); only their seeds may differ"),
    (lambda d: d["config"].update(strategy_options=[["loss", "epsilon", 0.25, None]]),
     r"other options \(strategy_options: "),
    (lambda d: d.update(train_samples={"mnist1d": 8000}),
     r"other options \(samples per dataset: \{'mnist1d': 16000\} in .*, \{'mnist1d': 8000\}"),
    (lambda d: d["machine"].update(cpu="Intel Xeon"),
     r"the parts ran on other machines \(cpu: 'AMD EPYC' in .*, 'Intel Xeon' in .*\); "
     r"their times do not pool"),
    (lambda d: d["machine"].update(daskpri="0.2.0"),  # (a part of a newer daskpri)
     r"other machines \(daskpri: '0.1.0' in .*, '0.2.0' in .*\); their times do not pool"),
    (lambda d: d["machine"].update(cuda=True, gpu="NVIDIA H200"),
     r"other machines \(cuda: False in .*, True in .*; gpu: None in .*, 'NVIDIA H200' in"),
    (lambda d: d["config"].update(scheduler="tcp://10.0.0.5:8786"),
     r"other options \(scheduler: 'LocalClusters \(no --scheduler\)' in .*a/results.json, "
     r"'the workers of a --scheduler' in .*b/results.json\)"),
    (lambda d: d["config"].update(first_seed=1),
     r"a/results.json \(seeds 0–1\) and .*b/results.json \(from seed 1\) share seeds"),
    (lambda d: d["config"].update(first_seed=3),
     r"\(from seed 3\) leave a gap between their seeds; the parts' seeds should follow on"),
    (lambda d: d.pop("runs"), r"b/results.json is not a daskpri bench results.json \('runs'\)"),
    (lambda d: d["config"].update(seeds="ten"),
     r"b/results.json is not a daskpri bench results.json \(seeds should be "),
])
def test_merge_refuses_parts_that_do_not_pool_naming_what_differs(tmp_path: Path, change,
                                                                  message: str):
    a = _part(tmp_path / "a", _config(first_seed=0))
    b = _part(tmp_path / "b", _config(first_seed=2))
    _edit(b, change)
    with pytest.raises(ValueError, match=message):
        merge_results([a, b], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_merge_needs_two_parts_that_exist(tmp_path: Path):
    a = _part(tmp_path / "a", _config(first_seed=0))
    with pytest.raises(ValueError, match="--merge pools two benchmarks or more, but got 1"):
        merge_results([a], tmp_path / "out")
    with pytest.raises(FileNotFoundError, match=r"--merge: .*none/results.json does not exist"):
        merge_results([a, tmp_path / "none"], tmp_path / "out")
    with pytest.raises(ValueError, match="names a directory twice"):
        merge_results([a, tmp_path / "a" / ".." / "a"], tmp_path / "out")


def test_the_command_merges_and_refuses_options_of_its_own(tmp_path: Path, capsys):
    a = _part(tmp_path / "a", _config(first_seed=0))
    b = _part(tmp_path / "b", _config(first_seed=2))
    out = tmp_path / "out"
    parts = f"{a},{b}"
    assert main(["bench", "--out", str(out), "--merge", parts, "--budget", "3"]) == 2
    assert ("--merge takes the options the parts were made with, but got --budget; with "
            "--merge, give only --out, --strategies and --no-progress") in capsys.readouterr().err
    assert main(["bench", "--out", str(out), "--merge", parts, "--resume"]) == 2
    assert "pass it without --resume and --report-only" in capsys.readouterr().err
    assert not out.exists()
    assert main(["bench", "--out", str(out), "--merge", parts, "--no-progress"]) == 0
    n = count_runs(_config(seeds=4), SIZES)
    assert f"{n} runs of 2 benchmarks pooled, seeds 0–3" in capsys.readouterr().out
    md = (out / "results.md").read_text()
    assert f"Command: `daskpri bench --out {out} --merge {parts} --no-progress`" in md
    # the report it wrote is not replaced
    assert main(["bench", "--out", str(out), "--merge", parts]) == 2
    assert "give --merge another --out (or remove that file)" in capsys.readouterr().err
    assert (out / "results.md").read_text() == md
    # and --report-only writes it again as it was (--traceback, the command line's own, taken)
    (out / "results.md").unlink()
    assert main(["bench", "--out", str(out), "--report-only", "--traceback"]) == 0
    assert (out / "results.md").read_text() == md
    with pytest.raises(ValueError, match="--merge names a directory twice"):  # as Python has it
        main(["bench", "--out", str(tmp_path / "x"), "--merge", f"{a},{a}/../a", "--traceback"])


@pytest.mark.parametrize(("change", "detail"), [
    (lambda d: d["runs"][2].pop("curve"), r"its run 3 of \d+: no 'curve'"),
    (lambda d: d["runs"].append(None), r"its run (\d+) of \1: 'NoneType' object"),
    (lambda d: d["machine"].pop("cores"), r"its machine has no 'cores'"),
], ids=["a run without its curve", "a run that is null", "a machine without its cores"])
def test_a_damaged_results_json_is_refused_naming_it_by_resume_report_only_and_merge(
    tmp_path: Path, capsys, change, detail: str
):
    from daskpri.bench.stored import previous_runs

    a = _part(tmp_path / "a", _config(first_seed=0))
    b = _part(tmp_path / "b", _config(first_seed=2))
    _edit(b, change)
    path = b / "results.json"
    message = f"{path} is not a daskpri bench results.json \\({detail}"
    with pytest.raises(ValueError, match=f"--merge: {message}"):
        merge_results([a, b], tmp_path / "out")
    with pytest.raises(ValueError, match=f"--resume: {message}"):
        previous_runs(path, _config(first_seed=2), SIZES)
    assert main(["bench", "--out", str(b), "--report-only"]) == 2
    assert re.search(f"^daskpri: error: --report-only: {message}", capsys.readouterr().err)


def test_merge_reads_a_part_whose_config_lacks_a_field_as_report_only_does(tmp_path: Path):
    a = _part(tmp_path / "a", _config(first_seed=0))
    b = _part(tmp_path / "b", _config(first_seed=2))
    _edit(b, lambda d: d["config"].pop("strategies"))  # its default: every strategy
    merge_results([a, b], tmp_path / "out")
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["config"]["strategies"] == ["uniform", "loss"]


def test_resume_refuses_to_move_a_benchmark_between_local_clusters_and_a_scheduler(
    tmp_path: Path
):
    from daskpri.bench.stored import previous_runs

    path = _part(tmp_path / "a", _config(scheduler="tcp://10.0.0.5:8786")) / "results.json"
    # the scheduler started again elsewhere: the runs made are kept
    assert previous_runs(path, _config(scheduler="tcp://10.0.0.6:8786"), SIZES)
    with pytest.raises(ValueError, match=r"--resume: .*a/results.json was made with other "
                       r"options \(clusters: the workers of --scheduler tcp://10.0.0.5:8786 "
                       r"there, LocalClusters \(no --scheduler\) here\); resume with"):
        previous_runs(path, _config(), SIZES)


def test_resume_with_other_options_quotes_the_command_that_made_the_runs(tmp_path: Path):
    from daskpri.bench.stored import previous_runs

    path = _part(tmp_path / "a", _config()) / "results.json"
    with pytest.raises(ValueError, match=r"\(budget: 10.0 there, 20.0 here\); resume with the "
                       r"options it was made with \(`daskpri bench --out .*a --first-seed 0 "
                       r"--resume`\), or give another --out$"):
        previous_runs(path, _config(budget=20.0), SIZES)


def test_a_merges_pool_resumed_keeps_its_parts_in_the_report(tmp_path: Path, capsys):
    from daskpri.bench.runner import run_bench

    global SIZES
    small = {"datasets": ("synthetic",), "n_samples": 2000}
    sizes, SIZES = SIZES, {"synthetic": 1600}  # what load("synthetic", n_samples=2000) gives
    try:
        a = _part(tmp_path / "a", _config(first_seed=0, **small))
        b = _part(tmp_path / "b", _config(first_seed=2, **small))
    finally:
        SIZES = sizes
    out = tmp_path / "merged"
    merge_results([a, b], out, command="daskpri bench --merge a,b")
    pooled = json.loads((out / "results.json").read_text())
    # every run is made: the resume makes none (no cluster), and writes the report again
    records = run_bench(_config(seeds=4, **small), out, resume=True, progress=False,
                        command="daskpri bench --out merged --resume")
    resumed = json.loads((out / "results.json").read_text())
    assert len(records) == len(pooled["runs"]) and resumed["runs"] == pooled["runs"]
    machine = resumed["machine"]
    assert [e["merged"] for e in machine["earlier"]] == [pooled["machine"]["merged"]]
    md = (out / "results.md").read_text()
    assert (f"- `daskpri bench --merge a,b`: {len(records)} runs, 200.0 s, AMD EPYC, load "
            "average (1/5/15 min) at start —, at end —; a `--merge` of seeds 0–1: "
            f"`daskpri bench --out {a} --first-seed 0`; seeds 2–3: `daskpri bench --out {b} "
            "--first-seed 2`") in md
