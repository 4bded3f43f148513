"""Helpers for tests that fit: a LocalCluster of their own, a trainer of an MLP, a short
fit on a client, and a fit run in the background while the test acts on its cluster."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from distributed import Client, LocalCluster

import daskpri
from daskpri.models import build_model


@contextlib.contextmanager
def local_cluster(n_workers: int = 1, *, processes: bool = True,
                  **kwargs: Any) -> Iterator[tuple[LocalCluster, Client]]:
    """A LocalCluster of ``n_workers`` one-thread workers, and its client, closed after.

    Worker processes (``processes=True``) listen on loopback; in-process
    ones talk over ``inproc`` unless ``kwargs`` name a ``protocol``. The
    dashboard listens on a free loopback port; ``kwargs`` are more of
    LocalCluster's (``memory_limit``, ``preload``, ``scheduler_kwargs``).
    """
    if processes:
        kwargs.setdefault("host", "127.0.0.1")
    with (
        LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=processes,
                     dashboard_address="127.0.0.1:0", **kwargs) as cluster,
        Client(cluster) as client,
    ):
        yield cluster, client


def mlp_trainer(client: Client, train: Any, *, strategy: Any = "uniform", seed: int = 0,
                **kwargs: Any) -> daskpri.Trainer:
    """A trainer of an MLP for ``train`` (its weights drawn from ``seed``) on ``client``.

    ``strategy`` is ``uniform`` unless said; ``kwargs`` are more of the
    Trainer's. Used as a context manager, the block's end closes it.
    """
    return daskpri.Trainer(build_model("mlp", train, seed=seed), strategy=strategy,
                           client=client, seed=seed, **kwargs)


def wait_while_fitting(condition: Callable[[], bool], what: str, running: Future | None,
                       timeout: float = 20.0) -> None:
    """Wait for ``condition``, the fit ``running`` (if any) still running meanwhile.

    A fit that ends (or fails) first fails the test with its result (or its
    error); ``what`` says what did not happen within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if running is not None:
            assert not running.done(), running.result()  # the fit ended (or failed) first
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def fit_until_step(trainer: Any, data: Any, step: int = 3, timeout: float = 60.0,
                   **kwargs: Any) -> Future:
    """Start ``trainer``'s fit on ``data`` in the background: its future, once at ``step``.

    The fit runs for good (``max_steps=100_000``) without a progress bar
    unless ``kwargs`` say otherwise; end it with ``trainer.stop()``.
    """
    kwargs = {"max_steps": 100_000, "progress": False, **kwargs}
    running = trainer.fit_in_background(data, **kwargs)
    wait_while_fitting(lambda: trainer.step_ >= step, f"the fit did not reach step {step}",
                       running, timeout)
    return running


def fit(client, data, strategy="uniform", steps=12, seed=0, **kw):
    """A trainer of an MLP fitted ``steps`` steps on ``data`` (train, test), and its history."""
    train, test = data
    trainer = mlp_trainer(client, train, strategy=strategy, seed=seed, batch_size=32,
                          eval_every=5, **kw)
    history = trainer.fit(train, eval_data=test, max_steps=steps, progress=False)
    return trainer, history
