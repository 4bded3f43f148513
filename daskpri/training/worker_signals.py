"""Preloaded into the workers of daskpri's LocalClusters: Ctrl-C is the driver's.

A terminal sends Ctrl-C's ``SIGINT`` to its whole foreground process group,
the worker processes of a LocalCluster the driver started included. Killed by
it, a worker takes its partitions with it while the driver ends the step in
flight and writes its checkpoint, and the scheduler reports the lost data.
The workers ignore it instead; the driver closes them as it ends.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


def dask_setup(worker: Any) -> None:
    """Ignore ``SIGINT`` in this worker's process (signals are set from its main thread)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
