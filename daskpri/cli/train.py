"""``daskpri train``: a new run, or one resumed from its checkpoint."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

import numpy as np
import xarray as xr
from distributed.security import Security

import daskpri
from daskpri.cli._argtypes import _strategy_options
from daskpri.cli._interrupt import StopAtOnce, _close, _heard_as_cluster_starts, _interruptible
from daskpri.cli._paths import _check_destination, _free_sibling, _unreplaceable
from daskpri.cli._prog import _DEFAULT_CHECKPOINT_EVERY, _DEFAULT_MAX_STEPS, _PROG
from daskpri.cli._summary import _dashboard_lines, _summary
from daskpri.cli._tls import client_security
from daskpri.data.io import open_dataset, to_store
from daskpri.data.store import PathTakenError
from daskpri.strategies import check_strategy_options
from daskpri.training import checkpoint
from daskpri.training._cleanup import start_own_cluster
from daskpri.training._fit import check_fit
from daskpri.training._resume import resume_trainer
from daskpri.training.cluster import connect, one_torch_thread
from daskpri.training.early_stopping import EarlyStopping
from daskpri.training.errors import WorkersLostError
from daskpri.training.placement import assign_owners
from daskpri.training.recovery import SchedulerLostError, close_client
from daskpri.training.schedule import SCHEDULES


def _train(args: argparse.Namespace) -> int:
    options = _strategy_options(args.strategy_option)
    max_steps = args.max_steps
    if max_steps is None and args.max_time is None:
        max_steps = _DEFAULT_MAX_STEPS
    security = _security(args)
    _check_data_flags(args)
    early_stopping = _early_stopping(args)
    # where the run's results go: checked before it runs, not found bad after it
    if args.output is not None:
        _check_destination("--output", args.output, kind="store")
    if args.checkpoint is not None:
        _check_destination("--checkpoint", args.checkpoint)
        # (probed for a file just above)
        checkpoint.check_replaceable(args.checkpoint, "--checkpoint", writable=False)
    for flag, other in (("--checkpoint", args.checkpoint), ("--resume", args.resume)):
        if (args.output is not None and other is not None
                and os.path.abspath(args.output) == os.path.abspath(other)):
            raise ValueError(
                f"--output and {flag} name the same file, {args.output!r}: the history "
                "would replace the checkpoint; give them different paths"
            )
    if args.resume is None:
        settings = _new_run(args, options, max_steps)
        seed, model_name = settings["seed"], args.model or "mlp"
    else:
        state = _read_checkpoint(args.resume)
        settings = _resumed_run(args, options, max_steps, state)
        # the data of a resumed run is split by the run's own seed
        seed, model_name = state["trainer"]["seed"], state["model_spec"]["name"]
    data, eval_data, train = _data(args, seed)
    if args.resume is not None:
        _check_resumed_data(args, state, train)
    client = None if args.scheduler is None else connect(args.scheduler, security)
    trainer = None
    at_once = False  # a second Ctrl-C: the close waits for no worker long
    try:
        if args.resume is None:
            model = daskpri.models.build_model(model_name, train, seed=seed)
            trainer = daskpri.Trainer(model, client=client, **settings)
            if client is None:  # the LocalCluster's workers are known: told before it starts
                _check_batch_fits(trainer, train.sizes["sample"],
                                  "more --n-samples" if args.data is None else "more samples")
        else:
            trainer = resume_trainer(daskpri.Trainer, args.resume, None, client, settings,
                                     state=state)
        if client is None:
            _check_before_cluster(trainer, data, eval_data, max_steps, args, early_stopping)
        if args.resume is not None:  # (once it is known to go on)
            print(f"resumed {args.resume} at step {trainer.step_}", flush=True)
        if client is None:
            # started here, not by trainer.client below, so that a Ctrl-C as it starts
            # is said at once (no other thread uses the trainer yet)
            start_own_cluster(trainer, on_interrupt=_heard_as_cluster_starts)
        print("\n".join(_dashboard_lines(trainer.client)), flush=True)
        # a LocalCluster's workers have this machine's cores
        local = one_torch_thread() if client is None else contextlib.nullcontext()
        try:
            with _interruptible(trainer), local:
                history = trainer.fit(
                    data, eval_data=eval_data, max_steps=max_steps, max_time=args.max_time,
                    target_accuracy=args.target_accuracy, progress=not args.no_progress,
                    eval_chunked=args.eval_chunked, early_stopping=early_stopping,
                )
        except (KeyboardInterrupt, SchedulerLostError, WorkersLostError, OSError) as e:
            # an OSError after the first step is the machine's (a checkpoint the disk
            # cannot take); before it, a path found bad, which leaves nothing to keep
            if isinstance(e, OSError) and not trainer.step_:
                raise
            at_once = isinstance(e, StopAtOnce)
            lost = isinstance(e, SchedulerLostError)
            why = ("interrupted" if isinstance(e, KeyboardInterrupt)
                   else "the scheduler lost" if lost
                   else "its workers lost" if isinstance(e, WorkersLostError)
                   else "stopped by an error")
            if args.output is not None:  # the history so far is the driver's: kept
                _write_interrupted(trainer, args.output, args.dataset, model_name, why)
            path = trainer.checkpoint_path  # --checkpoint's, or a resumed run's own
            if path is not None and not lost:  # a lost scheduler's error names it
                step = trainer.checkpointed_step_
                print(f"no checkpoint written to {path}" if step is None else
                      f"the checkpoint in {path} is of step {step}", flush=True)
            raise
        print(_summary(history), flush=True)
        if args.output is not None:
            history.attrs.update(dataset=args.dataset, model=model_name)
            written, taken = _write_history(history, args.output)
            if taken is not None:
                print(f"{_PROG}: error: --output {args.output!r} now holds {taken}, put there "
                      f"during the run: it is left as it is, and the history is written to "
                      f"{written!r} instead", file=sys.stderr, flush=True)
                return 1
            print(f"history written to {args.output}", flush=True)
    finally:
        try:
            if trainer is not None:
                _close(trainer, at_once=at_once)  # (a Ctrl-C meanwhile: StopAtOnce)
        finally:
            if client is not None:
                close_client(client)
    return 0


def _builtin_flags(args: argparse.Namespace) -> list[str]:
    """The flags given of those that choose a built-in dataset (``--data`` excludes them)."""
    return [flag for flag, value in (("--dataset", args.dataset), ("--n-samples", args.n_samples),
                                     ("--root", args.root)) if value is not None]


def _check_data_flags(args: argparse.Namespace) -> None:
    """``--data`` (the user's own) or a built-in ``--dataset``, not both; mnist1d by default."""
    if args.data is not None:
        given = _builtin_flags(args)
        if given:
            raise ValueError(
                f"--data {args.data} trains on your own data, and {', '.join(given)} "
                "choose(s) a built-in dataset: give one or the other"
            )
        if args.target_accuracy is not None and args.eval_data is None:
            raise ValueError("--target-accuracy with --data needs --eval-data PATH, the "
                             "held-out data to measure accuracy on")
        if args.eval_chunked and args.eval_data is None:
            raise ValueError("--eval-chunked with --data needs --eval-data PATH, the "
                             "held-out data to score on the cluster")
        if args.patience is not None and args.eval_data is None:
            raise ValueError("--patience with --data needs --eval-data PATH, the held-out "
                             "data whose accuracy (or --monitor) it watches")
        args.dataset = args.data  # what the history's dataset attribute names
    elif args.eval_data is not None:
        raise ValueError("--eval-data goes with --data PATH, your own training data (a "
                         "built-in --dataset brings its own test split)")
    else:
        args.dataset = args.dataset or "mnist1d"


def _data(
    args: argparse.Namespace, seed: int
) -> tuple[xr.Dataset | str, xr.Dataset | str | None, xr.Dataset]:
    """The run's data and eval data as ``fit`` takes them, and its training set opened.

    A store given with ``--data`` goes to ``fit`` by path, so the workers
    read their partitions from it themselves; it is opened here (lazily,
    its layout checked) for the model's shape and classes, and its labels
    are read (they are small), so that a NaN among them is refused before a
    cluster starts. ``--eval-data`` is read here whole, once: the driver
    holds it to evaluate on anyway, and the checks before the cluster and
    ``fit`` take it from memory rather than each reading the file again;
    with ``--eval-chunked`` it goes to ``fit`` by path, for the workers.
    """
    if args.data is None:
        train, test = daskpri.datasets.load(
            args.dataset, root=args.root, seed=seed, n_samples=args.n_samples
        )
        return train, test, train
    path = os.path.abspath(args.data)
    train = open_dataset(path)
    train["y"].max().compute(scheduler="threads")
    evals: xr.Dataset | str | None = None
    if args.eval_data is not None and args.eval_chunked:
        evals = os.path.abspath(args.eval_data)
    elif args.eval_data is not None:
        evals = open_dataset(args.eval_data, name="eval_data")[["x", "y"]].compute(
            scheduler="threads")
    return path, evals, train


def _early_stopping(args: argparse.Namespace) -> EarlyStopping | None:
    """The fit's early stopping, from ``--patience`` and the flags that go with it."""
    given = [flag for flag, value in (("--monitor", args.monitor),
                                      ("--min-delta", args.min_delta),
                                      ("--restore-best", args.restore_best or None))
             if value is not None]
    if args.patience is None:
        if given:
            flags = (given[0] + " goes" if len(given) == 1
                     else f"{', '.join(given[:-1])} and {given[-1]} go")
            raise ValueError(f"{flags} with --patience N, the evaluations without improvement "
                             "that stop the run; give it")
        return None
    return EarlyStopping(patience=args.patience, monitor=args.monitor or "accuracy",
                         min_delta=args.min_delta or 0.0, restore_best=args.restore_best)


def _check_before_cluster(
    trainer: daskpri.Trainer, data: xr.Dataset | str, eval_data: xr.Dataset | str | None,
    max_steps: int | None, args: argparse.Namespace, early_stopping: EarlyStopping | None,
) -> None:
    """The checks ``fit`` makes on the driver before its cluster, made before ours starts.

    ``fit`` refuses data that its model cannot train on (labels out of the
    model's range, ``--eval-data`` of another shape or with such labels)
    before the trainer starts a LocalCluster; ``train`` starts its own
    first (so that a Ctrl-C as it starts is said at once), and would find
    them only after it. They are made here too, and again by ``fit``.
    """
    request = check_fit(trainer, data, eval_data, max_steps=max_steps, max_time=args.max_time,
                        target_accuracy=args.target_accuracy, progress=False,
                        eval_chunked=args.eval_chunked, early_stopping=early_stopping)
    _, n_classes = trainer._check_data(request.ds, request.info, request.source)
    if request.evalset is not None:
        request.evalset.check(n_classes)
    if trainer._resume_state is not None:  # the run's own cut, on the cluster's workers
        n_workers = trainer.n_workers or 2
        sizes = np.diff(np.asarray(trainer._resume_state["table"]["table"]["offsets"]))
        trainer._check_batch_fits(sizes, assign_owners(sizes, n_workers), n_workers)


def _security(args: argparse.Namespace) -> Security | None:
    """The client's TLS credentials from ``--tls-*`` (see :func:`client_security`).

    ``--tls`` is for the LocalCluster ``train`` starts: refused with ``--scheduler``.
    """
    if args.tls and args.scheduler is not None:
        raise ValueError("--tls starts a LocalCluster with TLS; with --scheduler, use --tls-*")
    return client_security(args, local_tls="--tls")


def _check_batch_fits(trainer: daskpri.Trainer, n_samples: int, more: str) -> None:
    """Refuse a batch over a worker's share of the data before the LocalCluster starts.

    Each worker trains a batch a step from its own share; the smallest
    share is at most an equal one, so a batch over that is refused here, as
    the trainer would refuse it once its cluster had started.
    """
    batch = getattr(trainer.strategy, "batch_size", None) or trainer.batch_size
    n_workers = trainer.n_workers or 2
    share = n_samples // n_workers
    if batch > share:
        raise ValueError(
            f"--batch-size {batch} is more than a worker's share of the data ({share} "
            f"samples: {n_samples} on {n_workers} workers), and each worker trains a batch a "
            f"step from its own share; give --batch-size {share} or less, fewer --workers, "
            f"or {more}"
        )


def _new_run(
    args: argparse.Namespace, options: dict[str, Any], max_steps: int | None
) -> dict[str, Any]:
    """The trainer's arguments for a new run (the trainer checks their values)."""
    strategy = args.strategy or "selective-backprop"
    if "batch_size" in options:
        size = options["batch_size"]
        raise ValueError(
            f"--strategy-option batch_size={size} is the trainer's batch: a strategy's "
            "batch_size is the samples per worker per step, which --batch-size sets (and "
            f"the history records); give --batch-size {size}"
        )
    check_strategy_options(strategy, options)
    if args.checkpoint_every is not None and args.checkpoint is None:
        raise ValueError("--checkpoint-every needs --checkpoint PATH, the file to write")
    lr_schedule = args.lr_schedule or "constant"
    if lr_schedule == "constant" and args.schedule_steps is not None:
        raise ValueError("--schedule-steps is the length of a decaying --lr-schedule "
                         f"({', '.join(s for s in SCHEDULES if s != 'constant')}); give one")
    schedule_steps = args.schedule_steps or max_steps
    if lr_schedule != "constant" and schedule_steps is None:
        raise ValueError(f"--lr-schedule {lr_schedule} decays over --max-steps (or "
                         "--schedule-steps); give one")
    warmup = args.warmup_steps or 0
    if lr_schedule != "constant" and warmup >= schedule_steps:
        # (the trainer refuses it too, by its parameters' names rather than the flags')
        raise ValueError(f"--warmup-steps {warmup} leaves no step for --lr-schedule "
                         f"{lr_schedule} to decay over: give fewer than its {schedule_steps} "
                         "(--max-steps, or --schedule-steps)")
    checkpoints = {}
    if args.checkpoint is not None:
        checkpoints = {"checkpoint_path": args.checkpoint,
                       "checkpoint_every": args.checkpoint_every or _DEFAULT_CHECKPOINT_EVERY}
    return dict(
        strategy=strategy, seed=0 if args.seed is None else args.seed,
        n_workers=args.workers, resources=args.resources, batch_size=args.batch_size,
        learning_rate=args.learning_rate, optimizer=args.optimizer,
        weight_decay=args.weight_decay, momentum=args.momentum, device=args.device,
        max_grad_norm=args.max_grad_norm, label_smoothing=args.label_smoothing,
        precision=args.precision,
        local_steps=1 if args.local_steps is None else args.local_steps,
        staleness=args.staleness, lr_schedule=lr_schedule,
        schedule_steps=None if lr_schedule == "constant" else schedule_steps,
        warmup_steps=warmup,
        eval_every=args.eval_every, transport=args.transport,
        security=True if args.tls else None, **checkpoints, **options,
    )


#: What ``train --resume`` may be given: the data, the budget, the outputs and
#: where the run goes on; the rest of the run comes from its checkpoint.
_RESUMABLE = (
    "--dataset, --n-samples and --root, or --data (the run's data), --eval-data, --eval-chunked, "
    "--max-steps, --max-time, "
    "--target-accuracy, --patience, --monitor, --min-delta, --restore-best, --output, "
    "--no-progress, --scheduler, --workers, --resources, --device, "
    "--transport, --tls, --tls-*, --eval-every, --checkpoint, --checkpoint-every and "
    "--schedule-steps"
)


def _checkpointed(state: dict[str, Any]) -> dict[str, Any]:
    """What a checkpointed run was started with, by the ``train`` option that sets it."""
    params = state["trainer"]
    return {
        "--model": (state["model_spec"] or {}).get("name"),
        "--strategy": state["strategy"]["name"],
        "--seed": params["seed"],
        "--batch-size": params["batch_size"],
        "--learning-rate": params["learning_rate"],
        "--optimizer": params["optimizer"],
        "--weight-decay": params.get("weight_decay", 0.0),
        "--momentum": params["momentum"],
        "--max-grad-norm": params.get("max_grad_norm"),  # absent before the option: none
        "--label-smoothing": params.get("label_smoothing", 0.0),  # the same
        "--precision": params.get("precision", "float32"),  # the same
        "--local-steps": params["local_steps"],
        "--staleness": params["staleness"],
        "--lr-schedule": params["lr_schedule"],
        "--warmup-steps": params.get("warmup_steps", 0),  # absent before the option: none
    }


def _read_checkpoint(path: str) -> dict[str, Any]:
    """The checkpoint at ``path``; ``ValueError`` where the file is not one ``train`` wrote."""
    state = checkpoint.read(path)  # refuses a file without all --resume reads (LAYOUT)
    if state["model_spec"] is None:
        raise ValueError(
            f"the run in {path!r} trained a model of its own, not a built-in one: resume it "
            "from Python, with daskpri.Trainer.resume(path, model=...)"
        )
    return state


def _resumed_run(
    args: argparse.Namespace, options: dict[str, Any], max_steps: int | None,
    state: dict[str, Any],
) -> dict[str, Any]:
    """``Trainer.resume``'s overrides; what the checkpoint fixes may only be repeated."""
    given = []
    for flag, theirs in _checkpointed(state).items():
        ours = getattr(args, flag[2:].replace("-", "_"))
        if ours is not None and ours != theirs:
            given.append(f"{flag} {ours} (the run's: {theirs})")
    name, params = state["strategy"]["name"], state["strategy"]["params"]
    for key, value in options.items():
        if key not in params or params[key] != value:
            theirs = f"{key}={params[key]}" if key in params else f"{name} takes no {key}"
            given.append(f"--strategy-option {key}={value} (the run's: {theirs})")
    if given:
        raise ValueError(
            f"--resume continues the run in {args.resume!r} as it was started, but got "
            f"{'; '.join(given)}. With --resume, give only {_RESUMABLE}"
        )
    step = state["step"]
    if max_steps is not None and max_steps <= step:
        default = "" if args.max_steps is not None else f" (the default, {_DEFAULT_MAX_STEPS})"
        raise ValueError(
            f"--max-steps counts the run's steps from its start, and the run in "
            f"{args.resume!r} is at step {step} already, but got --max-steps {max_steps}"
            f"{default}: give more than {step} to go on"
        )
    overrides: dict[str, Any] = {}
    # schedule_steps is absent from checkpoints older than the option (no schedule end)
    schedule, end = state["trainer"]["lr_schedule"], state["trainer"].get("schedule_steps")
    if args.schedule_steps is not None:
        if schedule == "constant":
            raise ValueError(f"--schedule-steps: the run in {args.resume!r} trains at a constant "
                             "learning rate, which has no schedule to stretch")
        end = overrides["schedule_steps"] = args.schedule_steps
    if schedule != "constant" and end is not None and max_steps is not None and max_steps > end:
        default = "" if args.max_steps is not None else " (the default)"
        raise ValueError(
            f"--max-steps {max_steps}{default} goes past the end of the run's {schedule} "
            "learning-rate "
            f"schedule at step {end}, after which it would train at learning rate 0: give "
            f"--max-steps {end} or less, or --schedule-steps {max_steps} to stretch the "
            "schedule to the new end"
        )
    if args.checkpoint is not None:
        every = state["trainer"]["checkpoint_every"] or _DEFAULT_CHECKPOINT_EVERY
        overrides.update(checkpoint_path=args.checkpoint,
                         checkpoint_every=args.checkpoint_every or every)
    elif args.checkpoint_every is not None:
        if state["trainer"]["checkpoint_path"] is None:
            raise ValueError(
                f"--checkpoint-every needs --checkpoint PATH, the file to write: the run in "
                f"{args.resume!r} was saved by hand and writes no checkpoints of its own"
            )
        overrides["checkpoint_every"] = args.checkpoint_every  # to the run's own file
    # where the run goes on may change
    for key, value in (("n_workers", args.workers), ("resources", args.resources),
                       ("device", args.device),
                       ("transport", args.transport), ("eval_every", args.eval_every),
                       ("security", True if args.tls else None)):
        if value is not None:
            overrides[key] = value
    return overrides


def _check_resumed_data(args: argparse.Namespace, state: dict[str, Any],
                        train: xr.Dataset) -> None:
    """Refuse data other than the resumed run's, before the cluster starts.

    The checkpoint holds what the run trained on: its model's sample shape
    and classes, and its table's sample count.
    """
    from daskpri.models import _shape_and_classes

    spec = state["model_spec"]
    theirs = (tuple(spec["in_shape"]), int(spec["n_classes"]),
              int(np.asarray(state["table"]["table"]["offsets"])[-1]))
    shape, n_classes = _shape_and_classes(train)
    ours = (tuple(shape), int(n_classes), int(train.sizes["sample"]))
    if ours != theirs:
        def said(shape: tuple[int, ...], classes: int, n: int) -> str:
            return f"{n} samples of shape {shape} in {classes} classes"

        given, same = (f"--data {args.data}", "--data") if args.data is not None else (
            f"--dataset {args.dataset}"
            + (f" --n-samples {args.n_samples}" if args.n_samples is not None else ""),
            "--dataset and --n-samples")
        raise ValueError(
            f"--resume: the run in {args.resume!r} trained on {said(*theirs)}, but {given} "
            f"gives {said(*ours)}; give the {same} the run was started with"
        )


def _write_interrupted(
    trainer: daskpri.Trainer, path: str, dataset: str, model: str, why: str = "interrupted"
) -> None:
    """Write the history of a fit that ended early (``why``) to ``path``, and say so."""
    history = trainer.history_
    if history.sizes["step"] == 0:
        print(f"{why} before the first step: no history to write", flush=True)
        return
    history.attrs.update(dataset=dataset, model=model)
    try:
        written, taken = _write_history(history, path)
    except Exception as e:  # the interrupt goes on; its history is what is lost
        # to_store's OSError names the path already ("could not write 'PATH': ...")
        reason = os.strerror(e.errno) if isinstance(e, OSError) and e.errno else e
        print(f"{_PROG}: could not write the history to {path}: {reason}", file=sys.stderr)
        return
    instead = "" if taken is None else (
        f" ({path!r} now holds {taken}, put there during the run: it is left as it is)")
    print(f"{why} at step {trainer.step_}: the history so far written to {written}{instead}",
          flush=True)


def _write_history(history: xr.Dataset, path: str) -> tuple[str, str | None]:
    """Write ``history`` to ``path``, unless something else was put there during the run.

    ``--output`` was checked before the run (:func:`_check_destination`), but
    a user may have put a store or file of their own there since: it is
    checked again, and the history goes to a new path beside it instead
    (``run-1.nc`` for ``run.nc``) rather than replacing it or being lost.

    Returns
    -------
    (str, str or None)
        The path written, and what stood at ``path`` where it was not
        ``path`` (``None`` where it was).
    """
    taken = _unreplaceable(path)
    if taken is None:
        try:
            return to_store(history, path), None
        except PathTakenError:  # put there as the history was being written: kept, as above
            taken = _unreplaceable(path) or "a store or file of another writer's"
    return to_store(history, _free_sibling(path)), taken
