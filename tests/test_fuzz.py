"""Property tests over the public entry points (Hypothesis, 1000 cases each).

Every failure must be a ValueError or TypeError whose message names the field
and what is allowed; the table stays valid and unchanged when refused. Kept in
its own file, apart from the behaviour tests; all cases run without a cluster.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import math
import warnings

import numpy as np
import pytest
import torch
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import daskpri
from daskpri.cli._arguments import _parser
from daskpri.data.io import check_values, validate_dataset
from daskpri.table.table import PriorityTable
from daskpri.training.placement import parse_resources

FUZZ = settings(max_examples=1000, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_MODEL = torch.nn.Linear(4, 3)

anything = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _names_field(message: str, fields: list[str]) -> bool:
    return any(f in message for f in fields)


_TRAINER_FIELDS = ["strategy", "seed", "n_workers", "resources", "batch_size", "learning_rate",
                   "momentum", "weight_decay", "optimizer", "eval_every", "partition_size",
                   "staleness", "device", "checkpoint_path", "checkpoint_every", "security",
                   "client", "lr_schedule", "schedule_steps", "local_steps", "transport",
                   "on_nonfinite", "precision", "warmup_steps"]


@FUZZ
@given(field=st.sampled_from(_TRAINER_FIELDS), value=anything)
def test_trainer_parameters(field, value):
    try:
        trainer = daskpri.Trainer(_MODEL, **{field: value})
    except (ValueError, TypeError) as e:
        assert field in str(e), f"{field}={value!r}: {e}"
        return
    # accepted: within what the docstring allows
    if field == "momentum":
        assert 0.0 <= trainer.momentum < 1.0 and (value is None or trainer.momentum == value)
    elif field in ("learning_rate", "weight_decay"):
        got = getattr(trainer, field)
        assert math.isfinite(got) and (got > 0 if field == "learning_rate" else got >= 0)


@FUZZ
@given(field=st.sampled_from(["patience", "monitor", "min_delta", "restore_best"]),
       value=anything)
def test_early_stopping_parameters(field, value):
    try:
        rule = daskpri.EarlyStopping(**{field: value})
    except (ValueError, TypeError) as e:
        assert field in str(e), f"{field}={value!r}: {e}"
        return
    # accepted: within what the docstring allows
    assert rule.patience >= 1 and rule.monitor in ("accuracy", "eval_loss")
    assert math.isfinite(rule.min_delta) and rule.min_delta >= 0
    assert isinstance(rule.restore_best, bool)


@FUZZ
@given(value=anything)
def test_fit_callbacks_and_early_stopping_arguments(value):
    from daskpri.training._fit import check_callbacks

    for name, check in (("callbacks", check_callbacks),
                        ("early_stopping", daskpri.EarlyStopping.from_argument)):
        try:
            check(value)
        except (ValueError, TypeError) as e:
            assert name in str(e), f"{name}={value!r}: {e}"


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [("momentum", -0.1, r"a number in \[0, 1\)"), ("momentum", 1.5, r"a number in \[0, 1\)"),
     ("momentum", "0.9", r"a number in \[0, 1\)"),
     ("learning_rate", 0, "a positive finite number"),
     ("weight_decay", -1.0, r"a number in \[0, inf\)"),
     ("seed", 2**32, r"an integer in \[0, 4294967295\]")],
)
def test_trainer_refuses_numbers_out_of_their_range(field, value, allowed):
    with pytest.raises(ValueError, match=f"^{field} should be {allowed}, but got {field}="):
        daskpri.Trainer(_MODEL, **{field: value})


@FUZZ
@given(
    name=st.sampled_from(sorted(daskpri.STRATEGIES)),
    options=st.dictionaries(
        st.sampled_from(["k", "renew", "epsilon", "fraction", "beta", "batch_size",
                         "train_on_renew", "mean_grad_decay", "presample", "tau_threshold",
                         "smoothing", "prune", "anneal", "epochs", "refresh", "warmup",
                         "anneal_step", "stale_beta", "prefilter"]),
        anything, max_size=3,
    ),
)
def test_strategy_parameters(name, options):
    try:
        strategy = daskpri.get_strategy(name, **options)
    except (ValueError, TypeError) as e:
        assert _names_field(str(e), list(options) + ["keyword"]), str(e)
        return
    # accepted: the strategy keeps them, and rebuilds from what it keeps
    params = strategy.get_params()
    assert daskpri.get_strategy(name, **params).get_params() == params


@FUZZ
@given(data=st.data(), name=st.sampled_from(sorted(daskpri.STRATEGIES)))
def test_each_strategys_own_options(data, name):
    # the keys a strategy takes, so the checks of accepted keys are reached
    keys = sorted(inspect.signature(type(daskpri.get_strategy(name)).__init__).parameters)
    keys = [k for k in keys if k != "self"]
    options = data.draw(st.dictionaries(st.sampled_from(keys), anything, max_size=3))
    test_strategy_parameters.hypothesis.inner_test(name, options)


@FUZZ
@given(
    sizes=st.lists(st.integers(-2, 5), min_size=0, max_size=6),
    indices=hnp.arrays(np.int64, st.integers(0, 12), elements=st.integers(-3, 40)),
    values=hnp.arrays(np.float64, st.integers(0, 12),
                      elements=st.floats(allow_nan=True, allow_infinity=True)),
    step=st.integers(-2, 10),
)
def test_table_updates(sizes, indices, values, step):
    try:
        table = PriorityTable(sizes)
    except ValueError as e:
        assert "partition" in str(e)
        return
    table.update(np.arange(min(2, table.n_samples)), np.ones(min(2, table.n_samples)), step=0)
    before = table.state_dict()
    try:
        table.update(indices, values, step=step)
    except (ValueError, TypeError) as e:
        assert _names_field(str(e), ["indices", "priorities", "step"]), str(e)
        after = table.state_dict()
        for k in ("current", "version", "older_p", "older_t"):
            np.testing.assert_array_equal(before[k], after[k])
    seen = table.version >= 0
    assert np.isfinite(table.current[seen]).all() and np.isposinf(table.current[~seen]).all()


@st.composite
def datasets(draw):
    n = draw(st.integers(0, 6))
    n_y = draw(st.sampled_from([n, n, max(n - 1, 0)]))
    x_dtype = draw(st.sampled_from([np.float32, np.float64, np.int64, object]))
    y_dtype = draw(st.sampled_from([np.int64, np.int32, np.float32]))
    raw = draw(hnp.arrays(np.float64, (n, 2), elements=st.floats(allow_nan=True,
                                                                 allow_infinity=True)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN/inf cast to int: garbage is fine
        x = np.asarray(raw).astype(x_dtype)
    y = np.asarray(draw(hnp.arrays(np.int64, (n_y,), elements=st.integers(-2, 12)))).astype(y_dtype)
    y_dim = "sample" if n_y == n else "label"
    drop = draw(st.sampled_from([None, "x", "y"]))
    data = {"x": (("sample", "f"), x), "y": (y_dim, y)}
    if drop:
        data.pop(drop)
    return xr.Dataset(data), x, y


@FUZZ
@given(ds=datasets(), n_classes=st.integers(1, 12))
def test_dataset_validation(ds, n_classes):
    ds, x, y = ds
    try:
        info = validate_dataset(ds)
    except (ValueError, TypeError) as e:
        assert _names_field(str(e), ["data.x", "data.y", "sample", "data"]), str(e)
        return
    assert info["n_samples"] == len(y) > 0
    try:
        check_values(x, y, n_classes=n_classes, where="partition 0")
    except (ValueError, TypeError) as e:
        assert _names_field(str(e), ["x in partition 0", "y in partition 0"]), str(e)
        return
    assert np.isfinite(x).all() and ((y >= 0) & (y < n_classes)).all()


@FUZZ
@given(text=st.text(max_size=20))
def test_resource_text(text):
    try:
        parsed = parse_resources(text)
    except (ValueError, TypeError) as e:
        assert "resources" in str(e)
        return
    assert parsed is None or all(v > 0 and not math.isnan(v) for v in parsed.values())


_FLAGS = ["--dataset", "--model", "--strategy", "--max-steps", "--max-time", "--batch-size",
          "--learning-rate", "--resources", "--output", "--strategy-option", "--workers",
          "--target-accuracy", "--eval-every", "--seed", "--patience", "--monitor",
          "--min-delta", "--restore-best", "--precision", "--warmup-steps", "--weight-decay",
          "--momentum", "--device"]


@FUZZ
@given(argv=st.lists(st.one_of(st.sampled_from(_FLAGS), st.text(max_size=8)), max_size=6))
def test_cli_arguments(argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            _parser().parse_args(["train", *argv])
    except SystemExit as e:
        assert e.code == 2
        assert "error:" in err.getvalue() and "usage:" in err.getvalue()
