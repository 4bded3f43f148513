"""``daskpri strategies``: the strategies and their defaults."""

from __future__ import annotations

import argparse

from daskpri.strategies import STRATEGIES, get_strategy


def _strategies(args: argparse.Namespace) -> int:
    width = max(len(name) for name in STRATEGIES) + 2
    for name in STRATEGIES:
        print(f"{name:<{width}}{get_strategy(name)!r}")
    return 0
