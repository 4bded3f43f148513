"""``daskpri evaluate`` and ``predict``: a checkpoint of ``daskpri train`` on other data."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from _fits import local_cluster
from _reads import opened_under

import daskpri
from daskpri.cli import main
from daskpri.data.io import to_store


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, xr.Dataset]:
    """A checkpoint of 20 steps of ``train`` (seed 3) and the history it wrote."""
    where = tmp_path_factory.mktemp("evaluate")
    ckpt, out = where / "run.ckpt", where / "run.nc"
    assert main(["train", "--dataset", "synthetic", "--n-samples", "2000", "--seed", "3",
                 "--max-steps", "20", "--eval-every", "10", "--workers", "1",
                 "--checkpoint", str(ckpt), "--checkpoint-every", "10",
                 "--output", str(out), "--no-progress"]) == 0
    return ckpt, xr.open_dataset(out, engine="h5netcdf").load()


def test_evaluate_scores_the_test_split_the_run_was_evaluated_on(
    trained: tuple[Path, xr.Dataset], capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, history = trained
    capsys.readouterr()
    with opened_under(ckpt.parent) as seen:
        assert main(["evaluate", str(ckpt), "--dataset", "synthetic", "--n-samples", "2000"]) == 0
    assert seen.count(ckpt.name) == 1  # read once: what was checked is what is scored
    line = capsys.readouterr().out.strip()
    accuracy, loss = float(history["accuracy"][-1]), float(history["eval_loss"][-1])
    assert line == (f"{ckpt} (step 20, selective-backprop): accuracy {accuracy:.4f}, loss "
                    f"{loss:.4f} on 400 samples of the test split of synthetic")
    assert main(["evaluate", str(ckpt), "--dataset", "synthetic", "--n-samples", "2000",
                 "--json", "--batch-size", "7"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["accuracy"] == accuracy and doc["loss"] == pytest.approx(loss, rel=1e-5)
    assert {k: doc[k] for k in ("checkpoint", "step", "strategy", "data", "samples")} == {
        "checkpoint": str(ckpt), "step": 20, "strategy": "selective-backprop",
        "data": "the test split of synthetic", "samples": 400}


@pytest.fixture(scope="module")
def held_out(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The run's test split (its seed's), in a zarr store of the user's, in chunks of 100."""
    _, test = daskpri.datasets.load("synthetic", n_samples=2000, seed=3)
    where = tmp_path_factory.mktemp("held-out") / "held-out.zarr"
    return to_store(test.chunk({"sample": 100}), str(where))


def test_evaluate_scores_held_out_data_of_a_store(
    trained: tuple[Path, xr.Dataset], held_out: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, history = trained
    store = held_out
    capsys.readouterr()
    assert main(["evaluate", str(ckpt), "--data", store, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["data"] == store and doc["samples"] == 400
    assert doc["accuracy"] == float(history["accuracy"][-1])


def test_evaluate_on_a_scheduler_scores_a_task_per_chunk_on_its_workers(
    trained: tuple[Path, xr.Dataset], held_out: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, history = trained
    with local_cluster(1) as (cluster, client):
        capsys.readouterr()
        assert main(["evaluate", str(ckpt), "--data", held_out, "--json",
                     "--scheduler", cluster.scheduler_address]) == 0
        prefixes = client.run_on_scheduler(
            lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
    doc = json.loads(capsys.readouterr().out)
    assert doc["samples"] == 400 and doc["accuracy"] == float(history["accuracy"][-1])
    assert doc["loss"] == pytest.approx(float(history["eval_loss"][-1]), rel=1e-5)
    # the store's 4 chunks read and scored by the workers
    assert "open_dataset-x" in prefixes and any(p.startswith("scored") for p in prefixes), \
        prefixes


def test_evaluate_refuses_another_split_and_data_it_cannot_score(
    trained: tuple[Path, xr.Dataset], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, _ = trained
    capsys.readouterr()
    cases = [
        # another --n-samples splits the data otherwise: refused, not scored on other samples
        (["--dataset", "synthetic", "--n-samples", "1000"],
         f"daskpri: error: the run in {str(ckpt)!r} trained on 1600 samples of shape (20,) in "
         "10 classes, but --dataset synthetic --n-samples 1000 gives 800 samples of shape "
         "(20,) in 10 classes; give the --dataset and --n-samples the run was started with"),
        (["--data", "x.zarr", "--dataset", "synthetic"],
         "daskpri: error: --data names the held-out data to score, and --dataset choose(s) a "
         "built-in dataset's test split: give one or the other"),
        (["--data", str(tmp_path / "none.zarr")],
         f"daskpri: error: data names {str(tmp_path / 'none.zarr')!r}, but there is no such "
         "file or directory"),
    ]
    for flags, message in cases:
        assert main(["evaluate", str(ckpt), *flags]) == 2, flags
        assert capsys.readouterr().err.strip() == message
    assert main(["evaluate", str(tmp_path / "none.ckpt")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"daskpri: error: no checkpoint at {str(tmp_path / 'none.ckpt')!r}")
    with pytest.raises(SystemExit) as exit_:  # argparse's own
        main(["evaluate", str(ckpt), "--batch-size", "0"])
    assert exit_.value.code == 2
    assert "argument --batch-size: should be a positive integer" in capsys.readouterr().err


def test_a_checkpoint_of_a_model_of_its_own_is_scored_from_python(
    small_data: tuple[xr.Dataset, xr.Dataset], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    train, test = small_data
    model = torch.nn.Sequential(torch.nn.Linear(20, 10))
    path = tmp_path / "own.ckpt"
    with local_cluster(1, processes=False) as (_, client), \
            daskpri.Trainer(model, strategy="uniform", client=client, batch_size=32) as trainer:
        trainer.fit(train, max_steps=2, progress=False)
        trainer.save(path)
        expected = trainer.evaluate(test)
    assert main(["evaluate", str(path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"daskpri: error: the run in {str(path)!r} trained a model of its own, not a built-in "
        "one: score it from Python, with daskpri.Trainer.resume(path, model=...)"
        ".evaluate(data)")
    assert main(["predict", str(path), "--data", "x.zarr", "--output",
                 str(tmp_path / "p.zarr")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"daskpri: error: the run in {str(path)!r} trained a model of its own, not a built-in "
        "one: predict from Python, with daskpri.Trainer.resume(path, model=...)"
        ".predict(data)")
    # as said
    with daskpri.Trainer.resume(path, model=torch.nn.Sequential(torch.nn.Linear(20, 10))) as t:
        assert t.evaluate(test) == expected


@contextlib.contextmanager
def read_only_copy(path: Path, where: Path) -> Iterator[Path]:
    """``path`` copied onto a file system mounted read-only at ``where`` (a tmpfs)."""
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"needs a read-only file system: mount -t tmpfs says {mounted.stderr!r}")
    try:
        shutil.copy(path, where / path.name)
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where / path.name
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_checkpoint_on_a_read_only_file_system_is_scored_and_said_not_writable(
    trained: tuple[Path, xr.Dataset], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # evaluate and predict write no checkpoint: they once refused it as "a damaged daskpri
    # checkpoint", its directory taking no new file
    ckpt, history = trained
    with read_only_copy(ckpt, tmp_path / "ro") as copy:
        capsys.readouterr()
        assert main(["evaluate", str(copy), "--dataset", "synthetic", "--n-samples", "2000",
                     "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["accuracy"] == history["accuracy"][-1]
        # going on training checkpoints to the file: this machine's refusal, and what to do
        with pytest.raises(ValueError, match=(
            rf"^checkpoint_path should be a path this process may write, but got checkpoint_path "
            rf"'{copy}', and '{copy.parent}' takes no new file: Read-only file system; a run "
            r"that checkpointed goes on checkpointing to the file it is resumed from: pass "
            r"checkpoint_path= a path to write to, or checkpoint_path=None to resume without "
            r"checkpoints \(to evaluate or predict\)$")):
            daskpri.Trainer.resume(copy)
        with daskpri.Trainer.resume(copy, checkpoint_path=None) as trainer:
            assert trainer.step_ == 20 and trainer.checkpoint_every is None
        elsewhere = tmp_path / "more.ckpt"
        with daskpri.Trainer.resume(copy, checkpoint_path=elsewhere) as trainer:
            assert trainer.checkpoint_path == str(elsewhere) and trainer.checkpoint_every == 10


@pytest.fixture(scope="module")
def unlabelled(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, xr.Dataset]:
    """A zarr store of the run's test split without its labels, and the split."""
    _, test = daskpri.datasets.load("synthetic", n_samples=2000, seed=3)
    path = str(tmp_path_factory.mktemp("predict") / "new.zarr")
    test[["x"]].chunk({"sample": 128}).to_zarr(path, zarr_format=3, consolidated=False)
    return path, test


@pytest.mark.parametrize("suffix", [".zarr", ".nc"])
def test_predict_writes_the_logits_and_classes_of_a_store_without_labels(
    trained: tuple[Path, xr.Dataset], unlabelled: tuple[str, xr.Dataset], tmp_path: Path,
    suffix: str, capsys: pytest.CaptureFixture[str],
) -> None:
    ckpt, history = trained
    data, test = unlabelled
    out = tmp_path / f"predictions{suffix}"
    quiet = suffix == ".nc"  # (and the progress bar hidden on asking)
    capsys.readouterr()
    with opened_under(ckpt.parent) as seen:
        assert main(["predict", str(ckpt), "--data", data, "--output", str(out),
                     *(["--no-progress", "--device", "cpu"] if quiet else [])]) == 0
    assert seen.count(ckpt.name) == 1
    said = capsys.readouterr()
    assert said.out.strip() == (
        f"predictions of 400 samples written to {out} (step 20, selective-backprop)")
    # tqdm's bar on stderr, over the threads' tasks
    assert ("predict: 100%" in said.err) is not quiet and ("task/s" in said.err) is not quiet
    got = xr.open_dataset(out, engine="zarr" if suffix == ".zarr" else "h5netcdf").load()
    with daskpri.Trainer.resume(ckpt) as trainer:
        expected = trainer.predict(test)
    assert got["logits"].dims == ("sample", "class") and got["predicted"].dtype == "int64"
    np.testing.assert_allclose(got["logits"].values, expected.values, rtol=1e-5, atol=1e-6)
    assert (got["predicted"] == expected.argmax("class")).all()
    # the run's last evaluation was on these samples
    assert float((got["predicted"] == test["y"]).mean()) == float(history["accuracy"][-1])
    assert got.attrs["step"] == 20 and got.attrs["model"] == "mlp"
    assert got.attrs["checkpoint"] == str(ckpt) and got.attrs["data"] == data


def test_predict_computes_on_the_scheduler_given(
    trained: tuple[Path, xr.Dataset], unlabelled: tuple[str, xr.Dataset], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ckpt, _ = trained
    data, test = unlabelled
    out = tmp_path / "on-cluster.zarr"
    with local_cluster(1) as (cluster, client):
        before = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.task_groups and
                                         len(dask_scheduler.task_groups))
        assert main(["predict", str(ckpt), "--data", data, "--output", str(out),
                     "--scheduler", cluster.scheduler_address]) == 0
        prefixes = client.run_on_scheduler(
            lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
    assert not before
    # the bar counts the result's chunks on the cluster: logits and predicted, 4 each
    err = capsys.readouterr().err
    assert "predict: 100%" in err and " 8/8 " in err, err
    # the store's chunks read and each one's forward pass made on the cluster
    assert {"open_dataset-x", "logits"} <= set(prefixes), prefixes
    got = xr.open_zarr(out, consolidated=False).load()
    assert got.sizes["sample"] == 400 and got.chunks is not None


def test_predict_replaces_nothing_and_refuses_what_it_cannot_read(
    trained: tuple[Path, xr.Dataset], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    ckpt, _ = trained
    taken = tmp_path / "mine.zarr"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["predict", str(ckpt), "--data", "x.zarr", "--output", str(taken)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"daskpri: error: --output {str(taken)!r} exists: predictions replace no file or "
        "store; remove it, or name another path")
    assert (taken / "notes.txt").read_text() == "mine"
    out = tmp_path / "p.nc"
    assert main(["predict", str(ckpt), "--data", str(tmp_path / "none.zarr"),
                 "--output", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"daskpri: error: data names {str(tmp_path / 'none.zarr')!r}, but there is no such "
        "file or directory")
    assert not out.exists()
