"""``daskpri report``: a static HTML report of a run's history."""

from __future__ import annotations

import argparse
import re

from daskpri.cli._paths import _check_destination


def _report(args: argparse.Namespace) -> int:
    from daskpri.dashboard.report import write_report

    _check_destination("--output", args.output)
    try:
        path = write_report(args.history, args.output, baseline=args.baseline, title=args.title)
    except ValueError as e:
        if not re.search(r"\boutput_html\b", str(e)):
            raise  # as raised: another library's error keeps its place for the hint
        # write_report's parameter is the -o/--output the user typed
        raise ValueError(re.sub(r"\boutput_html\b", "-o/--output", str(e))) from None
    print(f"report written to {path}")
    return 0
