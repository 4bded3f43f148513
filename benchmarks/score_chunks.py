"""The scoring forward pass whole against in chunks (``Replica.logits`` on a CPU).

Run: ``python benchmarks/score_chunks.py [--rows 192] [--repeats 5]``. One
torch thread. For each built-in model on MNIST-1D and ``mnist5k``, in
float32 and under bfloat16 autocast (``score_dtype``), it times
``Replica.logits`` on ``--rows`` candidates (192: ``selective-backprop``'s
``fraction=0.33`` of a batch of 64) in the chunks the replica measures
for itself (``Replica.score_rows``, from ``SCORE_CHUNK_BYTES``) and whole,
and a training step of 64 for scale, each the median over ``--repeats``
rounds, the order alternating.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from cnn_step import per_call_ms

from daskpri import datasets
from daskpri.models import build_model
from daskpri.replicas.replica import Replica


def measure(replica: Replica, x: torch.Tensor, y: torch.Tensor, repeats: int, calls: int) -> str:
    """The timings of one model: each precision chunked and whole, and a training step."""
    parts = []
    for dtype in (None, torch.bfloat16):
        key = (tuple(x.shape[1:]), dtype)
        replica.logits(x, dtype)  # measures the chunk
        rows = replica.score_rows[key]
        times: dict[str, list[float]] = {"chunked": [], "whole": []}
        for r in range(repeats):
            for kind in ("chunked", "whole") if r % 2 == 0 else ("whole", "chunked"):
                replica.score_rows[key] = rows if kind == "chunked" else None
                times[kind].append(per_call_ms(lambda: replica.logits(x, dtype), calls))  # noqa: B023
        replica.score_rows[key] = rows
        chunked, whole = (float(np.median(times[k])) for k in ("chunked", "whole"))
        name = "float32" if dtype is None else "bfloat16"
        parts.append(f"{name} whole {whole:.2f} ms, in chunks of {rows or len(x)} rows "
                     f"{chunked:.2f} ms ({whole / chunked:.2f}x)")
    opt = torch.optim.SGD(replica.params, lr=1e-3, momentum=0.9)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(replica.module(x[:64]), y[:64]).backward()
        opt.step()

    parts.append(f"training step of 64 {per_call_ms(step, calls):.2f} ms")
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in ("mnist1d", "mnist5k"):
        train, _ = datasets.load(name, seed=0)
        x = torch.as_tensor(train["x"].values[:args.rows]).float()
        y = torch.as_tensor(train["y"].values[:args.rows]).long()
        for kind in ("mlp", "cnn"):
            replica = Replica(build_model(kind, train, seed=0), "cpu")
            print(f"{name} {kind}: {measure(replica, x, y, args.repeats, args.calls)}",
                  flush=True)


if __name__ == "__main__":
    main()
