"""Helpers for tests that start processes: free ports, stopping."""

from __future__ import annotations

import socket
import subprocess
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(procs: list[subprocess.Popen[Any]]) -> None:
    """Terminate ``procs``, then kill those still running after 10 s."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
