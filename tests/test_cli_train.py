"""``daskpri train`` and ``daskpri demo`` on a LocalCluster of their own.

Its workers' settings and warnings, histories written, TLS, target accuracy,
and the demo's options.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import torch
from _cli_runs import SMALL, SUMMARY, _open

import daskpri
from daskpri.cli import main


def test_one_torch_thread_holds_for_the_block_and_is_undone_even_on_error() -> None:
    from daskpri.training.cluster import one_torch_thread

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(KeyError), one_torch_thread():
            assert torch.get_num_threads() == 1
            raise KeyError("inside")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _worker_settings(dask_worker: Any) -> dict[str, Any]:
    import dask.config

    return {
        "malloc": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
        "tick": dask_worker._tick_interval,
        "profile": dask.config.get("distributed.worker.profile.interval"),
    }


def test_own_local_cluster_starts_under_daskpri_settings_which_a_user_can_drop(
    monkeypatch, spawned_workers
) -> None:
    import dask.config
    from distributed import Client

    from daskpri.training.cluster import local_cluster

    # as a LocalCluster with Dask's defaults leaves this process's environment
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    with local_cluster(1) as cluster, Client(cluster) as client:
        [got] = client.run(_worker_settings).values()
        assert cluster.scheduler._tick_interval == 0.5
    assert got == {"malloc": None, "tick": 0.5, "profile": "100ms"}
    # {} keeps Dask's own, nannies' MALLOC_TRIM_THRESHOLD_ included
    with dask.config.set({"daskpri.local-cluster": {}}):
        with local_cluster(1) as cluster, Client(cluster) as client:
            [got] = client.run(_worker_settings).values()
            assert cluster.scheduler._tick_interval == 0.02
    assert got == {"malloc": "65536", "tick": 0.02, "profile": "10ms"}
    with dask.config.set({"daskpri.local-cluster": "fast"}):
        with pytest.raises(ValueError, match="should be a mapping of Dask settings.*'fast'"):
            local_cluster(1)


def test_more_local_workers_than_cores_warn_before_any_starts() -> None:
    from daskpri.training.cluster import available_cores, local_cluster

    cores = available_cores()
    # the suite turns daskpri's warnings into errors: raised before any process starts
    with pytest.raises(daskpri.DaskpriWarning,
                       match=rf"^{cores + 1} local workers on {cores} cores: they share the cores"):
        local_cluster(cores + 1)


def test_train_shows_daskpri_warnings_as_one_line_of_its_own(
    capsys: pytest.CaptureFixture[str]
) -> None:
    from daskpri.training.cluster import available_cores

    cores = available_cores()
    argv = ["train", *SMALL, "--workers", str(cores + 1), "--max-steps", "1", "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("always", daskpri.DaskpriWarning)
        assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"daskpri: warning: {cores + 1} local workers on {cores} cores: they share the cores, so "
        f"they train no faster than {cores} would, and each process holds its own torch and "
        "model; start fewer, or connect to a cluster with more machines"
    )
    # the formatting is main's alone: Python's own is back after it
    assert warnings.showwarning is not daskpri.cli._show_warning


@pytest.mark.parametrize("name", ["run.nc", "run.zarr"])
def test_train_on_own_local_cluster_writes_history(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    options = ["--strategy", "projection", "--strategy-option", "k=32",
               "--strategy-option", "train_on_renew=false", "--staleness", "exp-linear",
               "--momentum", "0.5"]
    argv = ["train", *SMALL, *options, "--workers", "2", "--no-progress", "--output", str(path)]
    torch.set_num_threads(2)
    seen = []
    fit = daskpri.Trainer.fit

    def counting_fit(self, *args, **kwargs):  # calls through: records the driver's threads
        seen.append(torch.get_num_threads())
        return fit(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(daskpri.Trainer, "fit", counting_fit)
        assert main(argv) == 0
    assert seen == [1] and torch.get_num_threads() == 2  # one while it trained, then as before
    out = capsys.readouterr().out
    assert re.search(r"^dashboard: http://127\.0\.0\.1:\d+/status$", out, re.M)
    assert SUMMARY.search(out)["strategy"] == "projection"
    with _open(path) as ds:
        assert {"step", "loss", "accuracy"} <= set(ds.variables)
        assert ds.sizes["step"] == 20
        assert ds.attrs["n_workers"] == 2
        assert ds.attrs["strategy_params"].startswith("Projection(k=32, renew=0.01, "
                                                      "train_on_renew=False")
        assert ds.attrs["dataset"] == "synthetic" and ds.attrs["model"] == "mlp"
        assert ds.attrs["staleness"] == "exp-linear" and ds.attrs["momentum"] == 0.5
    html = tmp_path / "report.html"
    assert main(["report", str(path), "-o", str(html)]) == 0
    assert "report written to" in capsys.readouterr().out
    assert html.read_text().lstrip().lower().startswith("<!doctype html")


def test_train_stops_at_its_target_accuracy_evaluating_as_asked(tmp_path: Path) -> None:
    path = tmp_path / "run.nc"
    argv = ["train", "--dataset", "synthetic", "--n-samples", "2000", "--max-steps", "400",
            "--target-accuracy", "0.6", "--eval-every", "2", "--optimizer", "adam",
            "--workers", "1", "--no-progress", "--output", str(path)]
    assert main(argv) == 0
    with _open(path) as ds:
        acc = ds["accuracy"].values
        assert ds.attrs["optimizer"] == "adam"
        assert np.isfinite(acc[1::2]).all() and np.isnan(acc[0::2]).all()  # every 2nd step
        assert acc[-1] >= 0.6 and (acc[:-1][np.isfinite(acc[:-1])] < 0.6).all()  # stopped there
        assert ds.sizes["step"] < 400


def test_train_stops_early_and_restores_the_best_evaluation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, ckpt = tmp_path / "run.nc", tmp_path / "run.ckpt"
    # no loss after the first evaluation's beats it by 10: stopped 2 evaluations later
    argv = ["train", "--dataset", "synthetic", "--n-samples", "2000", "--max-steps", "400",
            "--eval-every", "2", "--patience", "2", "--monitor", "eval_loss", "--min-delta",
            "10", "--restore-best", "--workers", "1", "--no-progress", "--output", str(path),
            "--checkpoint", str(ckpt)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert ("; early stopping: eval_loss not improved since step 1, stopped at step 5, "
            "step 1 restored\n") in out
    with _open(path) as ds:
        assert ds.sizes["step"] == 6
        assert (ds.attrs["best_step"], ds.attrs["stopped_step"]) == (1, 5)
        assert ds.attrs["restored_step"] == 1 and ds.attrs["monitor"] == "eval_loss"
        best = float(ds["eval_loss"].sel(step=1))
    # the checkpoint the run ended with holds step 1's weights
    with daskpri.Trainer.resume(ckpt, n_workers=1) as trainer:
        train, test = daskpri.datasets.load("synthetic", n_samples=2000, seed=0)
        assert trainer.evaluate(test)["loss"] == pytest.approx(best, rel=1e-6)


@pytest.mark.parametrize(("argv", "match"), [
    ([*SMALL, "--monitor", "eval_loss"], "--monitor goes with --patience N"),
    ([*SMALL, "--min-delta", "0.1", "--restore-best"],
     "--min-delta and --restore-best go with --patience"),
    (["--patience", "3", "--data", "x.zarr"], "--patience with --data needs --eval-data PATH"),
    ([*SMALL, "--warmup-steps", "20", "--lr-schedule", "cosine"],
     "--warmup-steps 20 leaves no step for --lr-schedule cosine to decay over: give fewer "
     "than its 20 (--max-steps, or --schedule-steps)"),
])
def test_flags_that_go_together_are_checked(argv, match, capsys: pytest.CaptureFixture[str]):
    assert main(["train", *argv]) == 2
    assert match in capsys.readouterr().err


def test_train_with_adamw_checkpoints_and_resumes_it(tmp_path: Path) -> None:
    ckpt, path = tmp_path / "run.ckpt", tmp_path / "run.nc"
    argv = ["train", *SMALL[:-1], "4", "--optimizer", "adamw", "--weight-decay", "0.05",
            "--workers", "1", "--no-progress", "--checkpoint", str(ckpt), "--device", "cpu"]
    assert main(argv) == 0
    state = torch.load(ckpt, weights_only=True)
    assert (state["trainer"]["optimizer"], state["trainer"]["weight_decay"]) == ("adamw", 0.05)
    assert state["trainer"]["device"] == "cpu"
    assert set(state["optimizer"]["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    resumed = ["train", *SMALL[:-1], "8", "--workers", "1", "--no-progress", "--resume",
               str(ckpt), "--output", str(path), "--device", "cpu"]  # (where it goes on: given)
    assert main(resumed) == 0
    with _open(path) as ds:
        assert ds.attrs["optimizer"] == "adamw" and ds.attrs["weight_decay"] == 0.05
        assert ds.sizes["step"] == 8


def test_train_with_tls_on_its_own_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from daskpri.training import _cleanup  # (where the trainer starts its cluster)

    argv = ["train", *SMALL, "--workers", "1", "--no-progress", "--tls", "--transport", "tasks"]
    addresses = []
    start = _cleanup.local_cluster

    def recording_cluster(*args, **kwargs):  # calls through: records where it listens
        cluster = start(*args, **kwargs)
        addresses.append(cluster.scheduler_address)
        return cluster

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_cleanup, "local_cluster", recording_cluster)
        assert main(argv) == 0
    assert len(addresses) == 1 and addresses[0].startswith("tls://127.0.0.1:"), addresses
    assert "dashboard: http" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--tls-ca-file", "ca.pem"], "--tls-ca-file, --tls-cert and --tls-key go together"),
        (["--tls", "--scheduler", "tcp://127.0.0.1:1"], "with --scheduler, use --tls-"),
    ],
)
def test_tls_flags_are_checked(extra, match, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *SMALL, *extra]) == 2
    assert re.search(match, capsys.readouterr().err)


def test_report_of_a_missing_history_is_a_clear_error(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "none.nc"
    assert main(["report", str(missing), "-o", str(tmp_path / "r.html")]) == 2
    assert capsys.readouterr().err == (
        f"daskpri: error: history names {str(missing)!r}, but there is no such file or "
        "directory\n"
    )


def test_demo_compares_prioritized_with_uniform(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--dataset", "synthetic", "--max-time", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    link = re.fullmatch(r"dashboard: (http://127\.0\.0\.1:\d+)/status", lines[0])
    # daskpri's page, which the runs add to the scheduler's dashboard, is the one to open
    assert link is not None and lines[1] == f"daskpri page: {link[1]}/daskpri (once the run starts)"
    lines = lines[1:]
    assert lines[1] == "selective-backprop against uniform, 1 local step per round, 1 s each"
    for name, line in (("selective-backprop", lines[2]), ("uniform", lines[3])):
        assert re.match(rf"{name}: \d+ steps, final accuracy 0\.\d{{4}}, ", line), line
    assert re.fullmatch(
        r"target 0\.\d{4} \(97% of uniform's best 0\.\d{4}\): "
        r"selective-backprop accuracy 0\.\d{4}, time to target ([\d.]+ s|not reached); "
        r"uniform accuracy 0\.\d{4}, time to target [\d.]+ s; "
        r"speedup (\d+\.\d\dx|not reached by selective-backprop)",
        lines[4],
    )


def test_demo_takes_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--dataset", "synthetic", "--max-time", "0.5", "--local-steps", "16",
            "--strategy-option", "fraction=0.25", "--strategy-option", "refresh=2"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()[1:]  # after the dashboard's two lines
    assert lines[1] == (
        "selective-backprop (fraction=0.25, refresh=2) against uniform, "
        "16 local steps per round, 0.5 s each"
    )
    # steps counted in steps, not in rounds of 16
    for name, line in (("selective-backprop", lines[2]), ("uniform", lines[3])):
        steps = re.match(rf"{name}: (\d+) steps, ", line)
        assert steps is not None and int(steps.group(1)) % 16 == 0 and int(steps.group(1)), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategy-option", "fraction=2"],
         "fraction should be a number in (0, 1], but got fraction=2"),
        (["--strategy-option", "k=3"], "strategy 'selective-backprop' takes the options"),
    ],
)
def test_demo_bad_option_fails_before_a_cluster_starts(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--dataset", "synthetic", "--max-time", "1", *args]) == 2
    captured = capsys.readouterr()
    assert "dashboard:" not in captured.out  # no cluster was started
    assert captured.err.startswith(f"daskpri: error: {message}")


@pytest.mark.parametrize("value", ["-5", "inf", "abc"])
def test_demo_max_time_is_checked_as_trains_is(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", "--max-time", value])
    assert info.value.code == 2
    assert (f"argument --max-time: should be a positive finite number of seconds, but got "
            f"'{value}'") in capsys.readouterr().err


def test_demo_refuses_a_configured_eval_period_before_a_cluster_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the demo rounds the trainer's configured period to whole rounds: a bad one is not
    # rounded up into a good one
    with dask.config.set({"daskpri.trainer.eval-every": 0}):
        assert main(["demo", "--dataset", "synthetic", "--max-time", "1",
                     "--local-steps", "16"]) == 2
    captured = capsys.readouterr()
    assert "dashboard:" not in captured.out
    assert captured.err.startswith(
        "daskpri: error: eval_every should be a positive integer, but got eval_every=0")
