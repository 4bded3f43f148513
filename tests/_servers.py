"""The standalone dashboard's Bokeh server, serving in a thread of the test's process."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def page_server(scheduler_address: str, **kwargs: Any) -> Iterator[Any]:
    """``make_server(scheduler_address, **kwargs)`` started in a thread; stopped after."""
    from daskpri.dashboard.remote import make_server

    box: dict[str, Any] = {}
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        box["server"] = server = make_server(scheduler_address, **kwargs)
        server.start()
        ready.set()
        server.io_loop.start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30)
    server = box["server"]
    try:
        yield server
    finally:

        def stop() -> None:
            server.stop()
            server.io_loop.stop()

        server.io_loop.add_callback(stop)
        thread.join(30)
