"""Helpers for tests that run a fit in the background and act on its cluster meanwhile."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


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
