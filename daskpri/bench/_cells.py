"""The cells of the benchmark's report: speedups, spreads, shares, seconds, tables."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from daskpri.bench.analysis import Interval, Ratio, Spread


def _paired(s: Spread | None) -> str:
    """A paired speedup's cell: ``median [min–max]`` of the seeds' ratios, ``x`` after each.

    Examples
    --------
    >>> _paired(Spread(1.5, 0.0, 2.0, 3, 3))
    '1.50x [n.r.–2.00x]'
    >>> _paired(None), _paired(Spread(math.nan, math.nan, math.nan, 0, 0))
    ('—', '—')
    >>> _paired(Spread(0.0, 0.0, 0.0, 3, 3))
    'n.r. (0/3 reached)'
    """
    if s is None or s.n == 0:
        return "—"
    if s.n > 1 and s.high == 0:  # no seed reached it: no range
        return f"n.r. (0/{s.n} reached)"

    def x(v: float) -> str:  # a seed that missed the target counts as 0
        return "n.r." if v == 0 else f"{v:.2f}x"

    return x(s.median) if s.n == 1 else f"{x(s.median)} [{x(s.low)}–{x(s.high)}]"


def _parts(merged: list[dict[str, Any]] | None) -> str:
    """The parts of a ``--merge`` that a resumed benchmark was, as its earlier invocation.

    Examples
    --------
    >>> _parts([{"seeds": "0–1", "command": "daskpri bench --out a", "path": "a"},
    ...         {"seeds": "2", "command": None, "path": "b/results.json"}])
    '; a `--merge` of seeds 0–1: `daskpri bench --out a`; seed 2: `b/results.json`'
    >>> _parts(None)
    ''
    """
    if not merged:
        return ""
    return "; a `--merge` of " + "; ".join(
        f"{_seeds(m['seeds'])}: `{m.get('command') or m['path']}`" for m in merged)


def _seeds(span: str) -> str:
    """``seeds 10–19``, or ``seed 3`` for one (``span``: :attr:`BenchConfig.seed_span`).

    Examples
    --------
    >>> _seeds("10–19"), _seeds("3")
    ('seeds 10–19', 'seed 3')
    """
    return f"seeds {span}" if "–" in span else f"seed {span}"


def _interval(ci: Interval | None) -> str:
    """A speedup's bootstrap interval: ``low–high``, ``x`` after each (``—`` for none).

    Examples
    --------
    >>> _interval(Interval(1.31, 1.8, 0.95, 10)), _interval(None)
    ('1.31x–1.80x', '—')
    """
    if ci is None:
        return "—"
    return f"{ci.low:.2f}x–{ci.high:.2f}x"


def _share(s: Spread) -> str:
    """A share over seeds as percentages.

    Examples
    --------
    >>> _share(Spread(0.061, 0.05, 0.07, 3, 3))
    '6.1% [5.0–7.0%]'
    >>> _share(Spread(math.nan, math.nan, math.nan, 0, 0))
    '—'
    """
    if s.n == 0:
        return "—"
    if s.n == 1:
        return f"{100 * s.median:.1f}%"
    return f"{100 * s.median:.1f}% [{100 * s.low:.1f}–{100 * s.high:.1f}%]"


def fmt_spread(s: Spread, digits: int = 1) -> str:
    """``median [min–max]`` over seeds; ``n.r.`` for a target not reached.

    Examples
    --------
    >>> fmt_spread(Spread(12.0, 10.0, math.inf, 3, 2))
    '12.0 [10.0–n.r.] (2/3 reached)'
    >>> fmt_spread(Spread(0.5, 0.5, 0.5, 1, 1), 3)
    '0.500'
    >>> fmt_spread(Spread(math.inf, math.inf, math.inf, 3, 0))
    'n.r. (0/3 reached)'
    """
    def one(v: float) -> str:
        if math.isnan(v):
            return "—"
        return "n.r." if math.isinf(v) else f"{v:,.{digits}f}"

    if s.n == 0:
        return "—"
    if s.n > 1 and s.reached == 0 and math.isinf(s.low):  # no seed reached it: no range
        return f"n.r. (0/{s.n} reached)"
    text = one(s.median) if s.n == 1 else f"{one(s.median)} [{one(s.low)}–{one(s.high)}]"
    if s.reached < s.n and s.reached > 0 and s.n > 1:
        text += f" ({s.reached}/{s.n} reached)"
    return text


def fmt_ratio(r: Ratio) -> str:
    """A speedup: ``1.23x``, ``≥1.50x`` (baseline missed the target), ``n.r.`` or ``—``.

    Examples
    --------
    >>> fmt_ratio(Ratio(1.234, "exact")), fmt_ratio(Ratio(2.0, "at least"))
    ('1.23x', '≥2.00x')
    """
    if r.kind == "exact":
        return f"{r.value:.2f}x"
    if r.kind == "at least":
        return f"≥{r.value:.2f}x"
    return "n.r." if r.kind == "not reached" else "—"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def _pct(f: float) -> str:
    return f"{100 * f:g}%"


def _cuda(machine: Mapping[str, Any]) -> str:
    """Whether the driver had CUDA, and its GPU (files made before it was recorded lack it).

    >>> _cuda({"cuda": True, "gpu": "NVIDIA H200"}), _cuda({"cuda": True}), _cuda({})
    ('yes (NVIDIA H200)', 'yes', 'no')
    """
    if not machine.get("cuda"):
        return "no"
    return f"yes ({machine['gpu']})" if machine.get("gpu") else "yes"


def _seconds(value: float) -> str:
    """A median time to target: ``n.r.`` for one not reached, ``—`` for no runs.

    Examples
    --------
    >>> _seconds(0.375), _seconds(math.inf), _seconds(math.nan)
    ('0.38 s', 'n.r.', '—')
    """
    if math.isnan(value):
        return "—"
    return f"{value:.2f} s" if math.isfinite(value) else "n.r."


def _num(v: float | None, spec: str = ".2f", unit: str = "") -> str:
    """``v`` as ``spec`` formats it, ``unit`` after; ``—`` where there is none.

    A partial report (``--report-only``, ``--merge`` of a part that stopped)
    has arms and baselines with no runs yet: no learning rate, budget or
    target to print, where ``nan`` would read as a value.

    Examples
    --------
    >>> _num(0.8), _num(0.15, "g"), _num(5.0, "g", " s"), _num(math.nan, "g", " s"), _num(None)
    ('0.80', '0.15', '5 s', '—', '—')
    """
    return "—" if v is None or not math.isfinite(v) else f"{v:{spec}}{unit}"
