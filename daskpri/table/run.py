"""One training run as the scheduler's table plugin holds it.

:class:`TableRun` keeps a run's :class:`~daskpri.table.table.PriorityTable`,
its strategy and the state of its selections, and selects each round's
samples for the worker slots (checking a strategy of one's own against the
selection contract).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from daskpri.strategies.base import (
    SelectContext,
    Selection,
    Strategy,
    TrainRound,
    concat_selections,
)
from daskpri.table.table import PriorityTable


@dataclass
class TableRun:
    """One training run's table, strategy and selection state."""

    table: PriorityTable
    strategy: Strategy
    rng: np.random.Generator
    owner: np.ndarray
    batch_size: int
    info: dict[str, Any]
    state: dict[str, Any] = field(default_factory=dict)
    groups: list[np.ndarray] = field(default_factory=list)
    metrics: collections.deque = field(default_factory=lambda: collections.deque(maxlen=100_000))
    last_step: int = -1
    selection_seconds: float = 0.0
    #: the selection state before the last selection made ahead (``undo=True``)
    undo: tuple[dict[str, Any], dict[str, Any], int, np.ndarray | None] | None = None
    #: mask of the samples of the last round selected: the round in flight
    #: while the next is selected ahead (``None``: not known)
    inflight: np.ndarray | None = None
    #: rounds of a strategy that reads the table selected ahead, and declined
    ahead_taken: int = 0
    ahead_declined: int = 0
    #: the trainer closed the run: kept, read-only, for the dashboard
    #: (``daskpri.table.keep-closed``)
    closed: bool = False
    #: the run's first priorities computed, as the dashboard's 'at the start'
    #: histogram keeps them (:func:`daskpri.dashboard.measures.start_sample`)
    start: dict[str, Any] | None = None

    def set_owner(self, owner: np.ndarray) -> None:
        owner = np.asarray(owner, dtype=np.int64)
        if owner.shape != (self.table.n_partitions,) or owner.min() < 0:
            raise ValueError(
                f"owner should give a worker slot for each of the {self.table.n_partitions} "
                f"partitions, but got shape {owner.shape}"
            )
        self.owner = owner
        n_slots = int(owner.max()) + 1
        self.groups = [self.table.indices_of(np.flatnonzero(owner == s)) for s in range(n_slots)]

    def select(self, step: int, inflight: np.ndarray | None = None) -> list[Selection]:
        return self._checked(self.strategy.select(self._context(step, inflight)))

    def select_round(
        self, step: int, count: int, inflight: np.ndarray | None = None
    ) -> Sequence[list[Selection]]:
        """The selections of steps ``step .. step + count - 1``: at once where the strategy can."""
        self.strategy.begin_round(self._context(step, inflight))
        if count > 1:
            rounds = self.strategy.select_round(self._context(step, inflight), count)
            if rounds is not None:
                return [self._checked(r) for r in rounds]
        return [self.select(step + i, inflight) for i in range(count)]

    @functools.cached_property
    def _trusted(self) -> bool:
        """A built-in strategy: :meth:`_checked` passes its selections through."""
        return type(self.strategy).__module__.startswith("daskpri.strategies.")

    def _checked(self, selections: Any) -> list[Selection]:
        """A strategy's selections of a step, refused by rule where one breaks the contract.

        Built-in strategies are trusted (their tests hold them to it); a
        strategy of one's own would otherwise fail deep in a worker, or
        silently leave a worker idle.
        """
        if self._trusted:
            return selections
        n_slots, n = len(self.groups), self.table.n_samples
        who = f"strategy {self.strategy.name!r}: select"

        def refuse(rule: str) -> None:
            raise ValueError(f"{who} {rule}")

        if not isinstance(selections, list | tuple) or len(selections) != n_slots:
            refuse(f"should return a list of {n_slots} Selections, one for each worker slot, "
                   f"but returned {type(selections).__name__}"
                   + (f" of {len(selections)}" if isinstance(selections, list | tuple) else ""))
        for slot, sel in enumerate(selections):
            if not isinstance(sel, Selection):
                refuse(f"should return Selections, but slot {slot}'s is a {type(sel).__name__}")
            for part in ("train", "score"):
                rows = getattr(sel, part)
                if not (isinstance(rows, np.ndarray) and rows.ndim == 1
                        and (rows.dtype.kind in "iu" or rows.size == 0)):
                    refuse(f"should give each Selection's {part} as a 1-D numpy array of sample "
                           f"indices, but slot {slot}'s is {type(rows).__name__}"
                           + (f" of dtype {rows.dtype}" if isinstance(rows, np.ndarray) else ""))
                if rows.size and (rows.min() < 0 or rows.max() >= n):
                    refuse(f"should give sample indices in [0, {n}), but slot {slot}'s {part} "
                           f"holds {int(rows.min() if rows.min() < 0 else rows.max())}")
                if rows.size and (self.owner[self.table.partition_of(rows)] != slot).any():
                    refuse(f"should give each worker slot samples of its own partitions "
                           f"(SelectContext.candidates(slot)), but slot {slot}'s {part} holds "
                           "another slot's")
            if sel.weights is not None and np.shape(sel.weights) != sel.train.shape:
                refuse(f"should give weights of train's shape, but slot {slot}'s are of shape "
                       f"{np.shape(sel.weights)} for {sel.train.size} samples")
        return list(selections)

    def select_round_arrays(
        self, step: int, count: int, inflight: np.ndarray | None = None
    ) -> list[dict[str, Any]]:
        """:meth:`select_round` as each slot's steps concatenated (:func:`concat_selections`)."""
        rounds = self.select_round(step, count, inflight)
        if isinstance(rounds, TrainRound):
            return [rounds.slot_arrays(slot) for slot in range(rounds.n_slots)]
        n_slots = len(rounds[0]) if rounds else 0
        return [concat_selections([selections[slot] for selections in rounds])
                for slot in range(n_slots)]

    def _context(self, step: int, inflight: np.ndarray | None) -> SelectContext:
        return SelectContext(
            table=self.table,
            groups=self.groups,
            owner=self.owner,
            step=step,
            batch_size=self.batch_size,
            rng=self.rng,
            state=self.state,
            inflight=inflight,
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "table": self.table.state_dict(),
            "rng": self.rng.bit_generator.state,
            "strategy_state": self.state,
            "owner": self.owner,
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.table.load_state_dict(state["table"])
        self.rng.bit_generator.state = state["rng"]
        self.state = state["strategy_state"]
        self.set_owner(state["owner"])
        self.last_step = int(state["last_step"])
        self.inflight = None
