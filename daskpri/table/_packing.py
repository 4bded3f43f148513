"""The packed form of what travels between the table and the driver.

A slot's selections of a round's steps as a few concatenated arrays
(:func:`_pack_round` and its inverse), and the priority updates the driver
sends with each step (:func:`_pack_updates`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from daskpri._wire import pack, pack_tree, unpack, unpack_tree
from daskpri.strategies.base import Selection, concat_selections


def _pack_round(selections: list[Selection]) -> dict[str, Any]:
    """One slot's selections of a round's steps, as a few concatenated arrays.

    A round of local steps selects hundreds of steps; an array each would
    cost more to pack, send and unpack than selecting them. Most rounds
    carry no extras: then none travel, not an empty dict a step.
    """
    return _pack_arrays(concat_selections(selections))


def _pack_arrays(arrays: dict[str, Any]) -> dict[str, Any]:
    return {key: [pack_tree(e) for e in v] if key == "extra" else pack(v)
            for key, v in arrays.items()}


def _unpack_round(packed: dict[str, Any]) -> list[Selection]:
    """Invert :func:`_pack_round` (each step's arrays are views of the round's)."""
    return _selections(_unpack_slot(packed))


def _unpack_slot(packed: dict[str, Any]) -> dict[str, Any]:
    """:func:`_pack_round`'s arrays unpacked, still concatenated."""
    return {key: [unpack_tree(e) for e in v] if key == "extra" else unpack(v)
            for key, v in packed.items()}


def _selections(arrays: dict[str, Any]) -> list[Selection]:
    """One :class:`Selection` a step from a slot's unpacked arrays."""
    n_train, n_score = arrays["n_train"], arrays["n_score"]
    if not n_train.size:
        return []
    trains = _split(arrays["train"], n_train)
    scores = _split(arrays["score"], n_score)
    weighted = arrays["weighted"]
    weights = iter(_split(arrays["weights"], n_train[weighted]))
    extras = arrays["extra"] or [{} for _ in range(n_train.size)]
    return [
        Selection(train=train, weights=next(weights) if w else None, score=score, extra=extra)
        for train, score, w, extra in zip(trains, scores, weighted, extras, strict=True)
    ]


def _split(a: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """``a`` cut into consecutive views of ``sizes`` (``np.split``, without its per-piece cost)."""
    ends = np.cumsum(sizes).tolist()
    return [a[i:j] for i, j in zip([0, *ends][:-1], ends, strict=True)]


def _mask(n_samples: int, arrays: list[dict[str, Any]]) -> np.ndarray:
    """The samples a round trains or scores (each slot's arrays), as a mask over the table."""
    mask = np.zeros(n_samples, dtype=bool)
    for a in arrays:
        mask[a["train"]] = True
        mask[a["score"]] = True
    return mask


def _pack_updates(updates: list[tuple[np.ndarray, np.ndarray, int]]) -> list[dict[str, Any]]:
    return [
        {
            "indices": pack(np.asarray(i, dtype=np.int64)),
            "priorities": pack(np.asarray(p, dtype=np.float64)),
            "step": int(s),
        }
        for i, p, s in updates
    ]
