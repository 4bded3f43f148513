"""Mixed precision (``Trainer(precision="bfloat16")``): the workers' training passes run under
``torch.autocast`` in bfloat16, the weights, gradients and losses stay float32; the setting
reaches every path of a step, a checkpoint keeps it and the command line takes it."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import daskpri
from daskpri.cli import main
from daskpri.models import MLP, build_model
from daskpri.replicas.replica import Replica
from daskpri.training._probe import cpu_bfloat16


def _batch(n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _replicas() -> tuple[Replica, Replica]:
    torch.manual_seed(0)
    module = MLP((6,), 3, hidden=32)
    full = Replica(module, "cpu")
    half = Replica(MLP((6,), 3, hidden=32), "cpu", precision=torch.bfloat16)
    half.module.load_state_dict(module.state_dict())
    return full, half


def test_a_bfloat16_gradient_is_float32_and_near_the_float32_one_but_not_it() -> None:
    full, half = _replicas()
    x, y = _batch()
    g32, l32, _ = full.weighted_grad(x, y, None)
    g16, l16, logits = half.weighted_grad(x, y, None)
    assert g16.dtype == l16.dtype == logits.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in half.module.parameters())
    assert not torch.equal(g16, g32)  # the products were bfloat16
    torch.testing.assert_close(g16, g32, rtol=0.05, atol=0.02)
    torch.testing.assert_close(l16, l32, rtol=0.02, atol=0.02)
    # the loss is that of the bfloat16 logits, taken in float32
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = F.cross_entropy(half.module(x).float(), y, reduction="none")
    torch.testing.assert_close(l16, expected)


def test_bfloat16_per_sample_gradients_sum_to_the_batch_gradient() -> None:
    full, half = _replicas()
    x, y = _batch()
    grads, losses, _ = half.per_sample_grads(x, y)
    assert grads.dtype == losses.dtype == torch.float32
    summed, _, _ = half.weighted_grad(x, y, None)
    torch.testing.assert_close(grads.sum(0), summed, rtol=0.02, atol=0.02)
    exact, _, _ = full.per_sample_grads(x, y)
    assert not torch.equal(grads, exact)


def test_precision_is_checked() -> None:
    with pytest.raises(ValueError, match="precision should be one of 'float32', 'bfloat16', "
                                         "but got 'float16'"):
        daskpri.Trainer(MLP((6,), 3), strategy="uniform", precision="float16")
    with pytest.raises(ValueError, match="float16 would need its loss scaled"):
        Replica(MLP((6,), 3), "cpu", precision=torch.float16)


@pytest.mark.parametrize(("strategy", "options"), [
    ("uniform", {}),
    ("uniform", {"local_steps": 4, "n_workers": 1}),
    ("projection", {"k": 16}),
    ("selective-backprop", {}),
])
def test_a_bfloat16_fit_trains_as_a_float32_one_does(gpu_client, small_data, strategy, options):
    train, test = small_data
    kw = {"client": gpu_client, "seed": 3, "strategy": strategy, "batch_size": 32,
          "eval_every": 32, **options}
    runs = {}
    for precision in ("float32", "bfloat16"):
        with daskpri.Trainer(build_model("mlp", train, seed=1), precision=precision,
                             **kw) as t:
            history = t.fit(train, eval_data=test, max_steps=64, progress=False)
            assert history.attrs["precision"] == precision
            runs[precision] = (history, torch.nn.utils.parameters_to_vector(t.model.parameters()))
    (h32, w32), (h16, w16) = runs["float32"], runs["bfloat16"]
    assert not torch.equal(w16, w32)  # the workers did train in bfloat16
    acc32, acc16 = float(h32["accuracy"][-1]), float(h16["accuracy"][-1])
    assert acc16 > 0.5 and abs(acc16 - acc32) < 0.1, (acc16, acc32)


def test_a_checkpoint_keeps_the_precision_and_the_command_line_takes_it(tmp_path, capsys):
    ckpt = tmp_path / "run.ckpt"
    argv = ["train", "--dataset", "synthetic", "--n-samples", "2000", "--max-steps", "4",
            "--workers", "1", "--no-progress", "--precision", "bfloat16",
            "--checkpoint", str(ckpt)]
    with warnings.catch_warnings():  # said, not raised, where this CPU emulates bfloat16
        warnings.simplefilter("default", daskpri.DaskpriWarning)
        assert main(argv) == 0
    # the LocalCluster's worker trains on this machine's CPU: warned of iff it emulates
    emulated = "precision='bfloat16' on the CPUs of 1 of the run's 1 worker(s)"
    assert (emulated in capsys.readouterr().err) == (cpu_bfloat16() is False)
    with daskpri.Trainer.resume(ckpt, n_workers=1) as trainer:
        assert trainer.precision == "bfloat16"
    capsys.readouterr()
    # --resume goes on in the run's own precision
    again = ["train", "--dataset", "synthetic", "--n-samples", "2000", "--max-steps", "8",
             "--workers", "1", "--no-progress", "--resume", str(ckpt)]
    assert main([*again, "--precision", "float32"]) == 2
    assert ("but got --precision float32 (the run's: bfloat16)"
            in capsys.readouterr().err)
    assert main(again) == 0
    with daskpri.Trainer.resume(ckpt, n_workers=1) as trainer:
        assert (trainer.step_, trainer.precision) == (8, "bfloat16")
