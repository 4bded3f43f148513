"""A worker's share of a step or of a round of local steps, computed on its replica.

:func:`_train` runs the strategy on the worker's samples of each step (a
:class:`~daskpri.replicas.shares.Shares`) and returns a :class:`StepResult`:
a step's gradient sum, or after a round of local steps the replica's
parameters and optimizer state, with the priorities of the samples scored.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from daskpri.replicas._numpy_tensors import TensorsAsNumpy
from daskpri.replicas.errors import ReplicaStateLost
from daskpri.replicas.optim import LocalSteps, make_optimizer, set_flat_grad
from daskpri.replicas.replica import Replica, Weights, flat_params, sample_losses
from daskpri.replicas.shares import Share, Shares
from daskpri.strategies.base import Batch, Computed, Strategy

if TYPE_CHECKING:  # for annotations only: the worker module imports this one
    from daskpri.replicas.worker import PartitionRef, ReplicaPlugin


@dataclass
class StepResult(TensorsAsNumpy):
    """What one worker returns for one step or round (CPU tensors and numpy only)."""

    #: ``sum_i w_i grad L_i`` of a step (empty after a round of local steps)
    grad: torch.Tensor
    n_grad: int
    indices: np.ndarray
    priorities: np.ndarray
    loss_sum: float
    n_loss: int
    correct: int
    compute_seconds: float
    worker: str
    device: str
    pid: int
    #: after a round of local steps: the replica's parameters and optimizer state
    params: torch.Tensor | None = None
    optimizer_state: dict[str, Any] | None = None
    #: the module's buffers after its forward passes (batch norm's running
    #: statistics), when it has any and ran a forward pass
    buffers: dict[str, torch.Tensor] | None = None
    #: the name under which the worker keeps its state after the round
    kept: str | None = None


def _train(
    plugin: ReplicaPlugin,
    weights: Weights,
    strategy: Strategy,
    shares: Shares,
    parts: Mapping[int, PartitionRef | str],
    local: LocalSteps | None = None,
) -> StepResult:
    """Compute one worker's share of a step (or of a round) with ``plugin``'s replica.

    Without ``local``, ``shares`` holds one step's samples and the result
    its gradient sum. With ``local``, the worker takes one optimizer step per
    share and returns its parameters and optimizer state. ``parts`` holds a
    reference for each partition touched (or the key of its scattered data,
    from the direct transport).
    """
    t0 = time.perf_counter()
    replica = plugin.replica
    device = replica.device
    params = replica.params
    opt = None
    kept, plugin.kept = plugin.kept, None  # a round that fails leaves nothing to resume
    if local is not None and local.resume is not None:
        if kept is None or kept[0] != local.resume:
            raise ReplicaStateLost(
                f"worker {plugin.address} does not hold the state of the round it was "
                f"to resume from ({local.resume}); it holds "
                + ("none" if kept is None else kept[0])
            )
        opt = kept[1]
    else:
        replica.load(weights)
        if local is not None:
            opt = make_optimizer(local.optimizer, params, local.options)
            # copies: ``load_state_dict`` keeps tensors already on the device,
            # which in a cluster of threads are the driver's (and shared by all)
            opt.load_state_dict(_copied(local.state))
    if opt is not None:
        replica.version = -1  # the replica's weights leave the driver's version
    grad: torch.Tensor | None = None  # a step's gradient sum (no local steps)
    out_idx: list[np.ndarray] = []
    out_prio: list[Any] = []
    deferred: list[tuple[int, Computed]] = []  # (place in out_prio, step)
    loss_sums: list[Any] = []  # each step's, numbers or 0-d tensors
    corrects: list[Any] = []
    n_loss, n_grad = 0, 0
    rows = _rows(plugin, shares, parts)
    # with local steps, gradients stay in the module for the optimizer
    replica.keep_grads = opt is not None
    try:
        for i in range(len(shares)):
            a, b = int(shares.splits[i]), int(shares.splits[i + 1])
            if a == b:
                continue
            share = shares.share(i)
            batch = _batch(plugin, weights, share, rows[a:b])
            c = strategy.compute(replica, batch)
            out_idx.append(share.indices if c.rows is None else share.indices[c.rows])
            if c.logits is not None:
                deferred.append((len(out_prio), c))
                out_prio.append(None)
            else:
                out_prio.append(c.priorities)
                loss_sums.append(c.loss_sum)
                corrects.append(c.correct)
            n_loss += int(c.n_loss)
            n_grad += int(c.n_grad)
            if opt is None:
                grad = c.grad
            elif c.n_grad:
                # a non-finite gradient shows in the parameters: the driver drops the round
                _mean_grad(replica, c.grad, local.rows_per_step or c.n_grad)  # type: ignore[union-attr]
                if local.max_grad_norm is not None:  # type: ignore[union-attr]
                    torch.nn.utils.clip_grad_norm_(params, local.max_grad_norm)  # type: ignore[union-attr]
                for group in opt.param_groups:
                    group["lr"] = local.rates[i]  # type: ignore[union-attr]
                opt.step()
    finally:
        replica.keep_grads = False
    if deferred:
        loss_sum, correct = _finish_deferred(deferred, out_prio, strategy)
        loss_sums.append(loss_sum)
        corrects.append(correct)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if opt is not None:
        grad = torch.empty(0)
    elif grad is None:  # nothing selected on this worker
        grad = torch.zeros(replica.n_params)
    result = StepResult(
        grad=grad.detach().to("cpu"),
        n_grad=n_grad,
        indices=np.concatenate(out_idx) if out_idx else np.empty(0, dtype=np.int64),
        priorities=_concat(out_prio),
        loss_sum=_total(loss_sums),
        n_loss=n_loss,
        correct=int(_total(corrects)),
        compute_seconds=0.0,
        worker=plugin.address,
        device=str(device),
        pid=os.getpid(),
    )
    if opt is not None:
        result.params = flat_params(params).to("cpu")
        result.optimizer_state = _copied(opt.state_dict(), "cpu")
        if local is not None and local.keep is not None:
            plugin.kept = (local.keep, opt)
            result.kept = local.keep
    if out_idx and replica.has_buffers:
        # copies: the replica goes on updating its own
        result.buffers = {
            k: v.detach().to("cpu", copy=True) for k, v in replica.module.named_buffers()
        }
    result.compute_seconds = time.perf_counter() - t0
    return result


def _finish_deferred(
    deferred: list[tuple[int, Computed]], out_prio: list[Any], strategy: Strategy
) -> tuple[float, int]:
    """The losses of a round's deferred steps, from their logits, all at once.

    Each step's priorities (:meth:`Strategy.priority`: by default its
    per-sample losses) take its place in ``out_prio``; returns
    the loss summed over the train rows (in float64) and the train rows
    predicted right. One cross-entropy over the round's rows costs what one
    step's did: a step's kernels are small, their launches are the cost.
    """
    steps = [c for _, c in deferred]
    logits = torch.cat([c.logits for c in steps])  # type: ignore[misc]
    labels = torch.cat([c.labels for c in steps])  # type: ignore[misc]
    losses = sample_losses(logits, labels)
    hits = logits.argmax(1) == labels
    sizes = [int(c.labels.shape[0]) for c in steps]  # type: ignore[union-attr]
    if all(c.n_loss == size for c, size in zip(steps, sizes, strict=True)):
        train_losses, train_hits = losses, hits
    else:  # scored-only rows follow each step's train rows
        rows = [np.arange(size) < c.n_loss for c, size in zip(steps, sizes, strict=True)]
        mask = torch.as_tensor(np.concatenate(rows), device=losses.device)
        train_losses, train_hits = losses[mask], hits[mask]
    priorities = strategy.priority(losses, logits)
    for (place, _), part in zip(deferred, priorities.split(sizes), strict=True):
        out_prio[place] = part
    return float(train_losses.double().sum()), int(train_hits.sum())


def _concat(parts: list[np.ndarray | torch.Tensor]) -> np.ndarray:
    """Numbers and tensors, concatenated as float64, tensors converted in one go."""
    if not parts:
        return np.empty(0)
    tensors = [p for p in parts if isinstance(p, torch.Tensor)]
    if len(tensors) == len(parts):
        return torch.cat([t.detach().reshape(-1) for t in tensors]).cpu().numpy().astype(np.float64)
    return np.concatenate(
        [
            p.detach().cpu().numpy() if isinstance(p, torch.Tensor) else np.asarray(p)
            for p in parts
        ]
    ).astype(np.float64)


def _total(values: list[Any]) -> float:
    """The sum of numbers and 0-d tensors (the tensors summed at once, converted once)."""
    tensors = [v.detach().reshape(()) for v in values if isinstance(v, torch.Tensor)]
    total = sum(float(v) for v in values if not isinstance(v, torch.Tensor))
    return total + (float(torch.stack(tensors).double().sum()) if tensors else 0.0)


def _mean_grad(replica: Replica, grad: torch.Tensor | None, n: int) -> None:
    """Give the replica's parameters the mean gradient of a step that sums ``n`` samples.

    ``grad`` is the step's flat gradient sum; ``None``: the gradient is in
    the parameters' ``.grad`` already, as the mean over ``replica.kept_rows``
    (the replica's ``keep_grads`` mode), and is rescaled there if ``n`` differs.
    """
    if grad is not None:
        set_flat_grad(replica.params, grad / n)
    elif n != replica.kept_rows:
        for p in replica.params:
            if p.grad is not None:
                p.grad.mul_(replica.kept_rows / n)


def _rows(
    plugin: ReplicaPlugin, shares: Shares, parts: Mapping[int, PartitionRef | str]
) -> torch.Tensor:
    """The rows of the worker's stacked partitions that the round's samples are in.

    Partitions not loaded here yet are loaded first (once).
    """
    pids, local = shares.locate()
    if not pids.size:
        return torch.empty(0, dtype=torch.int64)
    rows = plugin.rows(pids, local)
    if rows is None:
        for pid in np.unique(pids):
            plugin.partition(int(pid), parts[int(pid)])
        rows = plugin.rows(pids, local)
        if rows is None:
            raise LookupError(
                f"partitions {np.unique(pids).tolist()} did not load on worker {plugin.address}"
            )
    return rows


def _batch(plugin: ReplicaPlugin, weights: Weights, share: Share, rows: torch.Tensor) -> Batch:
    """The samples of ``share`` (at ``rows``) as tensors on the replica's device."""
    x, y = plugin.take(rows)
    w = share.weights
    return Batch(
        x=x,
        y=y,
        indices=share.indices,
        n_train=share.n_train,
        weights=None if w is None else torch.as_tensor(w, dtype=torch.float32, device=x.device),
        mean_grad=weights.mean_grad,
        extra=share.extra,
        seed=share.seed,
        defer=True,
    )


def _copied(tree: Any, device: str | None = None) -> Any:
    """``tree`` with every tensor copied (to ``device``, if given).

    The optimizer that a result's state comes from may be kept and go on;
    in a cluster of threads a driver's tensors arrive as they are.
    """
    if isinstance(tree, torch.Tensor):
        return tree.detach().to(device or tree.device, copy=True)
    if isinstance(tree, dict):
        return {k: _copied(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_copied(v, device) for v in tree)
    return tree
