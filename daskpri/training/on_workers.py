"""What the driver runs on a cluster's workers before they may hold a replica.

A function sent to workers (``client.run``, :func:`.transport.asked`) is
pickled by reference: each worker imports its module to run it, on its event
loop. The driver asks these of workers that may not have built a run's
replica yet (a trainer's first check of a notebook's cluster, the close of a
cluster where no fit ran), and their module imports neither torch nor the
rest of daskpri's driver: a worker answers at once, rather than seconds
later with its event loop blocked meanwhile (importing the driver's side took
5.5 s on a loaded 2-core machine; torch alone 3.2 s on an idle one).

>>> import subprocess, sys
>>> code = "import sys, daskpri.training.on_workers; print('torch' in sys.modules)"
>>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
'False\\n'
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any


def killed_by_interrupts_of(group: int, driver: int) -> bool:
    """Whether an interrupt of process group ``group`` kills this worker's process.

    Run on a worker. One in the ``driver``'s own process (a LocalCluster of
    threads) is only interrupted as the driver is.

    >>> killed_by_interrupts_of(os.getpgrp(), os.getpid())  # the driver's own process
    False
    """
    return (os.getpid() != driver and os.getpgrp() == group
            and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)


class ClosingHeartbeatFilter(logging.Filter):
    """Drop the ERROR of a heartbeat that was on its way as its cluster closed."""

    message = "Failed to communicate with scheduler during heartbeat."

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != self.message


def stop_heartbeat(dask_worker: Any) -> None:
    """Stop the worker's heartbeat to a scheduler about to close, and the error of one in flight."""
    dask_worker.periodic_callbacks["heartbeat"].stop()
    # a heartbeat already sent when the periodic callback stops still fails
    # if the scheduler closes before it answers
    logger = logging.getLogger("distributed.worker")
    if not any(isinstance(f, ClosingHeartbeatFilter) for f in logger.filters):
        logger.addFilter(ClosingHeartbeatFilter())
