"""The checks of the cluster before a run's set-up, from one probe of it.

A fit asks the run's workers and the scheduler everything its checks need
at once (:func:`daskpri.training._probe.probe`: one direct call to each
worker and one ``client.run_on_scheduler``, concurrently), then checks their answers on
the driver, in order: the same daskpri everywhere (:func:`check_versions`),
the device (:func:`~daskpri.training._checks.check_workers_device`), the
model's and strategy's modules
(:func:`~daskpri.training._checks.check_cluster_imports`), the data's store
(:func:`~daskpri.training.placement.check_workers_see`). Each check is a
pure function of the answers. A worker that does not answer (lost
meanwhile) is left to the set-up, which recovers from a lost worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from distributed import Client
from torch import nn

import daskpri
from daskpri import _config
from daskpri._warnings import warn
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
from daskpri.training.transport import asked


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
    bfloat16: bool = False,
) -> Answers:
    """:func:`~daskpri.training._probe.probe` ``workers`` and the scheduler, at once.

    Each worker is asked directly (:func:`~daskpri.training.transport.asked`),
    for ``daskpri.trainer.probe-timeout`` at most (those that count devices, which
    imports torch there, for ``daskpri.trainer.no-workers-timeout``): one that
    fails (lost meanwhile), or does not answer in time, is left out of the
    answers, and does not hold up the others' (a broadcast, ``client.run``,
    waits for a worker that has just died as long as the connect timeout,
    30 s, and answers for none if it is cut short). The scheduler's answer is
    left out where its probe fails; a lost connection to the scheduler is
    raised.
    """
    timeout = dask_timeout() if kinds else _config.get_seconds("trainer.probe-timeout")

    # client.run_on_scheduler with asynchronous=True gives its coroutine (Dask's
    # SyncMethodMixin.sync), awaited with the workers' on the client's loop
    async def ask() -> tuple[dict[str, Any], dict[str, Any] | None]:
        on_workers = asked(client, workers, _probe.probe, kinds, modules or [], path,
                           bfloat16, timeout=timeout)
        on_scheduler = client.run_on_scheduler(
            _probe.probe, (), scheduler_modules or [], None, asynchronous=True)
        answers: tuple[Any, Any] = await asyncio.gather(on_workers, on_scheduler,
                                                        return_exceptions=True)
        found, scheduler = answers
        for answer in answers:
            if isinstance(answer, OSError | asyncio.CancelledError):  # CommClosedError too
                raise answer
        if isinstance(found, BaseException):
            raise found
        if isinstance(scheduler, BaseException):
            scheduler = None
        return found, scheduler

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
    precision: str = "float32",
) -> list[str]:
    """Refuse a run that the cluster cannot set up, from one probe of ``workers`` and the scheduler.

    ``path`` is the data's store (None: data in memory). Returns those of
    ``workers`` that did not answer the probe, for the set-up
    (:func:`~daskpri.training.transport.register` does not wait for them again).
    """
    accelerator = _accelerator(device)
    of_model = foreign_modules(type(m) for m in model.modules())
    of_strategy = foreign_modules(type(strategy).__mro__)
    answers = ask_cluster(
        client, workers, kinds=() if accelerator is None else (accelerator[0],),
        modules=sorted(set(of_model) | set(of_strategy)), scheduler_modules=of_strategy,
        path=path, bfloat16=precision == "bfloat16",
    )
    check_versions(answers.workers, answers.scheduler, len(workers))
    check_workers_device(
        {a: r["devices"] for a, r in answers.workers.items()}, len(workers), device)
    check_cluster_imports(
        {a: r["unimportable"] for a, r in answers.workers.items()},
        [] if answers.scheduler is None else answers.scheduler["unimportable"],
        len(workers), of_model, of_strategy, strategy)
    if path is not None:
        check_workers_see({a: r["cannot_read"] for a, r in answers.workers.items()},
                          len(workers), path)
    if precision == "bfloat16":
        info = client.scheduler_info(n_workers=-1)["workers"]
        emulating = emulating_bfloat16(
            {a: r.get("cpu_bfloat16") for a, r in answers.workers.items()},
            {a: info.get(a, {}).get("resources") or {} for a in answers.workers}, device)
        if emulating:
            warn(f"precision='bfloat16' on the CPUs of {len(emulating)} of the run's "
                 f"{len(workers)} worker(s) ({_listed(emulating)}) that have no bfloat16 "
                 f"instructions ({', '.join(_probe.BFLOAT16_FLAGS)}): torch emulates it "
                 "there, slower than float32; train in precision='float32' on them")
    return [a for a in workers if a not in answers.workers]


def emulating_bfloat16(
    cpu_bfloat16: Mapping[str, bool | None], resources: Mapping[str, Mapping[str, float]],
    device: str | None,
) -> list[str]:
    """The workers that would train on a CPU without bfloat16 instructions.

    A worker trains on its CPU where ``device`` is ``"cpu"``, or where no
    device is forced and it has no ``GPU`` resource (one that has trains on
    its GPU); an unknown CPU (``None``: not Linux, an older daskpri) is not
    named.

    Examples
    --------
    >>> flags = {"tcp://a": False, "tcp://b": False, "tcp://c": True, "tcp://d": None}
    >>> emulating_bfloat16(flags, {"tcp://b": {"GPU": 1}}, None)
    ['tcp://a']
    >>> emulating_bfloat16(flags, {"tcp://b": {"GPU": 1}}, "cpu")
    ['tcp://a', 'tcp://b']
    >>> emulating_bfloat16(flags, {}, "cuda:0")
    []
    """
    if device is not None and not device.startswith("cpu"):
        return []
    return sorted(a for a, has in cpu_bfloat16.items()
                  if has is False and (device is not None
                                       or not resources.get(a, {}).get("GPU", 0)))


def _listed(addresses: list[str]) -> str:
    """Up to five of ``addresses``, for a message.

    Examples
    --------
    >>> _listed(["tcp://a"]), _listed([f"w{i}" for i in range(7)])
    ('tcp://a', 'w0, w1, w2, w3, w4 and 2 more')
    """
    more = f" and {len(addresses) - 5} more" if len(addresses) > 5 else ""
    return ", ".join(sorted(addresses)[:5]) + more


def _major_minor(version: str | None) -> str | None:
    """``'2.13'`` of ``'2.13.0+cpu'``.

    Examples
    --------
    >>> _major_minor("2.13.0+cpu"), _major_minor("2.4"), _major_minor(None)
    ('2.13', '2.4', None)
    """
    return None if version is None else ".".join(version.split("+")[0].split(".")[:2])


def check_versions(
    workers: Mapping[str, Mapping[str, Any]],
    scheduler: Mapping[str, Any] | None,
    n_workers: int | None = None,
    *,
    here: str | None = None,
    here_torch: str | None = None,
) -> None:
    """Refuse a cluster of another daskpri than the driver's; warn of another torch.

    The driver, the scheduler (the run's table) and the workers (its
    replicas) exchange daskpri's objects and messages, which differ
    between versions: a different daskpri fails there in ways that do not
    say so. A different torch (major.minor) on the workers is warned of:
    a model's state dict, and the pickled model that the workers rebuild,
    may not load across torch versions. ``workers`` are the answers of
    those of the run's ``n_workers`` (default: as many) that answered;
    ``here`` and ``here_torch`` default to this process's versions; a
    ``scheduler`` of None (its probe failed) is not checked.

    Examples
    --------
    >>> check_versions({"tcp://a": {"daskpri": "0.1.0", "torch": "2.13.0"}},
    ...                {"daskpri": "0.1.0"}, here="0.1.0", here_torch="2.13.1")
    >>> check_versions({"tcp://a": {"daskpri": "0.0.9", "torch": "2.13.0"},
    ...                 "tcp://b": {"daskpri": "0.1.0", "torch": "2.13.0"}},
    ...                {"daskpri": None}, here="0.1.0")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ValueError: the cluster runs another daskpri than this driver's 0.1.0: daskpri 0.0.9 on
    1 of the run's 2 worker(s) (tcp://a), and no daskpri on the scheduler; ...
    """
    here = daskpri.__version__ if here is None else here
    here_torch = str(torch.__version__) if here_torch is None else here_torch
    n_workers = len(workers) if n_workers is None else n_workers
    where: dict[str | None, list[str]] = {}
    for address, answer in sorted(workers.items()):
        if answer["daskpri"] != here:
            where.setdefault(answer["daskpri"], []).append(address)
    each = [f"{'no daskpri' if v is None else f'daskpri {v}'} on {len(addresses)} of the "
            f"run's {n_workers} worker(s) ({_listed(addresses)})"
            for v, addresses in where.items()]
    if scheduler is not None and scheduler["daskpri"] != here:
        v = scheduler["daskpri"]
        each.append(f"{'no daskpri' if v is None else f'daskpri {v}'} on the scheduler")
    if each:
        raise ValueError(
            f"the cluster runs another daskpri than this driver's {here}: {', and '.join(each)}; "
            "the driver, the scheduler and the workers exchange daskpri's objects, which "
            f"differ between versions: install daskpri {here} where each of them runs (the "
            "release or checkout that this driver runs), and restart them"
        )
    ours = _major_minor(here_torch)
    torches: dict[str | None, list[str]] = {}
    for address, answer in sorted(workers.items()):
        if _major_minor(answer["torch"]) != ours:
            torches.setdefault(answer["torch"], []).append(address)
    if torches:
        each = [f"{'no torch' if v is None else f'torch {v}'} on {len(addresses)} of the "
                f"run's {n_workers} worker(s) "
                f"({_listed(addresses)})" for v, addresses in torches.items()]
        warn(
            f"the workers run another torch than this driver's {here_torch}: "
            f"{', and '.join(each)}; a model's state dict and the pickled model the workers "
            f"rebuild may not load across torch versions: install torch {ours}, as here, on "
            "the workers if the run fails to set up or a checkpoint fails to load"
        )
