"""``daskpri bench``: its output directory checked, then the benchmark run."""

from __future__ import annotations

import argparse
import os

from daskpri.bench import command as bench_command
from daskpri.bench.report import RESULTS_JSON
from daskpri.cli._paths import _check_destination


def _bench(args: argparse.Namespace) -> int:
    if not args.out.strip():  # an unset shell variable, more likely than the current directory
        raise ValueError("--out should name a directory, but got an empty path; give --out . "
                         "for the current directory")
    _check_destination("--out", args.out, kind="directory")
    earlier = os.path.join(args.out, RESULTS_JSON)
    if args.report_only and args.resume:
        raise ValueError("--report-only makes no runs, and --resume makes the rest: pass one")
    if args.merge is not None and (args.report_only or args.resume):
        raise ValueError("--merge writes a new report in --out from the benchmarks it names: "
                         "pass it without --resume and --report-only")
    if not args.resume and not args.report_only and os.path.exists(earlier):
        # its runs may be hours of measurement: replaced only when asked to
        raise ValueError(
            f"--out {args.out!r} holds the results of an earlier benchmark ({earlier}); "
            + ("give --merge another --out (or remove that file)" if args.merge is not None else
               "pass --resume to go on with it, or give another --out (or remove that file) to "
               "start afresh")
        )
    report = [f for f in ("results.md", "results.html")
              if os.path.exists(os.path.join(args.out, f))]
    if not args.resume and not args.report_only and report:
        # a report without its results.json: written over, it could not be made again
        raise ValueError(
            f"--out {args.out!r} holds a benchmark's report ({', '.join(report)}) without its "
            f"{RESULTS_JSON}; give another --out (or remove those files)"
        )
    return bench_command.run(args)
