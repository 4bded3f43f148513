"""What two processes get from this machine: a plain PyTorch loop, alone and two at once.

Run: ``python benchmarks/two_plain_loops.py [--dataset mnist1d] [--model mlp]
[--seconds 10] [--repeats 2]``.

Each loop is the plain single-process training loop (one torch thread,
batch 64, SGD with momentum) in a process of its own, started by spawn. It
prints samples/s of one loop alone and of two side by side, and their
ratio: the most two one-thread workers could get over one on this machine,
with no driver, scheduler or communication at all.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from typing import Any


def loop(queue: Any, dataset: str, model_name: str, seconds: float) -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F

    import daskpri

    torch.set_num_threads(1)
    train, _ = daskpri.datasets.load(dataset)
    model = daskpri.models.build_model(model_name, train, seed=0)
    x = torch.as_tensor(np.asarray(train["x"].values, dtype=np.float32))
    y = torch.as_tensor(np.asarray(train["y"].values, dtype=np.int64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        idx = torch.randint(x.shape[0], (64,), generator=gen)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        n += 64
    queue.put(n / (time.perf_counter() - t0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist1d")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    print("| loops at once | samples/s of each | total | total / one alone |")
    print("| --- | --- | --- | --- |")
    alone = None
    for _ in range(args.repeats):
        for k in (1, 2):
            queue = ctx.Queue()
            procs = [ctx.Process(target=loop, args=(queue, args.dataset, args.model, args.seconds))
                     for _ in range(k)]
            for p in procs:
                p.start()
            rates = [queue.get() for _ in procs]
            for p in procs:
                p.join()
            alone = sum(rates) if k == 1 else alone
            print(f"| {k} | {', '.join(f'{r:,.0f}' for r in rates)} | {sum(rates):,.0f} | "
                  f"{sum(rates) / alone:.2f}x |")


if __name__ == "__main__":
    main()
