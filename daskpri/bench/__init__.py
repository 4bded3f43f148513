"""``daskpri bench``: the paper's claims measured side by side.

Every strategy and the uniform baseline train for the same wall-clock budget
on the same cluster, interleaved, over several seeds and learning rates; the
report gives the time to fixed accuracy targets (97% and 99% of the tuned
uniform baseline's median best accuracy), the accuracy at equal budgets, the
scaling over worker counts and the overhead against plain PyTorch and DDP.

The package is split by role:

- :mod:`~daskpri.bench.config` — :class:`BenchConfig`, what is measured;
- :mod:`~daskpri.bench.records` — run specs and records, JSON round trip;
- :mod:`~daskpri.bench.protocol` — which runs, in which order, which learning
  rate, which targets: pure functions of the records;
- :mod:`~daskpri.bench.analysis` — times to target, speedups, efficiencies and
  the tables: pure functions of the records;
- :mod:`~daskpri.bench.runner` — drives the clusters and runs;
- :mod:`~daskpri.bench.machine` — what the report records of the machine;
- :mod:`~daskpri.bench.stored`, :mod:`~daskpri.bench.merge` — a results.json
  read back: ``--resume``, ``--report-only``, ``--merge``;
- :mod:`~daskpri.bench.baselines` — the plain PyTorch loop and PyTorch DDP;
- :mod:`~daskpri.bench.report`, :mod:`~daskpri.bench.png`,
  :mod:`~daskpri.bench.bokeh_page` — results.json / .md, PNGs, HTML.

Examples
--------
>>> from daskpri.bench import BenchConfig, count_runs
>>> cfg = BenchConfig.from_options(quick=True)
>>> count_runs(cfg, {"mnist1d": 16000})  # 3 sweep, 3 x 2 scaling, 2 + 1 + 2 overhead
14
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daskpri.bench.config import BenchConfig
    from daskpri.bench.protocol import count_runs, next_runs, pick_learning_rates, targets
    from daskpri.bench.records import Arm, Curve, RunRecord, RunSpec
    from daskpri.bench.runner import run_bench

#: each public name's module, imported when the name is first read (the command
#: line's parser imports daskpri.bench.command, which must not import torch)
_LAZY = {
    "Arm": "daskpri.bench.records",
    "BenchConfig": "daskpri.bench.config",
    "Curve": "daskpri.bench.records",
    "RunRecord": "daskpri.bench.records",
    "RunSpec": "daskpri.bench.records",
    "count_runs": "daskpri.bench.protocol",
    "next_runs": "daskpri.bench.protocol",
    "pick_learning_rates": "daskpri.bench.protocol",
    "run_bench": "daskpri.bench.runner",
    "targets": "daskpri.bench.protocol",
}

__all__ = [
    "Arm",
    "BenchConfig",
    "Curve",
    "RunRecord",
    "RunSpec",
    "count_runs",
    "next_runs",
    "pick_learning_rates",
    "run_bench",
    "targets",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'daskpri.bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # read once: the next read is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
