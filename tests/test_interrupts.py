"""Interrupts that a terminal's Ctrl-C sends: real ``SIGINT`` to a real script's process group.

The Jupyter kernel's are in ``test_jupyter.py``, the CLI's in ``test_cli.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from _procs import SPAWNED, _stop

#: a script whose trainer starts its own LocalCluster in a fit, saying when its worker
#: process has been started (the cluster is still starting then, for seconds); Python's
#: handler put back, which a background job's children (``make test &``) lack
_DOUBLE_TAP = """
import multiprocessing.process, os, signal
signal.signal(signal.SIGINT, signal.default_int_handler)
import psutil
import daskpri
from daskpri.models import MLP
train, _ = daskpri.datasets.load("synthetic", n_samples=200, seed=0)
trainer = daskpri.Trainer(MLP(train["x"].shape[1:], int(train.attrs["n_classes"]), hidden=8),
                          strategy="uniform", n_workers=1)
def fit():
    try:
        trainer.fit(train, max_steps=10**6, progress=False)
    except KeyboardInterrupt as e:
        print("raised", repr(e), flush=True)
""" + SPAWNED.format("fit()") + """
children = [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)]
print("cluster", trainer._own_cluster, "processes",
      len([c for c in children if "resource_tracker" not in c]), flush=True)
os._exit(0)  # what is left is the test's to find, not the interpreter's exit to close
"""


def test_a_second_interrupt_as_the_trainer_starts_its_cluster_gives_the_start_up() -> None:
    """Ctrl-C twice while the cluster starts: it is closed, and the fit raises at once."""
    # its own process group, as a terminal's foreground job: Ctrl-C reaches the workers too
    proc = subprocess.Popen([sys.executable, "-c", _DOUBLE_TAP], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "worker process started\n"
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)  # two interrupts, not one sent twice
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        _stop([proc])
        with contextlib.suppress(ProcessLookupError):  # its workers, where left running
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    # one KeyboardInterrupt, bare as a second interrupt's, not the first's "stopped at
    # step_=0" after the run's whole set-up; no worker process left running
    assert out.splitlines() == ["raised KeyboardInterrupt()", "cluster None processes 0"], err
    assert "Traceback" not in err and "Nanny failed" not in err, err
