"""A damaged checkpoint is refused where it is read, in one line naming the field.

Each test damages a real checkpoint (of a short run, made once for the module)
as a hand edit or a broken copy could, and resumes it: the refusal comes from
``Trainer.resume`` (or ``daskpri train --resume``), before any cluster, not
from torch, numpy or the scheduler at the first step.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask.config
import pytest
import torch
from distributed import Client, LocalCluster

import daskpri
from daskpri.cli import main
from daskpri.data import load, to_store
from daskpri.data._fingerprint import data_fingerprint
from daskpri.models import build_model

Damage = Callable[[dict[str, Any]], object]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, small_data: Any) -> dict[str, Any]:
    """The state of a real checkpoint: 3 steps of ``projection`` with momentum."""
    train, _ = small_data
    path = tmp_path_factory.mktemp("fields") / "run.ckpt"
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                     dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        trainer = daskpri.Trainer(build_model("mlp", train, seed=1), strategy="projection",
                                  client=client, momentum=0.9)
        try:
            trainer.fit(train, max_steps=3, progress=False)
            trainer.save(path)
        finally:
            trainer.close()
    state: dict[str, Any] = torch.load(path, weights_only=True)
    assert isinstance(state["mean_grad"], torch.Tensor)  # (projection's, to damage)
    return state


def _damaged(saved: dict[str, Any], damage: Damage, path: Path) -> Path:
    state = copy.deepcopy(saved)
    damage(state)
    torch.save(state, path)
    return path


def _refused(saved: dict[str, Any], tmp_path: Path, damage: Damage, message: str) -> None:
    """``Trainer.resume`` of the damaged copy raises ``message`` (a regex after the path's)."""
    path = _damaged(saved, damage, tmp_path / "damaged.ckpt")
    with pytest.raises(ValueError, match="^" + re.escape(
        f"{str(path)!r} is a damaged daskpri checkpoint: "
    ) + message + "$"):
        daskpri.Trainer.resume(path)


def _id(value: Any) -> str:
    """A test's id: its message's words (its damage has none of its own)."""
    return "" if callable(value) else "-".join(re.findall(r"\w+", value))[:60]


def _set(*where: Any) -> Damage:
    """A damage: the value at ``state[where[0]][where[1]]...`` replaced by ``where[-1]``."""
    keys, value = where[:-1], where[-1]

    def damage(state: dict[str, Any]) -> None:
        inner = state
        for key in keys[:-1]:
            inner = inner[key]
        inner[keys[-1]] = value
    return damage


def _drop(*keys: Any) -> Damage:
    """A damage: the key at ``state[keys[0]][keys[1]]...`` removed."""

    def damage(state: dict[str, Any]) -> None:
        inner = state
        for key in keys[:-1]:
            inner = inner[key]
        del inner[keys[-1]]
    return damage


@pytest.mark.parametrize(("damage", "message"), ids=_id, argvalues=[
    (_set("step", -3), r"its 'step' should be a non-negative integer, but got int -3"),
    (_set("step", 7), r"its 'history' holds records of steps 0 to 2, where its 'step' is 7: "
     r"they should rise to step 6, the last it took, one a step \(or a round\)"),
    (_set("history", 1, "step", 0), r"its 'history' holds records of steps 0 to 2, where its "
     r"'step' is 3: they should rise .*"),
    (_set("history", []), r"its 'history' holds no records, where its 'step' is 3: .*"),
    (_set("elapsed", "x"), r"its 'elapsed' should be a number of seconds, at least 0, but "
     r"got str 'x'"),
    (_set("elapsed", float("nan")), r"its 'elapsed' should be .*, but got float nan"),
    (_set("setup_time", -1.0), r"its 'setup_time' should be .*, but got float -1.0"),
    (_set("data", "abc"), r"its 'data' should be None or the fingerprint of the run's data "
     r"\(a dict of str by key: 'x', 'y', 'x_rows', 'y_rows'\), but got str 'abc'"),
    (_drop("data", "y_rows"), r"its 'data' should be None or the fingerprint .*, but got "
     r"dict \{'x': .*"),
    (_set("history", {}), r"its 'history' should be a list of the steps' records, but got "
     r"dict \{\}"),
    (_set("history", 1, "x"), r"its 'history' record 1 should be a dict of a step's "
     r"metrics, with its 'step', but got str 'x'"),
    (_set("history", 1, "loss", "x"), r"its 'history' record 1's 'loss' should be a number, "
     r"but got str 'x'"),
    (_set("history", 2, "worker_samples", "x"), r"its 'history' record 2's 'worker_samples' "
     r"should be a list of numbers, one a worker, but got str 'x'"),
])
def test_a_count_or_history_out_of_step_is_refused(saved, tmp_path, damage, message):
    _refused(saved, tmp_path, damage, message)


@pytest.mark.parametrize(("damage", "message"), ids=_id, argvalues=[
    (_set("model", [1]), r"its 'model' should be a dict of tensors by name \(a module's "
     r"state_dict\), but got a list of length 1"),
    (_set("model", "1.bias", "x"), r"its 'model' entry '1.bias' should be a tensor, but got "
     r"str 'x'"),
    (_drop("model", "1.bias"), r"its 'model' does not hold the weights of its 'model_spec' "
     r"\('mlp'\): Missing key\(s\) in state_dict: \"1.bias\""),
    (_set("model", "extra", torch.zeros(2)), r"its 'model' does not hold .*: Unexpected "
     r"key\(s\) in state_dict: \"extra\""),
    (_set("model", "1.bias", torch.zeros(7)), r"its 'model' does not hold .*: size mismatch "
     r"for 1.bias: copying a param with shape torch.Size\(\[7\]\) from checkpoint, the shape "
     r"in current model is torch.Size\(\[300\]\)"),
    (lambda s: s["model"]["3.weight"].fill_(float("nan")), r"its 'model' holds values that "
     r"are not finite \(NaN or infinity\) in '3.weight': a run does not go on from them"),
    (_set("model_spec", "name", "resnet"), r"its 'model_spec' name should be 'mlp' or 'cnn' "
     r"\(None: a model of the user's\), but got str 'resnet'"),
    (_drop("model_spec", "n_classes"), r"its 'model_spec' 'n_classes' should be a positive "
     r"integer, but got NoneType None"),
    (_set("model_spec", "in_shape", "x"), r"its 'model_spec' 'in_shape' should be a positive "
     r"integer \(a list of them\), but got str 'x'"),
    (_set("model_spec", "hidden", 301), r"its 'model' does not hold the weights of its "
     r"'model_spec' \('mlp'\): size mismatch for 1.weight: .*; size mismatch for 1.bias: .*"),
])
def test_weights_that_do_not_fit_the_model_are_refused(saved, tmp_path, damage, message):
    _refused(saved, tmp_path, damage, message)


def test_weights_that_do_not_fit_a_users_model_are_one_line(saved, tmp_path):
    state = copy.deepcopy(saved)
    state["model_spec"] = None
    path = tmp_path / "own.ckpt"
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"^model does not match the checkpoint's "
                       r"architecture: size mismatch for 1.weight: copying a param with shape "
                       r"torch.Size\(\[300, 20\]\) from checkpoint, the shape in current model "
                       r"is torch.Size\(\[64, 5\]\); size mismatch for 1.bias: .*$") as info:
        daskpri.Trainer.resume(path, model=daskpri.models.MLP((5,), 10, hidden=64))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("damage", "message"), ids=_id, argvalues=[
    (_set("optimizer", []), r"its 'optimizer' should be an optimizer's state_dict \(a dict "
     r"of 'state' and 'param_groups'\), but got a list of length 0"),
    (_drop("optimizer", "state"), r"its 'optimizer' should be an optimizer's state_dict .*"),
    (_set("optimizer", "param_groups", 0, "params", [0, 1, 2]), r"its 'optimizer' holds the "
     r"state of parameter 3, which none of its param_groups lists \(they list 3\)"),
    (lambda s: (s["optimizer"]["param_groups"][0]["params"].pop(),
                s["optimizer"]["state"].pop(3)),
     r"its 'optimizer' holds the state of 3 parameters, but the model has 4"),
    (_set("optimizer", "state", 0, "momentum_buffer", torch.zeros(3)), r"its 'optimizer' "
     r"holds momentum_buffer of shape \(3,\) for parameter 0, of shape \(300, 20\)"),
    (_set("optimizer", "state", 2, "momentum_buffer", torch.full((10, 300), float("inf"))),
     r"its 'optimizer' state of parameter 2 holds values that are not finite \(NaN or "
     r"infinity\) in 'momentum_buffer': a run does not go on from them"),
    (_set("trainer", "optimizer", "adam"), r"its 'optimizer' holds momentum_buffer for "
     r"parameter 0, where the run's adam keeps exp_avg, exp_avg_sq, step"),
    (_set("optimizer", "param_groups", 0, "momentum", "x"), r"its 'optimizer' has "
     r"momentum='x', where the run's options give sgd momentum=0.9"),
    (_set("mean_grad", "x"), r"its 'mean_grad' should be None or a 1-D tensor of floats "
     r"\(the running mean gradient\), but got str 'x'"),
    (_set("mean_grad", torch.zeros(3)), r"its 'mean_grad' holds 3 values, where the model "
     r"has \d+ parameters"),
])
def test_optimizer_state_that_does_not_fit_the_model_is_refused(saved, tmp_path, damage,
                                                                message):
    _refused(saved, tmp_path, damage, message)


@pytest.mark.parametrize(("damage", "message"), ids=_id, argvalues=[
    (_set("strategy", "name", 3), r"its strategy's name should be a str, but got int 3"),
    (_set("strategy", "params", [1]), r"its strategy's 'params' should be a dict of options "
     r"by name, but got a list of length 1"),
    (_set("strategy", "params", "zzz", 1), r"its strategy's options are refused: strategy "
     r"'projection' takes the options .*, but got the option zzz"),
    (_set("strategy", "params", "k", "x"), r"its strategy's options are refused: k should be "
     r"a positive integer, but got k='x'"),
    (_set("trainer", "zzz", 1), r"its 'trainer' holds 'zzz', which the trainer does not "
     r"take; it takes seed, n_workers, .*, on_nonfinite"),
    (_set("trainer", "seed", "x"), r"its trainer's 'seed' should be an integer, but got "
     r"str 'x'"),
    (_set("trainer", "seed", -1), r"its trainer's 'seed' should be an integer in "
     r"\[0, 4294967295\], but got int -1"),
    (_set("trainer", "schedule_steps", "x"), r"its trainer's 'schedule_steps' should be an "
     r"integer or None, but got str 'x'"),
    (_set("trainer", "batch_size", -3), r"its trainer's options are refused: batch_size "
     r"should be a positive integer, but got batch_size=-3"),
    (_set("trainer", "lr_schedule", "zig"), r"its trainer's options are refused: lr_schedule "
     r"should be one of 'constant', 'cosine', 'linear', but got 'zig'"),
])
def test_a_strategy_or_options_that_do_not_exist_are_refused(saved, tmp_path, damage,
                                                             message):
    _refused(saved, tmp_path, damage, message)


def test_an_override_refused_is_the_callers_not_the_checkpoints(saved, tmp_path):
    path = _damaged(saved, lambda s: None, tmp_path / "run.ckpt")
    with pytest.raises(ValueError, match=r"^n_workers should be a positive integer, but got "
                       r"n_workers=0$"):
        daskpri.Trainer.resume(path, n_workers=0)


@pytest.mark.parametrize(("damage", "message"), ids=_id, argvalues=[
    (_set("table", {}), r"its 'table' should be the priority table's state \(a dict whose "
     r"'table' is a dict\), but got dict \{\}"),
    (_drop("table", "rng"), r"its 'table' has no 'rng'"),
    (_drop("table", "table", "older_p"), r"its 'table' table has no 'older_p'"),
    (_set("table", "table", "offsets", "x"), r"its table's 'offsets' should be a 1-D tensor "
     r"of integers rising from 0 \(the partitions' bounds\), but got str 'x'"),
    (lambda s: s["table"]["table"].update(current=s["table"]["table"]["current"][:5]),
     r"in its 'table', the state's current has shape \(5,\), expected \(1600,\)"),
    (_set("table", "table", "staleness", "zig"), r"in its 'table', staleness should be one "
     r"of 'keep', 'exp-linear', 'exp-quadratic', but got 'zig'"),
    (_set("table", "rng", "state", 3), r"its table's 'rng' should be the state of a numpy "
     r"PCG64 generator, but got dict \{'bit_generator': 'PCG64', 'state': 3, .*"),
    (_set("table", "strategy_state", [1]), r"its table's 'strategy_state' should be a dict, "
     r"but got a list of length 1"),
    (_set("table", "strategy_state", "renew", "x"), r"its table's 'strategy_state' is not one "
     r"strategy 'projection' goes on from \(selecting step 3: AttributeError: .*\)"),
    (_set("table", "owner", torch.zeros(1, dtype=torch.int64)), r"its table's 'owner' should "
     r"be a tensor of 2 worker slots, one a partition, but got a tensor of shape \(1,\)"),
    (_set("table", "last_step", "x"), r"its table's 'last_step' should be an integer of at "
     r"least -1, but got str 'x'"),
])
def test_a_priority_table_of_the_wrong_shape_is_refused(saved, tmp_path, damage, message):
    _refused(saved, tmp_path, damage, message)


def test_a_truncated_checkpoint_is_refused_in_a_line(saved, tmp_path):
    whole = _damaged(saved, lambda s: None, tmp_path / "whole.ckpt").read_bytes()
    path = tmp_path / "cut.ckpt"
    for size in (100, len(whole) // 2, len(whole) - 10):
        path.write_bytes(whole[:size])
        with pytest.raises(ValueError, match="^" + re.escape(
            f"{str(path)!r} is not a loadable daskpri checkpoint (it is read weights-only, and "
            "refused if it holds anything but tensors and plain values): it is cut short or "
            "damaged (torch: "
        ) + r"[^\n]*\)$"):
            daskpri.Trainer.resume(path)


@pytest.mark.parametrize(("damage", "message"), ids=_id, argvalues=[
    (_set("trainer", "seed", "x"), r"its trainer's 'seed' should be an integer"),
    (_drop("model_spec", "n_classes"), r"its 'model_spec' 'n_classes' should be"),
    (_set("table", {}), r"its 'table' should be the priority table's state"),
    (_set("trainer", "batch_size", -3), r"its trainer's options are refused: batch_size"),
    (_set("optimizer", "state", 0, "momentum_buffer", torch.zeros(3)),
     r"its 'optimizer' holds momentum_buffer of shape \(3,\)"),
])
def test_train_resume_of_a_damaged_checkpoint_exits_2_in_one_line(
    saved, tmp_path, capsys, damage, message
):
    path = _damaged(saved, damage, tmp_path / "damaged.ckpt")
    argv = ["train", "--dataset", "synthetic", "--n-samples", "2000", "--workers", "1",
            "--no-progress", "--resume", str(path), "--max-steps", "5"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing resumed, no cluster's dashboard
    assert re.fullmatch(re.escape(f"daskpri: error: {str(path)!r} is a damaged daskpri "
                                  "checkpoint: ") + message + r"[^\n]*\n", err), err


def test_a_refused_resume_leaves_the_users_model_as_it_was(saved, tmp_path):
    state = copy.deepcopy(saved)
    state["model_spec"] = None
    path = tmp_path / "own.ckpt"
    torch.save(state, path)
    # of another width: its last bias (10 classes) matches the checkpoint's, and torch
    # copies it before it says what does not match
    narrow = daskpri.models.MLP((20,), 10, hidden=64)
    before = [p.detach().clone() for p in narrow.parameters()]
    with pytest.raises(ValueError, match="model does not match the checkpoint's architecture"):
        daskpri.Trainer.resume(path, model=narrow)
    assert all(torch.equal(a, b) for a, b in zip(before, narrow.parameters(), strict=True))
    # of the run's architecture, but the optimizer state is damaged: found after the load
    state["optimizer"]["state"][0]["momentum_buffer"] = torch.zeros(3)
    torch.save(state, path)
    same = daskpri.models.MLP((20,), 10, hidden=300)
    before = [p.detach().clone() for p in same.parameters()]
    with pytest.raises(ValueError, match="its 'optimizer' holds momentum_buffer of shape"):
        daskpri.Trainer.resume(path, model=same)
    assert all(torch.equal(a, b) for a, b in zip(before, same.parameters(), strict=True))


def test_train_resume_reads_a_checkpoint_older_than_schedule_steps(saved, tmp_path, capsys):
    # checkpoints from before --schedule-steps have no such field: Trainer.resume takes
    # None for it, and so does the command line (a KeyError's traceback before)
    path = _damaged(saved, _drop("trainer", "schedule_steps"), tmp_path / "old.ckpt")
    argv = ["train", "--dataset", "synthetic", "--n-samples", "2000", "--workers", "1",
            "--no-progress", "--resume", str(path), "--max-steps", "5",
            "--checkpoint-every", "2"]  # refused after the schedule's checks, before a cluster
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("daskpri: error: --checkpoint-every needs --checkpoint"), err


def test_resume_refuses_other_data_of_the_same_shape_and_count(saved, small_data, tmp_path):
    train, _ = small_data
    path = _damaged(saved, lambda state: None, tmp_path / "run.ckpt")
    other, _ = load("synthetic", n_samples=2000, seed=1)  # another draw: 1600 samples too
    relabelled = train.assign(y=(train["y"] + 1) % 10)
    store = to_store(relabelled.chunk({"sample": 400}), tmp_path / "relabelled.zarr")
    cases = [(other, "the features differ at the sampled samples; the labels differ at the "
                     "sampled samples"),
             (store, "the labels differ at the sampled samples"),
             (train.assign(x=train["x"].astype("float64")), "x is float64 (1600, 20), where "
              "the run's was float32 (1600, 20); the features differ at the sampled samples")]
    for data, differs in cases:
        trainer = daskpri.Trainer.resume(path)
        # refused as the fit starts, before a cluster
        with pytest.raises(ValueError, match="^" + re.escape(
            "the checkpoint's run trained on other data than this, of the same sample count: "
            f"{differs}. Resume it with its own data; to go on with this data anyway, set "
            "dask.config.set({'daskpri.trainer.resume-other-data': True}) (or the environment "
            "variable DASK_DASKPRI__TRAINER__RESUME_OTHER_DATA=true)") + "$"):
            trainer.fit(data, max_steps=5, progress=False)
        assert trainer._own_cluster is None
    trainer = daskpri.Trainer.resume(path)
    with pytest.raises(ValueError, match=r"^the checkpoint's run trained on 1600 samples, but "
                       r"the data has 800: resume it with its own data$"):
        trainer.fit(train.isel(sample=slice(0, 800)), max_steps=5, progress=False)
    # told to, it goes on with other data; a checkpoint from before the fingerprint goes
    # on with a warning that the data is known by its count alone
    old = _damaged(saved, _drop("data"), tmp_path / "old.ckpt")
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                     dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        trainer = daskpri.Trainer.resume(path, client=client)
        try:
            with dask.config.set({"daskpri.trainer.resume-other-data": True}):
                assert trainer.fit(relabelled, max_steps=4, progress=False).sizes["step"] == 4
            trainer.save(path)  # the data it now goes on with
        finally:
            trainer.close()
        assert torch.load(path, weights_only=True)["data"] == data_fingerprint(relabelled)
        trainer = daskpri.Trainer.resume(old, client=client)
        try:
            with pytest.warns(daskpri.DaskpriWarning, match="^the checkpoint keeps no "
                              "fingerprint of its run's data .*: the data it goes on with is "
                              "checked by its sample count alone$"):
                trainer.fit(other, max_steps=4, progress=False)
        finally:
            trainer.close()
