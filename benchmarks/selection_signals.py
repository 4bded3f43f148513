"""Steps to a target accuracy for selection signals, in one process, scored afresh every step.

Run, for example::

    python benchmarks/selection_signals.py --dataset mnist5k --model mlp --target 0.9385 \\
        --lr 0.3 --seeds 8 --arm uniform --arm loss --arm loss:skip=0.03 --arm rho

A reference for the signal alone, without the cluster, the table or
staleness: each step draws ``--candidates`` samples (a shuffled pass over
the training set), forwards them all, and trains on the ``--batch`` that
rank highest; ``uniform`` trains on ``--batch`` samples in walk order.
SGD with momentum 0.9, one thread; evaluation every ``--eval-every``
steps is not counted. Arms (``NAME[:OPTION=VALUE...]``):

- ``uniform``: plain mini-batch SGD.
- ``loss``: the highest losses (``selective-backprop``'s top fraction,
  with ``fraction = batch / candidates``).
- ``rho``: the highest reducible losses, loss minus irreducible loss
  (RHO-LOSS, Mindermann et al. 2022). The irreducible loss of each
  sample comes from a model of the same architecture trained for
  ``il_epochs`` (default 3) on the other half of the training set (two
  halves, each scoring the other, as the paper does without a holdout
  set); its training is not charged to the steps.
- ``skip=q`` (with ``loss`` or ``rho``): pass over the top ``q`` of the
  ranking first, so that samples that stay hard (ambiguous or mislabelled)
  are not trained on at every step.
- ``projection``: the highest ``g_i . g_bar``, the paper's priority (the
  ``projection`` strategy's), ``g_bar`` the running mean of the steps'
  gradients (decay 0.9, as the strategy's ``mean_grad_decay``). Every
  candidate's is one forward-mode derivative of its loss along ``g_bar``
  (``torch.func.jvp``), without per-sample gradients. ``sign=-1`` ranks
  by ``-g_i . g_bar`` instead (the samples the mean step hurts most).
- ``gradnorm``: the highest norm of the loss gradient with respect to the
  logits, ``upper-bound``'s score, ranked rather than sampled.
- ``margin``: the smallest margin of the true class's logit over the
  highest other one (negative when misclassified), rather than the loss,
  which counts every other class's probability.
- ``entropy``: the highest entropy of the predicted distribution, the
  label-free uncertainty of active learning.
- ``classbal``: the highest losses within each class, each class given
  the share of the batch it has among the candidates (rounded, largest
  remainders first), so that the batch is stratified as a uniform one is.
- ``proxy``: the highest losses under a small proxy model (the built-in
  MLP, SGD with momentum at ``proxy_lr``, default 0.3) trained on every
  step's batch beside the model, so that scoring costs the proxy's
  forward pass rather than the model's (selection via proxy, Coleman et
  al. 2020). ``narrow=1``: the proxy is instead a CNN of 4 and 8
  channels (for image datasets; the built-in one has more).
- ``warmup=e`` (with any arm): the first ``e`` epochs (of the training
  set, ``--batch`` a step) are plain steps, as ``selective-backprop``'s
  ``warmup``. Without it (the default) loss ranking starts from the
  untrained model, which costs it steps: on the ``mnist5k`` CNN (lr 0.1,
  8 seeds, to 0.9553) the top losses took 120 steps from the start and
  76 after a warmup epoch (two seeds never, in 400), the entropy 76
  from the start (every seed) and 88 after one (thirty-fifth session).
- ``lw=b`` (with any arm): each trained row's loss weighted by its loss
  to the power ``b`` (weights of mean 1), from the step's own forward
  pass, so it costs nothing: a soft prioritization within the batch, as
  the focal loss weights by ``(1 - p) ** gamma``.
- ``ema=d`` (with any arm): evaluate an exponential moving average of
  the weights (decay ``d``, ``torch.optim.swa_utils.AveragedModel``)
  rather than the weights themselves.
- ``momentum=m``, ``nesterov=1``, ``lr=x`` (with any arm): the arm's SGD
  (momentum 0.9 and ``--lr`` otherwise).
- ``mix=q`` (with a ranking arm): only a share ``q`` of the batch from
  the top of the ranking, the rest drawn uniformly from the candidates
  left, so that every step keeps part of a uniform batch.
- ``ls=e`` (with any arm): label smoothing ``e`` in the training loss
  (``F.cross_entropy(..., label_smoothing=e)``); the scores stay the
  plain loss.
- ``ramp=e`` (with a ranking arm): the candidates grow linearly from
  ``--batch`` (a uniform step) to ``--candidates`` over the first ``e``
  epochs after any warmup, so that selection sharpens as the model learns.
- ``sampled``: a draw without replacement with probability proportional
  to ``loss ** alpha`` (``alpha`` default 1; Gumbel top-k), no importance
  weights: between uniform (``alpha=0``) and the top losses (large
  ``alpha``).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, jvp
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import daskpri
from daskpri.models import build_model
from daskpri.replicas.replica import sample_entropies

#: the selection signals an arm may name
ARMS = ("uniform", "loss", "rho", "projection", "gradnorm", "margin", "entropy", "classbal",
        "sampled", "proxy")


def parse_arm(text: str) -> tuple[str, dict[str, float]]:
    """``NAME[:OPTION=VALUE...]`` as (name, options).

    Examples
    --------
    >>> parse_arm("rho:skip=0.05:il_epochs=10")
    ('rho', {'skip': 0.05, 'il_epochs': 10.0})
    """
    name, *items = text.split(":")
    if name not in ARMS:
        raise argparse.ArgumentTypeError(
            f"an arm's name should be one of {', '.join(ARMS)}, but got {name!r}"
        )
    options = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in ("skip", "il_epochs", "sign", "alpha", "warmup", "proxy_lr", "narrow",
                       "lw", "ema", "momentum", "nesterov", "lr", "mix", "ls", "ramp"):
            raise argparse.ArgumentTypeError(
                f"arm {text!r}: options are skip, il_epochs, sign, alpha, warmup, proxy_lr, "
                f"narrow, lw, ema, momentum, nesterov, lr, mix, ls and ramp, "
                f"but got {key!r}"
            )
        options[key] = float(value)
    return name, options


class Walk:
    """Shuffled passes over ``n`` samples, drawn ``k`` at a time (a new pass when one runs out)."""

    def __init__(self, n: int, generator: torch.Generator) -> None:
        self.n, self.generator = n, generator
        self.order, self.at = torch.randperm(n, generator=generator), 0

    def draw(self, k: int) -> torch.Tensor:
        if self.at + k > self.n:
            self.order, self.at = torch.randperm(self.n, generator=self.generator), 0
        self.at += k
        return self.order[self.at - k:self.at]


def irreducible_losses(model_name, train, x, y, *, seed, lr, batch, epochs) -> torch.Tensor:
    """Each sample's loss under a model trained on the other half of the data."""
    n = len(x)
    generator = torch.Generator().manual_seed(1000 + seed)
    halves = torch.randperm(n, generator=generator).chunk(2)
    losses = torch.zeros(n)
    for h, (fit, scored) in enumerate([halves, halves[::-1]]):
        model = build_model(model_name, train, seed=seed + 77 + h)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        walk = Walk(len(fit), generator)
        for _ in range(epochs * (len(fit) // batch)):
            rows = fit[walk.draw(batch)]
            optimizer.zero_grad()
            F.cross_entropy(model(x[rows]), y[rows]).backward()
            optimizer.step()
        with torch.no_grad():
            losses[scored] = F.cross_entropy(model(x[scored]), y[scored], reduction="none")
    return losses


def projections(model, direction, x, y) -> torch.Tensor:
    """Each row's ``grad L_i . direction``: one forward-mode derivative of the losses."""
    params = {n: p.detach() for n, p in model.named_parameters()}

    def losses(p):
        return F.cross_entropy(functional_call(model, p, (x,)), y, reduction="none")

    return jvp(losses, (params,), (direction,))[1]


def class_balanced(score: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the ``k`` rows with the highest score within each class, stratified.

    Each class gets ``k`` times its share of the rows (largest remainders
    rounded up), and its highest-scoring rows fill it.

    Examples
    --------
    >>> score = torch.tensor([5.0, 1.0, 4.0, 3.0, 2.0, 0.0])
    >>> labels = torch.tensor([0, 0, 0, 1, 1, 1])
    >>> sorted(class_balanced(score, labels, 4).tolist())
    [0, 2, 3, 4]
    """
    classes, counts = labels.unique(return_counts=True)
    quota = counts.double() * k / len(labels)
    take = quota.floor().long()
    short = k - int(take.sum())
    take[(quota - take).argsort(descending=True)[:short]] += 1
    chosen = []
    for c, n in zip(classes.tolist(), take.tolist(), strict=True):
        rows = (labels == c).nonzero().flatten()
        chosen.append(rows[score[rows].argsort(descending=True)[:n]])
    return torch.cat(chosen)


def narrow_cnn(train, seed: int) -> torch.nn.Module:
    """A CNN of 4 and 8 channels for one-channel images, a cheap proxy."""
    if train.x.ndim != 4 or train.x.shape[1] != 1:
        raise SystemExit(f"narrow=1 needs one-channel images (samples of shape (1, H, W)), "
                         f"but the samples have shape {tuple(train.x.shape[1:])}")
    torch.manual_seed(seed)
    h, w = train.x.shape[-2:]
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(8 * (h // 4) * (w // 4), int(train.y.max()) + 1),
    )


def steps_to_target(arm, options, data, args, seed) -> int | None:
    """The first evaluated step at which one seed of one arm reaches the target."""
    train, x, y, x_test, y_test = data
    torch.manual_seed(seed)
    model = build_model(args.model, train, seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=options.get("lr", args.lr),
                                momentum=options.get("momentum", 0.9),
                                nesterov=bool(options.get("nesterov", 0)))
    irreducible = None
    if arm == "rho":
        irreducible = irreducible_losses(
            args.model, train, x, y, seed=seed, lr=args.lr, batch=args.batch,
            epochs=int(options.get("il_epochs", 3)),
        )
    proxy = proxy_opt = None
    if arm == "proxy":
        proxy = (narrow_cnn(train, seed + 500) if options.get("narrow")
                 else build_model("mlp", train, seed=seed + 500))
        proxy_opt = torch.optim.SGD(proxy.parameters(), lr=options.get("proxy_lr", 0.3),
                                    momentum=0.9)
    averaged = None
    if options.get("ema"):
        averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(options["ema"]))
    walk = Walk(len(x), torch.Generator().manual_seed(seed))
    draws = torch.Generator().manual_seed(2000 + seed)
    skip = options.get("skip", 0.0)
    mean_grad: dict[str, torch.Tensor] | None = None
    for step in range(1, args.max_steps + 1):
        warming = step <= options.get("warmup", 0.0) * len(x) / args.batch
        if arm == "uniform" or warming or (arm == "projection" and mean_grad is None):
            rows = walk.draw(args.batch)
        else:
            n_candidates = args.candidates
            if options.get("ramp"):
                warm_steps = options.get("warmup", 0.0) * len(x) / args.batch
                ramp_steps = options["ramp"] * len(x) / args.batch
                share = min(1.0, (step - warm_steps) / ramp_steps)
                n_candidates = round(args.batch + share * (args.candidates - args.batch))
            candidates = walk.draw(n_candidates)
            with torch.no_grad():
                if arm == "projection":
                    score = options.get("sign", 1.0) * projections(
                        model, mean_grad, x[candidates], y[candidates])
                elif arm == "gradnorm":
                    p = model(x[candidates]).softmax(1)
                    p[torch.arange(len(candidates)), y[candidates]] -= 1.0
                    score = p.norm(dim=1)
                elif arm == "margin":
                    logits = model(x[candidates])
                    true = logits.gather(1, y[candidates, None]).squeeze(1)
                    logits.scatter_(1, y[candidates, None], -torch.inf)
                    score = logits.max(1).values - true
                elif arm == "proxy":
                    score = F.cross_entropy(proxy(x[candidates]), y[candidates],
                                            reduction="none")
                elif arm == "entropy":
                    score = sample_entropies(model(x[candidates]))
                else:
                    score = F.cross_entropy(model(x[candidates]), y[candidates],
                                            reduction="none")
            if irreducible is not None:
                score = score - irreducible[candidates]
            first = int(skip * args.candidates)
            if arm == "classbal":
                rows = candidates[class_balanced(score, y[candidates], args.batch)]
            elif arm == "sampled":
                keys = options.get("alpha", 1.0) * score.clamp_min(1e-12).log()
                gumbel = -torch.empty_like(keys).exponential_(generator=draws).log()
                rows = candidates[(keys + gumbel).argsort(descending=True)[:args.batch]]
            elif options.get("mix"):
                order = score.argsort(descending=True)
                top = round(options["mix"] * args.batch)
                rest = order[top:][torch.randperm(len(order) - top, generator=draws)]
                rows = candidates[torch.cat([order[:top], rest[:args.batch - top]])]
            else:
                rows = candidates[score.argsort(descending=True)[first:first + args.batch]]
        optimizer.zero_grad()
        losses = F.cross_entropy(model(x[rows]), y[rows], reduction="none",
                                 label_smoothing=options.get("ls", 0.0))
        if options.get("lw"):
            weights = (losses.detach() / losses.detach().mean()) ** options["lw"]
            losses = losses * (weights / weights.mean())
        losses.mean().backward()
        if arm == "projection":
            grads = {n: p.grad.detach() for n, p in model.named_parameters()}
            mean_grad = ({n: g.clone() for n, g in grads.items()} if mean_grad is None
                         else {n: 0.9 * mean_grad[n] + 0.1 * grads[n] for n in grads})
        optimizer.step()
        if averaged is not None:
            averaged.update_parameters(model)
        if proxy is not None:
            proxy_opt.zero_grad()
            F.cross_entropy(proxy(x[rows]), y[rows]).backward()
            proxy_opt.step()
        if step % args.eval_every == 0:
            with torch.no_grad():
                judged = model if averaged is None else averaged
                accuracy = (judged(x_test).argmax(1) == y_test).float().mean().item()
            if accuracy >= args.target:
                return step
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist5k")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--target", type=float, required=True)
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--batch", type=int, default=128, help="samples trained on a step")
    parser.add_argument("--candidates", type=int, default=384, help="samples scored a step")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--arm", type=parse_arm, action="append", required=True)
    args = parser.parse_args()
    if not 0 < args.batch <= args.candidates:
        parser.error(f"--batch should be in 1..--candidates, but got {args.batch}")
    torch.set_num_threads(1)
    train, test = daskpri.datasets.load(args.dataset)
    data = (train, torch.tensor(train.x.values), torch.tensor(train.y.values),
            torch.tensor(test.x.values), torch.tensor(test.y.values))
    for arm, options in args.arm:
        steps = [steps_to_target(arm, options, data, args, seed) for seed in range(args.seeds)]
        median = np.median([s if s is not None else np.inf for s in steps])
        label = ":".join([arm, *(f"{k}={v:g}" for k, v in options.items())])
        print(f"{label:24s} median {median:g} steps; each seed {steps}", flush=True)


if __name__ == "__main__":
    main()
