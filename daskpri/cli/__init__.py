"""The ``daskpri`` command line: ``train``, ``demo``, ``bench``, ``evaluate``,
``predict``, ``report``, ``dashboard`` and ``strategies``.

Examples
--------
Train on a LocalCluster of two workers and keep the history::

    daskpri train --dataset mnist1d --model mlp --strategy selective-backprop \\
        --workers 2 --max-steps 2000 --output run.nc

Train on a running cluster, on workers started with ``--resources GPU=1``::

    daskpri train --scheduler tcp://HOST:8786 --resources GPU=1 --max-time 600

Score a checkpoint's model on the test split it was evaluated on::

    daskpri evaluate run.ckpt --dataset mnist1d

and write its predictions on new data::

    daskpri predict run.ckpt --data new.zarr --output predictions.zarr

Compare selective backprop with uniform sampling for the same time budget::

    daskpri demo --max-time 45

or with rounds of 16 local steps, keeping a third of the candidates::

    daskpri demo --local-steps 16 --strategy-option fraction=0.33
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from daskpri._warnings import DaskpriWarning, in_package
from daskpri.cli._arguments import _parser
from daskpri.cli._prog import _PROG
from daskpri.training.errors import SchedulerLostError, SchedulerUnreachable, WorkersLostError

__all__ = ["main"]

#: The file system's refusals of a path the user gave (for example a file
#: where a directory should be), told in one line rather than a traceback.
_PATH_ERRORS = (
    FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``daskpri`` command line.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments after the program name; ``None`` reads ``sys.argv``.

    Returns
    -------
    int
        The exit status: 0 on success, 2 for bad input (argparse exits with
        ``SystemExit(2)`` itself for bad arguments), 1 when the scheduler
        cannot be reached or the run fails (a NaN loss, a lost scheduler),
        130 when interrupted.

    Examples
    --------
    >>> main(["strategies"])  # doctest: +ELLIPSIS
    uniform             Uniform(batch_size=None)
    ...
    """
    args = _parser().parse_args(argv)
    with warnings.catch_warnings():  # restores showwarning for a caller's code after
        warnings.showwarning = _show_warning
        return _run(args)


def _command() -> int:
    """The ``daskpri`` script's (and ``python -m daskpri``'s) entry: :func:`main`, then exit.

    A Ctrl-C once :func:`main` has returned changes no exit status
    (:func:`_exiting`); :func:`main` itself, called from Python, leaves the
    caller's ``SIGINT`` as it was.
    """
    status = main()
    _exiting()
    return status


def _exiting() -> None:
    """Ignore Ctrl-C from here on: the command has its exit status and only exits.

    Once :func:`~daskpri.cli.main` has returned, the interpreter still
    collects its garbage and tears its modules (torch's among them) down,
    for a second or so after a run: with ``SIGINT``'s handler put back to
    the system's by then, a Ctrl-C meanwhile killed the process (exit status
    -2, 130 no more). Nothing then needs one to stop: the command has closed
    its clusters and clients, bounded, before it returned. Where something
    it started is still running (a cluster open, a child process), whose
    close at exit could wait on it, Ctrl-C is left as it is; and one in the
    main thread only, where Python's own handler has it (a caller's or an
    ignored one stays).
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return
    if multiprocessing.active_children():
        return
    if "distributed" in sys.modules:  # (else the command started no cluster)
        from distributed import SpecCluster
        from distributed.core import Status

        if any(c.status not in (Status.closing, Status.closed)
               for c in list(SpecCluster._instances)):
            return
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(args: Any) -> int:
    """Run the parsed command, an error as one line on stderr and its exit status."""
    if args.traceback:  # the errors below as Python shows them
        try:
            return int(args.run(args))
        except KeyboardInterrupt:
            # where it landed (a run that hung), and the exit status of an interrupt still:
            # let through, it killed the command with SIGINT (-2)
            traceback.print_exc()
            print(f"{_PROG}: interrupted", file=sys.stderr)
            return 130
    try:
        return int(args.run(args))
    except (ValueError, TypeError) as e:
        print(f"{_PROG}: error: {e}{_raised_outside(e)}", file=sys.stderr)
        return 2
    except _PATH_ERRORS as e:  # a path the user gave, found bad on the way
        where = "" if e.filename is None else f"{e.filename}: "
        print(f"{_PROG}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except (SchedulerUnreachable, FloatingPointError, SchedulerLostError,
            WorkersLostError) as e:
        # the last three: a run that stopped, saying why (and what was checkpointed)
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the machine's: a full disk, a failing device
        where = "" if e.filename is None else f"{e.filename}: "
        print(f"{_PROG}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130


_show_python_warning = warnings.showwarning


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Show daskpri's own warnings as one line of the command's, others as Python does.

    A command's warning has no user's line to point at (the frame walk of
    :func:`daskpri._warnings.warn` ends in ``runpy``), so its place is left out.
    """
    if issubclass(category, DaskpriWarning):
        print(f"{_PROG}: warning: {message}", file=sys.stderr if file is None else file)
    else:
        _show_python_warning(message, category, filename, lineno, file, line)


def _raised_outside(error: BaseException) -> str:
    """Where ``error`` was raised, when not by daskpri's own checks: a hint to report it.

    daskpri's checks say what was wrong in one line; an error raised inside
    another library (torch, xarray, numpy) may be a bad input they caught or
    a bug, and its line alone does not say where it came from.
    """
    frames = traceback.extract_tb(error.__traceback__)
    if not frames or in_package(frames[-1].filename):
        return ""
    last = frames[-1]
    return (
        f"\n  (raised in {last.filename}, line {last.lineno}, in {last.name}; "
        f"run `{_PROG} --traceback ...` for the full traceback)"
    )
