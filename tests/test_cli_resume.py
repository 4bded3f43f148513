"""``daskpri train --checkpoint`` and ``--resume``: a run stopped and resumed from the CLI.

Checkpoints written and resumed, what a checkpoint fixes refused before a
cluster starts, and files that are no checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _cli_runs import _open

import daskpri
from daskpri.cli import main
from daskpri.data import open_dataset, to_store
from daskpri.data._fingerprint import data_fingerprint
from daskpri.training import checkpoint


def test_train_checkpoints_then_resumes_where_it_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, out = tmp_path / "run.ckpt", tmp_path / "run.nc"
    common = ["train", "--dataset", "synthetic", "--n-samples", "2000", "--workers", "1",
              "--no-progress", "--checkpoint", str(ckpt), "--checkpoint-every", "5"]
    assert main([*common, "--strategy", "loss", "--lr-schedule", "linear",
                 "--max-steps", "10"]) == 0
    assert ckpt.exists() and not list(tmp_path.glob("*.tmp"))
    # the run's own settings (strategy, schedule) come back from the checkpoint; going on
    # past the schedule's end takes a longer one
    assert main([*common, "--resume", str(ckpt), "--max-steps", "16", "--schedule-steps", "16",
                 "--output", str(out)]) == 0
    assert "resumed " + str(ckpt) + " at step 10" in capsys.readouterr().out
    with _open(out) as ds:
        assert ds["step"].values.tolist() == list(range(16))
        assert ds.attrs["strategy"] == "loss" and ds.attrs["lr_schedule"] == "linear"
        assert ds.attrs["schedule_steps"] == 16
        # linear decay over 10 steps, then from step 10 on over 16: still above zero
        lr = ds["lr"].values
        assert (lr[10:] > 0).all() and (np.diff(lr[10:]) < 0).all()


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 4 steps of ``loss`` at seed 3 and lr 0.1, checkpointed every 2."""
    ckpt = tmp_path_factory.mktemp("resume") / "run.ckpt"
    argv = ["train", "--dataset", "synthetic", "--n-samples", "1000", "--workers", "1",
            "--no-progress", "--strategy", "loss", "--seed", "3", "--learning-rate", "0.1",
            "--max-steps", "4", "--checkpoint", str(ckpt), "--checkpoint-every", "2"]
    assert main(argv) == 0
    return ckpt


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategy", "uniform", "--learning-rate", "0.5"],
         "--resume continues the run in '{ckpt}' as it was started, but got --strategy uniform "
         "(the run's: loss); --learning-rate 0.5 (the run's: 0.1). With --resume, give only "
         "--dataset, --n-samples and --root, or --data (the run's data), --eval-data, "
         "--eval-chunked, --max-steps, --max-time, "
         "--target-accuracy, --patience, --monitor, --min-delta, --restore-best, --output, "
         "--no-progress, --scheduler, --workers, --resources, --device, "
         "--transport, --tls, --tls-*, --eval-every, --checkpoint, --checkpoint-every and "
         "--schedule-steps\n"),
        (["--seed", "0", "--model", "cnn", "--batch-size", "32"],
         "--resume continues the run in '{ckpt}' as it was started, but got --model cnn "
         "(the run's: mlp); --seed 0 (the run's: 3); --batch-size 32 (the run's: 64). "),
        (["--strategy-option", "epsilon=0.5", "--strategy-option", "k=3"],
         "--resume continues the run in '{ckpt}' as it was started, but got --strategy-option "
         "epsilon=0.5 (the run's: epsilon=0.2); --strategy-option k=3 (the run's: loss takes "
         "no k). "),
        (["--max-grad-norm", "1"],
         "--resume continues the run in '{ckpt}' as it was started, but got --max-grad-norm 1.0 "
         "(the run's: None). "),
        (["--momentum", "0.5"],
         "--resume continues the run in '{ckpt}' as it was started, but got --momentum 0.5 "
         "(the run's: 0.9). "),
        (["--weight-decay", "0.1"],
         "--resume continues the run in '{ckpt}' as it was started, but got --weight-decay 0.1 "
         "(the run's: 0.0). "),
        (["--warmup-steps", "3"],
         "--resume continues the run in '{ckpt}' as it was started, but got --warmup-steps 3 "
         "(the run's: 0). "),
        (["--label-smoothing", "0.1"],
         "--resume continues the run in '{ckpt}' as it was started, but got --label-smoothing "
         "0.1 (the run's: 0.0). "),
        (["--max-steps", "3"],
         "--max-steps counts the run's steps from its start, and the run in '{ckpt}' is at "
         "step 4 already, but got --max-steps 3: give more than 4 to go on\n"),
        # the data: the checkpoint knows the samples' shape and count
        (["--n-samples", "2000"],
         "--resume: the run in '{ckpt}' trained on 800 samples of shape (20,) in 10 classes, "
         "but --dataset synthetic --n-samples 2000 gives 1600 samples of shape (20,) in 10 "
         "classes; give the --dataset and --n-samples the run was started with\n"),
        # more workers than the run has partitions (one, on its one worker)
        (["--workers", "2"],
         "the checkpoint's run is cut into 1 partition(s), as it was for the workers it "
         "started on, fewer than the 2 workers here, so a worker would hold none: resume it "
         "on 1 worker(s) at most (Trainer.resume(path, n_workers=1), or daskpri train "
         "--resume PATH --workers 1)\n"),
        (["--dataset", "digits"],
         "--resume: the run in '{ckpt}' trained on 800 samples of shape (20,) in 10 classes, "
         "but --dataset digits --n-samples 1000 gives 800 samples of shape (8, 8) in 10 "
         "classes; "),
    ],
)
def test_resume_refuses_what_its_checkpoint_fixes_before_a_cluster_starts(
    checkpointed: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    argv = ["train", "--dataset", "synthetic", "--n-samples", "1000", "--no-progress",
            "--resume", str(checkpointed), *args]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no cluster, no data
    assert captured.err.startswith("daskpri: error: " + message.format(ckpt=checkpointed))


def test_resume_takes_the_runs_own_settings_repeated_and_keeps_its_checkpoint_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, out = tmp_path / "run.ckpt", tmp_path / "run.nc"
    first = ["train", "--dataset", "synthetic", "--n-samples", "1000", "--no-progress",
             "--strategy", "loss", "--seed", "3", "--learning-rate", "0.1", "--workers", "1"]
    assert main([*first, "--max-steps", "4", "--checkpoint", str(ckpt)]) == 0
    # the same command with --resume: the settings it repeats are the run's own
    assert main([*first, "--resume", str(ckpt), "--checkpoint-every", "3", "--max-steps", "7",
                 "--output", str(out)]) == 0
    assert f"resumed {ckpt} at step 4" in capsys.readouterr().out

    # --checkpoint-every alone: the run's own file, at step 6 and where the fit ended
    state = checkpoint.read(ckpt)
    assert state["step"] == 7 and state["trainer"]["checkpoint_every"] == 3
    assert not list(tmp_path.glob("*.tmp"))
    with _open(out) as ds:
        assert ds["step"].values.tolist() == list(range(7))
        assert ds.attrs["seed"] == 3 and ds.attrs["learning_rate"] == 0.1


def test_resume_goes_past_a_decaying_schedule_only_when_told_how_long_it_now_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "run.ckpt"
    first = ["train", "--dataset", "synthetic", "--n-samples", "1000", "--no-progress",
             "--workers", "1", "--lr-schedule", "cosine"]
    assert main([*first[:-2], "--schedule-steps", "9", "--max-steps", "4",
                 "--checkpoint", str(ckpt)]) == 2
    assert ("--schedule-steps is the length of a decaying --lr-schedule (cosine, linear); "
            "give one") in capsys.readouterr().err
    assert main([*first, "--max-steps", "4", "--checkpoint", str(ckpt)]) == 0
    assert checkpoint.read(ckpt)["trainer"]["schedule_steps"] == 4
    capsys.readouterr()
    # past its end the run would train at learning rate 0: refused, before a cluster starts
    assert main([*first[:-2], "--resume", str(ckpt), "--max-steps", "6"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        "daskpri: error: --max-steps 6 goes past the end of the run's cosine learning-rate "
        "schedule at step 4, after which it would train at learning rate 0: give --max-steps 4 "
        "or less, or --schedule-steps 6 to stretch the schedule to the new end")
    # (and going on with --schedule-steps: test_train_checkpoints_then_resumes_where_it_stopped)
    assert main([*first[:-2], "--schedule-steps", "9", "--resume", str(ckpt),
                 "--max-steps", "12"]) == 2
    assert "--max-steps 12 goes past the end of the run's cosine learning-rate schedule at " \
        "step 9" in capsys.readouterr().err


def test_resume_of_a_file_that_is_no_checkpoint_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    other = tmp_path / "other.ckpt"
    torch.save({"format": 1, "weights": torch.zeros(2)}, other)
    for path, message in ((text, "is not a loadable daskpri checkpoint"),
                          (other, "is not a daskpri checkpoint, or is one from an incompatible "
                           "version of daskpri: it has no 'step', 'elapsed', 'model', ")):
        assert main(["train", "--dataset", "synthetic", "--resume", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"daskpri: error: {str(path)!r} {message}"), err
        assert "Traceback" not in err


def test_trainer_resume_refuses_overrides_its_checkpoint_fixes(checkpointed: Path) -> None:
    with pytest.raises(ValueError, match=r"^resume takes overrides of n_workers, resources, "
                       r".*checkpoint_every, schedule_steps, but got learning_rate, strategy: "
                       r"the checkpoint fixes the run's strategy and its options, seed and "
                       r"optimization; start a new Trainer to change them$"):
        daskpri.Trainer.resume(checkpointed, strategy="uniform", learning_rate=0.5)
    with pytest.raises(ValueError, match=r"but got epsilon: "):
        daskpri.Trainer.resume(checkpointed, epsilon=0.5)  # the strategy's own option
    trainer = daskpri.Trainer.resume(checkpointed, checkpoint_every=3, n_workers=1)
    assert trainer.checkpoint_every == 3 and trainer.checkpoint_path == str(checkpointed)
    assert trainer.strategy.name == "loss" and trainer.learning_rate == 0.1
    # a worker's share of the run's own cut under its batch: fewer workers mend it, not a
    # batch_size the checkpoint fixes
    with pytest.raises(ValueError, match=r"^batch_size=64 is more than a worker's share of the "
                       r"data \(30 samples, .*; resume it on fewer workers \(n_workers=\)$"):
        trainer._check_batch_fits(np.array([30, 770]), np.array([0, 1]), 2)
    trainer.close()  # no cluster was started


def test_resume_on_other_data_of_the_same_shape_and_count_is_refused_before_a_cluster(
    checkpointed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the run's data (synthetic, 1000 at seed 3: 800 to train on), its labels shifted
    train, _ = daskpri.datasets.load("synthetic", n_samples=1000, seed=3)
    store = to_store(train.assign(y=(train["y"] + 1) % 10), tmp_path / "shifted.zarr")
    argv = ["train", "--data", store, "--no-progress", "--workers", "1",
            "--resume", str(checkpointed), "--max-steps", "6"]
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no cluster
    assert captured.err == (
        "daskpri: error: the checkpoint's run trained on other data than this, of the same "
        "sample count: the labels differ at the sampled samples. Resume it with its own data; "
        "to go on with this data anyway, set dask.config.set({'daskpri.trainer.resume-other-"
        "data': True}) (or the environment variable "
        "DASK_DASKPRI__TRAINER__RESUME_OTHER_DATA=true)\n")
    # the same data, from a store: the run's own
    assert checkpoint.read(checkpointed)["data"] == data_fingerprint(open_dataset(
        to_store(train, tmp_path / "same.zarr")))
