"""``daskpri report``: a static HTML report of a run's history."""

from __future__ import annotations

import argparse

from daskpri.cli._paths import _check_destination


def _report(args: argparse.Namespace) -> int:
    from daskpri.dashboard.report import write_report

    _check_destination("--output", args.output)
    path = write_report(args.history, args.output, baseline=args.baseline, title=args.title)
    print(f"report written to {path}")
    return 0
