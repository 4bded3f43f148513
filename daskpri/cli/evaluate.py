"""``daskpri evaluate`` and ``daskpri predict``: a checkpoint's model on other data."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import xarray as xr
from distributed import Client, as_completed, futures_of
from tqdm.auto import tqdm
from tqdm.dask import TqdmCallback

import daskpri
from daskpri.cli._paths import _check_destination
from daskpri.cli._tls import client_security
from daskpri.cli.train import _builtin_flags, _check_resumed_data
from daskpri.data.store import to_store
from daskpri.training import checkpoint
from daskpri.training._resume import resume_trainer
from daskpri.training.cluster import connect
from daskpri.training.recovery import close_client


def _evaluate(args: argparse.Namespace) -> int:
    """Score the model of ``args.checkpoint`` on ``--data`` or the test split of ``--dataset``.

    The test split is the one ``train`` evaluated on: the built-in dataset
    split by the run's own seed, its training split checked against the run's
    sample count (another ``--n-samples`` gives another split). On the
    driver, or with ``--scheduler`` a task per chunk on the cluster's workers.
    """
    if args.data is not None:
        given = _builtin_flags(args)
        if given:
            raise ValueError(
                f"--data names the held-out data to score, and {', '.join(given)} "
                "choose(s) a built-in dataset's test split: give one or the other")
    security = client_security(args)
    state = checkpoint.read(args.checkpoint)  # refuses what is no daskpri checkpoint
    if state["model_spec"] is None:
        raise ValueError(
            f"the run in {args.checkpoint!r} trained a model of its own, not a built-in one: "
            "score it from Python, with daskpri.Trainer.resume(path, model=...).evaluate(data)"
        )
    seed = state["trainer"]["seed"]
    if args.data is None:
        args.dataset = args.dataset or "mnist1d"
        train, data = daskpri.datasets.load(args.dataset, root=args.root, seed=seed,
                                            n_samples=args.n_samples)
        try:  # (the checkpoint named as train --resume's)
            _check_resumed_data(argparse.Namespace(**vars(args), resume=args.checkpoint),
                                state, train)
        except ValueError as e:
            raise ValueError(str(e).replace("--resume: ", "")) from None
        what: Any = data
        where = f"the test split of {args.dataset}"
    else:
        what = where = args.data
    # on a cluster: scored a task per chunk by its workers (the default client's)
    client = None if args.scheduler is None else connect(args.scheduler, security)
    try:
        trainer = resume_trainer(daskpri.Trainer, args.checkpoint, None, None,
                                 {"checkpoint_path": None}, state=state)
        try:
            scores = trainer.evaluate(what, batch_size=args.batch_size,
                                      chunked=client is not None, device=args.device)
        finally:
            trainer.close()
    finally:
        if client is not None:
            close_client(client)
    if args.json:
        print(json.dumps({"checkpoint": args.checkpoint, "step": trainer.step_,
                          "strategy": trainer.strategy.name, "data": where, **scores}))
    else:
        print(f"{args.checkpoint} (step {trainer.step_}, {trainer.strategy.name}): accuracy "
              f"{scores['accuracy']:.4f}, loss {scores['loss']:.4f} on {scores['samples']:,} "
              f"samples of {where}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    """Write the logits and predicted classes of ``args.checkpoint``'s model on ``--data``.

    Computed a task per chunk of samples: on the ``--scheduler`` cluster's
    workers (which read ``--data``), or by this process's threads.
    """
    if os.path.lexists(args.output):
        raise ValueError(f"--output {args.output!r} exists: predictions replace no file or "
                         "store; remove it, or name another path")
    _check_destination("--output", args.output)
    security = client_security(args)
    state = checkpoint.read(args.checkpoint)
    if state["model_spec"] is None:
        raise ValueError(
            f"the run in {args.checkpoint!r} trained a model of its own, not a built-in one: "
            "predict from Python, with daskpri.Trainer.resume(path, model=...).predict(data)"
        )
    client = None if args.scheduler is None else connect(args.scheduler, security)
    try:
        trainer = resume_trainer(daskpri.Trainer, args.checkpoint, None, None,
                                 {"checkpoint_path": None}, state=state)
        try:
            logits = trainer.predict(args.data, batch_size=args.batch_size, device=args.device)
        finally:
            trainer.close()
        out = logits.to_dataset().assign(predicted=logits.argmax("class").astype("int64"))
        out["predicted"].attrs["long_name"] = "the class of the largest logit"
        out.attrs.update(checkpoint=os.path.abspath(args.checkpoint), step=trainer.step_,
                         strategy=trainer.strategy.name, model=state["model_spec"]["name"],
                         data=os.path.abspath(args.data))
        # computed by the client's cluster (to_store then fetches them chunk by chunk),
        # else by this process's threads; the logits are small beside the data
        out = _computed(out, client, progress=not args.no_progress)
        to_store(out, args.output)
    finally:
        if client is not None:
            close_client(client)
    print(f"predictions of {out.sizes['sample']:,} samples written to {args.output} "
          f"(step {trainer.step_}, {trainer.strategy.name})")
    return 0


def _computed(out: xr.Dataset, client: Client | None, *, progress: bool) -> xr.Dataset:
    """``out`` persisted by ``client``'s cluster, else by threads; a tqdm bar on stderr.

    The bar counts the threads' tasks (``tqdm.dask``), or the cluster's
    chunks of the result as they are done, as ``train``'s bar counts steps.
    """
    if client is None:
        with TqdmCallback(desc="predict", unit="task", disable=not progress):
            return out.persist(scheduler="threads")
    out = client.persist(out)
    futures = futures_of(out)
    with tqdm(total=len(futures), desc="predict", unit="chunk", disable=not progress) as bar:
        for _ in as_completed(futures):
            bar.update()
    return out
