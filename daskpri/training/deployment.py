"""The run's partitions and replicas on its workers, kept in place as workers come and go.

A :class:`Deployment` knows which worker owns which partition, places the
partitions (scattered from memory or read from a store) and warms the
replicas up, sends each step's work to the workers, and re-plans after
losing workers: their partitions move to the workers left.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import dask
import numpy as np
import xarray as xr
from distributed import Client, Future

from daskpri import _config
from daskpri.data._persisted import driver_scheduler
from daskpri.replicas.arrival import why_no_replica
from daskpri.replicas.errors import PartitionsLost, raise_data_refused
from daskpri.replicas.optim import LocalSteps
from daskpri.replicas.replica import Weights
from daskpri.replicas.tasks import (
    ArrayPart,
    StoreRef,
    load_task,
    release_keys,
    train_task,
    warmup_task,
)
from daskpri.replicas.worker import Shares, StepResult
from daskpri.strategies import Strategy
from daskpri.table.plugin import RemoteTable, Round
from daskpri.training._memory import check_memory
from daskpri.training._waiting import PendingTask
from daskpri.training.errors import WorkersLostError
from daskpri.training.placement import (
    cluster_workers,
    eligible_workers,
    reassign_owners,
    rebalance_owners,
)
from daskpri.training.recovery import (
    FILE_ERRORS,
    LOST,
    SchedulerLostError,
    dask_timeout,
    is_lost,
    kept_dying,
    responsive,
    step_timeout,
)
from daskpri.training.transport import (
    StepTimeout,
    ask_workers,
    gather_within,
    run_direct,
    scatter_running,
    scatter_to,
    wait_tasks,
)

logger = logging.getLogger(__name__)

#: seconds before a worker that did not answer as it was asked to join a run is asked again
ASK_AGAIN_AFTER = 30.0


class Deployment:
    """Where a run's partitions live and how its steps reach the workers.

    Parameters
    ----------
    client : distributed.Client
        The run's cluster.
    run_id : str
        The run's name, in the keys of its tasks.
    plugin : str
        Name of the run's registered :class:`~daskpri.replicas.worker.ReplicaPlugin`.
    table : RemoteTable
        The run's table, told the owner of each partition after a re-plan.
    bounds : numpy.ndarray
        Partition ``p`` holds samples ``bounds[p]:bounds[p + 1]``.
    slots : list of str
        The workers in use, one per slot.
    owner_addr : list of str
        The worker of each partition.
    source : xarray.Dataset or str
        The data: in memory (scattered) or a path (read by the workers).
    ds : xarray.Dataset
        The data, opened.

    Attributes
    ----------
    parts : dict
        Each placed partition's scattered future or store reference.
    unfit : dict
        Workers of the cluster that hold no replica of the run (one that
        joined from an environment that cannot build it), by address: why.
        They take no partitions.
    memory_limits : dict
        The memory limit of each worker seen, by address, for a message
        once its nanny has killed it for memory (it is gone from the
        scheduler by then).
    """

    def __init__(
        self,
        client: Client,
        run_id: str,
        plugin: str,
        table: RemoteTable,
        bounds: np.ndarray,
        slots: list[str],
        owner_addr: list[str],
        source: xr.Dataset | str,
        ds: xr.Dataset,
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.plugin = plugin
        self.table = table
        self.bounds = bounds
        self.slots = slots
        self.owner_addr = owner_addr
        self.source = source
        self.ds = ds
        self.parts: dict[int, StoreRef | Future] = {}
        self.unfit: dict[str, str] = {}
        self.memory_limits: dict[str, int] = {}
        #: workers that did not answer as they were asked to join (or as the run was set
        #: up), by address: when (``time.monotonic()``) to ask them again
        self.quiet: dict[str, float] = {}

    def release(self) -> None:
        """Drop the partitions, the scheduler releasing those scattered before it returns.

        The layout (``slots``, ``owner_addr``) stays, for the history's
        ``n_workers``.
        """
        keys = [f.key for f in self.parts.values() if isinstance(f, Future)]
        self.parts = {}
        if keys and self.client.status == "running":
            # Dropping the futures releases them through the client's batched
            # stream, maybe still in flight when a cluster closed next removes the
            # workers, which logs an ERROR that their scattered data is lost
            # (a trainer never closed, at exit: see _cleanup._close_at_exit).
            with contextlib.suppress(Exception):  # the cluster may be gone already
                self.client.run_on_scheduler(release_keys, keys, self.client.id)

    def set_up(
        self,
        weights: Weights,
        strategy: Strategy,
        optimizer: str | None,
        *,
        resources: dict[str, float] | None,
        excluded: set[str],
        check_scheduler: Callable[[], None],
    ) -> None:
        """Place every partition and warm the replicas up, despite workers dying meanwhile.

        A worker lost during set-up is handled as during training: its
        partitions move to the workers left (bounded by ``no-workers-timeout``),
        up to ``daskpri.trainer.max-retries`` times; then, or where no
        suitable worker is left, ``RuntimeError`` says that workers kept
        dying, and which, and names apart those left out as silent (alive,
        but no answer within ``daskpri.trainer.step-timeout``). Workers whose
        memory the replicas took over Dask's pause threshold are refused
        first (:func:`check_memory`).
        """
        n_partitions = len(self.bounds) - 1
        check_memory(self.client, sorted(set(self.owner_addr)))
        deadline = time.monotonic() + dask_timeout()
        retries = _config.get_int("trainer.max-retries", 0)
        lost: set[str] = set()
        # (those left out as silent before this set-up are not its own to name)
        silent_before = set(excluded)
        for attempt in itertools.count():
            try:
                gone = set(self.owner_addr) - set(cluster_workers(self.client))
                if attempt == 0 and gone:
                    # workers planned on died before the set-up got here (as the replicas
                    # were set up): re-planned first, rather than scattered to in vain
                    raise KeyError(f"worker(s) {', '.join(sorted(gone))} left the cluster")
                missing = [p for p in range(n_partitions) if p not in self.parts]
                if missing:
                    self.place(missing, resources)
                self.warm_up(weights, strategy, optimizer, resources)
                self.note_limits(cluster_workers(self.client))
                return
            except FILE_ERRORS:
                raise
            except (KeyError, *LOST) as e:
                silent = isinstance(e, StepTimeout)
                if isinstance(e, StepTimeout):  # (for mypy) alive but silent (frozen) as
                    excluded.update(e.addresses)  # its partitions came: left out, as in a step
                # (a wait of step-timeout's, which passes the deadline, re-plans once more)
                if attempt >= retries or (time.monotonic() > deadline and not silent):
                    lost |= set(self.slots) - set(cluster_workers(self.client))
                    raise WorkersLostError(kept_dying(
                        lost, attempt + 1, retries, e, silent=excluded - silent_before)) from e
                before = set(self.slots)
                try:
                    self.recover(
                        resources=resources, excluded=excluded, check_scheduler=check_scheduler
                    )
                except (RuntimeError, ValueError, KeyError, *LOST) as gone:
                    # a lost scheduler (SchedulerLostError) and the data's files say so
                    if isinstance(gone, (SchedulerLostError, *FILE_ERRORS)):
                        raise
                    lost |= before - set(cluster_workers(self.client))
                    raise WorkersLostError(kept_dying(
                        lost, attempt + 1, retries, e, none_left=str(gone),
                        silent=excluded - silent_before,  # (recover's too)
                    )) from gone
                lost |= before - set(self.slots)

    def place(self, pids: list[int], resources: dict[str, float] | None) -> None:
        """Make partitions ``pids`` available on their owners and check them."""
        client = self.client
        by_worker: dict[str, list[int]] = {}
        for pid in pids:
            by_worker.setdefault(self.owner_addr[pid], []).append(pid)
        path = None if isinstance(self.source, xr.Dataset) else str(self.source)
        for addr, mine in by_worker.items():
            if path is not None:
                for pid in mine:
                    self.parts[pid] = StoreRef(
                        path, int(self.bounds[pid]), int(self.bounds[pid + 1])
                    )
            else:
                # read here (dask-backed data, as xr.open_mfdataset gives, by this
                # process's threads, not a default client's workers; data persisted on a
                # cluster, through its client) and scattered once
                with dask.config.set(scheduler=driver_scheduler(self.ds)):
                    arrays = [
                        ArrayPart(
                            np.asarray(self.ds["x"].isel(sample=slice(a, b)).values),
                            np.asarray(self.ds["y"].isel(sample=slice(a, b)).values),
                            int(a),
                        )
                        for a, b in ((self.bounds[p], self.bounds[p + 1]) for p in mine)
                    ]
                # bounded: an owner that froze since it answered would hold it for good
                futures = scatter_to(client, arrays, addr, step_timeout())
                self.parts.update(zip(mine, futures, strict=True))
        # a key of its own each time: a retry's task under the key of one that a lost
        # worker failed may be handed that one's state ("cancelled: already forgotten")
        tag = uuid.uuid4().hex[:6]
        checks = [
            client.submit(
                load_task,
                self.plugin,
                pid,
                self.parts[pid],
                pure=False,
                workers=[self.owner_addr[pid]],
                allow_other_workers=True,
                resources=resources,
                key=f"daskpri-load-{self.run_id}-{pid}-{tag}",
            )
            for pid in pids
        ]
        try:  # (bounded, as the scatter)
            loaded = gather_within(client, checks, [self.owner_addr[p] for p in pids],
                                   step_timeout(), "load and check their partitions")
            for result in loaded:  # data a worker refused: the first partition's error
                raise_data_refused(result)
        except BaseException:
            # an erred check kept under its key would be handed back, error and all,
            # to the next fit's submit of that key (its data since mended)
            with contextlib.suppress(Exception):
                client.cancel(checks, force=True)
            raise

    def warm_up(
        self,
        weights: Weights,
        strategy: Strategy,
        optimizer: str | None,
        resources: dict[str, float] | None,
    ) -> None:
        """Run the strategy once per worker on a few samples, results dropped.

        The first ``torch.func`` call on a fresh worker takes seconds; paying
        it here keeps it out of the history's training time. ``optimizer``
        is that of a round of local steps (None for one step).
        """
        first: dict[str, int] = {}
        for pid, addr in enumerate(self.owner_addr):
            first.setdefault(addr, pid)
        tag = uuid.uuid4().hex[:6]  # (as the checks' in place)
        # scattered once, for every worker's task: in each task, the scheduler would hold
        # (and unpickle, importing torch) a copy of the weights per worker
        scattered = scatter_running(self.client, weights, resources, dask_timeout(),
                                    list(first), step_timeout())
        futures = [
            self.client.submit(
                warmup_task,
                self.plugin,
                scattered,
                strategy,
                pid,
                self.parts[pid],
                optimizer,
                workers=[addr],
                allow_other_workers=True,
                resources=resources,
                pure=False,
                key=f"daskpri-warmup-{self.run_id}-{pid}-{tag}",
            )
            for addr, pid in first.items()
        ]
        try:
            gather_within(self.client, futures, list(first), step_timeout(),
                          "warm their replicas up")
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.cancel(futures, force=True)
            raise

    # -- one step --------------------------------------------------------------------

    def run(
        self,
        weights: Weights,
        rounds: Round,
        *,
        step: int,
        strategy: Strategy,
        seed: int,
        local: LocalSteps | None,
        transport: str,
        resources: dict[str, float] | None,
        then: Callable[[], None] | None = None,
    ) -> list[StepResult]:
        """Each worker's share of a step (or round), as tasks or as direct RPCs.

        ``then`` is called once they are sent, while the workers compute.
        """
        args = []
        for slot in range(rounds.n_slots):
            shares = Shares.concat(
                **rounds.slot_arrays(slot), seed=(seed, step, slot), bounds=self.bounds
            )
            parts = {int(p): self.parts[int(p)] for p in shares.partitions()}
            args.append([strategy, shares, parts, local])
        try:
            if transport == "direct":
                return self._run_direct(weights, args, then)
            return self._run_tasks(weights, args, step, resources, then)
        except PartitionsLost as e:
            # a worker closing, all of whose partitions are gone: the caller
            # recovers (a lost worker), which places them again, on it if it stays
            closing = {self.owner_addr[p] for p in e.pids if 0 <= p < len(self.owner_addr)}
            for pid, addr in enumerate(self.owner_addr):
                if addr in closing or pid in e.pids:
                    self.parts.pop(pid, None)
            raise

    def _run_tasks(
        self,
        weights: Weights,
        args: list[list[Any]],
        step: int,
        resources: dict[str, float] | None,
        then: Callable[[], None] | None,
    ) -> list[StepResult]:
        """One Dask task per worker, through the scheduler."""
        client = self.client
        wfut = scatter_running(client, weights, resources, dask_timeout(), self.slots,
                               step_timeout())
        futures = [
            client.submit(
                train_task,
                self.plugin,
                wfut,
                *a,
                key=f"daskpri-step-{self.run_id}-{step}-{slot}-{uuid.uuid4().hex[:6]}",
                workers=[self.slots[slot]],
                allow_other_workers=True,
                resources=resources,
                pure=False,
            )
            for slot, a in enumerate(args)
        ]
        if then is not None:
            then()
        return wait_tasks(client, futures, self.slots, resources, dask_timeout(), step_timeout())

    def _run_direct(
        self, weights: Weights, args: list[list[Any]], then: Callable[[], None] | None = None
    ) -> list[StepResult]:
        """One RPC per worker, past the scheduler's task machinery.

        Partitions are named by their scattered key (or store reference): the
        worker has them loaded already. A worker that dies mid-call closes its
        connection, which the step's retry treats as a lost worker.
        """
        calls = []
        for slot, a in enumerate(args):
            a[2] = {p: (r.key if isinstance(r, Future) else r) for p, r in a[2].items()}
            calls.append((self.slots[slot], (weights, *a)))
        return run_direct(self.client, calls, self.plugin, step_timeout(), then)

    # -- workers that join --------------------------------------------------------------

    def rescan(
        self, resources: dict[str, float] | None, excluded: set[str], limit: int | None
    ) -> tuple[list[str], list[str]]:
        """``(gone, new)``: the run's workers the scheduler no longer lists, and
        suitable workers of the cluster that the run does not use yet (``limit``: in all).

        A worker that died between steps is gone from the scheduler before
        the run sends it anything: a call to its address would wait for the
        connect timeout (``distributed.comm.timeouts.connect``, 30 s) before
        it failed. New workers are those that joined since the run was
        planned, or came back under another address after a restart (a nanny
        restarts a worker that died), but for those ``quiet`` for now. One call
        to the scheduler.
        """
        workers = cluster_workers(self.client)
        self.note_limits(workers)
        gone = [a for a in self.slots if a not in workers]
        try:
            live = eligible_workers(workers, resources, self.client.scheduler.address)
        except (RuntimeError, ValueError):
            return gone, []
        now = time.monotonic()
        new = [a for a in live if a not in self.slots and a not in excluded
               and a not in self.unfit and self.quiet.get(a, 0.0) <= now]
        if limit is not None:
            new = new[: max(0, limit - len(self.slots))]
        return gone, new

    def grow(self, new: list[str], resources: dict[str, float] | None) -> list[str]:
        """Move partitions to the workers ``new`` until all hold about as many; those that got some.

        The partitions moved are placed on their new workers (data loaded
        and checked there) and the table learns their owners. A worker that
        does not answer is left out; one lost meanwhile raises as in a step
        (the caller recovers).
        """
        answering = responsive(self.client, new)
        # a frozen worker would cost each rescan the wait for its answer
        self.left_quiet([a for a in new if a not in answering])
        new = self.serving(answering)
        if not new:
            return []
        old = self.owner_addr
        owner_addr = rebalance_owners(old, self.slots + new)
        moved = [pid for pid, (a, b) in enumerate(zip(old, owner_addr, strict=True)) if a != b]
        if not moved:  # more workers than partitions
            return []
        self.owner_addr = owner_addr
        for pid in moved:
            self.parts.pop(pid, None)
        self.place(moved, resources)
        self.slots = sorted(set(self.owner_addr))
        slot_of = {a: i for i, a in enumerate(self.slots)}
        self.table.set_owner(np.array([slot_of[a] for a in self.owner_addr], dtype=np.int64),
                             workers=self.slots)
        return [a for a in new if a in slot_of]

    def left_quiet(self, addresses: list[str]) -> None:
        """Ask ``addresses`` (workers that did not answer) to join again only after
        :data:`ASK_AGAIN_AFTER` seconds."""
        self.quiet.update(dict.fromkeys(addresses, time.monotonic() + ASK_AGAIN_AFTER))

    def serving(self, addresses: list[str]) -> list[str]:
        """Those of ``addresses`` that hold a replica of the run; the others go to ``unfit``.

        A worker that joined the cluster from an environment that cannot
        build the model (its module missing, a device forced that it lacks)
        has the run's plugin but no replica: partitions placed there would
        fail the run. Each is logged once, with why. A worker that does not
        answer (within 5 s: :func:`ask_workers`) is kept (the caller finds it lost).
        """
        if not addresses:
            return []
        found = ask_workers(self.client, addresses, why_no_replica, self.plugin)
        for addr, why in found.items():
            if isinstance(why, str) and addr not in self.unfit:
                self.unfit[addr] = why
                logger.warning(
                    "worker %s holds no replica of run %s (%s): it takes no partitions",
                    addr, self.run_id, why,
                )
        return [a for a in addresses if a not in self.unfit]

    # -- lost workers ----------------------------------------------------------------

    def note_limits(self, workers: dict[str, dict[str, Any]]) -> None:
        """Remember the memory limits of ``workers`` (:func:`cluster_workers`'s)."""
        for address, info in workers.items():
            if info.get("memory_limit"):
                self.memory_limits[address] = int(info["memory_limit"])

    def recover(
        self,
        *,
        resources: dict[str, float] | None,
        excluded: set[str],
        check_scheduler: Callable[[], None],
    ) -> None:
        """Re-plan after losing workers: move their partitions to live ones.

        More workers may die while this runs (their address then vanishes
        under a scatter, a ``KeyError``): it starts over until the plan holds
        or ``no-workers-timeout`` passes. Workers in ``excluded`` are left
        out, and those silent as partitions are placed on them (for the
        step timeout) are added to them; ``check_scheduler`` raises if the
        scheduler is gone. Where no suitable worker is left, it keeps a task
        with ``resources`` pending as it waits, as a fit's start does, so
        that an adaptive cluster starts one
        (:class:`~daskpri.training._waiting.PendingTask`); the task's result
        holds that worker until the partitions are placed there (and the
        table holds it as the run's).
        """
        deadline = time.monotonic() + dask_timeout()
        pending = PendingTask(self.client, resources)
        try:
            while True:
                try:
                    self._replan(deadline, resources, excluded, check_scheduler, pending)
                    return
                except FILE_ERRORS:
                    raise
                except StepTimeout as e:
                    # alive but silent (frozen) as partitions came, step-timeout's wait: left
                    # out, as after a step (each time one more, whatever the deadline)
                    excluded.update(e.addresses)
                except (KeyError, *LOST):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            pending.release()

    def _replan(
        self,
        deadline: float,
        resources: dict[str, float] | None,
        excluded: set[str],
        check_scheduler: Callable[[], None],
        pending: PendingTask,
    ) -> None:
        client = self.client
        while True:
            check_scheduler()
            workers = cluster_workers(client)
            self.note_limits(workers)
            try:
                live = eligible_workers(workers, resources, client.scheduler.address)
                live = [a for a in live if a not in excluded and a not in self.unfit]
                # The scheduler may still list a worker that just died; data
                # scattered to it would wait for the connect timeout.
                live = self.serving(responsive(client, live))
                if not live:
                    raise RuntimeError("no suitable worker answers")
                break
            except (RuntimeError, ValueError) as e:
                left = deadline - time.monotonic()
                if left < 0:
                    raise type(e)(f"{e}; waited {dask_timeout():g} s for a worker "
                                  "(daskpri.trainer.no-workers-timeout)") from None
                pending.keep()  # (an adaptive cluster's Adaptive starts a worker for it)
                pending.wait(min(0.2, left))
        old = self.owner_addr
        self.owner_addr = reassign_owners([a if a in live else None for a in old], live)
        self.slots = sorted(set(self.owner_addr))
        slot_of = {a: i for i, a in enumerate(self.slots)}
        moved = [
            pid
            for pid, (a, b) in enumerate(zip(old, self.owner_addr, strict=True))
            if a != b or pid not in self.parts or is_lost(self.parts[pid])
        ]
        for pid in moved:
            self.parts.pop(pid, None)
        if moved:
            self.place(moved, resources)
        self.table.set_owner(np.array([slot_of[a] for a in self.owner_addr], dtype=np.int64),
                             workers=self.slots)
