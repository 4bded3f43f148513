"""The checks of the cluster before a run's set-up, from one probe of it.

A fit asks the run's workers and the scheduler everything its checks need
at once (:func:`daskpri.training._probe.probe`: one ``client.run`` and one
``client.run_on_scheduler``, concurrently), then checks their answers on
the driver, in order: the device (:func:`~daskpri.training._checks.check_workers_device`), the
model's and strategy's modules
(:func:`~daskpri.training._checks.check_cluster_imports`), the data's store
(:func:`~daskpri.training.placement.check_workers_see`). Each check is a
pure function of the answers. A worker that does not answer (lost
meanwhile) is left to the set-up, which recovers from a lost worker.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from distributed import Client
from torch import nn

from daskpri.strategies import Strategy
from daskpri.training import _probe
from daskpri.training._checks import (
    _accelerator,
    check_cluster_imports,
    check_workers_device,
    foreign_modules,
)
from daskpri.training.placement import check_workers_see
from daskpri.training.recovery import dask_timeout


@dataclass
class Answers:
    """The probe's answers: each worker's that answered, by address, and the scheduler's."""

    workers: dict[str, dict[str, Any]]
    #: None where its probe failed other than by a lost connection (a scheduler
    #: of another Python, which cannot load the probe's code)
    scheduler: dict[str, Any] | None


def ask_cluster(
    client: Client,
    workers: list[str],
    *,
    kinds: tuple[str, ...] = (),
    modules: list[str] | None = None,
    scheduler_modules: list[str] | None = None,
    path: str | None = None,
) -> Answers:
    """:func:`~daskpri.training._probe.probe` ``workers`` and the scheduler, at once.

    A worker whose probe fails (lost meanwhile), or that does not answer
    within ``daskpri.trainer.no-workers-timeout``, is left out of the
    answers, as is the scheduler's where its probe fails; a lost connection
    to the scheduler is raised.
    """
    async def ask() -> tuple[dict[str, Any], dict[str, Any] | None]:
        on_workers = asyncio.wait_for(
            client._run(_probe.probe, kinds, modules or [], path, workers=workers,
                        on_error="return"),
            dask_timeout(),
        )
        on_scheduler = client._run_on_scheduler(
            _probe.probe, (), scheduler_modules or [], None)
        answers: tuple[Any, Any] = await asyncio.gather(on_workers, on_scheduler,
                                                        return_exceptions=True)
        found, scheduler = answers
        if isinstance(scheduler, OSError | asyncio.CancelledError):  # CommClosedError too
            raise scheduler
        if isinstance(scheduler, BaseException):
            scheduler = None
        return ({} if isinstance(found, BaseException) else found), scheduler

    found, scheduler = client.sync(ask)
    answered = {a: r for a, r in found.items() if isinstance(r, dict)}
    return Answers(answered, scheduler)


def check_cluster(
    client: Client,
    workers: list[str],
    device: str | None,
    model: nn.Module,
    strategy: Strategy,
    path: str | None,
) -> None:
    """Refuse a run that the cluster cannot set up, from one probe of ``workers`` and the scheduler.

    ``path`` is the data's store (None: data in memory).
    """
    accelerator = _accelerator(device)
    of_model = foreign_modules(type(m) for m in model.modules())
    of_strategy = foreign_modules(type(strategy).__mro__)
    answers = ask_cluster(
        client, workers, kinds=() if accelerator is None else (accelerator[0],),
        modules=sorted(set(of_model) | set(of_strategy)), scheduler_modules=of_strategy,
        path=path,
    )
    check_workers_device(
        {a: r["devices"] for a, r in answers.workers.items()}, len(workers), device)
    check_cluster_imports(
        {a: r["unimportable"] for a, r in answers.workers.items()},
        [] if answers.scheduler is None else answers.scheduler["unimportable"],
        len(workers), of_model, of_strategy, strategy)
    if path is not None:
        check_workers_see({a: r["cannot_read"] for a, r in answers.workers.items()},
                          len(workers), path)
