"""The trainer's run in the cluster: set up for a data set, driven step by step.

A mixin of :class:`~daskpri.training.trainer.Trainer`. Preparing a data set
creates the run's table and :class:`~daskpri.training.deployment.Deployment`
(partitions and replicas on the workers) and the master's optimizer; each
step (or round of local steps) selects samples in the table, runs the
workers' shares, retrying on the workers left after losing some, and updates
the master model from the combined results (:mod:`~daskpri.training.rounds`).

It is a mixin, not a separate object, because these methods read the
trainer's settings (``learning_rate``, ``local_steps``, ``resources``, ...)
as they are at each step, and update its counters (``step_``, the history).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
import uuid
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import xarray as xr
from distributed import Client, LocalCluster
from distributed.protocol import pickle
from torch import nn

from daskpri import _config
from daskpri._warnings import DaskpriWarning
from daskpri.data.io import fingerprint
from daskpri.replicas.optim import LocalSteps, average_states, make_optimizer, set_flat_grad
from daskpri.replicas.replica import Weights, flat_params, load_flat
from daskpri.replicas.worker import ReplicaPlugin, ReplicaStateLost, StepResult
from daskpri.strategies import Strategy
from daskpri.table.plugin import Ahead, RemoteTable, Round
from daskpri.training._checks import check_model, check_strategy_model
from daskpri.training.deployment import Deployment
from daskpri.training.history import HistoryRecorder
from daskpri.training.placement import (
    all_have_gpus,
    assign_owners,
    cluster_workers,
    eligible_workers,
    partition_bounds,
)
from daskpri.training.recovery import (
    FILE_ERRORS,
    LOST,
    check_scheduler,
    dask_timeout,
    rescan_interval,
)
from daskpri.training.rounds import combine, crossed, fresh_priorities, nonfinite, step_record
from daskpri.training.schedule import scheduled_rate
from daskpri.training.transport import StepTimeout

logger = logging.getLogger(__name__)


class RunMixin:
    """The run in the cluster and its steps, for :class:`~daskpri.training.trainer.Trainer`."""

    # The trainer's settings and state, which Trainer.__init__ sets.
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
    optimizer: str
    lr_schedule: str
    schedule_steps: int | None
    local_steps: int
    partition_size: int | None
    staleness: str
    device: str | None
    checkpoint_path: str | None
    checkpoint_every: int | None
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

        def save(self, path: str | os.PathLike[str]) -> str: ...

    # -- the run in the cluster ---------------------------------------------------------

    def _prepare(self, ds: xr.Dataset, info: dict[str, Any], source: xr.Dataset | str) -> None:
        client = self.client
        workers = cluster_workers(client)
        if self.resources is None and all_have_gpus(workers):
            self.resources = {"GPU": 1.0}
        addrs = eligible_workers(workers, self.resources, client.scheduler.address)
        if self.n_workers is not None and self._own_cluster is None:
            if len(addrs) < self.n_workers:
                raise ValueError(
                    f"n_workers={self.n_workers} but the cluster has {len(addrs)} suitable workers"
                )
            addrs = addrs[: self.n_workers]
        if self._resume_state is not None:
            # the run's own cut, whatever the number of workers now: its table and
            # selections go on only over the partitions they were made for
            bounds = np.asarray(self._resume_state["table"]["table"]["offsets"], dtype=np.int64)
            if int(bounds[-1]) != ds.sizes["sample"]:
                raise ValueError(
                    f"the checkpoint's run trained on {int(bounds[-1])} samples, but the data "
                    f"has {ds.sizes['sample']}: resume it with its own data"
                )
        else:
            bounds = partition_bounds(ds, self.partition_size, len(addrs))
        # the data (by content: a copy of the same data goes on with the run, data
        # changed in place does not) and its cut as one worker would have it: a
        # cluster that grew or shrank between fits keeps the run (its partitions
        # move, see _follow_cluster)
        key = (
            fingerprint(source),
            tuple(partition_bounds(ds, self.partition_size, 1).tolist()),
        )
        if key == self._data_key:
            # workers may have left or joined since the last fit: look before its first round
            self._next_rescan = 0.0
            return
        if self._data_key is not None:
            self._release()  # new data: a new table, partitions and replicas
        check_strategy_model(self.strategy, self.model)
        self._n_classes = check_model(self.model, ds, info)
        sizes = np.diff(bounds)
        owner = assign_owners(sizes, len(addrs))
        self._warn_unequal_shares(sizes, owner, len(addrs))
        self._plugin = ReplicaPlugin(
            self.run_id, pickle.dumps(self.model), self._n_classes, device=self.device
        )
        client.register_plugin(self._plugin)
        RemoteTable.ensure_plugin(client)
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
        # the data's own labels of its samples, for table_
        self._sample_coord = ds["sample"].values if "sample" in ds.coords else None
        if self._own_cluster is None:  # a cluster of the trainer's own goes with it
            # a trainer dropped without close() (a notebook's fit cell run again)
            # leaves its table and replicas in the user's cluster otherwise
            self._abandoned = weakref.finalize(
                self, _drop_run, client, self._remote.run, self._plugin.name
            )
            self._abandoned.atexit = False  # at exit, _close_at_exit closes it
        self._init_optimizer()
        if self._resume_state is not None:
            slot_of = {a: i for i, a in enumerate(self._deployment.slots)}
            self._restore(
                self._resume_state,
                np.array([slot_of[a] for a in self._deployment.owner_addr], dtype=np.int64),
            )
            self._resume_state = None
        self._next_rescan = time.monotonic() + rescan_interval()

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
        warnings.warn(
            f"the workers hold unequal shares of the data ({', '.join(map(str, shares))} "
            f"samples, cut by {cause}): each trains a batch a step from its own, so the "
            "samples of the smaller shares are trained more often; leave partition_size "
            "unset and the data unchunked, or chunk it evenly, as many chunks for every worker",
            DaskpriWarning,
            stacklevel=6,
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
            self._recover()
            logger.warning(
                "step %d: worker(s) %s left the cluster; their partitions moved, the run goes "
                "on with %d", self.step_, ", ".join(gone), len(self._deployment.slots),
            )
            return
        if not new or len(self._deployment.owner_addr) <= len(self._deployment.slots):
            return  # none joined, or a partition a worker already: none to move
        self._drop_prefetched()
        try:
            joined = self._deployment.grow(new, self.resources)
        except FILE_ERRORS:
            raise
        except (KeyError, *LOST):  # a worker lost meanwhile: as after a failed step
            self._recover()
            return
        if joined:
            self._kept = None  # a lone worker's state stands for the run's no longer
            logger.warning(
                "step %d: %d worker(s) joined the run (%s); it goes on with %d",
                self.step_, len(joined), ", ".join(joined), len(self._deployment.slots),
            )

    def _release(self) -> None:
        """Drop the run's table, replicas and partitions from the cluster."""
        if self._abandoned is not None:
            self._abandoned.detach()
            self._abandoned = None
        if self._client is not None and self._table is not None:
            # each on its own: a table already gone must not keep the replicas and
            # partitions (GPU memory among them) on the workers
            for what, release in (
                ("the table", self._table.close),
                ("the replicas",
                 functools.partial(self._client.unregister_worker_plugin, self._plugin.name)),
            ):
                try:
                    release()
                except Exception as e:  # the cluster, or that part of the run, gone already
                    logger.debug("releasing %s of run %s: %r", what, self.run_id, e)
        self._data_key = None
        self._table = None
        if self._deployment is not None:
            self._deployment.release()  # the layout stays, for the history's n_workers

    def _restore(self, state: dict[str, Any], owner: np.ndarray) -> None:
        assert self._opt is not None
        self._opt.load_state_dict(_state_shaped_like_params(self._opt, state["optimizer"]))
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
        check_scheduler(self._client, self.checkpoint_path, self._scheduler_address)

    # -- one step -----------------------------------------------------------------------

    def _step(self, limit: int | None = None) -> dict[str, Any]:
        """One step, or one round of ``local_steps`` steps (at most ``limit``)."""
        step = self.step_
        count = self.local_steps if limit is None else max(1, min(self.local_steps, limit))
        t_start = time.perf_counter()
        self._follow_cluster()  # charged to the round: its partitions move
        retries = _config.get_int("trainer.max-retries", 0)
        for attempt in range(retries + 1):
            t0 = time.perf_counter()
            ahead = self._take_prefetched(step, count)
            selected_ahead = ahead is not None
            if ahead is not None:
                rounds = ahead
            else:
                rounds = self._remote.step(
                    step, self._pending, metrics=self._new_metrics(), count=count
                )
                self._pending = []
            t_select = time.perf_counter() - t0
            following = None if limit is None else limit - count
            try:
                results = self._run_tasks(
                    step, rounds, then=functools.partial(self._prefetch, step + count, following)
                )
                break
            except FILE_ERRORS:
                raise  # a worker that cannot read the data is not lost
            except (*LOST, StepTimeout) as e:
                self._drop_prefetched()  # selected for the workers lost
                if attempt == retries:
                    raise RuntimeError(
                        f"step {step} failed {attempt + 1} times after losing workers: {e}"
                    ) from e
                if isinstance(e, StepTimeout):
                    # alive but stuck: train on without it rather than wait
                    warnings.warn(
                        f"step {step}: {e}; training goes on without them",
                        DaskpriWarning,
                        stacklevel=5,
                    )
                    self._excluded.update(e.addresses)
                self._recover()
                if not isinstance(e, StepTimeout):
                    assert self._deployment is not None
                    logger.warning(
                        "step %d: a worker was lost (%s: %s); its partitions moved, the run "
                        "goes on with %d", step, type(e).__name__, e, len(self._deployment.slots),
                    )
        t1 = time.perf_counter()
        total = combine(results, self.local_steps)
        problem = nonfinite(total, step, count, self.local_steps)
        if problem is not None and self.on_nonfinite == "raise":
            raise FloatingPointError(problem + "; " + self._save_last_good())
        skipped = problem is not None
        rate = self._rate() if total.n_grad and not skipped else 0.0
        if total.n_grad and not skipped:
            if self.local_steps > 1:
                self._apply_round(total.update, [r.optimizer_state for r in results])
            else:
                self._apply_gradient(total.update / total.n_grad, rate)
        if total.buffers is not None and not skipped:
            self._apply_buffers(total.buffers)
        if total.n_grad and not skipped and len(results) == 1 and results[0].kept:
            self._kept = (results[0].worker, results[0].kept)
        t_opt = time.perf_counter() - t1
        self.step_ += count
        self.skipped_steps_ += count if skipped else 0
        self._pending.extend(fresh_priorities(results, step + count - 1))
        step_time = time.perf_counter() - t_start
        self._elapsed += step_time
        return step_record(
            total,
            rounds.digest(),
            step=self.step_ - 1,
            skipped=skipped,
            elapsed=self._elapsed,
            rate=rate,
            prev=self._recorder.records[-1] if self._recorder.records else {},
            step_time=step_time,
            selection_time=t_select,
            optimizer_time=t_opt,
            selected_ahead=selected_ahead,
        )

    def _run_tasks(
        self,
        step: int,
        rounds: Round,
        then: Callable[[], None] | None = None,
    ) -> list[StepResult]:
        """Each worker's share of a step (or round), as tasks or as direct RPCs.

        ``then`` is called once the work is on its way to the workers.
        """
        assert self._deployment is not None
        slots = self._deployment.slots
        # One worker: its state after a round is the master's (the mean of
        # one), so it keeps it and the next round resumes from it.
        keep = self.local_steps > 1 and len(slots) == 1 and self._keep_state
        resume = self._kept[1] if keep and self._kept and self._kept[0] == slots[0] else None
        self._kept = None  # until this round's results are applied
        if resume is None:
            weights = self._weights(version=step)
        else:
            weights = Weights(-1, torch.empty(0), mean_grad=self._weights_mean_grad())
        local = None
        if self.local_steps > 1:
            assert self._opt is not None
            local = LocalSteps(
                optimizer=self.optimizer,
                options=self._optimizer_options(),
                state={} if resume else self._opt.state_dict(),
                rates=[
                    scheduled_rate(self.learning_rate, self.lr_schedule, s, self.schedule_steps)
                    for s in range(step, step + len(rounds))
                ],
                keep=uuid.uuid4().hex[:12] if keep else None,
                resume=resume,
                max_grad_norm=self.max_grad_norm,
                # what a worker backpropagates a step in expectation: its share of the draws
                rows_per_step=(
                    self.strategy.gradients_per_step(
                        self.batch_size, int(self._deployment.bounds[-1]) // len(slots)
                    )
                    if self.strategy.draws_globally else None
                ),
            )
        try:
            return self._deployment.run(
                weights,
                rounds,
                step=step,
                strategy=self.strategy,
                seed=self.seed,
                local=local,
                transport=self.transport,
                resources=self.resources,
                then=then,
            )
        except ReplicaStateLost:
            # restarted, say: the round goes again in full (selected ahead already, if it was)
            return self._run_tasks(step, rounds, then=None)

    def _prefetch(self, step: int, limit: int | None) -> None:
        """Select the round from ``step`` on while the workers compute the current one.

        Only for strategies whose selection does not read the table, which
        then has not received the current round's priorities yet (they go
        with the next request), or that check what they read
        (``selects_ahead``: the table declines a round that would read a
        priority in flight, and the round is selected after this one), and
        only for a round that will run: not past
        ``limit``, nor after a checkpoint (the table must be saved as it is).
        Called once the current round is on its way to the workers (with the
        direct transport, on the client's event loop while the driver waits):
        in a LocalCluster the scheduler shares the driver's process, and a
        selection made earlier would hold up sending the round.
        """
        count = self.local_steps if limit is None else min(self.local_steps, limit)
        if (
            count < 1
            or (self.strategy.reads_table and not self.strategy.selects_ahead)
            or not self._prefetch_rounds
            or self._stop_requested
            or (self.checkpoint_every and crossed(self.step_, step, self.checkpoint_every))
        ):
            return
        ahead = self._remote.step_ahead(step, self._pending, self._new_metrics(), count)
        self._prefetched = (step, count, ahead)
        self._pending = []

    def _take_prefetched(self, step: int, count: int) -> Round | None:
        """The round selected ahead, if it is the round from ``step`` of ``count`` steps."""
        if self._prefetched is None:
            return None
        if self._prefetched[:2] != (step, count):
            self._drop_prefetched()
            return None
        ahead = self._prefetched[2]
        self._prefetched = None
        return ahead.result(timeout=dask_timeout())

    def _drop_prefetched(self) -> None:
        """Take back a round selected ahead and not run: the table selects as if it never was."""
        if self._prefetched is None:
            return
        ahead = self._prefetched[2]
        self._prefetched = None
        try:
            ahead.result(timeout=dask_timeout())
        except Exception:  # it never reached the table, or the scheduler is gone
            return
        self._remote.unselect()

    def _recover(self) -> None:
        """Re-plan after losing workers: move their partitions to live ones."""
        assert self._deployment is not None
        self._deployment.recover(
            resources=self.resources,
            excluded=self._excluded,
            check_scheduler=self._check_scheduler,
        )

    def _save_last_good(self) -> str:
        """Checkpoint the model before the failed step, where a path is set."""
        if self.checkpoint_path is None:
            return "the model was not updated with it (no checkpoint_path= to save it to)"
        self.save(self.checkpoint_path)
        return (
            f"the model was not updated with it; its last good state (step {self.step_}) "
            f"is checkpointed to {self.checkpoint_path!r}"
        )

    def _flush(self) -> None:
        """Send the table the priorities and history records it has not had yet."""
        metrics = self._new_metrics()
        if self._pending or metrics:
            self._remote.update(self._pending, metrics=metrics)
            self._pending = []

    def _new_metrics(self) -> list[dict[str, Any]]:
        """The history records not sent to the table yet (for the dashboard in the cluster)."""
        records = self._recorder.records
        new = records[self._metrics_sent :]
        self._metrics_sent = len(records)
        return new

    # -- the master model ---------------------------------------------------------------

    def _rate(self) -> float:
        """This step's learning rate under the schedule."""
        return scheduled_rate(self.learning_rate, self.lr_schedule, self.step_, self.schedule_steps)

    def _optimizer_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"lr": self.learning_rate, "weight_decay": self.weight_decay}
        if self.optimizer == "sgd":
            options["momentum"] = self.momentum
        return options

    def _apply_gradient(self, grad: torch.Tensor, rate: float) -> None:
        params = list(self.model.parameters())
        set_flat_grad(params, grad)
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        assert self._opt is not None
        for group in self._opt.param_groups:
            group["lr"] = rate
        self._opt.step()
        if self.strategy.uses_mean_grad:
            decay = float(self.strategy.mean_grad_decay)
            if self._mean_grad is None:
                self._mean_grad = grad.clone()
            else:
                self._mean_grad.mul_(decay).add_(grad, alpha=1.0 - decay)

    def _apply_round(self, params: torch.Tensor, states: list[dict[str, Any] | None]) -> None:
        """Take the workers' mean parameters and mean optimizer state after a round."""
        assert self._opt is not None
        load_flat(self.model.parameters(), params)
        self._opt.load_state_dict(average_states([s for s in states if s is not None]))

    def _apply_buffers(self, buffers: dict[str, torch.Tensor]) -> None:
        """Take the workers' buffers after a step (batch norm's running statistics)."""
        named = dict(self.model.named_buffers())
        with torch.no_grad():
            for name, value in buffers.items():
                named[name].copy_(value)

    def _weights(self, version: int) -> Weights:
        """The master's current weights as CPU tensors, for the replicas."""
        return Weights(
            version=version,
            params=flat_params(self.model.parameters()),
            buffers={k: v.detach().clone() for k, v in self.model.named_buffers()},
            mean_grad=self._weights_mean_grad(),
        )

    def _weights_mean_grad(self) -> torch.Tensor | None:
        return self._mean_grad if self.strategy.uses_mean_grad else None

    def _init_optimizer(self) -> None:
        self._opt = make_optimizer(
            self.optimizer, list(self.model.parameters()), self._optimizer_options()
        )
        self._mean_grad = None


def _state_shaped_like_params(opt: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (an optimizer's state dict) with each buffer shaped as its parameter.

    A buffer of the parameter's size in another shape (a 1-D `CNN`'s
    momentum, ``(out, in, k)``, saved before its convolutions ran as 2-D
    ones, ``(out, in, 1, k)``) takes the parameter's shape, its values in
    the same order; ``load_state_dict`` would keep the saved shape, and the
    first step would fail.
    """
    params = [p for group in opt.param_groups for p in group["params"]]
    ids = [i for group in state["param_groups"] for i in group["params"]]
    if len(ids) != len(params):
        return state  # load_state_dict says what is wrong
    shape = {i: p.shape for i, p in zip(ids, params, strict=True)}

    def shaped(i: Any, value: Any) -> Any:
        if (
            isinstance(value, torch.Tensor)
            and i in shape
            and value.dim() > 0
            and value.shape != shape[i]
            and value.numel() == math.prod(shape[i])
        ):
            return value.reshape(shape[i])
        return value

    return {
        **state,
        "state": {i: {k: shaped(i, v) for k, v in s.items()} for i, s in state["state"].items()},
    }


def _drop_run(client: Client, run: str, plugin: str) -> None:
    """Close a garbage-collected trainer's run in the cluster, without waiting.

    Called by the collector, on whatever thread it runs: the calls are
    handed to the client's event loop, and their failures (the cluster
    gone) are only logged at debug level.
    """
    if client.status != "running" or client.loop is None:
        return

    async def drop() -> None:
        for call in (client.scheduler.daskpri_close(run=run),
                     client.scheduler.unregister_worker_plugin(name=plugin)):
            try:
                await call
            except Exception as e:
                logger.debug("dropping run %s of a trainer never closed: %r", run, e)

    client.loop.add_callback(drop)
