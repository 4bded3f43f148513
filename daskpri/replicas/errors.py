"""The errors a replica's worker reports to the driver.

:class:`ReplicaStateLost`, which the worker answers as ``{STATE_LOST:
message}`` (a round to resume from state it no longer holds),
:class:`PartitionsLost`, answered as ``{PARTITIONS_LOST: message, "pids":
[...]}`` (partitions it no longer holds), and :class:`UnreadableDataError`
(a partition it could not read).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ReplicaStateLost(LookupError):
    """The worker no longer holds the state a round was to resume from.

    The driver then sends the round again with the parameters and optimizer
    state in full. The worker answers ``{STATE_LOST: message}`` rather than
    raising; :func:`raise_state_lost` turns that back into this error.
    """


#: the key of a worker's answer to a round it could not resume
STATE_LOST = "daskpri-replica-state-lost"


class PartitionsLost(ConnectionError):
    """The worker no longer holds partitions that a step names: it is closing.

    A worker that closes (``client.restart()``, a nanny's restart, a
    retirement) drops its replicas' partitions and the scattered data they
    were loaded from while it may still answer a step's call. A lost worker,
    as a closed connection is (a ``ConnectionError``): the driver places the
    partitions ``pids`` again and runs the step again. The worker answers
    ``{PARTITIONS_LOST: message, "pids": pids}`` rather than raising, and
    logs no traceback; :func:`raise_state_lost` turns that back into this.
    """

    def __init__(self, message: str, pids: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.pids = [int(p) for p in pids]


#: the key of a worker's answer to a step whose partitions it no longer holds
PARTITIONS_LOST = "daskpri-partitions-lost"


class UnreadableDataError(ValueError):
    """A worker could not read a partition of the data's store (damaged or truncated)."""


#: the key of a worker's answer to a partition whose data it refused (a NaN in ``x``, a
#: label out of range, a file it cannot read): the error, which the driver raises
DATA_REFUSED = "daskpri-data-refused"


def raise_data_refused(result: Any) -> None:
    """Raise the error of a worker's answer that it refused a partition's data.

    The worker answers ``{DATA_REFUSED: error}`` rather than raising, so
    that it logs no "Compute Failed" with a traceback for the user's data:
    the driver raises the error once, as the fit's.
    """
    if isinstance(result, dict) and DATA_REFUSED in result:
        raise result[DATA_REFUSED]


def raise_state_lost(result: Any) -> None:
    """Raise :class:`ReplicaStateLost` or :class:`PartitionsLost` for a worker's answer that
    it lost its state or partitions."""
    if isinstance(result, dict) and STATE_LOST in result:
        raise ReplicaStateLost(result[STATE_LOST])
    if isinstance(result, dict) and PARTITIONS_LOST in result:
        raise PartitionsLost(result[PARTITIONS_LOST], result.get("pids", ()))
