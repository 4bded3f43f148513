"""The worker side: one replica per worker, partitions loaded where processed.

:class:`ReplicaPlugin` is a distributed ``WorkerPlugin``: registered once by
the trainer, it builds the user's module on every worker of the cluster,
including workers that join (or restart) later, on the device of that worker.
It also caches the partitions that the worker has loaded, as tensors on that
device, so training steps ship partition ids and indices, not data.

The samples a step ships (:mod:`daskpri.replicas.shares`), the computation of
a worker's share of it (:mod:`daskpri.replicas.step`) and the errors a worker
reports (:mod:`daskpri.replicas.errors`) have modules of their own; their
names are importable from here too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import dask.config
import numpy as np
import torch
from distributed import Worker, WorkerPlugin, get_worker
from distributed.protocol import pickle
from distributed.protocol.serialize import to_serialize

import daskpri
from daskpri.data.io import FILE_ERRORS, check_values, open_dataset
from daskpri.replicas.arrival import why_no_replica  # noqa: F401  (re-exported)
from daskpri.replicas.devices import choose_device, device_count, spread_kind, worker_device
from daskpri.replicas.errors import (
    DATA_REFUSED,
    PARTITIONS_LOST,
    STATE_LOST,
    PartitionsLost,
    ReplicaStateLost,
    UnreadableDataError,
    raise_state_lost,  # noqa: F401  (re-exported)
)
from daskpri.replicas.optim import make_optimizer
from daskpri.replicas.replica import PRECISIONS, Replica, Weights
from daskpri.replicas.shares import Share, Shares  # noqa: F401  (re-exported)
from daskpri.replicas.step import StepResult, _train
from daskpri.replicas.tasks import ArrayPart, PartitionRef, StoreRef  # noqa: F401  (re-exported)
from daskpri.strategies.base import Batch, Strategy
from daskpri.table.plugin import replicas_name

logger = logging.getLogger(__name__)

#: Seconds a replica whose run has dropped it waits for the scheduler's own
#: ``plugin-remove`` before it removes itself (see ``_drop_if_unwanted``)
DROP_GRACE = 2.0


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
        Where it names a kind (``"cuda"``, or ``None`` on a worker with a
        ``GPU`` resource) and the worker's process sees several such
        devices, the worker processes of a host take one each
        (:mod:`daskpri.replicas.devices`).
    resources : dict, optional
        The resources the run's tasks ask for: a worker that lacks them
        never trains the run, and builds no replica (its memory and devices
        stay free for other work; a device forced with ``device`` need not
        exist there).
    version : str, optional
        The driver's daskpri version (default: this process's). A worker
        that runs another builds no replica: it is left out of the run as
        unfit, saying both versions (the driver checks the workers there
        at the set-up; this catches those that join later).
    label_smoothing : float
        The training loss's label smoothing (``F.cross_entropy``'s), which
        the replica's gradients take (see
        :class:`~daskpri.replicas.replica.Replica`).
    precision : {"float32", "bfloat16"}
        The training passes' precision (the Trainer's ``precision``); a
        device that cannot train in it (a GPU older than Ampere, for
        bfloat16) builds no replica, saying why.

    Attributes
    ----------
    serves : bool
        Whether this worker holds a replica: it has the run's resources, and
        the replica was built.
    unfit : str
        Why it holds none, where it does not.
    """

    idempotent = False

    def __init__(
        self,
        run: str,
        module: bytes,
        n_classes: int,
        device: str | None = None,
        resources: dict[str, float] | None = None,
        version: str | None = None,
        label_smoothing: float = 0.0,
        precision: str = "float32",
    ):
        self.name = replicas_name(run)
        self.label_smoothing = label_smoothing
        self.precision = precision
        self.module = module
        self.n_classes = n_classes
        self.device = device
        self.resources = resources
        self.version = daskpri.__version__ if version is None else version
        self.serves = True
        #: why this worker holds no replica, where it does not serve the run
        self.unfit = ""

    def setup(self, worker: Any) -> Awaitable[None] | None:
        """Build the replica; a coroutine (which the worker awaits) where it asks the scheduler.

        The worker's own device is known at once; one of several GPUs is
        chosen from the scheduler's list of the host's workers.
        """
        # The plugin goes to every worker (register_plugin has no choice of
        # workers, and a worker that joins later gets it too): the workers that
        # placement chose by resources are not the only ones that set it up.
        have = getattr(getattr(worker, "state", None), "total_resources", {}) or {}
        self.serves = all(have.get(k, 0) >= v for k, v in (self.resources or {}).items())
        self.address = worker.address
        if not self.serves:
            self.unfit = f"it lacks the run's resources {self.resources!r}"
            return None
        if daskpri.__version__ != self.version:
            # daskpri's objects and messages differ between versions: such a worker
            # (one that joined after the driver's check of the cluster) fails the run
            # in ways that do not say so, if it takes partitions
            self.serves, self.unfit = False, (
                f"it runs daskpri {daskpri.__version__}, the driver daskpri {self.version}: "
                f"install daskpri {self.version} where the worker runs, and restart it"
            )
            raise RuntimeError(f"worker {worker.address} cannot serve run {self.name}: "
                               f"{self.unfit}")
        kind = spread_kind(worker, self.device)
        if kind is not None:  # several GPUs: which is this process's asks the scheduler
            #: set once the replica is built (or failed): the plugin is in the worker's
            #: plugins meanwhile, where the driver may find a worker that joins mid-run
            self.ready = asyncio.Event()
            return self._set_up_spread(worker, kind)
        self._set_up(worker, lambda: worker_device(worker, self.device))
        self._drop_if_unwanted(worker)
        return None

    def _drop_if_unwanted(self, worker: Any) -> None:
        """Ask the scheduler, after the set-up, whether the run still wants this replica.

        A worker frozen while its run was set up and closed gets the
        scheduler's ``plugin-add`` and ``plugin-remove`` once it thaws, on
        two connections, read in either order: the remove first left the
        replica (its model, its partitions) on the worker for good. Where
        the scheduler no longer holds the plugin, it is removed here, after
        ``DROP_GRACE`` seconds: a remove that the scheduler sent after this
        set-up's add may still be on its way, and would find the plugin gone
        (distributed logs that as a failed teardown). Nothing is asked for a
        set-up outside a worker's event loop (in-process use), and the
        replica is kept where the scheduler lacks daskpri's table plugin or
        does not answer within 30 s.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return

        async def check() -> None:
            try:
                wanted = await asyncio.wait_for(
                    worker.scheduler.daskpri_replicas_wanted(name=self.name), 30)
            except Exception as e:
                logger.debug("daskpri: replica %s not checked with the scheduler: %r",
                             self.name, e)
                return
            # (None: a scheduler without daskpri's table plugin, which has no such handler)
            if wanted is not False:
                return
            await asyncio.sleep(DROP_GRACE)
            if worker.plugins.get(self.name) is self:  # no remove came meanwhile
                logger.warning("daskpri: the run of replica %s was closed before its set-up "
                               "reached this worker: the replica is dropped", self.name)
                await worker.plugin_remove(name=self.name)

        #: held, so the check is not collected before it ends
        self.checked = asyncio.ensure_future(check())

    async def _set_up_spread(self, worker: Any, kind: str) -> None:
        """Set up on one of the host's ``kind`` devices, shared out among its worker processes."""
        try:
            try:
                device = await choose_device(worker, kind, device_count(kind), self.resources,
                                             gpu=self.device is None)
            except Exception as e:  # the scheduler gone meanwhile
                self.serves, self.unfit = False, f"{type(e).__name__}: {e}"
                raise
            self._set_up(worker, lambda: device)
            self._drop_if_unwanted(worker)
        finally:
            self.ready.set()

    def _set_up(self, worker: Any, device: Callable[[], torch.device]) -> None:
        # the device is made in here: one a worker lacks fails as a missing module does
        try:
            self.replica = self._build(worker, device)
        except Exception as e:
            # a worker that joins later from another environment (the model's module
            # missing, a forced device it lacks) must not take partitions: the driver
            # leaves it out (its failure is in its log, and the driver's warning)
            self.serves, self.unfit = False, f"{type(e).__name__}: {e}"
            raise
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
        self.worker = worker
        # The direct transport: steps arrive as RPCs from the driver, past the
        # scheduler's task machinery (one handler serves every run).
        worker.handlers["daskpri_train"] = _train_handler(worker)

    def _build(self, worker: Any, device: Callable[[], torch.device]) -> Replica:
        try:
            module = pickle.loads(self.module)
        except ImportError as e:  # a module of the model's that the driver checks missed
            raise ModuleNotFoundError(
                f"worker {worker.address} could not rebuild the model: {e}; install the "
                "module where the workers run, send it with client.upload_file(path), or "
                "have it sent with the model (cloudpickle.register_pickle_by_value)",
                name=e.name,
            ) from e
        return Replica(module, device(), label_smoothing=self.label_smoothing,
                       precision=PRECISIONS[self.precision])

    def teardown(self, worker: Any) -> None:
        # a setup that failed (a device the worker lacks) may not have made them
        if hasattr(self, "partitions"):
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
                # its data freed and the replica torn down: the worker is closing
                raise PartitionsLost(
                    f"partition {pid} is neither loaded nor held on worker {self.address} "
                    f"(status {getattr(self.worker, 'status', '?')})", [pid]
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
                # its links checked on the driver, under the driver's config
                ds = open_dataset(ref.path, check_links=False, check_chunks=False).isel(
                    sample=slice(ref.start, ref.stop))
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


def _plugin(name: str, worker: Worker | None = None) -> ReplicaPlugin:
    """The replica ``name`` of ``worker`` (this task's worker by default)."""
    worker = get_worker() if worker is None else worker
    try:
        plugin: ReplicaPlugin = worker.plugins[name]  # type: ignore[assignment]
    except KeyError:
        raise RuntimeError(
            f"worker {worker.address} has no daskpri replica {name!r}: its run was closed "
            "meanwhile, or the worker joined the cluster without it"
        ) from None
    if not plugin.serves:
        raise RuntimeError(
            f"worker {worker.address} has no daskpri replica {name!r}: {plugin.unfit}"
        )
    return plugin


def load(name: str, pid: int, ref: PartitionRef) -> dict[str, Any]:
    """Load and check a partition on this worker (run once per partition).

    Data that the checks refuse, or a store this worker cannot read, is
    answered ``{DATA_REFUSED: error}`` (see :func:`raise_data_refused`): a
    task that raised would have the worker log "Compute Failed" with its
    traceback, a dozen lines before the one the user is told.
    """
    plugin = _plugin(name)
    with plugin.busy:
        try:
            x, y = plugin.partition(pid, ref)
        except (ValueError, *FILE_ERRORS) as e:  # (UnreadableDataError is a ValueError)
            return {DATA_REFUSED: e}
    return {
        "pid": pid,
        "n": int(x.shape[0]),
        "worker": plugin.address,
        "device": str(plugin.replica.device),
    }


#: rows of the partition that :func:`warm_up` runs the strategy on
_WARMUP_ROWS = 32


def warm_up(
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


def train(name: str, *args: Any) -> StepResult | dict[str, Any]:
    """One worker's share of a step, as a Dask task (the ``tasks`` transport).

    ``args`` are those of :func:`_train` after the plugin, which is looked
    up by ``name`` on the worker running the task.
    """
    return _train_or_lost(_plugin(name), *args)


def _train_or_lost(plugin: ReplicaPlugin, *args: Any) -> StepResult | dict[str, Any]:
    """:func:`_train`, answering ``{STATE_LOST: message}`` for a state not held,
    ``{PARTITIONS_LOST: message, "pids": [...]}`` for partitions not held.

    Expected (a restarted worker, one closing), so answered rather than
    raised: the worker then logs no failed task or call with a traceback.
    """
    try:
        with plugin.busy:
            return _train(plugin, *args)
    except ReplicaStateLost as e:
        return {STATE_LOST: str(e)}
    except PartitionsLost as e:
        return {PARTITIONS_LOST: str(e), "pids": e.pids}


def _train_handler(worker: Any) -> Any:
    """The worker's ``daskpri_train`` RPC handler (direct transport)."""

    async def daskpri_train(name: str, payload: tuple) -> Any:
        if name not in worker.plugins and worker.status.name in ("closing", "closed"):
            # retired, or restarted: its close removed the replica before the comms
            # closed, and the step's call came in between; a lost worker, not an error
            return {PARTITIONS_LOST: f"worker {worker.address} is closing: its replica is gone",
                    "pids": [int(p) for p in payload[3]]}
        plugin = _plugin(name, worker)
        # compute off the event loop, so the worker keeps answering heartbeats
        result = await asyncio.to_thread(_train_or_lost, plugin, *payload)
        return to_serialize(result) if isinstance(result, StepResult) else result

    return daskpri_train
