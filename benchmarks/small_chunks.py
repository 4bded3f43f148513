"""A fit from a zarr store of small chunks: its partitions grouped, and not.

Run: ``python benchmarks/small_chunks.py [--chunk 1] [--samples 3000] [--steps 20]``.
It writes the ``synthetic`` dataset's training part (80% of ``--samples``)
to a zarr store in a temporary directory, chunked ``--chunk`` samples along
``sample``, then times a fit of ``--steps`` steps (2 workers, batch 32,
the trainer's own LocalCluster, its start included) twice: as daskpri
cuts the store (chunks of fewer than ``SMALL_CHUNK`` samples on average
grouped into runs of whole chunks) and with every chunk a partition of
its own (``SMALL_CHUNK = 0``, as before the fortieth session). Each line
gives the partitions and the seconds.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import daskpri
from daskpri.data.datasets import load
from daskpri.data.store import to_store
from daskpri.models import build_model
from daskpri.training import placement


def timed_fit(path: str, train, steps: int) -> tuple[int, float]:
    """The partitions of a fit from ``path`` and its seconds, cluster start included."""
    t0 = time.perf_counter()
    with daskpri.Trainer(build_model("mlp", train), n_workers=2, batch_size=32) as trainer:
        trainer.fit(path, max_steps=steps, progress=False)
        partitions = int(trainer.table_["partition"].max()) + 1
    return partitions, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", type=int, default=1)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    train, _ = load("synthetic", n_samples=args.samples, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = to_store(train.chunk({"sample": args.chunk}), str(Path(tmp) / "train.zarr"))
        for label, small in (("grouped", placement.SMALL_CHUNK), ("a chunk each", 0)):
            placement.SMALL_CHUNK = small
            partitions, seconds = timed_fit(path, train, args.steps)
            print(f"chunks of {args.chunk}, {label}: {partitions} partitions, "
                  f"{args.steps} steps in {seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main()
