"""Numpy arrays through distributed's RPC messages (msgpack carries bytes).

The scheduler's side of daskpri uses them, and imports no torch: the tensors
that pickle as numpy arrays are in :mod:`daskpri.replicas._numpy_tensors`.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def pack(a: np.ndarray) -> dict[str, Any]:
    """A msgpack-friendly form of ``a``, its shape kept (0-d arrays too).

    Examples
    --------
    >>> unpack(pack(np.asarray(64))).shape, unpack(pack(np.arange(6).reshape(2, 3).T)).tolist()
    ((), [[0, 3], [1, 4], [2, 5]])
    """
    a = np.asarray(a, order="C")  # not ascontiguousarray, which makes a 0-d array 1-d
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.tobytes()}


def unpack(d: dict[str, Any]) -> np.ndarray:
    """The array that :func:`pack` packed (a writable copy)."""
    return np.frombuffer(d["data"], dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


def pack_tree(obj: Any) -> Any:
    """Pack every array inside nested dicts and lists."""
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": pack(obj)}
    if isinstance(obj, dict):
        return {
            str(k) if not isinstance(k, int) else f"__int__{k}": pack_tree(v)
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [pack_tree(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, int) and not isinstance(obj, bool) and not -(2**63) <= obj < 2**63:
        # msgpack stops at 64 bits; random generator states go beyond.
        return {"__bigint__": str(obj)}
    return obj


def unpack_tree(obj: Any) -> Any:
    """Invert :func:`pack_tree`."""
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return unpack(obj["__ndarray__"])
        if "__bigint__" in obj:
            return int(obj["__bigint__"])
        return {
            (int(k[7:]) if isinstance(k, str) and k.startswith("__int__") else k): unpack_tree(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [unpack_tree(v) for v in obj]
    return obj
