"""``daskpri bench``'s baselines (plain loops, DDP) and its end-to-end runs.

Real runs: the plain and DDP loops it compares daskpri with, and whole
benchmarks on a LocalCluster of its own or on a running scheduler.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import dask
import numpy as np
import pytest
import torch
from _bench_records import (
    LOSS,
    MACHINE,
    SIZES,
    UNIFORM,
    _config,
)

from daskpri.bench.baselines import train_ddp, train_plain, train_plain_loops
from daskpri.bench.records import Curve, RunRecord, RunSpec
from daskpri.bench.report import render_markdown, write_report
from daskpri.cli import main

# -- baselines ------------------------------------------------------------------------


def _tiny() -> tuple[tuple[np.ndarray, np.ndarray], object]:
    from daskpri.models import build_model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return (x, y), build_model("mlp", {"x_shape": (8,), "n_classes": 2})


def test_plain_loop_trains_for_its_budget_and_evaluates():
    data, model = _tiny()
    r = train_plain(model, data, data, batch_size=32, learning_rate=0.05, momentum=0.9,
                    budget=0.3, eval_seconds=0.1, seed=0)
    assert r.curve.time[-1] >= 0.3
    assert r.samples == 32 * r.curve.step[-1]
    assert not np.isnan(r.curve.accuracy[-1])


def test_plain_loop_clips_each_steps_gradient_to_the_norm_given():
    data, model = _tiny()
    start = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    moved = {}
    for norm in (1e-4, None):
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(start.clone(), model.parameters())
        r = train_plain(model, data, data, batch_size=32, learning_rate=0.5, momentum=0.0,
                        budget=0.2, eval_seconds=0.1, seed=0, max_grad_norm=norm)
        after = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        moved[norm] = (float(torch.linalg.vector_norm(after - start)), int(r.curve.step[-1]))
    # no momentum: each step moves the weights by at most lr x the norm
    distance, steps = moved[1e-4]
    assert 0 < distance <= steps * 0.5 * 1e-4 * (1 + 1e-5)
    assert moved[None][0] > 10 * distance


def _halves() -> tuple[tuple[np.ndarray, np.ndarray], object]:
    """Class 0 in the first half of the samples, class 1 in the second, told apart by x1.

    Each of two processes trains on its half: alone, a process learns one
    class (accuracy 0.5 on both); sharing gradients, they learn both.
    """
    from daskpri.models import build_model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype(np.float32)
    x[:, 1] = np.where(np.arange(512) < 256, -1.0, 1.0) * (np.abs(x[:, 1]) + 0.5)
    y = (np.arange(512) >= 256).astype(np.int64)
    return (x, y), build_model("mlp", {"x_shape": (8,), "n_classes": 2})


def test_ddp_trains_on_two_processes():
    data, model = _halves()
    r = train_ddp(model, data, data, processes=2, batch_size=32, learning_rate=0.05,
                  momentum=0.9, budget=0.5, eval_seconds=0.1, seed=0, timeout=120)
    assert r.curve.time[-1] >= 0.5
    assert r.samples == 2 * 32 * r.curve.step[-1]
    # rank 0 holds class 0 only: it learns class 1 from rank 1's gradients
    assert r.curve.accuracy[-1] > 0.9


def test_ddp_processes_listen_on_loopback_only():
    """Spawned, as daskpri's users' are by default (the suite's fork from a forkserver)."""
    import psutil

    data, model = _halves()
    listening: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        me = psutil.Process()
        while not done.is_set():
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    for c in child.net_connections(kind="inet"):
                        if c.status == psutil.CONN_LISTEN:
                            listening.add(c.laddr.ip)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with dask.config.set({"daskpri.bench.start-method": "spawn"}):
            train_ddp(model, data, data, processes=2, batch_size=32, learning_rate=0.05,
                      momentum=0.9, budget=1.0, eval_seconds=0.2, seed=0, timeout=120)
    finally:
        done.set()
        watcher.join(5)
    assert listening and listening <= {"127.0.0.1", "::1"}, listening


def test_a_start_method_the_baselines_do_not_take_is_refused_before_the_first_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    data, model = _halves()
    with dask.config.set({"daskpri.bench.start-method": "fork"}):
        assert main(["bench", "--quick", "--no-progress", "--out", str(tmp_path / "b")]) == 2
        with pytest.raises(ValueError, match="start-method should be spawn or forkserver"):
            train_plain_loops(model, data, data, processes=2, batch_size=32, learning_rate=0.05,
                              momentum=0.9, budget=0.5, eval_seconds=0.1, seed=0)
    assert capsys.readouterr().err == (
        "daskpri: error: daskpri.bench.start-method should be spawn or forkserver, but got "
        "'fork'\n")
    assert not (tmp_path / "b").exists()


def test_plain_loops_train_at_once_and_add_up_their_samples():
    data, model = _halves()
    r = train_plain_loops(model, data, data, processes=2, batch_size=32, learning_rate=0.05,
                          momentum=0.9, budget=0.5, eval_seconds=0.1, seed=0, timeout=120)
    assert r.curve.time[-1] >= 0.5
    # rank 0's curve; the samples are both processes'
    assert r.samples % 32 == 0 and r.samples > 32 * r.curve.step[-1]
    # rank 0 alone: its own class only
    assert r.curve.accuracy[-1] == pytest.approx(0.5)
    # a process that fails is reported, and the others are not waited for
    wrong = (np.zeros((64, 3), dtype=np.float32), np.zeros(64, dtype=np.int64))
    with pytest.raises(RuntimeError, match="the plain-loops run failed in rank [01]: "):
        train_plain_loops(model, wrong, wrong, processes=2, batch_size=32, learning_rate=0.05,
                          momentum=0.9, budget=0.5, eval_seconds=0.1, seed=0, timeout=120)


# -- end to end -------------------------------------------------------------------------


def test_bench_writes_json_markdown_pngs_and_html(tmp_path: Path):
    out = tmp_path / "bench"
    status = main([
        "bench", "--quick", "--datasets", "synthetic", "--n-samples", "2000",
        "--strategies", "uniform,selective-backprop,selective-backprop+fresh", "--workers", "1",
        "--budget", "2", "--strategy-option", "selective-backprop+fresh:fraction=0.5",
        "--baseline-budget", "1", "--no-ddp", "--no-progress", "--out", str(out),
        "--local-steps", "4", "--strategy-option", "selective-backprop:fraction=0.25",
        "--strategy-option", "selective-backprop@mlp:refresh=2", "--staleness", "exp-linear",
    ])
    assert status == 0
    doc = json.loads((out / "results.json").read_text())
    assert {r["spec"]["arm"]["label"] for r in doc["runs"]} == {
        "uniform", "selective-backprop", "selective-backprop+fresh"}
    assert all(len(r["curve"]["time"]) == len(r["curve"]["accuracy"]) for r in doc["runs"])
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["torch"]
    md = (out / "results.md").read_text()
    # a seed's floats depend on the CPU's kernels: the report names them
    capability = torch.backends.cpu.get_cpu_capability()
    assert doc["machine"]["torch_cpu_capability"] == capability
    assert f"torch's CPU kernels {capability}; " in md
    # and whether it has bfloat16 arithmetic, for score_dtype
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    low = [f for f in ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16") if f in flags]
    assert doc["machine"]["cpu_low_precision"] == low
    assert f"bfloat16/float16 instructions {', '.join(low) or 'none'}; " in md
    assert "| selective-backprop |" in md
    assert "4 local steps per round trip" in md and "selective-backprop:fraction=0.25" in md
    sb = [r for r in doc["runs"] if r["spec"]["arm"]["label"] == "selective-backprop"]
    assert sb[0]["spec"]["arm"]["options"] == [["fraction", 0.25], ["refresh", 2]]
    assert "selective-backprop@mlp:refresh=2" in md
    # the second arm ran selective-backprop with its own options only
    fresh = [r for r in doc["runs"] if r["spec"]["arm"]["label"] == "selective-backprop+fresh"]
    assert fresh and fresh[0]["spec"]["arm"]["strategy"] == "selective-backprop"
    assert fresh[0]["spec"]["arm"]["options"] == [["fraction", 0.5]]
    assert "fraction=0.5" in fresh[0]["info"]["strategy"] and "| selective-backprop+fresh |" in md
    # the table's staleness model reaches every daskpri run's trainer, and the report
    assert doc["config"]["staleness"] == "exp-linear" and "staleness model exp-linear" in md
    daskpri_runs = [r for r in doc["runs"] if r["spec"]["kind"] == "daskpri"]
    assert daskpri_runs and {r["info"]["staleness"] for r in daskpri_runs} == {"exp-linear"}
    # each run keeps where its step time went, and how many rounds were selected ahead
    for r in daskpri_runs:
        parts = r["info"]["time_parts"]
        assert set(parts) == {"compute", "communication", "selection", "optimizer"}
        assert all(v >= 0 for v in parts.values()) and parts["compute"] > 0
        assert sum(parts.values()) <= r["curve"]["time"][-1] + 1e-6
        assert 0.0 <= r["info"]["selected_ahead"] <= 1.0
    # uniform never reads the table: the rounds after the first are selected ahead
    assert all(r["info"]["selected_ahead"] > 0.5 for r in daskpri_runs
               if r["spec"]["arm"]["strategy"] == "uniform")
    assert "### Where the training time goes" in md
    for png in ("accuracy_synthetic_mlp.png", "speedup.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "results.html").read_text()
    assert "Bokeh" in page and "cdn.bokeh.org" not in page


def test_a_learning_rate_that_diverges_is_reported_and_the_benchmark_goes_on(tmp_path: Path):
    out = tmp_path / "bench"
    status = main([
        "bench", "--quick", "--datasets", "synthetic", "--n-samples", "2000",
        "--strategies", "uniform", "--workers", "1", "--budget", "2",
        "--learning-rates", "0.1,1000000", "--baseline-budget", "1", "--no-ddp",
        "--no-progress", "--out", str(out),
    ])
    assert status == 0
    doc = json.loads((out / "results.json").read_text())
    diverged = [r for r in doc["runs"] if r["spec"]["learning_rate"] == 1e6]
    assert len(diverged) == 1 and diverged[0]["curve"]["accuracy"] == []
    assert diverged[0]["info"]["error"].startswith("diverged: the training loss became ")
    assert [f["run"] for f in doc["summary"]["failed"]] == [
        "synthetic/mlp sweep: uniform lr=1e+06 seed=0 workers=1"]
    # the sweep keeps the rate that trained, and the later phases run at it
    sweep = {r["learning_rate"]: r["picked"] for r in doc["summary"]["lr_sweep"]}
    assert sweep == {0.1: True, 1e6: False}
    later = [r for r in doc["runs"] if r["spec"]["phase"] != "sweep"]
    assert later and {r["spec"]["learning_rate"] for r in later} == {0.1}
    md = (out / "results.md").read_text()
    assert "### Failed runs" in md
    assert "- synthetic/mlp sweep: uniform lr=1e+06 seed=0 workers=1: diverged: " in md
    # the overhead table says what its daskpri runs pay that the plain loop does not
    assert "daskpri's runs take 1 local step per round trip (--local-steps)" in md
    assert "--local-steps 512 measures the engine" in md


def test_resume_keeps_the_runs_made_and_makes_only_the_rest(tmp_path: Path, capsys):
    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--datasets", "synthetic", "--n-samples", "2000",
            "--strategies", "uniform,loss", "--workers", "1", "--budget", "1",
            "--baseline-budget", "0.5", "--no-ddp", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    path = out / "results.json"
    whole = json.loads(path.read_text())
    assert len(whole["runs"]) >= 4
    # stopped after its first two runs: what results.json holds then
    # without --resume its runs are not replaced
    assert main(argv) == 2
    assert (f"--out {str(out)!r} holds the results of an earlier benchmark ({path}); pass "
            "--resume to go on with it") in capsys.readouterr().err
    assert json.loads(path.read_text()) == whole
    cut = {**whole, "summary": None, "runs": whole["runs"][:2]}
    path.write_text(json.dumps(cut))
    (out / "results.md").unlink()
    # the report of the runs made so far, under the file's own options
    n = len(whole["runs"])
    capsys.readouterr()
    assert main(["bench", "--out", str(out), "--report-only"]) == 0
    assert f"daskpri bench: report of 2 of {n} runs in " in capsys.readouterr().out
    partial = (out / "results.md").read_text()
    assert f"**Partial: 2 of the {n} runs planned.**" in partial
    assert "| uniform |" in partial
    assert [r["spec"] for r in json.loads(path.read_text())["runs"]] == [
        r["spec"] for r in cut["runs"]]
    assert main(["bench", "--out", str(out), "--report-only", "--resume"]) == 2
    assert "--report-only makes no runs, and --resume makes the rest" in capsys.readouterr().err
    assert main(["bench", "--out", str(tmp_path / "none"), "--report-only"]) == 2
    assert "results.json does not exist" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert f"2 runs kept from {path}" in printed
    # each run's line counts the runs made, with or without the progress bar
    assert f"[3/{n}] " in printed and f"[{n}/{n}] " in printed
    assert "**Partial" not in (out / "results.md").read_text()
    resumed = json.loads(path.read_text())
    assert resumed["runs"][:2] == whole["runs"][:2]  # kept as they were, not made again
    assert [r["spec"] for r in resumed["runs"]] == [r["spec"] for r in whole["runs"]]
    assert resumed["machine"]["resumed_runs"] == 2
    # the earlier invocation's command and seconds are kept, and counted in the time
    earlier = resumed["machine"]["earlier"]
    assert [(e["command"], e["runs"], e["bench_seconds"]) for e in earlier] == [
        (whole["machine"]["command"], 2, whole["machine"]["bench_seconds"])]
    assert resumed["machine"]["bench_seconds"] > whole["machine"]["bench_seconds"]
    md = (out / "results.md").read_text()
    assert "Resumed (`--resume`): the benchmark time is that of 2 invocations together" in md
    assert f"- `{whole['machine']['command']}`: 2 runs, {earlier[0]['bench_seconds']} s, " in md
    # other options would not make the runs it holds: refused, naming what differs
    assert main([*argv[:-2], "--budget", "2", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"--resume: {path} was made with other options (budget: 1.0 there, 2.0 here)" in err
    assert json.loads(path.read_text()) == resumed  # and left as it was
    # more seeds: the runs of seed 0 are kept and seed 1's made, its arms side by side
    capsys.readouterr()
    assert main([*argv, "--seeds", "2", "--resume"]) == 0
    grown = json.loads(path.read_text())
    assert grown["runs"][:len(resumed["runs"])] == resumed["runs"]
    added = [r["spec"] for r in grown["runs"][len(resumed["runs"]):]]
    assert {s["seed"] for s in added} == {1}
    assert [(s["phase"], s["arm"]["label"]) for s in added if s["phase"] == "sweep"] == [
        ("sweep", "uniform"), ("sweep", "loss")]
    assert grown["config"]["seeds"] == 2
    assert "Seeds: 0–1 (each seeds" in (out / "results.md").read_text()
    # but not a seed range without the seeds it holds
    assert main([*argv, "--seeds", "2", "--first-seed", "1", "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"--resume: {path} was made with other options (first_seed: 0 there, 1 here)" in err


def test_report_says_there_are_no_targets_when_every_uniform_run_failed(tmp_path: Path):
    cfg = _config(seeds=1, workers=(2,), learning_rates=(0.05,))
    failed = [RunRecord(RunSpec("sweep", "daskpri", "mnist1d", "mlp", arm, 0.05, 0, 2, 10.0),
                        Curve([], [], [], []), 0, 0, 1.0,
                        info={"error": "diverged: the training loss became nan at step 3"})
              for arm in (UNIFORM, LOSS)]
    # the whole report, its plots too (with no target to draw; a NaN one was an error)
    summary = write_report(tmp_path, cfg, dict(MACHINE), SIZES, failed)
    assert len(summary["failed"]) == 2
    assert (tmp_path / "accuracy_mnist1d_mlp.png").exists()
    assert (tmp_path / "results.html").exists()
    md = (tmp_path / "results.md").read_text()
    assert md == render_markdown(cfg, MACHINE, summary, ["accuracy_mnist1d_mlp.png",
                                                         "speedup.png"])
    assert ("Targets: none: uniform has no accuracy at any learning rate swept (its runs "
            "failed, see \"Failed runs\" below).") in md
    assert ("- mnist1d/mlp sweep: loss lr=0.05 seed=0 workers=2: diverged: the training loss "
            "became nan at step 3") in md


def test_bench_on_a_running_scheduler_uses_its_gpu_workers(gpu_cluster: str, tmp_path: Path,
                                                           capsys):
    # `dask scheduler` and two `dask worker --resources GPU=1` processes (conftest): the
    # daskpri runs ask for GPU=1; the plain loop trains where those workers do, the GPU
    # where the driver has CUDA, else the CPU
    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--datasets", "synthetic", "--n-samples", "2000",
            "--strategies", "uniform", "--budget", "1", "--baseline-budget", "0.5",
            "--no-ddp", "--no-progress", "--scheduler", gpu_cluster]
    assert main([*argv, "--workers", "2", "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    kinds = {(r["spec"]["kind"], r["spec"]["n_workers"]) for r in doc["runs"]}
    assert kinds == {("daskpri", 2), ("daskpri", 1), ("torch", 1)}
    plain = [r for r in doc["runs"] if r["spec"]["kind"] == "torch"]
    assert plain[0]["info"]["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert doc["machine"]["gpu"] == (torch.cuda.get_device_name(0)
                                     if torch.cuda.is_available() else None)
    assert all(r["curve"]["accuracy"] for r in doc["runs"])
    # more workers than the scheduler has: refused before any run, saying what to do
    capsys.readouterr()
    with dask.config.set({"daskpri.trainer.no-workers-timeout": "0.2s"}):  # waited this long
        assert main([*argv, "--workers", "3", "--out", str(tmp_path / "three")]) == 2
    assert (f"the benchmark needs 3 workers, but the scheduler at {gpu_cluster} has 2; start "
            "more or pass --workers up to 2; waited 0.2 s for 3 worker(s)"
            ) in capsys.readouterr().err
    assert not (tmp_path / "three" / "results.json").exists()
