"""The scoring forward pass in float32 against bfloat16 (``score_dtype``).

Run: ``python benchmarks/score_dtype.py [--repeats 3]``. One torch thread.
For each built-in model on MNIST-1D and ``mnist5k`` (after 100 training
steps, so that the losses spread), it times ``Replica.losses`` on 128
candidates in float32 and under bfloat16 autocast (what
``selective-backprop`` and ``upper-bound`` run with ``score_dtype``), and a
training step of 64 for scale, each the median over ``--repeats`` rounds,
the order alternating. Over 2,048 training samples it prints how alike
the two precisions rank the losses: their Spearman correlation, the share
of the top half they agree on, and the largest relative difference.
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


def ranks_alike(replica: Replica, x: torch.Tensor, y: torch.Tensor) -> str:
    """How alike float32 and bfloat16 losses of ``x`` rank the samples."""
    full = replica.losses(x, y)[0].numpy()
    low = replica.losses(x, y, torch.bfloat16)[0].numpy()
    half = len(full) // 2
    top = len(set(np.argsort(-full)[:half]) & set(np.argsort(-low)[:half])) / half
    rho = float(np.corrcoef(np.argsort(np.argsort(full)), np.argsort(np.argsort(low)))[0, 1])
    rel = float(np.max(np.abs(full - low) / (np.abs(full) + 1e-3)))
    return (f"ranks: Spearman {rho:.4f}, top half {100 * top:.1f}% alike, "
            f"largest relative difference {100 * rel:.0f}%")


def measure(replica: Replica, xs: torch.Tensor, ys: torch.Tensor, repeats: int, calls: int) -> str:
    """The timings and rank agreement of one model, trained 100 steps first."""
    opt = torch.optim.SGD(replica.params, lr=0.1, momentum=0.9)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad()
        F.cross_entropy(replica.module(x), y).backward()
        opt.step()

    rng = torch.Generator().manual_seed(0)
    for _ in range(100):
        j = torch.randint(0, len(xs), (64,), generator=rng)
        step(xs[j], ys[j])
    x, y = xs[:128], ys[:128]
    fns = {
        "float32": lambda: replica.losses(x, y),
        "bfloat16": lambda: replica.losses(x, y, torch.bfloat16),
    }
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats):
        for k in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            times[k].append(per_call_ms(fns[k], calls))
    ms = {k: float(np.median(v)) for k, v in times.items()}
    alike = ranks_alike(replica, xs, ys)
    # training steps change the weights: timed last
    ms["step64"] = per_call_ms(lambda: step(x[:64], y[:64]), calls)
    return (f"forward of 128 float32 {ms['float32']:.2f} ms, bfloat16 {ms['bfloat16']:.2f} ms "
            f"({ms['float32'] / ms['bfloat16']:.2f}x); training step of 64 "
            f"{ms['step64']:.2f} ms; {alike}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in ("mnist1d", "mnist5k"):
        train, _ = datasets.load(name, seed=0)
        xs = torch.as_tensor(train["x"].values[:2048]).float()
        ys = torch.as_tensor(train["y"].values[:2048]).long()
        for kind in ("mlp", "cnn"):
            replica = Replica(build_model(kind, train, seed=0), "cpu")
            print(f"{name} {kind}: {measure(replica, xs, ys, args.repeats, args.calls)}",
                  flush=True)


if __name__ == "__main__":
    main()
