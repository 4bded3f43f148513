"""Evaluation on the driver: the held-out set, its device, and the setting that picks it."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import daskpri
from daskpri.models import build_model
from daskpri.training.evaluation import EvalSet, eval_device


def _by_hand(model, ds):
    x = torch.as_tensor(ds["x"].values, dtype=torch.float32)
    y = torch.as_tensor(ds["y"].values, dtype=torch.int64)
    with torch.no_grad():
        out = model.eval()(x)
    model.train()
    return float((out.argmax(1) == y).float().mean()), float(F.cross_entropy(out, y))


def test_an_eval_set_scores_the_model_in_batches_and_leaves_its_mode(small_data):
    train, test = small_data
    model = build_model("mlp", train, seed=0).train()
    acc, loss = EvalSet(test, batch_size=64, device="cpu").evaluate(model)
    want_acc, want_loss = _by_hand(model, test)
    assert acc == pytest.approx(want_acc) and loss == pytest.approx(want_loss, rel=1e-5)
    assert model.training  # put back as it was
    model.eval()
    EvalSet(test, device="cpu").evaluate(model)
    assert not model.training


def test_the_eval_device_setting_is_checked_before_a_fit_sends_work(gpu_client, small_data):
    train, test = small_data
    expected = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert eval_device() == expected  # null: the driver's GPU where it has one
    assert EvalSet(test).batch_size == (4096 if expected.type == "cuda" else 256)
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)
    try:
        with dask.config.set({"daskpri.trainer.eval-device": "abacus"}):
            with pytest.raises(ValueError, match=r"daskpri\.trainer\.eval-device should name a "
                               r"torch device like 'cpu' or 'cuda:0' .*but got 'abacus'"):
                trainer.fit(train, eval_data=test, max_steps=4, progress=False)
        with dask.config.set({"daskpri.trainer.eval-device": "cuda:7"}):
            with pytest.raises(ValueError, match=r"eval-device is 'cuda:7', but this process "
                               r"has \d+ CUDA device\(s\)"):
                trainer.fit(train, eval_data=test, max_steps=4, progress=False)
        assert trainer.step_ == 0  # refused before any step
        with dask.config.set({"daskpri.trainer.eval-device": "cpu"}):
            history = trainer.fit(train, eval_data=test, max_steps=4, progress=False)
    finally:
        trainer.close()
    acc = history["accuracy"].dropna("step")
    assert acc.size and float(acc[-1]) == pytest.approx(_by_hand(trainer.model, test)[0])
    assert np.isfinite(history["eval_loss"].dropna("step")).all()
