"""``daskpri bench``: its arguments and what it runs.

Examples
--------
The quick version (under 5 minutes on 2 cores)::

    daskpri bench --quick --out bench-quick

The full comparison on the paper's models, 3 seeds, 1 and 2 workers::

    daskpri bench --datasets mnist1d,mnist5k --models mlp,cnn --seeds 3 \\
        --workers 1,2 --budget 120 --out bench
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

# only what the parser needs, none of which imports torch: `daskpri --help` stays quick
from daskpri._choices import PRECISIONS
from daskpri.bench._defaults import FULL_DEFAULTS, QUICK_DEFAULTS
from daskpri.bench._options import StrategyOptionError
from daskpri.table.staleness import STALENESS_MODELS

if TYPE_CHECKING:
    from daskpri.bench.config import BenchConfig

__all__ = ["add_arguments", "run"]


def _listof(kind: Callable[[str], Any], what: str) -> Callable[[str], tuple[Any, ...]]:
    """An argparse type: a comma-separated list of ``kind``, each item once, none empty.

    ``--workers 1,,2`` or ``--strategies uniform,uniform`` is more likely a
    slip than what was meant. :class:`BenchConfig` refuses a repeated or
    missing item too (for the Python API); checking here as well gives an
    error that names the flag and quotes the text as typed.

    Examples
    --------
    >>> _listof(int, "integers")("1,2")
    (1, 2)
    >>> _listof(float, "numbers")("0.1,0.10")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: should name each item once, but got '0.1,0.10' (0.1 more than once)
    """

    def parse(text: str) -> tuple[Any, ...]:
        if text.strip() and any(not item.strip() for item in text.split(",")):
            raise argparse.ArgumentTypeError(
                f"should be a comma-separated list without empty items, but got {text!r}"
            )
        try:
            values = tuple(kind(v.strip()) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"should be a comma-separated list of {what}, e.g. "
                f"{'1,2' if kind is int else '0.025,0.05' if kind is float else 'a,b'}, "
                f"but got {text!r}"
            ) from None
        if not values:
            raise argparse.ArgumentTypeError(f"should name at least one of {what}")
        repeated = sorted({str(v) for v in values if values.count(v) > 1})
        if repeated:
            raise argparse.ArgumentTypeError(
                f"should name each item once, but got {text!r} ({', '.join(repeated)} "
                "more than once)"
            )
        return values

    parse.__name__ = f"list of {what}"  # argparse names the type in some errors
    return parse


def _defaults(key: str) -> str:
    def show(v: Any) -> str:
        return ",".join(map(str, v)) if isinstance(v, tuple) else str(v)

    return f"default {show(FULL_DEFAULTS[key])}; --quick: {show(QUICK_DEFAULTS[key])}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``parser``; ``None`` defaults mean "per --quick"."""
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="directory for results.json, results.md, PNGs and results.html "
                             "(a standalone page, Bokeh's JavaScript inline: it opens offline)")
    parser.add_argument("--quick", action="store_true",
                        help="a short run: mnist1d, mlp, 3 arms, 1 seed, 15 s budgets")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs of DIR/results.json (made with the same options; "
                             "--seeds and --first-seed may take in more seeds than it has) and "
                             "make only the rest: after an interruption, or to add seeds")
    parser.add_argument("--report-only", action="store_true",
                        help="make no runs: write the report of DIR/results.json as it stands "
                             "(a benchmark stopped part way; the file's own options are used)")
    parser.add_argument("--merge", type=_listof(str, "directories"), metavar="DIR,DIR[,...]",
                        help="make no runs: pool the seeds of benchmarks run in parts (same "
                             "options and machine, seeds that follow on, e.g. --first-seed 10 "
                             "and 20 with --seeds 10) into one report in --out; --strategies "
                             "picks the arms (default: those every part ran)")
    what = parser.add_argument_group("what is compared")
    what.add_argument("--datasets", type=_listof(str, "datasets"), metavar="D[,D...]",
                      help=_defaults("datasets"))
    what.add_argument("--models", type=_listof(str, "models"), metavar="M[,M...]",
                      help=_defaults("models"))
    what.add_argument("--strategies", type=_listof(str, "strategies"), metavar="S[,S...]",
                      help=_defaults("strategies") + " (uniform is always run); NAME+LABEL "
                           "is a second arm of strategy NAME with its own --strategy-option, "
                           "e.g. selective-backprop+stale")
    what.add_argument("--n-samples", type=int, metavar="N",
                      help="samples of each dataset, train and test together")
    what.add_argument("--root", metavar="DIR",
                      help="directory of the mnist or cifar10 files (for --datasets mnist, "
                           "cifar10; daskpri downloads nothing)")
    how = parser.add_argument_group("protocol")
    how.add_argument("--seeds", type=int, metavar="N", help=_defaults("seeds"))
    how.add_argument("--first-seed", type=int, metavar="N",
                     help="the first seed (default 0): another run's seeds draw other weights "
                          "and selections")
    how.add_argument("--budget", type=float, metavar="S",
                     help="seconds of training per run, " + _defaults("budget"))
    how.add_argument("--learning-rates", type=_listof(float, "numbers"), metavar="LR[,LR...]",
                     help="the sweep, " + _defaults("learning_rates"))
    how.add_argument("--pick", choices=("time", "final"),
                     help="how each arm's learning rate is chosen from the sweep: the one "
                          "reaching the highest target soonest (time, the default; the target "
                          "from uniform's best accuracy at any learning rate), or the one of "
                          "best final accuracy (final)")
    how.add_argument("--batch-size", type=int, metavar="N",
                     help="samples per worker per step (default: the trainer's, 64)")
    how.add_argument("--eval-every", type=int, metavar="N",
                     help="steps between evaluations: with --local-steps K above 1, at most K "
                          "(every round) or a multiple of K (default: about 20, in whole rounds)")
    how.add_argument("--baseline-budget", type=float, metavar="S",
                     help="seconds of the plain PyTorch and DDP runs (default --budget; "
                          "--quick: 5)")
    how.add_argument("--no-ddp", action="store_true", help="do not measure PyTorch DDP")
    how.add_argument("--max-grad-norm", type=float, metavar="NORM",
                     help="clip the gradients of every run and baseline to this L2 norm "
                          "(default: daskpri.trainer.max-grad-norm, null: no clipping)")
    how.add_argument("--label-smoothing", type=float, metavar="EPS",
                     help="label smoothing of the training loss of every run and baseline, in "
                          "[0, 1) (default: daskpri.trainer.label-smoothing, 0: none)")
    how.add_argument("--precision", choices=PRECISIONS,
                     help="the training passes of every run and baseline: float32, or "
                          "bfloat16 under torch.autocast (default: daskpri.trainer.precision, "
                          "float32)")
    how.add_argument("--local-steps", type=int, metavar="K",
                     help="optimizer steps per worker per round trip (local SGD; default 1) "
                     "in the runs of strategies that allow it")
    how.add_argument("--staleness", choices=STALENESS_MODELS,
                     help="the priority table's staleness model in the daskpri runs (default: "
                          "daskpri.table.staleness, keep)")
    how.add_argument("--strategy-option", type=_arm_option, action="append",
                     metavar="STRATEGY[@MODEL]:KEY=VALUE",
                     help="an option of one strategy's arms, e.g. selective-backprop:fraction=0.33;"
                          " with @MODEL only on that model's runs, e.g. "
                          "selective-backprop@mlp:fraction=0.25")
    where = parser.add_argument_group("cluster")
    where.add_argument("--workers", type=_listof(int, "integers"), metavar="N[,N...]",
                       help="worker counts; the comparison runs on the largest, "
                            + _defaults("workers"))
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="a running scheduler (default: a LocalCluster per worker count)")
    # here, not at the top: daskpri.cli's parser imports this module for the bench command
    from daskpri.cli._tls import add_tls_arguments

    add_tls_arguments(parser.add_argument_group("TLS (with a tls:// --scheduler)"))
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


#: fields of :class:`BenchConfig` whose flag is not their name with dashes
_FLAGS = {"strategy_options": "--strategy-option"}


def as_flags(message: str, fields: Iterable[str]) -> str:
    """``message`` of :class:`BenchConfig` with its ``fields`` named as the flags they come from.

    Examples
    --------
    >>> as_flags("baseline_budget should be positive, but got baseline_budget=-5.0",
    ...          ["baseline_budget"])
    '--baseline-budget should be positive, but got --baseline-budget -5.0'
    """
    for field in fields:
        flag = _FLAGS.get(field, "--" + field.replace("_", "-"))
        message = re.sub(rf"\b{field}=(?=[^\s,;:)]+)", flag + " ", message)
        message = re.sub(rf"^{field}\b", flag, message)
    return message


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The :class:`BenchConfig` the arguments ask for (trainer defaults from dask.config).

    Its errors name the flags (``--baseline-budget``, not ``baseline_budget``).
    """
    try:
        return _config_from_args(args)
    except StrategyOptionError as e:  # its entry as typed, STRATEGY[@MODEL]:KEY=VALUE
        raise ValueError(e.as_flags()) from None
    except ValueError as e:
        given = [k for k, v in vars(args).items() if v is not None and v is not False]
        if args.strategy_option:
            given.append("strategy_options")
        raise ValueError(as_flags(str(e), given)) from None


def _config_from_args(args: argparse.Namespace) -> BenchConfig:
    from daskpri import _config
    from daskpri.bench.baselines import start_method
    from daskpri.bench.config import BenchConfig

    start_method()  # a bad daskpri.bench.start-method, refused before the first run

    return BenchConfig.from_options(
        quick=args.quick,
        datasets=args.datasets,
        models=args.models,
        strategies=args.strategies,
        seeds=args.seeds,
        first_seed=args.first_seed,
        workers=args.workers,
        learning_rates=args.learning_rates,
        budget=args.budget,
        pick=args.pick,
        baseline_budget=args.baseline_budget,
        batch_size=_config.get("trainer.batch-size", args.batch_size),
        eval_every=args.eval_every,
        n_samples=args.n_samples,
        partition_size=_config.get("trainer.partition-size"),
        momentum=float(_config.get("trainer.momentum")),
        max_grad_norm=_config.get("trainer.max-grad-norm", args.max_grad_norm),
        label_smoothing=float(_config.get("trainer.label-smoothing", args.label_smoothing)),
        precision=_config.get("trainer.precision", args.precision),
        ddp=not args.no_ddp,
        local_steps=args.local_steps,
        staleness=_config.get("table.staleness", args.staleness),
        strategy_options=tuple(args.strategy_option or ()) or None,
        scheduler=args.scheduler,
    )


def _arm_option(text: str) -> tuple[str, str, Any, str | None]:
    """``STRATEGY[@MODEL]:KEY=VALUE`` as (strategy, key, value, model or None).

    The value is parsed as ``train`` parses it.
    """
    # here, not at the top: daskpri.cli's parser imports this module for the bench command
    from daskpri.cli._argtypes import _parse_value

    strategy, sep, rest = text.partition(":")
    strategy, at, model = strategy.partition("@")
    key, eq, value = rest.partition("=")
    if (not sep or not eq or not strategy.strip() or not key.strip().isidentifier()
            or (at and not model.strip())):
        raise argparse.ArgumentTypeError(
            "a strategy option should look like STRATEGY[@MODEL]:KEY=VALUE, e.g. "
            f"selective-backprop:fraction=0.33 or selective-backprop@mlp:fraction=0.25, "
            f"but got {text!r}"
        )
    return strategy.strip(), key.strip(), _parse_value(value.strip()), model.strip() or None


def _command_line(args: argparse.Namespace) -> str:
    """The command, rebuilt from the options given (for the report)."""
    parts = ["daskpri", "bench"]
    for key, value in vars(args).items():
        if key in ("run", "command") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif key == "strategy_option":
            for strategy, k, v, model in value:
                scope = "" if model is None else f"@{model}"
                parts += [flag, f"{strategy}{scope}:{k}={v}"]
        elif isinstance(value, tuple):
            # repr: the shortest text that reads back as the same float
            parts += [flag, ",".join(map(repr if isinstance(value[0], float) else str, value))]
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)


#: The options ``--merge`` takes (the rest are the parts' own); ``--traceback`` is the CLI's.
_MERGE_OPTIONS = ("run", "command", "out", "merge", "strategies", "no_progress", "traceback")
#: The options ``--report-only`` takes (it reads the rest from results.json).
_REPORT_OPTIONS = ("run", "command", "out", "report_only", "no_progress", "traceback")


def _others(args: argparse.Namespace, taken: tuple[str, ...]) -> list[str]:
    """The flags given in ``args`` besides ``taken``, as typed."""
    return sorted(f"--{k.replace('_', '-')}" for k, v in vars(args).items()
                  if k not in taken and v is not None and v is not False)


def check_scheduler(address: str | None) -> None:
    """Refuse a ``--scheduler`` that is no address, before the data loads.

    Examples
    --------
    >>> check_scheduler("tcp://127.0.0.1:8786")
    >>> check_scheduler("tcp://127.0.0.1:99999")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --scheduler 'tcp://127.0.0.1:99999': port 99999 is not between 1 and 65535; ...
    """
    from distributed.comm import get_address_host_port, parse_address

    if address is None or parse_address(address, strict=False)[0] not in ("tcp", "tls"):
        return  # other protocols' addresses are theirs to check

    example = "give the scheduler's address, e.g. tcp://127.0.0.1:8786"
    try:
        _, port = get_address_host_port(address)
    except ValueError as e:
        raise ValueError(f"--scheduler {address!r}: {e}; {example}") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"--scheduler {address!r}: port {port} is not between 1 and 65535; "
                         f"{example}")


def check_root(datasets: tuple[str, ...], root: str | None) -> None:
    """Refuse ``--root`` where no dataset reads it, and its absence where one does.

    Examples
    --------
    >>> check_root(("mnist1d", "mnist"), None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --datasets mnist needs --root DIR, the directory of its files; ...
    """
    import os

    from daskpri.data.datasets import TAKES_ROOT

    takes = [d for d in datasets if d in TAKES_ROOT]
    if takes and root is None:
        raise ValueError(f"--datasets {','.join(takes)} needs --root DIR, the directory of its "
                         "files; daskpri downloads nothing")
    if root is not None and not takes:
        raise ValueError(f"--root is only read for --datasets {', '.join(TAKES_ROOT)}, but "
                         f"the datasets are {','.join(datasets)}")
    if root is not None and not os.path.isdir(root):
        raise ValueError(f"--root {root!r} is not a directory")


def run(args: argparse.Namespace) -> int:
    """Run ``daskpri bench`` as parsed into ``args``; return the exit status."""
    from daskpri.bench.report import check_report_files
    from daskpri.bench.runner import merge_results, report_only, run_bench
    from daskpri.cli._interrupt import _heard_as_cluster_starts
    from daskpri.cli._tls import client_security

    if args.report_only:
        if given := _others(args, _REPORT_OPTIONS):
            raise ValueError(f"--report-only reports under the options results.json was made "
                             f"with, but got {', '.join(given)}; with --report-only, give only "
                             "--out")
        report_only(args.out)
        return 0
    if args.merge is not None:
        if given := _others(args, _MERGE_OPTIONS):
            raise ValueError(f"--merge takes the options the parts were made with, but got "
                             f"{', '.join(given)}; with --merge, give only --out, --strategies "
                             "and --no-progress")
        merge_results(args.merge, args.out, strategies=args.strategies,
                      command=_command_line(args))
        return 0
    config = config_from_args(args)
    check_report_files(args.out, config)  # the report is written after the runs
    check_scheduler(config.scheduler)
    security = client_security(args)
    check_root(config.datasets, args.root)
    try:
        run_bench(config, args.out, progress=not args.no_progress,
                  command=_command_line(args), resume=args.resume, root=args.root,
                  security=security, on_interrupt=_heard_as_cluster_starts)
    except ConnectionError as e:
        print(f"daskpri: error: {e}", file=sys.stderr)
        return 1
    return 0
