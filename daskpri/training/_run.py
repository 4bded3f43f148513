"""The trainer's run in the cluster: set up for a data set, following the cluster.

A mixin of :class:`~daskpri.training.trainer.Trainer`, the base of
:class:`~daskpri.training._step.StepMixin` (each step of the run). Preparing
a data set creates the run's table and
:class:`~daskpri.training.deployment.Deployment` (partitions and replicas on
the workers) and the master's optimizer, restoring a checkpoint's state if
the trainer was resumed; between steps the run follows the workers that
leave or join the cluster, and re-plans after losing some; releasing it
drops its state from the cluster. :class:`RunMixin` also declares the
trainer's settings and state that its mixins and helper modules use.

It is a mixin, not a separate object, because these methods read the
trainer's settings (``learning_rate``, ``local_steps``, ``resources``, ...)
as they are at each step, and update its counters (``step_``, the history).
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import cloudpickle
import numpy as np
import torch
import xarray as xr
from distributed import Client, LocalCluster
from distributed.security import Security
from torch import nn

from daskpri import _config
from daskpri._warnings import warn
from daskpri.data.io import fingerprint
from daskpri.replicas.arrival import ReplicaArrival
from daskpri.replicas.replica import Weights
from daskpri.strategies import Strategy
from daskpri.table.plugin import Ahead, RemoteTable
from daskpri.training._checks import (
    check_local_device,
    check_model,
    check_strategy_model,
    foreign_modules,
)
from daskpri.training._cleanup import drop_run
from daskpri.training._cluster_checks import check_cluster
from daskpri.training._resume import data_fingerprint_of, state_shaped_like_params
from daskpri.training._waiting import workers_awaited
from daskpri.training.deployment import Deployment
from daskpri.training.errors import WorkersLostError
from daskpri.training.history import HistoryRecorder
from daskpri.training.placement import (
    all_have_gpus,
    assign_owners,
    cluster_workers,
    eligible_workers,
    partition_bounds,
    too_few_workers,
)
from daskpri.training.recovery import (
    FILE_ERRORS,
    LOST,
    check_scheduler,
    how_workers_left,
    kept_dying,
    memory_restarts,
    report_left,
    rescan_interval,
    restarted_for_memory,
    scheduler_gone,
    scheduler_id,
)
from daskpri.training.transport import StepTimeout, register, unregister

if TYPE_CHECKING:
    from daskpri.training._interrupts import Interrupts

logger = logging.getLogger(__name__)


class RunMixin:
    """The run in the cluster, for :class:`~daskpri.training.trainer.Trainer`."""

    # The trainer's settings and state, which Trainer.__init__ sets (its
    # arguments through _settings.set_arguments).
    model: nn.Module
    strategy: Strategy
    seed: int
    n_workers: int | None
    resources: dict[str, float] | None
    batch_size: int
    learning_rate: float
    momentum: float
    weight_decay: float
    max_grad_norm: float | None
    label_smoothing: float
    precision: str
    optimizer: str
    lr_schedule: str
    schedule_steps: int | None
    warmup_steps: int
    local_steps: int
    eval_every: int
    partition_size: int | None
    staleness: str
    device: str | None
    checkpoint_path: str | None
    checkpoint_every: int | None
    security: Security | bool | None
    on_nonfinite: str
    transport: str
    run_id: str
    step_: int
    skipped_steps_: int
    _client: Client | None
    _own_cluster: LocalCluster | None
    _abandoned: weakref.finalize[Any, Any] | None
    _sample_coord: np.ndarray | None
    _scheduler_address: str | None
    #: the id of the scheduler the run was set up on, to tell one restarted at its address
    _scheduler_id: str | None = None
    _excluded: set[str]
    _recorder: HistoryRecorder
    _opt: torch.optim.Optimizer | None
    _mean_grad: torch.Tensor | None
    _pending: list[tuple[np.ndarray, np.ndarray, int]]
    #: (first step, steps, answer) of the next round, selected ahead
    _prefetched: tuple[int, int, Ahead] | None
    _kept: tuple[str, str] | None
    _prefetch_rounds: bool
    _keep_state: bool
    _data_key: tuple[Any, ...] | None
    #: the classes of the run's data (its labels lie in [0, _n_classes))
    _n_classes: int
    _elapsed: float
    _stop_requested: bool
    #: how many of the history's records the table has been sent
    _metrics_sent: int
    _deployment: Deployment | None
    _table: RemoteTable | None
    #: when (``time.monotonic()``) to look for workers that joined next
    _next_rescan: float
    _resume_state: dict[str, Any] | None

    if TYPE_CHECKING:

        @property
        def client(self) -> Client: ...

        # StepMixin's, which the run's set-up calls
        def _drop_prefetched(self) -> None: ...

        def _weights(self, version: int) -> Weights: ...

        def _init_optimizer(self) -> None: ...

    # -- the run in the cluster ---------------------------------------------------------

    def _check_data(
        self, ds: xr.Dataset, info: dict[str, Any], source: xr.Dataset | str
    ) -> tuple[tuple[Any, ...], int]:
        """The data's key for :meth:`_prepare`, and the classes its labels need.

        New data is checked here, on the driver: a resumed run's against its
        checkpoint's (:func:`~._resume.data_fingerprint_of`), the strategy
        against the model, the model on two samples, the labels' range. This
        runs before :meth:`_prepare` starts the trainer's LocalCluster or
        releases the last data's run, so that a fit refused here starts no
        cluster and leaves that run as it was.
        """
        # the data (by content: a copy of the same data goes on with the run, data
        # changed in place does not) and its cut as one worker would have it: a
        # cluster that grew or shrank between fits keeps the run (its partitions
        # move, see _follow_cluster)
        key: tuple[Any, ...] = (
            fingerprint(source),
            tuple(partition_bounds(ds, self.partition_size, 1).tolist()),
        )
        if self._data_key is not None and key == self._data_key[:2]:
            return self._data_key, self._n_classes
        # the data's own fingerprint (a few samples' values), which a checkpoint keeps
        digest = data_fingerprint_of(ds, self._resume_state)
        check_strategy_model(self.strategy, self.model)
        return (*key, digest), check_model(self.model, ds, info)

    def _prepare(
        self,
        ds: xr.Dataset,
        source: xr.Dataset | str,
        key: tuple[Any, ...],
        n_classes: int,
        interrupts: Interrupts | None = None,
    ) -> None:
        """Set the run up in the cluster for data that :meth:`_check_data` checked.

        ``interrupts`` is told while the fit waits for workers (:mod:`._waiting`).
        """
        if self._client is None:  # before the trainer starts its LocalCluster, here
            check_local_device(self.device)
        client = self.client
        asked = self.resources  # the user's, for the advice below; not the GPUs found
        # the trainer's own LocalCluster has n_workers: a user's cluster is asked for as many
        limit = self.n_workers if self._own_cluster is None else None
        need = limit or 1

        def suited(workers: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, float] | None,
                                                                     list[str]]:
            resources = asked
            if resources is None and all_have_gpus(workers):
                resources = {"GPU": 1.0}
            addrs = eligible_workers(workers, resources, client.scheduler.address)
            if len(addrs) < need:
                raise ValueError(too_few_workers(need, len(addrs), len(workers),
                                                  client.scheduler.address, asked))
            return resources, addrs[:limit]

        with_resources = f" with resources {asked!r}" if asked else ""
        # the set-up inside: the task the wait kept pending for an adaptive cluster holds
        # the worker that ran it until the run's data is there (see _waiting)
        with workers_awaited(
            client, suited, f"{'a worker' if need == 1 else f'{need} workers'}{with_resources}",
            resources=asked, need=need, stopped=lambda: self._stop_requested, interrupts=interrupts,
        ) as (resources, addrs):
            self.resources = resources
            self._prepare_on(client, ds, source, key, n_classes, addrs)

    def _prepare_on(
        self,
        client: Client,
        ds: xr.Dataset,
        source: xr.Dataset | str,
        key: tuple[Any, ...],
        n_classes: int,
        addrs: list[str],
    ) -> None:
        """:meth:`_prepare` once the cluster has the workers ``addrs`` for the run."""
        if key == self._data_key:
            # workers may have left or joined since the last fit: look before its first round
            self._next_rescan = 0.0
            return
        if self._resume_state is not None:
            # the run's own cut, whatever the number of workers now: its table and
            # selections go on only over the partitions they were made for
            bounds = np.asarray(self._resume_state["table"]["table"]["offsets"], dtype=np.int64)
        else:
            bounds = partition_bounds(ds, self.partition_size, len(addrs))
        # checked before the last data's run is released: a fit refused here leaves it
        sizes = np.diff(bounds)
        owner = assign_owners(sizes, len(addrs))
        self._check_batch_fits(sizes, owner, len(addrs))
        # one probe of the workers and the scheduler answers every check of the cluster
        silent = check_cluster(client, addrs, self.device, self.model, self.strategy,
                               source if isinstance(source, str) else None, self.precision)
        if self._data_key is not None:
            self._release()  # new data: a new table, partitions and replicas
        self._n_classes = n_classes
        self._warn_unequal_shares(sizes, owner, len(addrs))
        try:
            self._set_up(client, ds, source, bounds, sizes, owner, addrs, key, silent)
        except BaseException:
            # a set-up that failed on the workers (x's values they check as they
            # load them, a device that a worker joined meanwhile lacks) leaves
            # nothing in the cluster: the next fit starts clean
            self._drop_failed_set_up()
            raise

    def _set_up(
        self,
        client: Client,
        ds: xr.Dataset,
        source: xr.Dataset | str,
        bounds: np.ndarray,
        sizes: np.ndarray,
        owner: np.ndarray,
        addrs: list[str],
        key: tuple[Any, ...],
        silent: list[str],
    ) -> None:
        """Make the run in the cluster: replicas, table, partitions placed and checked.

        ``silent`` are the workers that did not answer the cluster's probe.
        """
        # what the workers unpickle imports no torch: a worker that joins mid-run imports
        # it, and the model's modules, in a thread (ReplicaArrival), not on its event loop
        self._plugin = ReplicaArrival(
            # cloudpickle itself: distributed's pickle sends by value only a top-level
            # object of __main__ or of a module registered with register_pickle_by_value,
            # not a layer of such a module inside a Sequential
            self.run_id, cloudpickle.dumps(self.model), self._n_classes, device=self.device,
            resources=self.resources, label_smoothing=self.label_smoothing,
            precision=self.precision,
            modules=foreign_modules(type(m) for m in self.model.modules()),
        )
        # first: each replica's set-up asks the table's plugin whether its run still wants it
        RemoteTable.ensure_plugin(client)
        # (a failure here, its setup failing on a worker, leaves the plugin in the
        # scheduler, which would set it up on each worker that joins: _prepare drops it)
        silent = self._register_replicas(client, silent)
        if set(silent) & set(addrs):  # (named by the registration's warning)
            # a worker frozen (or gone) since it was planned on: a scatter or a task sent
            # to it would wait for the scheduler to drop it (worker-ttl, 5 minutes)
            addrs = [a for a in addrs if a not in silent]
            if not addrs:
                raise WorkersLostError(
                    f"none of the run's workers ({', '.join(silent)}) answered as its replicas "
                    "were set up: restart (or stop) the workers that are frozen, and fit again")
            owner = assign_owners(sizes, len(addrs))
        self._table = RemoteTable(client, self.run_id)
        self._deployment = Deployment(
            client,
            self.run_id,
            self._plugin.name,
            self._table,
            bounds,
            slots=addrs,
            owner_addr=[addrs[s] for s in owner],
            source=source,
            ds=ds,
        )
        self._deployment.left_quiet(silent)
        self._table.create(
            sizes,
            owner,
            self.strategy,
            seed=self.seed,
            batch_size=self.batch_size,
            staleness=self.staleness,
            n_bins=_config.get_int("table.histogram-bins", 1),
            info={
                "strategy": self.strategy.name,
                "params": repr(self.strategy),
                "n_workers": len(addrs),
                "n_samples": int(bounds[-1]),
            },
        )
        self._deployment.set_up(
            self._weights(version=-2),
            self.strategy,
            self.optimizer if self.local_steps > 1 else None,
            resources=self.resources,
            excluded=self._excluded,
            check_scheduler=self._check_scheduler,
        )
        self._data_key = key
        self._scheduler_address = client.scheduler.address  # for a message once it is gone
        self._scheduler_id = scheduler_id(client)
        # the data's own labels of its samples, for table_
        self._sample_coord = ds["sample"].values if "sample" in ds.coords else None
        if self._own_cluster is None:  # a cluster of the trainer's own goes with it
            # a trainer dropped without close() (a notebook's fit cell run again)
            # leaves its table and replicas in the user's cluster otherwise
            self._abandoned = weakref.finalize(
                self, drop_run, client, self._remote.run, self._plugin.name
            )
            self._abandoned.atexit = False  # at exit, _cleanup._close_at_exit closes it
        self._init_optimizer()
        if self._resume_state is not None:
            slot_of = {a: i for i, a in enumerate(self._deployment.slots)}
            self._restore(
                self._resume_state,
                np.array([slot_of[a] for a in self._deployment.owner_addr], dtype=np.int64),
            )
            self._resume_state = None
        self._next_rescan = time.monotonic() + rescan_interval()

    def _register_replicas(self, client: Client, silent: list[str]) -> list[str]:
        """Register the run's replica plugin (a :class:`ReplicaArrival`), again where
        workers die under it.

        The scheduler keeps the plugin, and sets it up on the workers that
        join (a nanny's restart among them), but its broadcast to the workers
        fails as soon as one of them dies (a flaky node, a segfault): it is
        sent again, up to ``daskpri.trainer.max-retries`` times, to the
        workers left, as a step is after losing workers. A worker its nanny
        killed for memory as it built the replica stops the fit, saying so.
        The workers that do not answer (``silent``: the probe's, not asked
        again) are left out, and returned (see :func:`.transport.register`).
        """
        retries = _config.get_int("trainer.max-retries", 0)
        restarts = memory_restarts(client)
        lost: set[str] = set()
        for attempt in range(retries + 1):  # (its set-up on a worker failing raises at once)
            before = sorted(cluster_workers(client))
            try:
                # not held up by a silent one
                # (each worker imports the model's modules in a thread first, as torch)
                return register(client, self._plugin, silent, self._plugin.modules)
            except LOST as e:
                why = restarted_for_memory(client, restarts)
                if why is not None:
                    raise WorkersLostError(why) from e
                # (the scheduler has dropped a dead worker by now: that took 2 s at most)
                gone = set(before) - set(cluster_workers(client))
                if not gone:  # none died: the error is the setup's own, as it is
                    raise
                lost |= gone
                if attempt == retries:
                    raise WorkersLostError(kept_dying(lost, attempt + 1, retries, e)) from e
                logger.warning(
                    "worker(s) %s died as the run's replicas were set up (%s: %s); setting "
                    "them up again on the workers left", ", ".join(sorted(gone)) or "?",
                    type(e).__name__, e,
                )
        return []  # (not reached: the last attempt returns or raises)

    def _drop_failed_set_up(self) -> None:
        """Release what a set-up that failed had made: table, replicas, partitions."""
        if self._table is None and getattr(self, "_plugin", None) is not None:  # no table yet
            with contextlib.suppress(Exception):
                self._unregister_replicas()
        with contextlib.suppress(Exception):
            self._release()

    def _check_batch_fits(self, sizes: np.ndarray, owner: np.ndarray, n_slots: int) -> None:
        """Refuse a batch larger than a worker's share: each trains one a step from its own."""
        batch = getattr(self.strategy, "batch_size", None) or self.batch_size
        shares = np.bincount(owner, weights=sizes, minlength=n_slots)
        least = int(shares.min())
        if least == 0:  # fewer partitions than workers
            n = int(sizes.sum())
            if n < n_slots:  # no cut of its own gives each worker a sample
                raise ValueError(
                    f"the data has {n} sample(s), fewer than the {n_slots} workers, so a "
                    "worker would hold none: give more samples, or fewer workers (n_workers=)"
                )
            if self._resume_state is not None:  # a cut that only fewer workers can change
                raise ValueError(
                    f"the checkpoint's run is cut into {len(sizes)} partition(s), as it was "
                    f"for the workers it started on, fewer than the {n_slots} workers here, "
                    f"so a worker would hold none: resume it on {len(sizes)} worker(s) at "
                    f"most (Trainer.resume(path, n_workers={len(sizes)}), or daskpri train "
                    f"--resume PATH --workers {len(sizes)})"
                )
            cut = ("its chunks" if self.partition_size is None
                   else f"partition_size={self.partition_size}")
            raise ValueError(
                f"the data ({n} samples) is cut into {len(sizes)} partition(s) by {cut}, fewer "
                f"than the {n_slots} workers, so a worker would hold none: give a "
                f"partition_size of at most {n // n_slots}, or fewer workers"
            )
        if batch > least:
            mend = (f"give a batch_size of at most {least}, or fewer workers"
                    if self._resume_state is None  # (the checkpoint's batch_size is the run's)
                    else "resume it on fewer workers (n_workers=)")
            raise ValueError(
                f"batch_size={batch} is more than a worker's share of the data ({least} "
                f"samples, of {int(sizes.sum())} on {n_slots} workers): each worker trains "
                f"a batch a step from its own share; {mend}"
            )

    def _warn_unequal_shares(self, sizes: np.ndarray, owner: np.ndarray, n_slots: int) -> None:
        """Warn where one worker's share of the data is over 1.25 times another's.

        Each worker trains a batch a step from its own share (but for a
        strategy that draws over the whole dataset), so the samples of a
        smaller share are trained more often than the rest.
        """
        if self.strategy.draws_globally or n_slots < 2:
            return
        shares = np.bincount(owner, weights=sizes).astype(np.int64)
        shares = shares[shares > 0]  # (fewer partitions than workers: the rest hold none)
        if shares.size < 2 or shares.max() <= 1.25 * shares.min():
            return
        if self._resume_state is not None:
            cause = "the checkpoint's partitions, cut for another number of workers"
        elif self.partition_size is not None:
            cause = "partition_size"
        else:
            cause = "the data's chunks along 'sample'"
        warn(
            f"the workers hold unequal shares of the data ({', '.join(map(str, shares))} "
            f"samples, cut by {cause}): each trains a batch a step from its own, so the "
            "samples of the smaller shares are trained more often; leave partition_size "
            "unset and the data unchunked, or chunk it evenly, as many chunks for every worker",
        )

    def _follow_cluster(self) -> None:
        """Follow the workers that left the cluster or joined it, if any.

        Looked for every ``daskpri.trainer.rescan-interval`` (one call to the
        scheduler), before a round. Partitions of workers the scheduler no
        longer lists (they died since the last step) move to live ones at
        once, rather than after a call to them times out. Workers that joined
        the cluster, or came back under a new address after a restart, take
        partitions, up to ``n_workers`` where that was given. The round
        selected ahead, if any, is dropped first (it was selected for the
        workers as they were).
        """
        now = time.monotonic()
        if now < self._next_rescan:
            return
        self._next_rescan = now + rescan_interval()
        assert self._deployment is not None
        limit = self.n_workers if self._own_cluster is None else None
        gone, new = self._deployment.rescan(self.resources, self._excluded, limit)
        if gone:
            self._drop_prefetched()
            before = list(self._deployment.owner_addr)
            retired, kills = how_workers_left(self.client, gone)
            self._recover()
            left = [a for a in gone if a not in retired and a not in kills]
            report_left(
                self._deployment, self.step_, before, retired, kills,
                f"worker(s) {', '.join(left)} left the cluster; their partitions moved"
                if left else None,
            )
            return
        if not new or len(self._deployment.owner_addr) <= len(self._deployment.slots):
            return  # none joined, or a partition a worker already: none to move
        self._drop_prefetched()
        try:
            joined = self._deployment.grow(new, self.resources)
        except FILE_ERRORS:
            raise
        except (KeyError, *LOST) as e:  # a worker lost meanwhile: as after a failed step
            if isinstance(e, StepTimeout):  # one silent as its partitions came: left out
                self._excluded.update(e.addresses)
            self._recover()
            return
        if joined:
            self._kept = None  # a lone worker's state stands for the run's no longer
            logger.warning(
                "step %d: %d worker(s) joined the run (%s); it goes on with %d",
                self.step_, len(joined), ", ".join(joined), len(self._deployment.slots),
            )

    def _release(self, *, workers: bool = True) -> None:
        """Drop the run's table, replicas and partitions from the cluster.

        The replicas are left on workers about to be killed (``workers=False``).
        """
        if self._abandoned is not None:
            self._abandoned.detach()
            self._abandoned = None
        try:
            if (self._client is not None and self._table is not None
                    and not scheduler_gone(self._client)):  # gone, it took the run with it
                # each on its own: a table already gone must not keep the replicas and
                # partitions (GPU memory among them) on the workers
                for what, release in (
                    ("the table", self._table.close),
                    ("the replicas", self._unregister_replicas if workers else lambda: None),
                ):
                    try:
                        release()
                    except Exception as e:  # the cluster, or that part of the run, gone
                        logger.debug("releasing %s of run %s: %r", what, self.run_id, e)
        finally:
            # released, even where an interrupt cut a call to a worker stuck in a step:
            # the next close (at exit's) would wait for it again, and the scheduler,
            # asked to drop the replicas it dropped already, log an ERROR
            self._data_key = None
            self._table = None
            if self._deployment is not None:
                self._deployment.release()  # the layout stays, for the history's n_workers

    def _unregister_replicas(self) -> None:
        """Drop the run's replicas from the workers, waiting at most the scheduler timeout.

        The scheduler answers once every worker has: a worker that never
        does (one stuck in a step, for which a second Ctrl-C stops the run
        at once, or one frozen) would hold the close, and the interrupt,
        forever (see :func:`.transport.unregister`).
        """
        assert self._client is not None
        silent = set(self._excluded)  # (stuck in a step, or frozen as partitions came)
        if self._deployment is not None:  # (left out as the replicas were set up, or grew)
            silent |= set(self._deployment.quiet) - set(self._deployment.slots)
        unregister(self._client, self._plugin.name,
                   _config.get_seconds("trainer.scheduler-timeout"), silent=silent)

    def _restore(self, state: dict[str, Any], owner: np.ndarray) -> None:
        assert self._opt is not None
        self._opt.load_state_dict(state_shaped_like_params(self._opt, state["optimizer"]))
        self._mean_grad = state["mean_grad"]
        self._remote.load_state_dict(state["table"])
        # the cluster may have another size now: partitions go where they are
        self._remote.set_owner(owner)

    @property
    def _remote(self) -> RemoteTable:
        if self._table is None:
            raise RuntimeError("the trainer has no table in the cluster yet: call fit first")
        return self._table

    def _check_scheduler(self) -> None:
        """Raise :class:`SchedulerLostError` if the scheduler does not answer.

        Waits ``daskpri.trainer.scheduler-timeout`` for an answer; the message
        names the checkpoint to resume from.
        """
        if self._client is None:
            return
        check_scheduler(self._client, self.checkpoint_path, self._scheduler_address,
                        self._scheduler_id)

    def _recover(self) -> None:
        """Re-plan after losing workers: move their partitions to live ones."""
        assert self._deployment is not None
        self._deployment.recover(
            resources=self.resources,
            excluded=self._excluded,
            check_scheduler=self._check_scheduler,
        )

