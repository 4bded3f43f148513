"""The priority table's state: what it saves and restores.

:class:`TableStateMixin` gives :class:`~daskpri.table.table.PriorityTable`
its ``state_dict``, ``load_state_dict`` (which checks a state whole before
writing any of it) and ``from_state_dict``; a checkpoint keeps the table
through them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from daskpri.table.staleness import validate_staleness

if TYPE_CHECKING:
    from daskpri.table.table import PriorityTable


class TableStateMixin:
    """The state of :class:`~daskpri.table.table.PriorityTable`, as plain arrays and values.

    ``from_state_dict`` builds the ``PriorityTable`` this is a base of;
    ``cast`` tells mypy so.
    """

    # PriorityTable's arrays and settings, which its __init__ sets
    staleness: str
    n_bins: int
    offsets: np.ndarray
    current: np.ndarray
    version: np.ndarray
    older_p: np.ndarray
    older_t: np.ndarray
    n_updates: int

    if TYPE_CHECKING:

        @property
        def n_samples(self) -> int: ...

        @property
        def n_partitions(self) -> int: ...

    # -- state ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The table's state, as numpy arrays and plain values.

        Returns
        -------
        dict
            Copies of the arrays (so later updates leave it alone), the
            staleness model, ``n_bins`` and the count of updates; what
            :meth:`load_state_dict` and :meth:`from_state_dict` take.

        Examples
        --------
        >>> from daskpri.table.table import PriorityTable
        >>> sorted(PriorityTable([3, 2]).state_dict())
        ['current', 'n_bins', 'n_updates', 'offsets', 'older_p', 'older_t', 'staleness', 'version']
        """
        return {
            "offsets": self.offsets.copy(),
            "current": self.current.copy(),
            "version": self.version.copy(),
            "older_p": self.older_p.copy(),
            "older_t": self.older_t.copy(),
            "staleness": self.staleness,
            "n_bins": self.n_bins,
            "n_updates": self.n_updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`; the partitions must match.

        Everything is checked before anything is written.

        Parameters
        ----------
        state : dict
            A state from :meth:`state_dict`.

        Raises
        ------
        ValueError
            If the state's partitions or array shapes differ from this
            table's, a computed priority is not finite or the staleness model
            is unknown.

        Examples
        --------
        >>> import numpy as np
        >>> from daskpri.table.table import PriorityTable
        >>> table = PriorityTable([3, 2])
        >>> table.update(np.array([4]), np.array([2.0]), step=1)
        >>> copy = PriorityTable([3, 2])
        >>> copy.load_state_dict(table.state_dict())
        >>> copy.priority.tolist()
        [nan, nan, nan, nan, 2.0]
        >>> PriorityTable([2, 3]).load_state_dict(table.state_dict())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: the state's partitions do not match this table's: ... cut at 3 there and 2 here
        """
        offsets = np.asarray(state["offsets"])
        if not np.array_equal(offsets, self.offsets):
            raise ValueError(
                "the state's partitions do not match this table's: "
                f"{len(offsets) - 1} partitions of {int(offsets[-1])} samples in the state, "
                f"{self.n_partitions} of {self.n_samples} here"
                + (f", cut at {_cuts(offsets)} there and {_cuts(self.offsets)} here"
                   if offsets[-1] == self.n_samples and len(offsets) == len(self.offsets) else "")
            )
        arrays = {k: np.asarray(state[k]) for k in ("current", "version", "older_p", "older_t")}
        for k, a in arrays.items():
            if a.shape != getattr(self, k).shape:
                raise ValueError(
                    f"the state's {k} has shape {a.shape}, expected {getattr(self, k).shape}"
                )
        seen = arrays["version"] >= 0
        if not np.isfinite(arrays["current"][seen]).all():
            raise ValueError("the state's priorities should be finite where computed")
        staleness = validate_staleness(str(state["staleness"]))
        n_bins = _state_count(state, "n_bins", 1)
        n_updates = _state_count(state, "n_updates", 0)
        # everything checked: only now is the table written
        self.staleness = staleness
        self.n_bins = n_bins
        for k, a in arrays.items():
            getattr(self, k)[...] = a
        self.current[~seen] = np.inf
        self.n_updates = n_updates

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PriorityTable:
        """A table rebuilt from :meth:`state_dict`.

        Parameters
        ----------
        state : dict
            A state from :meth:`state_dict`; its partitions shape the table.

        Returns
        -------
        PriorityTable
            A new table holding that state.

        Examples
        --------
        >>> import numpy as np
        >>> from daskpri.table.table import PriorityTable
        >>> table = PriorityTable([3, 2], staleness="exp-linear")
        >>> table.update(np.array([4]), np.array([2.0]), step=1)
        >>> copy = PriorityTable.from_state_dict(table.state_dict())
        >>> copy.sizes.tolist(), copy.staleness, copy.priority.tolist()
        ([3, 2], 'exp-linear', [nan, nan, nan, nan, 2.0])
        """
        table = cast("type[PriorityTable]", cls)(
            np.diff(np.asarray(state["offsets"])), staleness=str(state["staleness"])
        )
        table.load_state_dict(state)
        return table


def _state_count(state: dict[str, Any], key: str, minimum: int) -> int:
    """``state[key]`` as an integer of at least ``minimum``, or a ``ValueError`` saying so."""
    value = state[key]
    a = np.asarray(value)  # a checkpoint's may be a 0-d array
    if a.shape != () or not np.issubdtype(a.dtype, np.integer) or int(a) < minimum:
        least = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
        raise ValueError(f"the state's {key} should be {least}, but got {key}={value!r}")
    return int(a)


def _cuts(offsets: np.ndarray, shown: int = 6) -> str:
    """The first partition boundaries of ``offsets``, for a message."""
    inner = [int(v) for v in offsets[1:-1]]
    return ", ".join(map(str, inner[:shown])) + (", ..." if len(inner) > shown else "")
