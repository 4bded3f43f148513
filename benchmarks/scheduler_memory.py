"""A ``dask scheduler`` process's memory after a short run of each built-in strategy.

Run: ``python benchmarks/scheduler_memory.py [--steps 10]``. Starts a
``dask scheduler`` and ``dask worker --nworkers 2 --nthreads 1`` on loopback
(no dashboards), fits each strategy of ``daskpri.STRATEGIES`` in turn on 2,000
synthetic samples (batch 32), and prints the scheduler's resident memory
(``VmRSS``), whether it has imported torch, and the heavy libraries it has
imported, before the first run and after the last. Also prints how long
importing ``daskpri.table.plugin`` takes in a fresh interpreter: the
scheduler does that on its event loop as the first run's plugin arrives.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from distributed import Client

import daskpri
from daskpri.models import build_model

HEAVY = ("torch", "pandas", "xarray", "bokeh", "scipy", "zarr", "daskpri")


def on_scheduler() -> dict[str, Any]:
    """The scheduler's resident memory (MiB) and which of :data:`HEAVY` it has imported."""
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    return {"rss_mib": rss // 1024, "imported": [m for m in HEAVY if m in sys.modules]}


def plugin_import_seconds() -> float:
    """Seconds a fresh interpreter takes to import ``daskpri.table.plugin``."""
    code = ("import time; t = time.perf_counter(); import daskpri.table.plugin; "
            "print(time.perf_counter() - t)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="steps of each run")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps should be 1 or more, but got {args.steps}")
    print(f"import daskpri.table.plugin: {plugin_import_seconds():.2f} s")
    directory = tempfile.mkdtemp()
    scheduler_file = os.path.join(directory, "scheduler.json")
    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    common = ["--host", "127.0.0.1", "--no-dashboard"]
    scheduler = subprocess.Popen([dask, "scheduler", "--port", "0", *common,
                                  "--scheduler-file", scheduler_file], stderr=subprocess.DEVNULL)
    workers = subprocess.Popen([dask, "worker", "--scheduler-file", scheduler_file, "--nthreads",
                                "1", "--nworkers", "2", *common], stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(scheduler_file):
            time.sleep(0.2)
        with Client(scheduler_file=scheduler_file, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
            print("before the runs:", client.run_on_scheduler(on_scheduler))
            train, _ = daskpri.datasets.load("synthetic", n_samples=2000, seed=0)
            for name in sorted(daskpri.STRATEGIES):
                trainer = daskpri.Trainer(build_model("mlp", train), strategy=name,
                                          client=client, batch_size=32)
                try:
                    trainer.fit(train, max_steps=args.steps, progress=False)
                finally:
                    trainer.close()
            print(f"after {args.steps} steps of each strategy:",
                  client.run_on_scheduler(on_scheduler))
    finally:
        workers.terminate()
        workers.wait(30)
        scheduler.terminate()
        scheduler.wait(30)


if __name__ == "__main__":
    main()
