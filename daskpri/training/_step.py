"""Each step of the trainer's run: select, run the workers' shares, update the master.

A mixin of :class:`~daskpri.training.trainer.Trainer`, on
:class:`~daskpri.training._run.RunMixin` (the run in the cluster). Each step
(or round of local steps) selects samples in the table, or takes the round
selected ahead while the workers computed the last, runs the workers' shares,
retrying on the workers left after losing some, and updates the master model
and its optimizer from the combined results (:mod:`~daskpri.training.rounds`);
the fresh priorities and the history's new records go to the table with the
next request.
"""

from __future__ import annotations

import functools
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from daskpri import _config
from daskpri._warnings import warn
from daskpri.replicas.optim import LocalSteps, average_states, make_optimizer, set_flat_grad
from daskpri.replicas.replica import Weights, flat_params, load_flat
from daskpri.replicas.worker import ReplicaStateLost, StepResult
from daskpri.table.plugin import Round
from daskpri.training._run import RunMixin
from daskpri.training.errors import WorkersLostError
from daskpri.training.recovery import (
    FILE_ERRORS,
    LOST,
    MEMORY_ADVICE,
    dask_timeout,
    how_workers_left,
    killed_for_memory,
    report_left,
)
from daskpri.training.rounds import combine, crossed, fresh_priorities, nonfinite, step_record
from daskpri.training.schedule import scheduled_rate
from daskpri.training.transport import StepTimeout

logger = logging.getLogger(__name__)


class StepMixin(RunMixin):
    """The steps of the run, for :class:`~daskpri.training.trainer.Trainer`."""

    if TYPE_CHECKING:

        def save(self, path: str | os.PathLike[str]) -> str: ...

    # -- one step -----------------------------------------------------------------------

    def _step(self, limit: int | None = None) -> dict[str, Any]:
        """One step, or one round of ``local_steps`` steps (at most ``limit``).

        A step that fails as workers leave runs again on the workers left
        (their partitions moved), up to ``daskpri.trainer.max-retries``
        times (:meth:`_workers_left`): a worker retired is no failure and
        costs no retry; a retry that a nanny kills for memory again, as the
        first try was, stops the fit (the step does not fit the workers'
        memory, and each retry restarts a worker to be killed again).
        """
        step = self.step_
        count = self.local_steps if limit is None else max(1, min(self.local_steps, limit))
        t_start = time.perf_counter()
        self._follow_cluster()  # charged to the round: its partitions move
        retries = _config.get_int("trainer.max-retries", 0)
        failures = 0
        killed = False  # a try of this step was killed for memory
        while True:
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
            except StepTimeout as e:
                self._drop_prefetched()  # selected for the workers left out
                if failures >= retries:
                    raise WorkersLostError(
                        f"step {step} failed {failures + 1} times after losing workers: {e}"
                    ) from e
                # alive but stuck: train on without it rather than wait
                warn(f"step {step}: {e}; training goes on without them")
                self._excluded.update(e.addresses)
                self._recover()
                failures += 1
            except LOST as e:
                self._drop_prefetched()  # selected for the workers lost
                failed, killed = self._workers_left(step, e, failures, retries, killed)
                failures += failed
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

    def _workers_left(
        self, step: int, error: BaseException, failures: int, retries: int, killed: bool
    ) -> tuple[bool, bool]:
        """Re-plan after step ``step`` failed with ``error`` as workers left, saying why they did.

        ``failures`` is how many tries of the step failed before, of
        ``retries``; ``killed`` whether one was killed for memory. Returns
        whether this try counts as failed (a worker retired by the scheduler
        is none: the step runs again at no cost to ``retries``) and whether
        a try was killed for memory. Raises ``RuntimeError`` where the
        retries are spent, or where a nanny killed workers for memory at a
        second try (saying so, with what to do).
        """
        assert self._deployment is not None
        deployment = self._deployment
        before = list(deployment.owner_addr)
        self._check_scheduler()  # a lost scheduler is said at once, as the re-plan would
        # the last try waits a moment for a nanny's word that it killed the worker
        retired, kills = how_workers_left(
            self.client, sorted(set(before)), wait=2.0 if failures >= retries else 0.0
        )
        if kills:
            why = killed_for_memory(kills, deployment.memory_limits)
            if killed or failures >= retries:
                when = (
                    "again at its retry" if killed
                    else f"at its last try (daskpri.trainer.max-retries={retries})"
                )
                raise WorkersLostError(
                    f"step {step} failed {when}: {why}; {MEMORY_ADVICE}"
                ) from error
        elif failures >= retries and not retired:
            raise WorkersLostError(
                f"step {step} failed {failures + 1} times after losing workers: {error}"
            ) from error
        self._recover()
        gone = set(before) - set(deployment.owner_addr)
        lost = gone - retired - set(kills)
        if lost and not kills:
            # a nanny logs its kill as it kills: the event may reach the scheduler after
            # the call it failed did the driver, and before the re-plan is done
            kills = how_workers_left(self.client, sorted(lost))[1]
            lost -= set(kills)
        report_left(
            deployment, step, before, retired, kills,
            f"a worker was lost ({type(error).__name__}: {error}); its partitions moved"
            if lost or not (retired or kills) else None,
            then=" (a retry of the step killed for memory again stops the fit)",
        )
        return bool(kills or lost or not retired), killed or bool(kills)

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
                    scheduled_rate(self.learning_rate, self.lr_schedule, s, self.schedule_steps,
                                   self.warmup_steps)
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
        return scheduled_rate(self.learning_rate, self.lr_schedule, self.step_,
                              self.schedule_steps, self.warmup_steps)

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
