"""How well an older loss ranks the candidates that a fresh scoring pass would keep.

Run, for example::

    python benchmarks/rank_drift.py --dataset mnist5k --model cnn --lr 0.075 --epochs 12

One process, one thread, ``selective-backprop``'s default shape: one epoch
of plain mini-batch steps (``--batch``), then each step scores
``--candidates`` samples of a shuffled pass afresh and trains on the
``--batch`` of highest loss, SGD with momentum 0.9. At every fresh step it
also ranks the same candidates by their losses from 1, 2, 4 and 8 epochs
before (each epoch scores every sample once; the first epoch's are the
plain steps' training losses) and prints, per epoch, the recall of the
fresh top ``--batch`` under each older ranking: the share of the fresh
selection that a stale step (``refresh``) would also have kept. Chance is
``batch / candidates``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

import daskpri
from daskpri.models import build_model

#: the ages, in epochs, of the losses compared with a fresh pass's
LAGS = (1, 2, 4, 8)


def recall(fresh: np.ndarray, old: np.ndarray, k: int) -> float:
    """Share of the ``k`` highest of ``fresh`` that are among the ``k`` highest of ``old``.

    Examples
    --------
    >>> recall(np.array([4.0, 3.0, 2.0, 1.0]), np.array([4.0, 1.0, 3.0, 2.0]), 2)
    0.5
    """
    top = np.argsort(-fresh, kind="stable")[:k]
    return np.intersect1d(top, np.argsort(-old, kind="stable")[:k]).size / k


def run(data, args, seed: int) -> list[tuple[int, float, dict[int, float]]]:
    """Each epoch's test accuracy and mean recall at each lag, for one seed."""
    x, y, x_test, y_test, train = data
    n = len(x)
    torch.manual_seed(seed)
    model = build_model(args.model, train, seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    generator = torch.Generator().manual_seed(seed)
    scored: dict[int, np.ndarray] = {}  # epoch -> each sample's loss in that epoch
    out = []
    for epoch in range(args.epochs):
        order = torch.randperm(n, generator=generator)
        losses = np.full(n, np.nan)
        recalls: dict[int, list[float]] = {lag: [] for lag in LAGS}
        draw = args.batch if epoch == 0 else args.candidates
        for start in range(0, n - draw + 1, draw):
            cand = order[start:start + draw]
            rows = cand
            if epoch > 0:
                model.eval()
                with torch.no_grad():
                    fresh = F.cross_entropy(model(x[cand]), y[cand], reduction="none").numpy()
                model.train()
                losses[cand.numpy()] = fresh
                for lag in LAGS:
                    if epoch - lag in scored:
                        recalls[lag].append(
                            recall(fresh, scored[epoch - lag][cand.numpy()], args.batch))
                rows = cand[np.sort(np.argsort(-fresh, kind="stable")[:args.batch])]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[rows]), y[rows], reduction="none")
            loss.mean().backward()
            optimizer.step()
            if epoch == 0:
                losses[rows.numpy()] = loss.detach().numpy()
        scored[epoch] = losses
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        model.train()
        out.append((epoch, accuracy, {lag: float(np.mean(r)) for lag, r in recalls.items() if r}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist5k")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch", type=int, default=64, help="samples trained on a step")
    parser.add_argument("--candidates", type=int, default=256, help="samples scored a step")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    if not 0 < args.batch <= args.candidates:
        parser.error(f"--batch should be in 1..--candidates, but got {args.batch}")
    torch.set_num_threads(1)
    train, test = daskpri.datasets.load(args.dataset)
    data = (torch.tensor(train.x.values), torch.tensor(train.y.values),
            torch.tensor(test.x.values), torch.tensor(test.y.values), train)
    runs = [run(data, args, seed) for seed in range(args.seeds)]
    print(f"{args.dataset} {args.model}, lr {args.lr:g}; recall of the fresh top {args.batch} "
          f"of {args.candidates} under losses 1, 2, 4, 8 epochs old (chance "
          f"{args.batch / args.candidates:.2f}), mean over {args.seeds} seeds")
    for epoch in range(args.epochs):
        accuracy = np.mean([r[epoch][1] for r in runs])
        cells = [f"{lag}: {np.mean([r[epoch][2][lag] for r in runs]):.2f}"
                 for lag in LAGS if lag in runs[0][epoch][2]]
        print(f"epoch {epoch:3d}  test accuracy {accuracy:.4f}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
