"""Early stopping (``fit(early_stopping=...)``): a fit ends once its evaluations stop
improving, and with ``restore_best`` leaves the best evaluation's weights in the model, the
checkpoint it writes as it ends and the history's attributes."""

from __future__ import annotations

import shutil

import pytest
import torch
from _fits import fit_until_step

import daskpri
from daskpri import EarlyStopping
from daskpri.models import build_model


def _trainer(client, train, **kw):
    kw = {"client": client, "seed": 3, "batch_size": 32, "strategy": "uniform",
          "eval_every": 2, **kw}
    return daskpri.Trainer(build_model("mlp", train, seed=1), **kw)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_fit_ends_once_patience_evaluations_have_not_improved(gpu_client, small_data):
    train, test = small_data
    # min_delta far above any change of the accuracy: only the first evaluation improves
    rule = EarlyStopping(patience=3, min_delta=2.0)
    with _trainer(gpu_client, train) as t:
        history = t.fit(train, eval_data=test, max_steps=200, progress=False,
                        early_stopping=rule)
        # evaluated after steps 1, 3, 5, 7 (eval_every=2): the first best, three without
        assert t.step_ == 8
        assert (t.best_step_, t.stopped_step_) == (1, 7)
        first = history["accuracy"].sel(step=1).item()
        assert t.best_score_ == first
        assert history.attrs["best_step"] == 1 and history.attrs["stopped_step"] == 7
        assert history.attrs["early_stopping"] == repr(rule)
        # a second fit watches its own evaluations (from step 8 on); one without early
        # stopping drops them
        t.fit(train, eval_data=test, max_steps=200, progress=False,
              early_stopping=EarlyStopping(patience=1, min_delta=2.0))
        assert (t.step_, t.best_step_, t.stopped_step_) == (12, 9, 11)
        t.fit(train, eval_data=test, max_steps=t.step_ + 2, progress=False)
        assert (t.best_step_, t.best_score_, t.stopped_step_) == (None, None, None)
        assert "best_step" not in t.history_.attrs


def test_restore_best_leaves_the_weights_of_the_best_evaluation(gpu_client, small_data, tmp_path):
    train, test = small_data
    path = tmp_path / "run.ckpt"
    # monitor the loss, which no evaluation after the first beats by 10: the fit ends at
    # step 5, and the model is put back to the weights it had after step 1
    rule = EarlyStopping(patience=2, monitor="eval_loss", min_delta=10.0, restore_best=True)
    # (checkpoint_every=3: the last periodic checkpoint is of step 6 too, before the restore)
    with _trainer(gpu_client, train, learning_rate=0.05, checkpoint_path=path,
                  checkpoint_every=3) as t:
        t.fit(train, eval_data=test, max_steps=200, progress=False, early_stopping=rule)
        assert (t.step_, t.best_step_, t.stopped_step_) == (6, 1, 5)
        restored = _weights(t.model)
        assert t.evaluate(test)["loss"] == pytest.approx(t.best_score_, rel=1e-6)
        assert t.history_["eval_loss"].sel(step=1).item() == t.best_score_
    # the same run taken to step 2 and no further: the same weights (the same selections)
    with _trainer(gpu_client, train, learning_rate=0.05) as t:
        t.fit(train, max_steps=2, progress=False)
        torch.testing.assert_close(_weights(t.model), restored)
    with _trainer(gpu_client, train, learning_rate=0.05) as t:
        t.fit(train, max_steps=6, progress=False)  # as it was before it was put back
        assert not torch.allclose(t.model.state_dict()["1.weight"], restored["1.weight"])
    # the checkpoint written as the fit ended holds the restored weights, at step 6
    resumed = daskpri.Trainer.resume(path, client=gpu_client)
    try:
        assert resumed.step_ == 6
        torch.testing.assert_close(_weights(resumed.model), restored)
    finally:
        resumed.close()


def test_the_evaluation_at_the_end_of_the_budget_counts_and_is_not_patience(
    gpu_client, small_data, tmp_path
):
    train, test = small_data
    # no evaluation before the end (eval_every=100): the last is the only, and best, one
    with _trainer(gpu_client, train, eval_every=100) as t:
        t.fit(train, eval_data=test, max_steps=6, progress=False,
              early_stopping=EarlyStopping(patience=1, restore_best=True))
        assert (t.best_step_, t.stopped_step_) == (5, None)
        assert t.best_score_ == t.history_["accuracy"].sel(step=5).item()
    # evaluated after step 3 and at the end (step 5), which does not improve: the budget
    # ended the fit, not patience, which that evaluation used up: the checkpoint keeps the
    # watch so, and the next fit of the rule stops at its first evaluation
    rule = EarlyStopping(patience=1, min_delta=2.0)
    with _trainer(gpu_client, train, eval_every=4, checkpoint_path=tmp_path / "r.ckpt") as t:
        t.fit(train, eval_data=test, max_steps=6, progress=False, early_stopping=rule)
        assert (t.step_, t.best_step_, t.stopped_step_) == (6, 3, None)
    with daskpri.Trainer.resume(tmp_path / "r.ckpt", client=gpu_client) as t:
        t.fit(train, eval_data=test, max_steps=100, progress=False, early_stopping=rule)
        assert (t.step_, t.best_step_, t.stopped_step_) == (8, 3, 7)


def test_bad_early_stopping_is_refused_before_any_work(small_data):
    train, test = small_data
    with daskpri.Trainer(build_model("mlp", train), strategy="uniform", n_workers=1) as t:
        with pytest.raises(ValueError, match="early_stopping= needs eval_data="):
            t.fit(train, max_steps=5, early_stopping=3)
        with pytest.raises(TypeError, match="an int \\(the patience\\) or a daskpri.EarlyStop"):
            t.fit(train, eval_data=test, max_steps=5, early_stopping="3")
        with pytest.raises(TypeError, match="early_stopping should be"):
            t.fit_in_background(train, eval_data=test, max_steps=5, early_stopping=True)
        assert t._own_cluster is None  # refused before the cluster started
    with pytest.raises(ValueError, match="^monitor should be one of 'accuracy', 'eval_loss', "
                                         "but got monitor='val_loss'$"):
        EarlyStopping(monitor="val_loss")
    with pytest.raises(ValueError, match="^min_delta should be a finite number >= 0, but got "
                                         "min_delta=-0.1$"):
        EarlyStopping(min_delta=-0.1)
    with pytest.raises(ValueError, match="^patience should be a positive integer, but got "
                                         "patience=2.5$"):
        EarlyStopping(patience=2.5)
    with pytest.raises(TypeError, match="restore_best should be True or False"):
        EarlyStopping(restore_best="yes")


def test_a_stopped_background_fit_ends_with_its_best_weights(gpu_client, small_data):
    train, test = small_data
    # every evaluation after the first falls short by min_delta, and patience never runs out:
    # stop() ends the fit, which puts the first evaluation's weights back
    rule = EarlyStopping(patience=10_000, monitor="eval_loss", min_delta=10.0, restore_best=True)
    with _trainer(gpu_client, train, learning_rate=0.05) as t:
        running = fit_until_step(t, train, step=8, eval_data=test, early_stopping=rule)
        t.stop()
        history = running.result(timeout=60)
        assert t.step_ >= 8 and (t.best_step_, t.stopped_step_) == (1, None)
        assert history.attrs["restored_step"] == 1
        assert t.evaluate(test)["loss"] == pytest.approx(t.best_score_, rel=1e-6)


def _crash_at(step: int):
    """A callback that raises after ``step`` (its checkpoint written), as a driver that dies."""

    def crash(trainer, record):
        if record["step"] == step:
            raise RuntimeError("the driver died")

    return crash


def test_a_run_resumed_from_a_checkpoint_written_mid_fit_goes_on_with_its_watch(
    gpu_client, small_data, tmp_path
):
    train, test = small_data
    rule = EarlyStopping(patience=3, monitor="eval_loss", min_delta=10.0, restore_best=True)
    with _trainer(gpu_client, train, learning_rate=0.05) as t:  # unbroken: evaluated at 1, 3,
        t.fit(train, eval_data=test, max_steps=200, progress=False, early_stopping=rule)
        assert (t.step_, t.best_step_, t.stopped_step_) == (8, 1, 7)  # 5 and 7, stopped at 7
        unbroken = _weights(t.model)
    path = tmp_path / "run.ckpt"
    with _trainer(gpu_client, train, learning_rate=0.05, checkpoint_path=path,
                  checkpoint_every=2) as t:
        with pytest.raises(RuntimeError, match="the driver died"):
            t.fit(train, eval_data=test, max_steps=200, progress=False, early_stopping=rule,
                  callbacks=_crash_at(3))  # after the checkpoint of step 4
    again = tmp_path / "again.ckpt"  # (the resumed run below checkpoints to its own file)
    shutil.copy(path, again)
    with daskpri.Trainer.resume(path, client=gpu_client) as t:
        assert t.step_ == 4
        t.fit(train, eval_data=test, max_steps=200, progress=False, early_stopping=rule)
        # as the unbroken run: the best still step 1's, patience out at step 7, its weights
        assert (t.step_, t.best_step_, t.stopped_step_) == (8, 1, 7)
        torch.testing.assert_close(_weights(t.model), unbroken)
    # another rule (or none) watches afresh, saying so
    with daskpri.Trainer.resume(again, client=gpu_client) as t:
        with pytest.warns(daskpri.DaskpriWarning,
                          match=r"written during a fit with early_stopping=EarlyStopping\("
                                r"patience=3, .*\(its best eval_loss [\d.]+ at step 1, 1 "
                                r"evaluation\(s\) since\), and this fit has none; pass the same"):
            t.fit(train, eval_data=test, max_steps=6, progress=False)
        assert t.best_step_ is None


def test_a_fit_of_the_same_rule_goes_on_with_the_last_fits_watch(gpu_client, small_data,
                                                                   tmp_path):
    train, test = small_data
    path, again = tmp_path / "run.ckpt", tmp_path / "again.ckpt"
    rule = EarlyStopping(patience=3, min_delta=2.0)  # only the first evaluation improves
    with _trainer(gpu_client, train, checkpoint_path=path) as t:
        # evaluated at 1 (the best), 3 and 5: ended by its budget, 2 evaluations since the best
        t.fit(train, eval_data=test, max_steps=6, progress=False, early_stopping=rule)
        assert (t.best_step_, t.stopped_step_) == (1, None)
        shutil.copy(path, again)  # its checkpoint keeps the watch
        t.fit(train, eval_data=test, max_steps=200, progress=False, early_stopping=rule)
        assert (t.step_, t.best_step_, t.stopped_step_) == (8, 1, 7)  # one evaluation more
        # that watch ended its fit: the next watches afresh
        t.fit(train, eval_data=test, max_steps=10, progress=False, early_stopping=rule)
        assert (t.best_step_, t.stopped_step_) == (9, None)
    with daskpri.Trainer.resume(again, client=gpu_client, checkpoint_path=None) as t:
        t.fit(train, eval_data=test, max_steps=200, progress=False, early_stopping=rule)
        assert (t.step_, t.best_step_, t.stopped_step_) == (8, 1, 7)
    # a fit that put its best weights back leaves no watch to go on with
    restoring = EarlyStopping(patience=3, min_delta=2.0, restore_best=True)
    with _trainer(gpu_client, train, checkpoint_path=path) as t:
        t.fit(train, eval_data=test, max_steps=6, progress=False, early_stopping=restoring)
        assert t.history_.attrs["restored_step"] == 1
        assert torch.load(path, weights_only=True)["early_stopping"] is None
        t.fit(train, eval_data=test, max_steps=8, progress=False, early_stopping=restoring)
        assert (t.best_step_, t.stopped_step_) == (7, None)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda w: w.update(waited=4), r"its waited should be an integer in \[0, 3\]"),
    (lambda w: w["rule"].update(monitor="val_loss"), "its rule is refused: monitor should be "
                                                      "one of"),
    (lambda w: w.update(best_score=None), "its best_step and best_score should both be None"),
    (lambda w: w.update(best_state=None), "its best_state should hold the best weights"),
    (lambda w: w["best_state"].update({"1.weight": torch.zeros(2, 2)}),
     "its early stopping's best weights do not fit the model: size mismatch for 1.weight"),
])
def test_a_damaged_watch_in_a_checkpoint_is_refused(gpu_client, small_data, tmp_path, damage,
                                                    message):
    train, test = small_data
    path = tmp_path / "run.ckpt"
    rule = EarlyStopping(patience=3, min_delta=2.0, restore_best=True)
    with _trainer(gpu_client, train, checkpoint_path=path, checkpoint_every=2) as t:
        with pytest.raises(RuntimeError):
            t.fit(train, eval_data=test, max_steps=20, progress=False, early_stopping=rule,
                  callbacks=_crash_at(3))
    state = torch.load(path, weights_only=True)
    assert state["early_stopping"]["best_step"] == 1
    damage(state["early_stopping"])
    torch.save(state, path)
    with pytest.raises(ValueError, match="is a damaged daskpri checkpoint: .*" + message):
        daskpri.Trainer.resume(path, client=gpu_client)
