"""The worker side: one replica per worker, partitions loaded where processed.

:class:`ReplicaPlugin` is a distributed ``WorkerPlugin``: registered once by
the trainer, it builds the user's module on every worker of the cluster,
including workers that join (or restart) later, on the device of that worker.
It also caches the partitions that the worker has loaded, as tensors on that
device, so training steps ship partition ids and indices, not data.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dask.config
import numpy as np
import torch
from distributed import WorkerPlugin, get_worker
from distributed.protocol import pickle
from distributed.protocol.serialize import to_serialize

from daskpri._wire import TensorsAsNumpy
from daskpri.data.io import FILE_ERRORS, check_values, open_dataset
from daskpri.replicas.optim import LocalSteps, make_optimizer, set_flat_grad
from daskpri.replicas.replica import Replica, Weights, flat_params, sample_losses
from daskpri.strategies.base import Batch, Computed, Strategy, concat_selections


class ReplicaStateLost(LookupError):
    """The worker no longer holds the state a round was to resume from.

    The driver then sends the round again with the parameters and optimizer
    state in full. The worker answers ``{STATE_LOST: message}`` rather than
    raising; :func:`raise_state_lost` turns that back into this error.
    """


#: the key of a worker's answer to a round it could not resume
STATE_LOST = "daskpri-replica-state-lost"


class UnreadableDataError(ValueError):
    """A worker could not read a partition of the data's store (damaged or truncated)."""


def raise_state_lost(result: Any) -> None:
    """Raise :class:`ReplicaStateLost` if ``result`` is a worker's answer that it lost its state."""
    if isinstance(result, dict) and STATE_LOST in result:
        raise ReplicaStateLost(result[STATE_LOST])


@dataclass(frozen=True)
class StoreRef:
    """A partition read from a zarr store or netCDF file by the worker."""

    path: str
    start: int
    stop: int


@dataclass
class ArrayPart:
    """A partition scattered from the driver's memory once."""

    x: np.ndarray
    y: np.ndarray
    start: int


PartitionRef = StoreRef | ArrayPart


def worker_device(worker: Any, requested: str | None = None) -> torch.device:
    """The device a worker trains on.

    ``requested`` wins; else the GPU that the worker's ``GPU`` resource
    stands for (``cuda:0`` of the worker's ``CUDA_VISIBLE_DEVICES``) when
    CUDA is available, else the CPU.
    """
    if requested is not None:
        device = torch.device(requested)
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise RuntimeError(
                f"device={requested!r}, but worker {getattr(worker, 'address', '?')} has "
                f"{torch.cuda.device_count()} CUDA device(s) (torch {torch.__version__}, "
                f"built with CUDA {torch.version.cuda}); leave device unset to train on each "
                "worker's GPU where its GPU resource names one, else on its CPU"
            )
        return device
    resources = getattr(getattr(worker, "state", None), "total_resources", {}) or {}
    if resources.get("GPU", 0) > 0 and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


class ReplicaPlugin(WorkerPlugin):
    """Builds and holds one replica of a run's module on each worker.

    Parameters
    ----------
    run : str
        The run's name; the plugin registers as ``daskpri-<run>``.
    module : bytes
        The module, pickled with cloudpickle (so classes defined in a user's
        ``__main__`` rebuild on spawned workers).
    n_classes : int
        Labels must lie in ``[0, n_classes)``.
    device : str, optional
        Force a device (for example ``"cpu"``); ``None`` picks per worker.
    """

    idempotent = False

    def __init__(self, run: str, module: bytes, n_classes: int, device: str | None = None):
        self.name = f"daskpri-{run}"
        self.module = module
        self.n_classes = n_classes
        self.device = device

    def setup(self, worker: Any) -> None:
        module = pickle.loads(self.module)
        self.replica = Replica(module, worker_device(worker, self.device))
        self.partitions: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # All loaded partitions in one pair of tensors (``partitions`` holds
        # views into them), so that a batch spanning many partitions is one
        # ``index_select``; ``offset[pid]`` is a partition's first row (-1: not here).
        self.stacked: tuple[torch.Tensor, torch.Tensor] | None = None
        self.offset = np.full(0, -1, dtype=np.int64)
        self._lock = threading.Lock()
        #: held while a step, a warm-up or a load runs on the replica: a step the
        #: driver gave up on (a worker lost) may still be computing when its retry
        #: or the recovery's partitions arrive, and they share the module, its
        #: gradients and the stacked partitions
        self.busy = threading.RLock()
        #: (name, optimizer) of the state a round of local steps left in the
        #: replica, for the next round to resume from (see :class:`LocalSteps`)
        self.kept: tuple[str, torch.optim.Optimizer] | None = None
        self.address = worker.address
        self.worker = worker
        # The direct transport: steps arrive as RPCs from the driver, past the
        # scheduler's task machinery (one handler serves every run).
        worker.handlers["daskpri_train"] = _train_handler(worker)

    def teardown(self, worker: Any) -> None:
        self.partitions.clear()
        self.stacked = None

    def partition(self, pid: int, ref: PartitionRef | str) -> tuple[torch.Tensor, torch.Tensor]:
        """Partition ``pid`` as tensors on this worker's device, loaded once."""
        cached = self.partitions.get(pid)
        if cached is not None:
            return cached
        if isinstance(ref, str):  # the key of scattered data, sent by the direct transport
            try:
                ref = self.worker.data[ref]
            except KeyError:
                raise LookupError(
                    f"partition {pid} is neither loaded nor held on worker {self.address}"
                ) from None
        if isinstance(ref, StoreRef):
            where = f"partition {pid} (samples {ref.start}-{ref.stop - 1} of {ref.path})"
            x, y = self._read(ref, where)
            start = ref.start
        elif isinstance(ref, ArrayPart):
            x, y, start = ref.x, ref.y, ref.start
            where = f"partition {pid} (samples {start}-{start + len(y) - 1})"
        else:
            raise TypeError(f"partition {pid}: unknown reference {type(ref).__name__}")
        check_values(x, y, n_classes=self.n_classes, where=where, offset=start)
        device = self.replica.device
        xt = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32)).to(device)
        yt = torch.as_tensor(np.asarray(y, dtype=np.int64)).to(device)
        with self._lock:
            if pid not in self.partitions:
                self.partitions[pid] = (xt, yt)
                self.stacked = None  # stacked again, once, by the next batch
        return self.partitions[pid]

    def _read(self, ref: StoreRef, where: str) -> tuple[np.ndarray, np.ndarray]:
        """``x`` and ``y`` of a partition of a store, read on this worker.

        A failure says which worker could not read which partition of which
        store: a missing or forbidden file keeps its error's type (the driver
        raises it at once rather than take the worker for lost), a codec's
        error on a damaged chunk or a truncated file becomes
        :class:`UnreadableDataError`.
        """
        cannot = f"worker {self.address} cannot read {where}"
        try:
            # Read in this thread: a dask compute here would submit tasks to
            # the cluster from inside a task and wait on this worker's slot.
            with dask.config.set(scheduler="synchronous"):
                ds = open_dataset(ref.path).isel(sample=slice(ref.start, ref.stop))
                return np.asarray(ds["x"].values), np.asarray(ds["y"].values)
        except FILE_ERRORS as e:
            raise type(e)(f"{cannot}: {e}") from None
        except OSError as e:
            if e.errno is not None:  # the file system's, perhaps passing: as it is
                raise
            raise UnreadableDataError(f"{cannot}: {e}") from None  # h5py's, on a damaged file
        except (RuntimeError, ValueError, KeyError) as e:
            raise UnreadableDataError(f"{cannot}: {type(e).__name__}: {e}") from None

    def _restack(self) -> None:
        """Stack every loaded partition; ``partitions`` become views into the stack.

        Runs once after partitions arrive (set-up, recovery), not per
        partition, so placing P partitions copies the data once.
        """
        pids = sorted(self.partitions)
        sizes = [int(self.partitions[p][0].shape[0]) for p in pids]
        xs = torch.cat([self.partitions[p][0] for p in pids])
        ys = torch.cat([self.partitions[p][1] for p in pids])
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.offset = np.full(pids[-1] + 1, -1, dtype=np.int64)
        self.offset[pids] = starts
        self.partitions = {
            p: (xs[a : a + n], ys[a : a + n]) for p, a, n in zip(pids, starts, sizes, strict=True)
        }
        self.stacked = (xs, ys)

    def rows(self, pids: np.ndarray, local: np.ndarray) -> torch.Tensor | None:
        """The rows of the stacked partitions holding the (partition, row) samples.

        ``None`` if a partition is not loaded here. ``pids`` is not empty.
        """
        with self._lock:
            if self.stacked is None and self.partitions:
                self._restack()
            offset, stacked = self.offset, self.stacked
        if stacked is None or int(pids.max()) >= offset.size:
            return None
        start = offset[pids]
        if (start < 0).any():
            return None
        return torch.as_tensor(start + local, device=stacked[0].device)

    def take(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` and ``y`` of ``rows`` (from :meth:`rows`), as one gather each."""
        if self.stacked is None:
            raise RuntimeError(f"worker {self.address} holds no partitions to take rows from")
        xs, ys = self.stacked
        return xs.index_select(0, rows), ys.index_select(0, rows)


def _plugin(name: str) -> ReplicaPlugin:
    worker = get_worker()
    try:
        return worker.plugins[name]  # type: ignore[return-value]
    except KeyError:
        raise RuntimeError(
            f"worker {worker.address} has no daskpri replica {name!r}: its run was closed "
            "meanwhile, or the worker joined the cluster without it"
        ) from None


def load_task(name: str, pid: int, ref: PartitionRef) -> dict[str, Any]:
    """Load and check a partition on this worker (run once per partition)."""
    plugin = _plugin(name)
    with plugin.busy:
        x, y = plugin.partition(pid, ref)
    return {
        "pid": pid,
        "n": int(x.shape[0]),
        "worker": plugin.address,
        "device": str(plugin.replica.device),
    }


#: rows of the partition that :func:`warmup_task` runs the strategy on
_WARMUP_ROWS = 32


def warmup_task(
    name: str,
    weights: Weights,
    strategy: Strategy,
    pid: int,
    ref: PartitionRef,
    optimizer: str | None = None,
) -> None:
    """Run ``strategy`` once on a few rows of partition ``pid``; drop the result.

    The first ``torch.func`` transform on a process is slow, and so is the
    first optimizer; this keeps those costs out of the first training step.
    ``optimizer`` names the one that rounds of local steps build on the
    worker (``None``: no local steps, no optimizer here).
    """
    plugin = _plugin(name)
    with plugin.busy:
        _warm_up(plugin, weights, strategy, pid, ref, optimizer)


def _warm_up(
    plugin: ReplicaPlugin,
    weights: Weights,
    strategy: Strategy,
    pid: int,
    ref: PartitionRef,
    optimizer: str | None,
) -> None:
    replica = plugin.replica
    x, y = plugin.partition(pid, ref)
    # enough rows that a strategy training a share of them (selective-backprop
    # keeps a quarter by default) still trains two: batch norm refuses one
    n = min(_WARMUP_ROWS, int(x.shape[0]))
    plugin.kept = None
    replica.load(weights)
    batch = Batch(
        x=x[:n],
        y=y[:n],
        indices=np.arange(n),
        n_train=n,
        weights=None,
        mean_grad=weights.mean_grad,
        extra={"reference": np.zeros(1)},
        seed=(0,),
    )
    strategy.compute(replica, batch)
    replica.version = -1  # the warm-up weights are not a training version
    if optimizer is not None:
        # The first optimizer a process builds imports torch's compiler stack
        # (over a second); rounds of local steps build one each.
        dummy = [torch.nn.Parameter(torch.zeros(1, device=replica.device))]
        opt = make_optimizer(optimizer, dummy, {"lr": 0.0})
        opt.load_state_dict(opt.state_dict())
        dummy[0].grad = torch.zeros_like(dummy[0])
        opt.step()


@dataclass
class Share:
    """One worker's samples for one step, located in its partitions.

    ``pids``/``local`` locate each selected sample (partition, row), in the
    order of ``indices``: the first ``n_train`` are trained on (with
    ``weights``), the rest only scored.
    """

    pids: np.ndarray
    local: np.ndarray
    n_train: int
    weights: np.ndarray | None
    indices: np.ndarray
    extra: dict[str, np.ndarray]
    #: seeds the worker half's random choices: (run seed, step, slot)
    seed: tuple[int, int, int]


@dataclass
class Shares:
    """One worker's samples for the steps of a round, packed in a few arrays.

    A round of many steps travels as a handful of arrays rather than many
    small ones (each array is a frame of its own on the wire).
    """

    #: every step's samples (train rows first, then scored rows), concatenated
    indices: np.ndarray
    #: step ``i``'s samples are ``indices[splits[i]:splits[i + 1]]``
    splits: np.ndarray
    n_train: np.ndarray
    #: the train rows' weights of the weighted steps, concatenated
    weights: np.ndarray
    #: which steps carry weights
    weighted: np.ndarray
    #: each step's extras, or ``[]`` where no step has any
    extra: list[dict[str, np.ndarray]]
    #: (run seed, first step, slot): step ``i`` is seeded (seed, first + i, slot)
    seed: tuple[int, int, int]
    #: partition bounds along ``sample``
    bounds: np.ndarray

    @classmethod
    def pack(
        cls,
        selections: Sequence[Any],
        seed: tuple[int, int, int],
        bounds: np.ndarray,
    ) -> Shares:
        """Pack one slot's :class:`~daskpri.strategies.Selection` of each step."""
        return cls.concat(**concat_selections(selections), seed=seed, bounds=bounds)

    @classmethod
    def concat(
        cls,
        *,
        train: np.ndarray,
        n_train: np.ndarray,
        score: np.ndarray,
        n_score: np.ndarray,
        weights: np.ndarray,
        weighted: np.ndarray,
        extra: list[dict[str, np.ndarray]],
        seed: tuple[int, int, int],
        bounds: np.ndarray,
    ) -> Shares:
        """Pack one slot's steps from the arrays the table sends, without a loop over them.

        ``train``: every step's train rows, concatenated (``n_train`` of
        each); ``score`` likewise; ``weights``: the weighted steps' weights,
        concatenated; ``extra``: each step's extras, ``[]`` where none has any.

        Examples
        --------
        >>> s = Shares.concat(train=np.array([1, 2, 3]), n_train=np.array([2, 1]),
        ...     score=np.array([7]), n_score=np.array([0, 1]), weights=np.empty(0),
        ...     weighted=np.zeros(2, bool), extra=[], seed=(0, 0, 0), bounds=np.array([0, 10]))
        >>> s.indices.tolist(), s.splits.tolist()
        ([1, 2, 3, 7], [0, 2, 4])
        """
        n_train = np.asarray(n_train, dtype=np.int64)
        n_score = np.asarray(n_score, dtype=np.int64)
        sizes = n_train + n_score
        splits = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        if not n_score.any():
            indices = np.asarray(train, dtype=np.int64)
        else:  # each step's train rows, then its scored rows
            indices = np.empty(int(splits[-1]), dtype=np.int64)
            t0 = np.concatenate([[0], np.cumsum(n_train)[:-1]])
            s0 = np.concatenate([[0], np.cumsum(n_score)[:-1]])
            indices[np.arange(train.size) + np.repeat(splits[:-1] - t0, n_train)] = train
            indices[np.arange(score.size) + np.repeat(splits[:-1] + n_train - s0, n_score)] = score
        return cls(
            indices=indices,
            splits=splits,
            n_train=n_train,
            weights=np.asarray(weights, dtype=float),
            weighted=np.asarray(weighted, dtype=bool),
            extra=list(extra),
            seed=seed,
            bounds=np.asarray(bounds, dtype=np.int64),
        )

    def __len__(self) -> int:
        return int(self.n_train.size)

    def partitions(self) -> np.ndarray:
        """The partitions that the round touches, in order."""
        touched = np.zeros(max(self.bounds.size - 1, 0), dtype=bool)
        touched[np.searchsorted(self.bounds, self.indices, side="right") - 1] = True
        return np.flatnonzero(touched)

    def locate(self) -> tuple[np.ndarray, np.ndarray]:
        """(partition, row within it) of every sample of the round."""
        if not hasattr(self, "_located"):  # once per round, on the worker
            pids = np.searchsorted(self.bounds, self.indices, side="right") - 1
            self._located = (pids, self.indices - self.bounds[pids])
        return self._located

    def share(self, i: int) -> Share:
        """Step ``i`` of the round."""
        pids, local = self.locate()
        if not hasattr(self, "_w0"):  # where each step's weights start
            self._w0 = np.concatenate([[0], np.cumsum(self.n_train * self.weighted)])
        a, b = self.splits[i], self.splits[i + 1]
        w0, n = int(self._w0[i]), int(self.n_train[i])
        return Share(
            pids=pids[a:b],
            local=local[a:b],
            n_train=n,
            weights=self.weights[w0 : w0 + n] if self.weighted[i] else None,
            indices=self.indices[a:b],
            extra=self.extra[i] if self.extra else {},
            seed=(self.seed[0], self.seed[1] + i, self.seed[2]),
        )


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


def train_task(name: str, *args: Any) -> StepResult | dict[str, str]:
    """One worker's share of a step, as a Dask task (the ``tasks`` transport).

    ``args`` are those of :func:`_train` after the plugin, which is looked
    up by ``name`` on the worker running the task.
    """
    return _train_or_lost(_plugin(name), *args)


def _train_or_lost(plugin: ReplicaPlugin, *args: Any) -> StepResult | dict[str, str]:
    """:func:`_train`, answering ``{STATE_LOST: message}`` for a state not held.

    Expected (a restarted worker), so answered rather than raised: the
    worker then logs no failed task or call with a traceback.
    """
    try:
        with plugin.busy:
            return _train(plugin, *args)
    except ReplicaStateLost as e:
        return {STATE_LOST: str(e)}


def _train_handler(worker: Any) -> Any:
    """The worker's ``daskpri_train`` RPC handler (direct transport)."""

    async def daskpri_train(name: str, payload: tuple) -> Any:
        plugin = worker.plugins.get(name)
        if plugin is None:
            raise RuntimeError(f"worker {worker.address} has no daskpri replica {name!r}")
        # compute off the event loop, so the worker keeps answering heartbeats
        result = await asyncio.to_thread(_train_or_lost, plugin, *payload)
        return to_serialize(result) if isinstance(result, StepResult) else result

    return daskpri_train


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
