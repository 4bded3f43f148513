"""How soon a `dask worker` that joins a run under way answers, and holds its replica.

Run: ``python benchmarks/joining_worker.py`` (``--repeat 3``). Starts a
``dask scheduler`` and one ``dask worker --no-nanny`` on loopback, fits 3
steps (the run's replica plugin then stays registered with the
scheduler), starts a second such worker and prints, in seconds from its
start: when the scheduler lists it, when it first answers
``client.run``, and when it holds its replica (``why_no_replica`` answers
None); then whether the next fit trained on both workers. A worker
handed a plugin as it registers answers nothing until the plugin's
set-up has ended (distributed's server waits for its own start).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from distributed import Client

import daskpri
from daskpri.data.datasets import load
from daskpri.models import build_model
from daskpri.replicas.worker import why_no_replica

WORKER = ["--nthreads", "1", "--no-nanny", "--host", "127.0.0.1", "--dashboard-address",
          "127.0.0.1:0"]


def _start(*args: str, cwd: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=cwd)


def once() -> dict[str, object]:
    """One scheduler, one worker, one run, one worker joining it: the figures."""
    directory = tempfile.mkdtemp()
    scheduler_file = os.path.join(directory, "scheduler.json")
    scheduler = _start("distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                       "--scheduler-file", scheduler_file, "--dashboard-address", "127.0.0.1:0",
                       cwd=directory)
    first = joiner = None
    try:
        while not os.path.exists(scheduler_file):
            time.sleep(0.05)
        time.sleep(0.5)  # (written before the scheduler listens, at times)
        with open(scheduler_file) as f:
            address = json.load(f)["address"]
        first = _start("distributed.cli.dask_worker", address, *WORKER, cwd=directory)
        with Client(address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            train, _ = load("synthetic", n_samples=2000, seed=0)
            trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform",
                                      client=client)
            trainer.fit(train, max_steps=3, progress=False)
            before = set(client.scheduler_info(n_workers=-1)["workers"])
            start = time.monotonic()
            joiner = _start("distributed.cli.dask_worker", address, *WORKER, cwd=directory)
            while not (new := set(client.scheduler_info(n_workers=-1)["workers"]) - before):
                time.sleep(0.02)
            [added] = new
            listed = time.monotonic() - start
            client.run(os.getpid, workers=[added])
            answered = time.monotonic() - start
            why = client.run(why_no_replica, trainer._plugin.name, workers=[added])[added]
            built = time.monotonic() - start
            history = trainer.fit(train, max_steps=6, progress=False)
            trainer.close()
            return {"listed_s": round(listed, 2), "answered_s": round(answered, 2),
                    "replica_s": round(built, 2), "why_no_replica": why,
                    "n_workers_next_fit": [int(v) for v in history["n_workers"].values[3:]]}
    finally:
        for process in (joiner, first, scheduler):
            if process is not None:
                process.terminate()
                process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.repeat):
        print(json.dumps(once()), flush=True)


if __name__ == "__main__":
    main()
