"""``fit(callbacks=...)``: a callable called with the trainer and each step's record, in the
fit's thread, which may stop the fit; its error ends the fit with the steps kept."""

from __future__ import annotations

import math
import threading

import pytest
from _fits import mlp_trainer


def test_callbacks_see_every_step_in_order_with_its_evaluations(gpu_client, small_data):
    train, test = small_data
    seen, threads = [], set()

    def log(trainer, record):
        threads.add(threading.get_ident())
        assert trainer.step_ == record["step"] + 1  # the step is taken, and in the history
        assert trainer.history_["step"].values[-1] == record["step"]
        seen.append((record["step"], record.get("accuracy", math.nan), record["loss"]))

    with mlp_trainer(gpu_client, train, batch_size=32, eval_every=4) as t:
        history = t.fit(train, eval_data=test, max_steps=10, progress=False,
                        callbacks=[log, lambda trainer, record: None])
        # every step, then step 9 again with the evaluation the fit made as it ended
        assert [s for s, _, _ in seen] == [*range(10), 9]
        evaluated = {s: a for s, a, _ in seen if not math.isnan(a)}
        assert evaluated == {s: float(history["accuracy"].sel(step=s)) for s in (3, 7, 9)}
        assert [loss for _, _, loss in seen[:10]] == list(history["loss"].values)
        assert threads == {threading.get_ident()}
        # in the background, in the fit's own thread
        seen.clear(), threads.clear()
        t.fit_in_background(train, eval_data=test, max_steps=14, callbacks=log).result(60)
        assert [s for s, _, _ in seen] == [10, 11, 12, 13, 13]  # (evaluated as it ended)
        assert threading.get_ident() not in threads


def test_a_callback_can_stop_the_fit_and_one_that_raises_ends_it(gpu_client, small_data):
    train, test = small_data

    def stop_at_5(trainer, record):
        if record["step"] == 5:
            trainer.stop()

    with mlp_trainer(gpu_client, train, batch_size=32) as t:
        t.fit(train, max_steps=100, progress=False, callbacks=stop_at_5)
        assert t.step_ == 6

        def fails(trainer, record):
            if record["step"] == 8:
                raise RuntimeError("the logger is down")

        with pytest.raises(RuntimeError, match="the logger is down"):
            t.fit(train, max_steps=100, progress=False, callbacks=fails)
        assert t.step_ == 9 and t.history_.sizes["step"] == 9  # the step was kept
        t.fit(train, max_steps=12, progress=False)  # and the trainer goes on
        assert t.step_ == 12


def test_callbacks_that_are_not_callables_are_refused_before_any_work(small_data):
    train, _ = small_data
    with mlp_trainer(None, train, n_workers=1) as t:
        with pytest.raises(TypeError, match="callbacks should be a callable or a list of them"):
            t.fit(train, max_steps=5, callbacks="print")
        with pytest.raises(TypeError, match="but got 3 among them"):
            t.fit_in_background(train, max_steps=5, callbacks=[print, 3])
        assert t._own_cluster is None
