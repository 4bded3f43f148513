"""Per-sample gradients through torch.func against a plain loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from distributed import Client, LocalCluster

import daskpri
from daskpri.data import load
from daskpri.models import CNN, MLP
from daskpri.replicas.replica import SCORE_CHUNK_BYTES, Replica, Weights, sample_losses


def _loop_grads(module, x, y):
    rows = []
    for i in range(x.shape[0]):
        module.zero_grad()
        torch.nn.functional.cross_entropy(module(x[i : i + 1]), y[i : i + 1]).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in module.parameters()]))
    return torch.stack(rows)


def test_per_sample_grads_match_a_loop_for_mlp_and_cnn():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    cnn = torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 8)),
        torch.nn.Conv1d(1, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 3),
    )
    for module, x in ((mlp, torch.randn(6, 5)), (cnn, torch.randn(6, 8))):
        y = torch.randint(0, 3, (6,))
        replica = Replica(module, "cpu")
        grads, losses, logits = replica.per_sample_grads(x, y)
        torch.testing.assert_close(grads, _loop_grads(module, x, y), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            losses, torch.nn.functional.cross_entropy(module(x), y, reduction="none").detach()
        )
        assert logits.shape == (6, 3)



def test_per_sample_grads_of_frozen_parameters_are_zeros_and_the_rest_match_a_loop():
    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    expected = _loop_grads(module, x, y)
    module[0].weight.requires_grad_(False)
    grads, _, _ = Replica(module, "cpu").per_sample_grads(x, y)
    frozen = module[0].weight.numel()
    # the frozen weight comes first in the flat layout
    assert torch.count_nonzero(grads[:, :frozen]) == 0
    torch.testing.assert_close(grads[:, frozen:], expected[:, frozen:], rtol=1e-5, atol=1e-6)


def _dropout_mlp(p: float, n_in: int = 5, n_out: int = 3) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(n_in, 16), torch.nn.ReLU(), torch.nn.Dropout(p), torch.nn.Linear(16, n_out)
    )


def test_per_sample_grads_of_a_model_with_dropout_draw_a_mask_for_each_sample():
    torch.manual_seed(3)
    replica = Replica(_dropout_mlp(0.5), "cpu")
    assert replica.module.training
    # eight copies of one sample: only their dropout masks can tell them apart
    x, y = torch.randn(1, 5).expand(8, 5), torch.full((8,), 2)
    grads, losses, logits = replica.per_sample_grads(x, y)
    assert grads.shape == (8, replica.n_params) and torch.isfinite(grads).all()
    torch.testing.assert_close(losses, F.cross_entropy(logits, y, reduction="none"))
    assert len({tuple(row.tolist()) for row in logits}) > 1


def test_per_sample_grads_with_dropout_of_zero_match_a_loop():
    torch.manual_seed(4)
    module = _dropout_mlp(0.0)
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    grads, losses, _ = Replica(module, "cpu").per_sample_grads(x, y)
    torch.testing.assert_close(grads, _loop_grads(module, x, y), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses, F.cross_entropy(module(x), y, reduction="none").detach())


@pytest.mark.parametrize("strategy", ["projection", "length"])
def test_strategies_of_per_sample_gradients_train_a_model_with_dropout(strategy):
    train, _ = load("synthetic", n_samples=200, seed=0)
    torch.manual_seed(5)
    model = _dropout_mlp(0.5, n_in=int(train["x"].shape[1]), n_out=train.attrs["n_classes"])
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
        daskpri.Trainer(model, strategy=strategy, client=client, batch_size=16, seed=0) as t,
    ):
        h = t.fit(train, max_steps=3, progress=False)
    assert h.sizes["step"] == 3 and np.isfinite(h["loss"]).all()

def test_weighted_grad_is_the_weighted_sum_of_per_sample_grads():
    torch.manual_seed(1)
    replica = Replica(torch.nn.Linear(4, 3), "cpu")
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    w = torch.rand(5)
    g, _, _ = replica.weighted_grad(x, y, w)
    per, _, _ = replica.per_sample_grads(x, y)
    torch.testing.assert_close(g, (w[:, None] * per).sum(0), rtol=1e-5, atol=1e-6)


def test_weighted_grad_every_path_gives_the_sum_or_mean_and_the_losses():
    # unweighted rows take a fused loss and recompute the losses without a graph;
    # weighted rows reduce the per-sample losses: both give the same numbers
    torch.manual_seed(2)
    module = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    replica = Replica(module, "cpu")
    x, y = torch.randn(7, 4), torch.randint(0, 3, (7,))
    per, want_losses, _ = replica.per_sample_grads(x, y)
    for w in (None, torch.ones(7), torch.rand(7)):
        want = per.sum(0) if w is None else (w[:, None] * per).sum(0)
        replica.keep_grads = False
        g, losses, logits = replica.weighted_grad(x, y, w)
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(losses, want_losses)
        assert not losses.requires_grad and not logits.requires_grad
        replica.keep_grads = True
        g, losses, _ = replica.weighted_grad(x, y, w)
        assert g is None and replica.kept_rows == 7
        kept = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
        torch.testing.assert_close(kept, want / 7, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(losses, want_losses)
    # no rows: a zero gradient, not the nan of a mean over nothing
    replica.keep_grads = False
    g, losses, _ = replica.weighted_grad(x[:0], y[:0], None)
    assert torch.equal(g, torch.zeros_like(g)) and losses.shape == (0,)
    replica.keep_grads = True
    g, _, _ = replica.weighted_grad(x[:0], y[:0], None)
    kept = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
    assert replica.kept_rows == 0 and torch.equal(kept, torch.zeros_like(kept))


def test_load_copies_weights_once_per_version():
    replica = Replica(torch.nn.Linear(2, 2), "cpu")
    params = torch.arange(6, dtype=torch.float32)
    replica.load(Weights(version=3, params=params))
    assert torch.equal(torch.nn.utils.parameters_to_vector(replica.module.parameters()), params)
    replica.load(Weights(version=3, params=torch.zeros(6)))  # same version: not reloaded
    assert torch.equal(torch.nn.utils.parameters_to_vector(replica.module.parameters()), params)


def test_step_messages_carry_tensors_as_numpy_and_arrive_equal_and_writable():
    from distributed.protocol import dumps, loads
    from distributed.protocol.serialize import Serialize, to_serialize

    from daskpri.replicas.optim import LocalSteps

    base = torch.arange(200_000.0)
    weights = Weights(
        version=3,
        params=base[::2],  # a strided view: only its 100,000 values travel
        buffers={"half": torch.ones(2, dtype=torch.bfloat16)},  # numpy has no bfloat16
    )
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1, momentum=0.9)
    opt.state[opt.param_groups[0]["params"][0]]["momentum_buffer"] = torch.full((3,), 2.0)
    local = LocalSteps("sgd", {"lr": 0.1, "momentum": 0.9}, opt.state_dict(), [0.1, 0.05])
    frames = dumps({"payload": to_serialize((weights, local))})
    # the view, not its whole storage (which torch's own pickling would send)
    assert sum(len(memoryview(f)) for f in frames) < 2 * base.numel() + 10_000
    got = loads(frames)["payload"]
    w, lo = got.data if isinstance(got, Serialize) else got
    assert w.version == 3 and torch.equal(w.params, base[::2])
    assert w.buffers["half"].dtype == torch.bfloat16
    buf = lo.state["state"][0]["momentum_buffer"]
    assert torch.equal(buf, torch.full((3,), 2.0)) and lo.rates == [0.1, 0.05]
    buf.mul_(0.5)  # the optimizer writes into what arrives
    w.params.add_(1.0)
    assert float(buf[0]) == 1.0 and float(w.params[0]) == 1.0
    assert float(base[0]) == 0.0  # the sender's tensor is untouched


@pytest.mark.parametrize(
    "rows, classes", [(1, 10), (127, 10), (128, 10), (4096, 10), (300, 31), (300, 32), (300, 100)]
)
def test_sample_losses_equal_torch_cross_entropy_on_either_path(rows, classes):
    # the CPU fast path (few classes, many rows) and torch's own, with logits far
    # apart enough that a naive log(sum(exp)) would overflow
    g = torch.Generator().manual_seed(rows * classes)
    logits = torch.randn(rows, classes, generator=g) * 30.0
    labels = torch.randint(0, classes, (rows,), generator=g)
    ours = sample_losses(logits, labels)
    assert ours.shape == (rows,) and ours.dtype == torch.float32
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(
        ours, F.cross_entropy(logits, labels, reduction="none"), rtol=1e-5, atol=1e-4
    )


def _counting_forwards(replica: Replica) -> list[int]:
    """The row counts of every forward pass of ``replica``'s module, as they happen."""
    rows: list[int] = []
    replica.module.register_forward_pre_hook(lambda m, args: rows.append(args[0].shape[0]))
    return rows


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_a_cpu_scoring_pass_of_large_activations_runs_in_chunks_with_the_same_logits(dtype):
    torch.manual_seed(0)
    replica = Replica(CNN((1, 28, 28), 10, seed=0), "cpu")
    calls = _counting_forwards(replica)
    x = torch.randn(192, 1, 28, 28)
    assert replica.logits(x[:0], dtype).shape == (0, 10)  # no rows measure nothing
    assert replica.score_rows == {}
    whole = replica.logits(x, dtype)  # the first pass runs whole and measures
    # the largest output a row: the first convolution's, 32 x 28 x 28 elements
    per_row = 32 * 28 * 28 * (4 if dtype is None else 2)
    rows = SCORE_CHUNK_BYTES // per_row
    assert replica.score_rows[((1, 28, 28), dtype)] == rows
    chunked = replica.logits(x, dtype)
    assert calls == [0, 192] + [rows] * (192 // rows) + [192 % rows]
    assert whole.dtype == chunked.dtype == torch.float32
    tol = 1e-5 if dtype is None else 1e-2
    torch.testing.assert_close(chunked, whole, atol=tol, rtol=tol)
    torch.testing.assert_close(chunked, replica.module(x).detach(), atol=tol * 10, rtol=tol * 10)


def test_small_activations_and_modules_with_buffers_score_whole():
    mlp = Replica(MLP((40,), 10, seed=0), "cpu")
    x = torch.randn(300, 40)
    mlp.logits(x)
    assert mlp.score_rows[((40,), None)] > 300  # 300 hidden floats a row: far under the budget
    with_bn = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 2048),
                                  torch.nn.BatchNorm1d(2048), torch.nn.Linear(2048, 10))
    replica = Replica(with_bn, "cpu")
    calls = _counting_forwards(replica)
    x = torch.randn(1024, 1, 28, 28)  # 8 MiB of the wide layer's output
    replica.logits(x)
    replica.logits(x)
    # batch norm in training mode normalizes over the batch: chunks would change the logits
    assert replica.score_rows[((1, 28, 28), None)] is None
    assert calls == [1024, 1024]


def test_a_step_sent_to_a_worker_without_the_replica_says_why() -> None:
    import asyncio

    from distributed import Scheduler, Worker

    from daskpri.replicas.worker import _train_handler

    async def main() -> None:
        async with Scheduler(host="127.0.0.1", dashboard_address=":0") as s:
            async with Worker(s.address, host="127.0.0.1", nthreads=1) as w:
                # the direct transport's handler says what the task path says
                with pytest.raises(RuntimeError, match=rf"^worker {w.address} has no daskpri "
                                   r"replica 'daskpri-gone': its run was closed meanwhile, or "
                                   r"the worker joined the cluster without it$"):
                    await _train_handler(w)("daskpri-gone", ())

    asyncio.run(main())
