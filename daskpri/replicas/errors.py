"""The errors a replica's worker reports to the driver.

:class:`ReplicaStateLost`, which the worker answers as ``{STATE_LOST:
message}`` (a round to resume from state it no longer holds), and
:class:`UnreadableDataError` (a partition it could not read).
"""

from __future__ import annotations

from typing import Any


class ReplicaStateLost(LookupError):
    """The worker no longer holds the state a round was to resume from.

    The driver then sends the round again with the parameters and optimizer
    state in full. The worker answers ``{STATE_LOST: message}`` rather than
    raising; :func:`raise_state_lost` turns that back into this error.
    """


#: the key of a worker's answer to a round it could not resume
STATE_LOST = "daskpri-replica-state-lost"


class UnreadableDataError(ValueError):
    """A worker could not read a partition of the data's store (damaged or truncated)."""


def raise_state_lost(result: Any) -> None:
    """Raise :class:`ReplicaStateLost` if ``result`` is a worker's answer that it lost its state."""
    if isinstance(result, dict) and STATE_LOST in result:
        raise ReplicaStateLost(result[STATE_LOST])
