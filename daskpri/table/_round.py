"""A round's selections as the table answers them, and an answer still on its way.

:class:`Round` is what :meth:`~daskpri.table.plugin.RemoteTable.step` returns;
:class:`Ahead` what :meth:`~daskpri.table.plugin.RemoteTable.step_ahead` does.
"""

from __future__ import annotations

import collections.abc
import concurrent.futures
import zlib
from typing import Any

import numpy as np

from daskpri.strategies.base import Selection
from daskpri.table._packing import _selections, _unpack_slot


class Ahead:
    """The answer of :meth:`RemoteTable.step_ahead`, to be waited for."""

    def __init__(self, future: concurrent.futures.Future) -> None:
        self._future = future

    def result(self, timeout: float | None = None) -> Round | None:
        """The selections, as :meth:`RemoteTable.step` returns them.

        ``None`` where the strategy needed priorities still in flight: the
        round is to be selected once they arrive.
        """
        out = self._future.result(timeout)
        return None if out is None else Round(out)


class Round(collections.abc.Sequence):
    """The selections of a round's steps, as the table packs them for each slot.

    A sequence of steps, each a list of one :class:`Selection` per worker
    slot (as :meth:`RemoteTable.step` documents), built when first indexed.
    The driver's path between two rounds reads the packed arrays instead:
    :meth:`slot_arrays` for the workers' shares and :meth:`digest`, without a
    Python object per step (a round of 512 local steps on 2 workers would
    build 1,024).
    """

    def __init__(self, packed: list[dict[str, Any]]) -> None:
        self._slots = [_unpack_slot(slot) for slot in packed]
        self._steps: list[list[Selection]] | None = None

    @property
    def n_slots(self) -> int:
        return len(self._slots)

    def __len__(self) -> int:
        return int(self._slots[0]["n_train"].size) if self._slots else 0

    def __getitem__(self, i: Any) -> Any:
        if self._steps is None:
            slots = [_selections(arrays) for arrays in self._slots]
            self._steps = [list(step) for step in zip(*slots, strict=True)]
        return self._steps[i]

    def slot_arrays(self, slot: int) -> dict[str, Any]:
        """Slot ``slot``'s steps as concatenated arrays (the keys of :func:`_pack_round`)."""
        return self._slots[slot]

    def digest(self) -> float:
        """:func:`~daskpri.training.rounds.digest` of the round's selections, step by step.

        Each step's train rows of slot 0, then of slot 1, and so on: the
        slots' concatenations interleaved, in one pass.
        """
        if not self._slots:
            return 0.0
        sizes = np.stack([a["n_train"] for a in self._slots], axis=1)  # step, slot
        starts = np.cumsum(sizes.ravel()).reshape(sizes.shape) - sizes
        out = np.empty(int(sizes.sum()), dtype=np.int64)
        for slot, arrays in enumerate(self._slots):
            n = sizes[:, slot]
            own = np.cumsum(n) - n  # where each step starts in this slot's array
            out[np.arange(int(n.sum())) + np.repeat(starts[:, slot] - own, n)] = arrays["train"]
        return float(zlib.crc32(out.tobytes()))
