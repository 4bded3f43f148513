"""The built-in CNN's training step and forward pass, against its earlier layouts.

Run: ``python benchmarks/cnn_step.py [--repeats 3]``. One torch thread. For
the MNIST-1D shape ``(40,)`` it times a training step of batch 64 (forward,
backward, SGD with momentum) and a forward pass without gradient of 128
samples (a scoring pass of selective-backprop), for ``daskpri.models.CNN``
(2-D channels-last kernels of shape ``(1, 5)``) and for the same weights
in 1-D layers, ``nn.Conv1d`` with ``daskpri.models.MaxPool1d`` (what the
CNN was before); for the MNIST shape ``(28, 28)`` the same two timings of
the CNN (channels-last) and of the same model with contiguous weights
(what it was before). Prints the median over ``--repeats`` rounds of each
timing, the order of the two reversed every other round.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from daskpri.models import CNN


def variants(shape: tuple[int, ...]) -> dict[str, nn.Module]:
    """The CNN for ``shape`` and the variant it is compared with."""
    model = CNN(shape, 10, seed=0)
    if len(shape) == 1:
        return {"daskpri": model, "1-D layers": model.as_1d_layers()}
    other = copy.deepcopy(model)
    for p in other.parameters():
        p.data = p.data.clone(memory_format=torch.contiguous_format)
    return {"daskpri": model, "contiguous": other}


def per_call_ms(fn: Callable[[], object], calls: int) -> float:
    for _ in range(calls // 2):  # warm the allocator and oneDNN's caches
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def timings(model: nn.Module, x: torch.Tensor, y: torch.Tensor, calls: int) -> tuple[float, float]:
    """Milliseconds per training step on ``x[:64]`` and per forward pass of ``x``."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x[:64]), y[:64]).backward()
        opt.step()

    def forward() -> None:
        with torch.no_grad():
            model(x)

    return per_call_ms(step, calls), per_call_ms(forward, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    for shape, calls in (((40,), 200), ((28, 28), 20)):
        x = torch.randn(128, *shape, generator=gen)
        y = torch.randint(0, 10, (128,), generator=gen)
        models = variants(shape)
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(args.repeats):
            # in turn, the order reversed every other round: the first after a
            # switch can pay for the other's allocations
            for name, model in list(models.items())[:: 1 if r % 2 == 0 else -1]:
                step_ms, forward_ms = timings(model, x, y, calls)
                times.setdefault((name, "step"), []).append(step_ms)
                times.setdefault((name, "forward"), []).append(forward_ms)
        first, second = models
        print(f"CNN for samples of shape {shape}:")
        for what, label in (("step", "training step, batch 64"),
                            ("forward", "forward pass, 128 samples, no gradient")):
            a = float(np.median(times[(first, what)]))
            b = float(np.median(times[(second, what)]))
            print(f"  {label}: {first} {a:.2f} ms, {second} {b:.2f} ms ({b / a:.2f}x)")


if __name__ == "__main__":
    main()
