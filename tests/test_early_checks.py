"""What a fit refuses before it starts a cluster, or sets a run up on one.

:meth:`Trainer.fit_in_background` raises a bad argument in its caller's
thread, not in its future.
"""

from __future__ import annotations

import pytest

import daskpri
from daskpri.models import build_model


@pytest.mark.parametrize(
    ("data", "kwargs", "exc", "match"),
    [
        ("train", {"max_steps": -1}, ValueError, r"^max_steps should be .*, but got"),
        ("train", {"max_time": "x"}, ValueError,
         r"^max_time should be a positive finite number, but got max_time='x'$"),
        ("train", {"max_steps": 5, "target_accuracy": 2, "eval_data": "test"}, ValueError,
         r"^target_accuracy should be a number in \(0, 1\], but got 2$"),
        ("train", {"max_steps": 5, "eval_data": "narrow"}, ValueError,
         r"^eval_data.x should have per-sample shape \(20,\) like data.x, but got \(10,\)$"),
        (42, {"max_steps": 5}, TypeError,
         r"^data should be an xarray.Dataset or the path of a .*, but got an object of type int$"),
    ],
    ids=["max_steps", "max_time", "target_accuracy", "eval_data", "data"],
)
def test_fit_in_background_raises_a_bad_argument_in_the_callers_thread(
    small_data, data, kwargs, exc, match
):
    train, test = small_data
    named = {"train": train, "test": test, "narrow": test.isel(feature=slice(0, 10))}
    data = named.get(data, data)
    if "eval_data" in kwargs:
        kwargs = {**kwargs, "eval_data": named[kwargs["eval_data"]]}
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", n_workers=1)
    try:
        with pytest.raises(exc, match=match):
            trainer.fit_in_background(data, **kwargs)
        assert trainer._background is None and not trainer._fitting.locked()
        assert trainer._own_cluster is None
    finally:
        trainer.close()
