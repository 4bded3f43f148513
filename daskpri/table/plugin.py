"""The priority table held in the cluster: a scheduler plugin and its client.

The table lives inside the scheduler process (not in an Actor, which dies
with its worker), so it survives the loss of any worker. The plugin adds RPC
handlers named ``daskpri_*``; the driver talks to them through
:class:`RemoteTable`, one round trip per training step: the previous step's
priority updates go in, the next step's selection comes out.

Start a ``dask scheduler`` with the plugin already installed with
``dask scheduler --preload daskpri.table.plugin``; otherwise the trainer
registers it.

A run's state on the scheduler (:class:`~daskpri.table.run.TableRun`) and the
packed form of selections and updates (:mod:`daskpri.table._packing`) have
modules of their own, as do the round the driver gets back
(:mod:`daskpri.table._round`).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from distributed import Client, Scheduler, SchedulerPlugin
from distributed.core import Status
from distributed.protocol import pickle
from distributed.scheduler import WorkerState
from distributed.utils import sync

from daskpri import _config
from daskpri._wire import pack, pack_tree, unpack, unpack_tree
from daskpri.dashboard.measures import start_sample
from daskpri.strategies.base import NotAhead, Strategy
from daskpri.table._packing import _mask, _pack_arrays, _pack_updates
from daskpri.table._round import Ahead, Round
from daskpri.table.run import TableRun
from daskpri.table.table import PriorityTable

PLUGIN_NAME = "daskpri"

logger = logging.getLogger(__name__)


class TablePlugin(SchedulerPlugin):
    """Holds the priority tables of the runs on this cluster.

    It also keeps the workers of a fit that runs from an adaptive cluster's
    scale-down (:meth:`valid_workers_downscaling`): their steps are RPCs from
    the driver (``transport="direct"``) or brief tasks, so the scheduler would
    find them idle and ``cluster.adapt()`` would retire them mid-fit. For the
    same reason such a fit's steps count as the scheduler's activity
    (:meth:`_step`), against its idle timeout.

    Examples
    --------
    A scheduler started with ``dask scheduler --preload daskpri.table.plugin``
    has it from the start; a client can add it:

    >>> client.register_plugin(TablePlugin())  # doctest: +SKIP
    """

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.runs: dict[str, TableRun] = {}
        self.scheduler: Scheduler | None = None
        #: the client that made each run not closed yet (its driver's), by run
        self.drivers: dict[str, str] = {}
        #: the workers of each run whose fit is running (see :meth:`_hold`), by run
        self.held: dict[str, set[str]] = {}

    async def start(self, scheduler: Scheduler) -> None:
        _keep_closed()  # a bad value fails the plugin's registration, not a run's close
        _orphan_timeout()
        self.scheduler = scheduler
        for op in (
            "create",
            "step",
            "unselect",
            "update",
            "set_owner",
            "hold",
            "state",
            "load",
            "summary",
            "priorities",
            "metrics",
            "runs",
            "close",
            "replicas_wanted",
        ):
            scheduler.handlers[f"daskpri_{op}"] = getattr(self, f"_{op}")
        try:  # the /daskpri dashboard page must never break training
            from daskpri.dashboard.page import install  # local import: bokeh only when serving

            install(scheduler)
        except Exception as e:
            logger.warning("daskpri: no /daskpri dashboard page: %s: %s", type(e).__name__, e)

    async def close(self) -> None:
        self.runs.clear()
        self.drivers.clear()
        self.held.clear()

    def valid_workers_downscaling(
        self, scheduler: Scheduler, workers: list[WorkerState]
    ) -> list[WorkerState]:
        """Those of ``workers`` that no run's fit holds: the others are not to be retired.

        Dask's hook for a plugin whose work the scheduler does not see (its
        P2P shuffle's keeps a shuffle's workers so). ``Scheduler.workers_to_close``
        asks it, and so ``Scheduler.adaptive_target`` and ``Adaptive``: a
        cluster that adapts keeps the workers of a fit while it runs, and may
        retire them once it ends, as it would idle workers.
        """
        held = set().union(*self.held.values())
        return [ws for ws in workers if ws.address not in held]

    def remove_client(self, scheduler: Scheduler, client: str) -> None:
        """A client left: close its runs unless it is back within ``daskpri.table.orphan-timeout``.

        A driver whose client is closed before ``Trainer.close()`` (by the
        user, or because the driver's process died) cannot drop its run any
        more: its replicas (a model and the partitions on every worker,
        GPU memory included) and its table would stay on the cluster for
        good. A client whose connection broke reconnects under the same id
        (within ``distributed.comm.timeouts.connect``), so the runs wait
        that long before they go.
        """
        runs = [run for run, owner in self.drivers.items() if owner == client]
        if not runs:
            return
        delay = _orphan_timeout()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called off the scheduler's event loop: nothing to wait on
            return
        loop.call_later(
            delay, lambda: asyncio.ensure_future(self._drop_orphans(runs, client, delay))
        )

    async def _drop_orphans(self, runs: list[str], client: str, delay: float) -> None:
        scheduler = self.scheduler
        if scheduler is None or client in scheduler.clients:  # it came back
            return
        for run in runs:
            if self.drivers.get(run) != client:  # closed meanwhile, or made again by another
                continue
            logger.warning(
                "daskpri: the client of run %s left %g s ago without closing it "
                "(daskpri.table.orphan-timeout); its table is closed and its replicas dropped",
                run, delay,
            )
            self._close(run)
            name = replicas_name(run)
            if name in scheduler.worker_plugins:
                try:
                    await scheduler.unregister_worker_plugin(None, name)
                except Exception as e:  # a worker that did not answer: it goes with its run
                    logger.debug("dropping the replicas of run %s: %r", run, e)

    def _run(self, run: str, *, live: bool = False) -> TableRun:
        """The run named ``run``; with ``live``, only one not closed (for writes)."""
        try:
            tr = self.runs[run]
        except KeyError:
            raise KeyError(
                f"no daskpri run {run!r} on this scheduler; runs: {sorted(self.runs)}"
            ) from None
        if live and tr.closed:
            raise KeyError(
                f"daskpri run {run!r} is closed: the scheduler keeps its table and metrics "
                f"for the dashboard only (daskpri.table.keep-closed); fit again to start a "
                f"new table"
            )
        return tr

    # -- handlers (called with the message's keyword arguments) ----------------

    def _create(
        self,
        run: str,
        sizes: dict,
        owner: dict,
        strategy: bytes,
        seed: int,
        batch_size: int,
        staleness: str,
        n_bins: int,
        info: dict,
        client: str | None = None,
    ) -> None:
        table = PriorityTable(unpack(sizes), staleness=staleness, n_bins=n_bins)
        strat = pickle.loads(strategy)
        if not isinstance(strat, Strategy):
            raise TypeError(f"strategy should be a daskpri Strategy, but got {type(strat)}")
        tr = TableRun(
            table=table,
            strategy=strat,
            rng=np.random.default_rng(seed),
            owner=np.zeros(0, dtype=np.int64),
            batch_size=batch_size,
            info=info,
        )
        tr.set_owner(unpack(owner))
        self.runs.pop(run, None)  # a run made again (new data) is the newest
        self.runs[run] = tr
        if client is not None:
            self.drivers[run] = client

    def _apply(self, tr: TableRun, updates: list | None, metrics: list | dict | None) -> None:
        for u in updates or ():
            tr.table.update(unpack(u["indices"]), unpack(u["priorities"]), int(u["step"]))
        if tr.start is None and updates:  # kept here: a page opened later shows the same start
            tr.start = start_sample(tr.table.priority, max(int(u["step"]) for u in updates))
        # history records, one or a list (each record once, by its step)
        for record in [metrics] if isinstance(metrics, dict) else metrics or ():
            if not tr.metrics or tr.metrics[-1].get("step") != record.get("step"):
                tr.metrics.append(record)

    def _step(
        self,
        run: str,
        step: int,
        updates: list | None = None,
        metrics: list | dict | None = None,
        count: int = 1,
        undo: bool = False,
    ) -> list[dict] | None:
        """Apply ``updates``; the selections of steps ``step .. step + count - 1``.

        One packed round per worker slot (see :func:`_pack_round`). With
        ``undo`` (a round selected ahead, while the last round selected is
        computed) the selection state before it is kept, for
        :meth:`_unselect`; a strategy that reads the table is given the last
        round's samples as in flight, and where it would read one of their
        priorities (:class:`~daskpri.strategies.base.NotAhead`), the
        selection is taken back at once and the answer is ``None``.

        A step of a run whose fit holds its workers is activity: the
        scheduler's idle time (``idle_since``) starts again from it.
        """
        tr = self._run(run, live=True)
        if run in self.held and self.scheduler is not None:
            # work the scheduler does not see: without it, an idle-timeout (Dask's
            # distributed.scheduler.idle-timeout, a dask-gateway or Coiled cluster's
            # idle shutdown, which read idle_since) would close it under a running fit
            self.scheduler.idle_since = None
        self._apply(tr, updates, metrics)
        tr.undo = None
        if undo:
            tr.undo = (copy.deepcopy(dict(tr.rng.bit_generator.state)), copy.deepcopy(tr.state),
                       tr.last_step, tr.inflight)
        checked = undo and tr.strategy.reads_table
        t0 = time.perf_counter()
        try:
            if checked and (tr.inflight is None or not tr.strategy.selects_ahead):
                raise NotAhead("the round in flight is not known, or not checked")
            arrays = tr.select_round_arrays(step, count, tr.inflight if checked else None)
        except NotAhead:
            self._unselect(run)
            tr.ahead_declined += 1
            return None
        tr.selection_seconds = time.perf_counter() - t0
        tr.last_step = step + count - 1
        tr.ahead_taken += checked
        if tr.strategy.reads_table and tr.strategy.selects_ahead:  # only these check it
            tr.inflight = _mask(tr.table.n_samples, arrays)
        return [_pack_arrays(a) for a in arrays]

    def _unselect(self, run: str) -> None:
        """Take back the last selection made with ``undo`` (a round selected ahead, unused)."""
        tr = self._run(run, live=True)
        if tr.undo is not None:
            tr.rng.bit_generator.state, tr.state, tr.last_step, tr.inflight = tr.undo
            tr.undo = None

    def _update(self, run: str, updates: list, metrics: list | dict | None = None) -> None:
        self._apply(self._run(run, live=True), updates, metrics)

    def _set_owner(self, run: str, owner: dict, workers: list[str] | None = None) -> None:
        """The owner slot of each partition; ``workers``: the slots' addresses, now held
        instead if the run's fit holds its workers."""
        self._run(run, live=True).set_owner(unpack(owner))
        if workers is not None and run in self.held:
            self.held[run] = set(workers)

    def _hold(self, run: str, workers: list[str]) -> None:
        """Keep ``workers`` (those of run ``run``'s fit) from a scale-down; none: let go.

        Held until the driver lets go, or the run closes (its client gone
        included: see :meth:`remove_client`).
        """
        self._run(run, live=True)
        if workers:
            self.held[run] = set(workers)
        else:
            self.held.pop(run, None)

    def _state(self, run: str) -> dict:
        return pack_tree(self._run(run).state_dict())

    def _load(self, run: str, state: dict) -> None:
        tr = self._run(run, live=True)
        tr.load_state_dict(unpack_tree(state))
        tr.undo = None

    def _summary(self, run: str, step: int | None = None) -> dict:
        tr = self._run(run)
        s: dict[str, Any] = dict(
            tr.table.summaries(tr.last_step if step is None else step),
            owner=tr.owner,
            n_updates=tr.table.n_updates,
            last_step=tr.last_step,
            info=tr.info,
            selection_seconds=tr.selection_seconds,
            closed=tr.closed,
            start=tr.start,
        )
        return pack_tree(s)

    def _priorities(self, run: str) -> dict:
        tr = self._run(run)
        return pack_tree({"priority": tr.table.priority, "version": tr.table.version})

    def _metrics(self, run: str, start: int = 0) -> list:
        return list(self._run(run).metrics)[start:]

    def _runs(self) -> list[str]:
        """The runs' names, closed ones kept included, oldest first (the dashboard
        follows the newest)."""
        return list(self.runs)

    def _replicas_wanted(self, name: str) -> bool:
        """Whether the scheduler still holds the replica plugin ``name`` for its workers.

        A worker that was frozen as a run was set up and closed may get the
        plugin's ``plugin-add`` after its ``plugin-remove`` (two connections,
        read in either order once it thaws): it asks here after the set-up,
        and drops a replica whose run has dropped its plugin.
        """
        assert self.scheduler is not None
        return name in self.scheduler.worker_plugins

    def _close(self, run: str) -> None:
        """Close a run: it stays, read-only, among the last ``daskpri.table.keep-closed``.

        The dashboard can then still show it, and compare a later run with it
        as its uniform baseline (a run is usually closed before the next starts).
        """
        keep = _keep_closed()  # checked before the run changes
        self.drivers.pop(run, None)
        self.held.pop(run, None)
        tr = self.runs.get(run)
        if tr is None:
            return
        tr.closed, tr.undo, tr.inflight = True, None, None
        closed = [name for name, r in self.runs.items() if r.closed]
        for name in closed[: max(len(closed) - keep, 0)]:  # the oldest closed go first
            del self.runs[name]


def _keep_closed() -> int:
    """``daskpri.table.keep-closed``, checked: how many closed runs the scheduler keeps."""
    value = _config.get("table.keep-closed")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"daskpri.table.keep-closed should be a non-negative integer (0: drop a run's "
            f"table when it closes), but got {value!r}"
        )
    return value


def _orphan_timeout() -> float:
    """``daskpri.table.orphan-timeout``: how long a run outlives its driver's client, in s."""
    return _config.get_seconds("table.orphan-timeout")


def replicas_name(run: str) -> str:
    """The name of run ``run``'s replica plugin on the workers.

    >>> replicas_name("uniform-1a2b3c4d")
    'daskpri-uniform-1a2b3c4d'
    """
    return f"daskpri-{run}"


def dask_setup(scheduler: Scheduler) -> None:
    """Entry point of ``dask scheduler --preload daskpri.table.plugin``."""
    scheduler.add_plugin(TablePlugin())


class RemoteTable:
    """The driver's handle on a run's table inside the scheduler.

    Holds only the run's name: the table's arrays stay in the cluster, so the
    driver's memory does not grow with the number of samples.
    """

    def __init__(self, client: Client, run: str) -> None:
        self.client = client
        self.run = run

    @staticmethod
    def ensure_plugin(client: Client) -> None:
        """Register :class:`TablePlugin` on the scheduler unless it is there."""

        def has_plugin(dask_scheduler: Scheduler) -> bool:
            return PLUGIN_NAME in dask_scheduler.plugins

        if not client.run_on_scheduler(has_plugin):
            client.register_plugin(TablePlugin())

    def _call(self, op: str, _timeout: float | None = None, **kwargs: Any) -> Any:
        scheduler = _in_process(self.client)
        if scheduler is not None:
            return sync(scheduler.loop, _handle, scheduler.handlers[f"daskpri_{op}"], kwargs,
                        callback_timeout=_timeout)
        return self.client.sync(getattr(self.client.scheduler, f"daskpri_{op}"), **kwargs,
                                callback_timeout=_timeout)

    def create(
        self,
        sizes: np.ndarray,
        owner: np.ndarray,
        strategy: Strategy,
        *,
        seed: int,
        batch_size: int,
        staleness: str,
        n_bins: int,
        info: dict[str, Any],
    ) -> None:
        self._call(
            "create",
            run=self.run,
            sizes=pack(np.asarray(sizes, dtype=np.int64)),
            owner=pack(np.asarray(owner, dtype=np.int64)),
            strategy=pickle.dumps(strategy),
            seed=seed,
            batch_size=batch_size,
            staleness=staleness,
            n_bins=n_bins,
            info=info,
            # the scheduler closes the run if this client leaves for good
            client=self.client.id,
        )

    def step(
        self,
        step: int,
        updates: list[tuple[np.ndarray, np.ndarray, int]],
        metrics: list[dict[str, Any]] | dict[str, Any] | None = None,
        count: int = 1,
    ) -> Round:
        """Apply ``updates``; the selections of ``count`` steps from ``step`` on.

        One list per step, of one :class:`Selection` per worker slot (a
        :class:`Round`, which also keeps them packed).
        """
        message = self._step_message(step, updates, metrics, count)
        packed = self._call("step", **message)
        if packed is None:
            # what a Dask scheduler answers to an operation it has no handler for
            raise RuntimeError(
                f"the scheduler at {self.client.scheduler.address} has no daskpri table for "
                f"run {self.run!r} (no daskpri_step handler: it was started again without "
                "--preload daskpri.table.plugin, or the plugin was removed)"
            )
        return Round(packed)

    def step_ahead(
        self,
        step: int,
        updates: list[tuple[np.ndarray, np.ndarray, int]],
        metrics: list[dict[str, Any]] | dict[str, Any] | None = None,
        count: int = 1,
    ) -> Ahead:
        """:meth:`step`, sent now and answered in the background.

        The table keeps its selection state from before, so that
        :meth:`unselect` can take the selection back if it goes unused.
        """
        message = self._step_message(step, updates, metrics, count)
        scheduler = _in_process(self.client)
        if scheduler is not None:
            call = _handle(scheduler.handlers["daskpri_step"], {**message, "undo": True})
            loop = scheduler.loop
        else:
            call = self.client.scheduler.daskpri_step(**message, undo=True)
            loop = self.client.loop
        assert loop is not None
        return Ahead(asyncio.run_coroutine_threadsafe(call, loop.asyncio_loop))

    def _step_message(
        self,
        step: int,
        updates: list[tuple[np.ndarray, np.ndarray, int]],
        metrics: list[dict[str, Any]] | dict[str, Any] | None,
        count: int,
    ) -> dict[str, Any]:
        return {
            "run": self.run,
            "step": step,
            "updates": _pack_updates(updates),
            "metrics": metrics,
            "count": count,
        }

    def unselect(self) -> None:
        """Take back the selection of the last :meth:`step_ahead`."""
        self._call("unselect", run=self.run)

    def update(
        self,
        updates: list[tuple[np.ndarray, np.ndarray, int]],
        metrics: list[dict[str, Any]] | dict[str, Any] | None = None,
    ) -> None:
        self._call("update", run=self.run, updates=_pack_updates(updates), metrics=metrics)

    def set_owner(self, owner: np.ndarray, workers: list[str] | None = None) -> None:
        """The owner slot of each partition, and the slots' addresses where given."""
        self._call("set_owner", run=self.run, owner=pack(np.asarray(owner, dtype=np.int64)),
                   workers=workers)

    def hold(self, workers: list[str], timeout: float | None = None) -> None:
        """Keep ``workers`` from an adaptive cluster's scale-down while a fit runs; ``[]``:
        let them go. Waits at most ``timeout`` seconds for the scheduler."""
        self._call("hold", run=self.run, workers=list(workers), _timeout=timeout)

    def state_dict(self) -> dict[str, Any]:
        return unpack_tree(self._call("state", run=self.run))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._call("load", run=self.run, state=pack_tree(state))

    def summary(self, step: int | None = None) -> dict[str, Any]:
        return unpack_tree(self._call("summary", run=self.run, step=step))

    def priorities(self) -> dict[str, np.ndarray]:
        return unpack_tree(self._call("priorities", run=self.run))

    def metrics(self, start: int = 0) -> list[dict[str, Any]]:
        return self._call("metrics", run=self.run, start=start)

    def close(self) -> None:
        self._call("close", run=self.run)


def _in_process(client: Client) -> Scheduler | None:
    """The client's scheduler where it runs in this process with the plugin (a LocalCluster's).

    Only with ``daskpri.table.in-process`` set. ``None`` otherwise, and once
    it stops running: then calls go over the comm, and fail as they would
    for a scheduler elsewhere.
    """
    if not _config.get_bool("table.in-process"):
        return None
    scheduler = getattr(getattr(client, "cluster", None), "scheduler", None)
    if (
        isinstance(scheduler, Scheduler)
        and scheduler.status == Status.running
        and scheduler.address == client.scheduler.address
        and PLUGIN_NAME in scheduler.plugins
    ):
        return scheduler
    return None


async def _handle(handler: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """A handler's answer as a message would carry it, on the scheduler's loop, without one.

    Copies both ways, as a comm would: nothing the driver holds is shared
    with the table. (Packed arrays are bytes, which copying leaves alone.)
    """
    answer = handler(**copy.deepcopy(kwargs))
    if inspect.isawaitable(answer):
        answer = await answer
    return copy.deepcopy(answer)
