"""Checkpoints: atomic, weights-only, and a resumed run continues exactly."""

from __future__ import annotations

import os
import pickle
import re
import time
import zipfile
from typing import Any

import numpy as np
import pytest
import torch
import xarray as xr

import daskpri
from daskpri.models import build_model
from daskpri.training import checkpoint


@pytest.mark.parametrize("strategy", ["projection", "uniform"])
def test_resumed_run_selects_the_same_samples_and_reaches_the_same_weights(
    gpu_client, small_data, tmp_path, strategy
):
    train, test = small_data
    path = tmp_path / "run.ckpt"
    kw = {"strategy": strategy, "client": gpu_client, "seed": 5, "batch_size": 32, "eval_every": 7}
    a = daskpri.Trainer(build_model("mlp", train, seed=1), **kw)
    try:
        a.fit(train, eval_data=test, max_steps=15, progress=False)
        a.save(path)
        setup = a.history_.attrs["setup_time"]
        ha = a.fit(train, eval_data=test, max_steps=40, progress=False)
        params_a = [p.detach().clone() for p in a.model.parameters()]
    finally:
        a.close()
    b = daskpri.Trainer.resume(path, client=gpu_client)
    try:
        assert b.step_ == 15 and b.history_.sizes["step"] == 15
        assert b.history_.attrs["setup_time"] == setup > 0  # the run's own, kept
        hb = b.fit(train, eval_data=test, max_steps=40, progress=False)
        assert hb["step"].values.tolist() == list(range(40))
        np.testing.assert_array_equal(ha["selection_digest"], hb["selection_digest"])
        np.testing.assert_array_equal(ha["loss"], hb["loss"])
        for pa, pb in zip(params_a, b.model.parameters(), strict=True):
            assert torch.equal(pa, pb), "bitwise equal parameters on CPU"
        assert (np.diff(hb["time"]) > 0).all()
    finally:
        b.close()


def test_a_run_resumed_on_fewer_workers_keeps_its_partitions(gpu_client, small_data, tmp_path):
    train, _ = small_data
    path = tmp_path / "two.ckpt"
    a = daskpri.Trainer(build_model("mlp", train, seed=1), strategy="loss", client=gpu_client)
    try:
        a.fit(train, max_steps=6, progress=False)
        a.save(path)
        offsets = a._remote.state_dict()["table"]["offsets"].tolist()
    finally:
        a.close()
    assert len(offsets) == 3  # cut for two workers: the data is not chunked
    b = daskpri.Trainer.resume(path, client=gpu_client, n_workers=1)
    try:
        h = b.fit(train, max_steps=10, progress=False)
        assert h["step"].values.tolist() == list(range(10))
        assert h["n_workers"].values[6:].tolist() == [1] * 4
        assert b._remote.state_dict()["table"]["offsets"].tolist() == offsets
    finally:
        b.close()
    c = daskpri.Trainer.resume(path, client=gpu_client)
    try:
        with pytest.raises(ValueError, match=r"^the checkpoint's run trained on 1600 samples, "
                           r"but the data has 1000: resume it with its own data$"):
            c.fit(train.isel(sample=slice(0, 1000)), max_steps=10, progress=False)
    finally:
        c.close()


class _SavesCounted(daskpri.Trainer):
    """A trainer that notes the step of each checkpoint it writes."""

    saved: list[int]

    def save(self, path):
        self.__dict__.setdefault("saved", []).append(self.step_)
        return super().save(path)


def test_checkpoint_every_writes_the_latest_state(gpu_client, small_data, tmp_path):
    train, _ = small_data
    path = tmp_path / "periodic.ckpt"
    t = _SavesCounted(build_model("mlp", train), strategy="loss", client=gpu_client,
                      checkpoint_path=path, checkpoint_every=4)
    try:
        t.fit(train, max_steps=10, progress=False)
        assert t.saved == [4, 8, 10]  # every 4 steps, and where the fit ended
        state = checkpoint.read(path)
        assert state["step"] == 10 and len(state["history"]) == 10
        with pytest.warns(daskpri.DaskpriWarning, match=r"^max_steps=10 is reached already "
                          r"\(step_=10\): max_steps counts the steps of every fit of this "
                          r"trainer, so this one trains none; pass max_steps=20 to train 10 "
                          r"more$") as record:
            t.fit(train, max_steps=10, progress=False)  # nothing to do: nothing written
        assert record[0].filename == __file__
        t.fit(train, max_steps=12, progress=False)  # ends on a period's step: written once
        assert t.saved == [4, 8, 10, 12]
    finally:
        t.close()
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []
    with pytest.raises(ValueError, match="checkpoint_every= needs checkpoint_path="):
        daskpri.Trainer(build_model("mlp", train), checkpoint_every=3)
    with pytest.raises(ValueError, match=re.escape(
        f"checkpoint_path should be a file's path, but got {str(tmp_path)!r}, which is a "
        "directory"
    )):
        daskpri.Trainer(build_model("mlp", train), checkpoint_path=tmp_path)
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match=re.escape(
        f"checkpoint_path should be a path under directories, but got "
        f"{str(tmp_path / 'afile' / 'sub' / 'x.ckpt')!r}, and {str(tmp_path / 'afile')!r} is a "
        "file"
    )):
        daskpri.Trainer(build_model("mlp", train),
                        checkpoint_path=tmp_path / "afile" / "sub" / "x.ckpt")
    daskpri.Trainer(build_model("mlp", train), checkpoint_path=tmp_path / "new" / "x.ckpt")


def test_a_stopped_fit_is_checkpointed_where_it_stopped(gpu_client, small_data, tmp_path):
    train, test = small_data
    path = tmp_path / "stopped.ckpt"
    t = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client,
                        checkpoint_path=path, eval_every=1)
    try:
        # a target reached ends the fit as stop() would: no period given, one checkpoint
        h = t.fit(train, eval_data=test, max_steps=500, target_accuracy=0.3, progress=False)
        assert h.sizes["step"] < 500
        state = checkpoint.read(path)
        assert state["step"] == t.step_ == h.sizes["step"]
    finally:
        t.close()


def _whole(**values: Any) -> dict[str, Any]:
    """A whole checkpoint's state, of a run of a model of the user's at step 0, but ``values``."""
    net = torch.nn.Linear(3, 2)
    params = dict(
        seed=0, n_workers=None, resources=None, batch_size=2, learning_rate=0.1, momentum=0.9,
        weight_decay=0.0, max_grad_norm=None, optimizer="sgd", lr_schedule="constant",
        schedule_steps=None, local_steps=1, eval_every=50, partition_size=None,
        staleness="keep", device=None, checkpoint_path=None, checkpoint_every=None,
        transport="direct", on_nonfinite="raise",
    )
    table = {"table": daskpri.PriorityTable([3, 2]).state_dict(),
             "rng": np.random.default_rng(0).bit_generator.state, "strategy_state": {},
             "owner": np.zeros(2, dtype=np.int64), "last_step": -1}
    state = {
        "step": 0, "elapsed": 0.0, "model": net.state_dict(), "model_spec": None,
        "optimizer": torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9).state_dict(),
        "mean_grad": None, "strategy": {"name": "uniform", "params": {"batch_size": None}},
        "trainer": params, "table": checkpoint.to_storable(table), "history": [],
    }
    return dict(state, **values)


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "c.ckpt"
    checkpoint.write(_whole(elapsed=1.0), path)

    class Unsaveable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle this")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        checkpoint.write(_whole(elapsed=2.0, bad=Unsaveable()), path)
    assert checkpoint.read(path)["elapsed"] == 1.0
    assert sorted(os.listdir(tmp_path)) == ["c.ckpt"]


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# torch warns of the pickle's protocol before its weights-only loader refuses it
@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
def test_a_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.ckpt"
    with open(path, "wb") as f:
        torch.save({"format": checkpoint.FORMAT, "step": 0, "x": _Evil(str(marker))}, f)
    with pytest.raises(ValueError, match="not a loadable daskpri checkpoint") as info:
        daskpri.Trainer.resume(path)
    assert not marker.exists()
    # the refusal names what was refused, and never suggests loading it unsafely
    assert "GLOBAL posix.system" in str(info.value)
    assert "weights_only` set to `False`" not in str(info.value)
    path.write_bytes(pickle.dumps(_Evil(str(marker))))  # not even torch's: never unpickled
    with pytest.raises(ValueError, match="it is a plain pickle, not the zip archive that "
                       "torch.save writes$") as info:
        checkpoint.read(path)
    assert not marker.exists()
    assert "weights_only` set to `False`" not in str(info.value)


def test_resume_errors(tmp_path, small_data):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        daskpri.Trainer.resume(tmp_path / "missing.ckpt")
    path = tmp_path / "other.ckpt"
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match=r"^'.*other.ckpt' is not a daskpri checkpoint: it has "
                       r"no 'format' key, which every checkpoint holds$"):
        daskpri.Trainer.resume(path)
    torch.save([1, 2], path)
    with pytest.raises(ValueError, match=r"is not a daskpri checkpoint: it holds a list, where "
                       r"a checkpoint holds a dict of format 1$"):
        checkpoint.read(path)
    for text in ["root:x:0:0:root:/root:/bin/bash\n", "", "{}", "hello world"]:
        path.write_text(text)  # files that are not a pickle at all
        with pytest.raises(ValueError, match="is not a loadable daskpri checkpoint") as info:
            checkpoint.read(path)
        assert not re.search(r": \d+$", str(info.value))  # an unpickler's KeyError: 101
    with zipfile.ZipFile(path, "w") as z:  # a zip archive of another kind
        z.writestr("notes.txt", "mine")
    with pytest.raises(ValueError, match=r": it is a zip archive, but not one torch.save wrote$"):
        checkpoint.read(path)
    path.write_text("hello world")
    with pytest.raises(ValueError, match=r"it is not the zip archive that torch.save writes$"):
        checkpoint.read(path)
    # files given by mistake for a checkpoint are named, not given to torch's unpickler
    np.save(tmp_path / "a.npy", np.zeros(3))
    xr.Dataset({"a": ("x", [1])}).to_netcdf(tmp_path / "a.nc", engine="h5netcdf")
    for name, kind in (("a.npy", "a NumPy .npy file"), ("a.nc", "an HDF5 or netCDF4 file")):
        with pytest.raises(ValueError, match=re.escape(
                f"{str(tmp_path / name)!r} is not a loadable daskpri checkpoint: it is {kind}, "
                "not the zip archive that torch.save writes") + "$"):
            checkpoint.read(tmp_path / name)
    # a numpy scalar is refused by name, without torch's advice to allow it
    torch.save({"format": checkpoint.FORMAT, "x": np.float64(1.0)}, path)
    with pytest.raises(ValueError, match=r"Unsupported global: GLOBAL numpy\S*scalar was not an "
                       r"allowed global by default\.$"):
        checkpoint.read(path)


def test_read_refuses_a_checkpoint_of_another_format(tmp_path):
    path = str(tmp_path / "future.ckpt")
    torch.save(dict(_whole(), format=2), path)
    with pytest.raises(ValueError, match=re.escape(
        f"{path!r} is not a checkpoint this version of daskpri reads: its 'format' should be "
        "1, but got 2 (a checkpoint of an incompatible version of daskpri, or not a daskpri "
        "checkpoint)"
    )):
        daskpri.Trainer.resume(path)
    for fmt, got in [(torch.ones(2), "a tensor of shape (2,)"), ("1", "str '1'")]:
        torch.save(dict(_whole(), format=fmt), path)
        with pytest.raises(ValueError, match=re.escape(f"'format' should be 1, but got {got} ")):
            daskpri.Trainer.resume(path)


def test_read_refuses_a_partial_checkpoint_naming_the_keys_it_lacks(tmp_path):
    path = str(tmp_path / "partial.ckpt")
    refused = (f"{path!r} is not a daskpri checkpoint, or is one from an incompatible version "
               "of daskpri: ")
    torch.save({"format": 1}, path)  # unpickles fine, weights-only
    with pytest.raises(ValueError, match="^" + re.escape(
        refused + "it has no 'step', 'elapsed', 'model', 'model_spec', 'optimizer', "
        "'mean_grad', 'strategy', 'trainer', 'table', 'history', which every checkpoint of "
        "format 1 holds"
    ) + "$"):
        checkpoint.read(path)
    state = _whole()
    del state["model_spec"], state["trainer"]["seed"], state["strategy"]["params"]
    checkpoint.write(state, path)
    with pytest.raises(ValueError, match=re.escape(
        refused + "it has no 'model_spec', 'params' in 'strategy', 'seed' in 'trainer', "
        "which every checkpoint of format 1 holds"
    )):
        checkpoint.read(path)
    damaged = f"{path!r} is a damaged daskpri checkpoint: its "
    for key, value, allowed in [("step", "3", "a non-negative integer"),
                                ("step", True, "a non-negative integer"),
                                ("trainer", [], "a dict"),
                                ("model_spec", "mlp", "None or a built-in model's spec")]:
        checkpoint.write(_whole(**{key: value}), path)
        with pytest.raises(ValueError, match=re.escape(
            f"{damaged}{key!r} should be {allowed}, but got {checkpoint.shown(value)}"
        )):
            checkpoint.read(path)


def test_resume_of_a_partial_checkpoint_is_a_value_error_naming_what_it_lacks(tmp_path):
    path = tmp_path / "partial.ckpt"
    state = _whole()
    del state["model_spec"]
    checkpoint.write(state, path)
    # a ValueError saying what is wrong, where it was a KeyError: 'model_spec'
    with pytest.raises(ValueError, match=r"is not a daskpri checkpoint, or is one from an "
                       r"incompatible version of daskpri: it has no 'model_spec', which"):
        daskpri.Trainer.resume(path)


def test_resume_needs_a_matching_model(tmp_path):
    net = torch.nn.Linear(3, 2)
    state = _whole(model=net.state_dict())
    path = checkpoint.write(state, tmp_path / "m")
    with pytest.raises(ValueError, match="not a built-in one: pass model="):
        daskpri.Trainer.resume(path)
    with pytest.raises(ValueError, match="model does not match the checkpoint's architecture"):
        daskpri.Trainer.resume(path, model=torch.nn.Linear(4, 2))


def test_resume_of_an_unregistered_strategy_says_how_to_register_it(tmp_path):
    net = torch.nn.Linear(3, 2)
    state = _whole(model=net.state_dict(), strategy={"name": "mine", "params": {"k": 2}})
    path = checkpoint.write(state, tmp_path / "m")
    with pytest.raises(ValueError, match=re.escape(
        "the checkpoint's strategy 'mine' is not registered in this process: define its class "
        "and decorate it with daskpri.register_strategy (with name = 'mine') before resuming"
    )):
        daskpri.Trainer.resume(path, model=net)


def test_a_1d_cnn_checkpoint_saved_with_1d_weight_shapes_resumes_exactly(
    gpu_client, small_data, tmp_path
):
    # the 1-D CNN ran nn.Conv1d layers before: its checkpoints hold conv weights and
    # momentum of shape (out, in, k), where the layers now have (out, in, 1, k)
    train, test = small_data
    path, old = tmp_path / "run.ckpt", tmp_path / "old.ckpt"
    kw = {"strategy": "uniform", "client": gpu_client, "seed": 5, "batch_size": 32,
          "momentum": 0.9}
    a = daskpri.Trainer(build_model("cnn", train, seed=1), **kw)
    try:
        a.fit(train, max_steps=6, progress=False)
        a.save(path)
        ha = a.fit(train, max_steps=12, progress=False)
        params_a = [p.detach().clone() for p in a.model.parameters()]
    finally:
        a.close()
    state = checkpoint.read(path)
    for key in ("1.weight", "4.weight"):
        assert state["model"][key].dim() == 4
        state["model"][key] = state["model"][key].squeeze(2)
    squeezed = 0
    for buffers in state["optimizer"]["state"].values():
        for name, value in buffers.items():
            if isinstance(value, torch.Tensor) and value.dim() == 4:
                buffers[name], squeezed = value.squeeze(2), squeezed + 1
    assert squeezed == 2  # the two convolutions' momentum
    checkpoint.write(state, old)
    b = daskpri.Trainer.resume(old, client=gpu_client)
    try:
        hb = b.fit(train, max_steps=12, progress=False)
        np.testing.assert_array_equal(ha["selection_digest"], hb["selection_digest"])
        for pa, pb in zip(params_a, b.model.parameters(), strict=True):
            assert pa.shape == pb.shape and torch.equal(pa, pb)
    finally:
        b.close()


def test_a_write_removes_what_writers_killed_mid_write_left(tmp_path):
    path = tmp_path / "c.ckpt"
    stale = tmp_path / ".c.ckpt.0123abcd.tmp"  # a writer killed by kill -9
    young = tmp_path / ".c.ckpt.4567ef01.tmp"  # perhaps another writer's, still writing
    other = tmp_path / ".d.ckpt.89ab.tmp"  # another checkpoint's
    for f in (stale, young, other):
        f.write_bytes(b"part of a checkpoint")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    checkpoint.write(_whole(step=1), path)
    assert sorted(os.listdir(tmp_path)) == sorted([".c.ckpt.4567ef01.tmp", ".d.ckpt.89ab.tmp",
                                                   "c.ckpt"])


def test_a_resumed_run_checkpoints_to_the_file_it_resumed_never_a_path_stored_in_it(
    gpu_client, small_data, tmp_path
):
    train, _ = small_data
    original = tmp_path / "run.ckpt"
    a = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client,
                        checkpoint_path=original, checkpoint_every=5)
    try:
        a.fit(train, max_steps=5, progress=False)
    finally:
        a.close()
    # a copy whose stored path names a file of the user's (as a shared checkpoint could)
    victim = tmp_path / "notes.txt"
    victim.write_text("precious")
    state = torch.load(original, weights_only=True)
    state["trainer"]["checkpoint_path"] = str(victim)
    copy = tmp_path / "copy.ckpt"
    torch.save(state, copy)
    before = original.read_bytes()
    b = daskpri.Trainer.resume(copy, client=gpu_client)
    try:
        assert b.checkpoint_path == str(copy) and b.checkpoint_every == 5
        b.fit(train, max_steps=10, progress=False)
    finally:
        b.close()
    assert victim.read_text() == "precious" and original.read_bytes() == before
    assert checkpoint.read(copy)["step"] == 10


def test_a_checkpoint_never_replaces_a_file_that_is_not_one(gpu_client, small_data, tmp_path):
    train, _ = small_data
    notes = tmp_path / "notes.txt"
    notes.write_text("precious")
    message = re.escape(f"checkpoint_path names {str(notes)!r}, a file that is not a daskpri "
                        "checkpoint: writing the checkpoint would replace it")
    with pytest.raises(ValueError, match=message):
        daskpri.Trainer(build_model("mlp", train), client=gpu_client, checkpoint_path=notes)
    t = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)
    try:
        t.fit(train, max_steps=2, progress=False)
        with pytest.raises(ValueError, match="a file that is not a daskpri checkpoint"):
            t.save(notes)
    finally:
        t.close()
    assert notes.read_text() == "precious"
