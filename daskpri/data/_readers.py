"""Readers for the standard MNIST and CIFAR-10 files in a directory the user names.

Nothing here downloads: the files are read where the user put them. CIFAR-10's
python batches are pickles, so they are read through an unpickler that builds
dicts, lists, strings and numpy arrays and nothing else: a dataset file must
not be able to run code.
"""

from __future__ import annotations

import gzip
import importlib
import os
import pickle
import zlib
from typing import IO, Any, cast

import numpy as np

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST = "test_batch"

# IDX type codes (the third byte of the magic number) and their big-endian dtypes.
_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into a native-endian array."""
    try:
        with _open_maybe_gzip(path) as f:
            raw = f.read()
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:  # a truncated or foreign .gz
        raise type(e)(f"{path}: {e}") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(
            f"{path} should be an IDX file, starting with the bytes 00 00 <type> <ndim> "
            f"where <type> is one of {', '.join(f'{c:02x}' for c in _IDX_DTYPES)}, "
            f"but it starts with {raw[:4].hex(' ') or 'nothing'}"
        )
    dtype = _IDX_DTYPES[raw[2]]
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(
            f"{path} should hold {ndim} dimension sizes after its magic number, "
            f"but it is only {len(raw)} bytes long"
        )
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(
            f"{path} should be {expected} bytes long for an IDX array of shape {shape} "
            f"and dtype {dtype.name}, but it is {len(raw)} bytes long"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def read_mnist(root: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read MNIST's four IDX files from ``root``.

    Each file may also be gzipped (``<name>.gz``). Returns ``(x_train,
    y_train, x_test, y_test)`` with images as ``(n, rows, cols)`` uint8 and
    labels as ``(n,)`` uint8, in the files' order.
    """
    paths: dict[str, str] = {}
    missing = []
    for key, name in MNIST_FILES.items():
        found = [p for p in (name, name + ".gz") if os.path.isfile(os.path.join(root, p))]
        if found:
            paths[key] = os.path.join(root, found[0])
        else:
            missing.append(name)
    if missing:
        raise FileNotFoundError(
            f"MNIST needs the IDX files {', '.join(MNIST_FILES.values())} (each may be "
            f"gzipped, ending in .gz) in {root!r}, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not there"
        )
    arrays = {key: read_idx(path) for key, path in paths.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3:
            raise ValueError(
                f"{paths[f'{split}_images']} should hold images of shape (n, rows, cols), "
                f"but holds an array of shape {images.shape}"
            )
        if labels.ndim != 1 or len(labels) != len(images):
            raise ValueError(
                f"{paths[f'{split}_labels']} should hold one label for each of the "
                f"{len(images)} images of {paths[f'{split}_images']}, "
                f"but holds an array of shape {labels.shape}"
            )
    return (
        arrays["train_images"],
        arrays["train_labels"],
        arrays["test_images"],
        arrays["test_labels"],
    )


def read_cifar10(root: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read CIFAR-10's python batches from ``root``.

    The batches are looked for in ``root/cifar-10-batches-py`` and then in
    ``root`` itself. Returns ``(x_train, y_train, x_test, y_test)`` with
    images as ``(n, 3, 32, 32)`` uint8 and labels as ``(n,)`` int64.
    """
    sub = os.path.join(root, "cifar-10-batches-py")
    folder = sub if os.path.isdir(sub) else root
    names = (*CIFAR10_TRAIN, CIFAR10_TEST)
    missing = [n for n in names if not os.path.isfile(os.path.join(folder, n))]
    if missing:
        raise FileNotFoundError(
            f"CIFAR-10 needs the python batches {', '.join(names)} in {root!r} or in its "
            f"subdirectory 'cifar-10-batches-py', but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing from {folder!r}"
        )
    train = [_read_cifar_batch(os.path.join(folder, n)) for n in CIFAR10_TRAIN]
    x_test, y_test = _read_cifar_batch(os.path.join(folder, CIFAR10_TEST))
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    return x_train, y_train, x_test, y_test


class _DataOnlyUnpickler(pickle.Unpickler):
    """An unpickler that builds only containers, strings and numpy arrays.

    ``find_class`` is where a pickle names the callables it will call; any name
    outside the table below is refused before it is imported, so a crafted
    file cannot reach ``os.system`` or any other code.
    """

    def __init__(self, file: IO[bytes], path: str) -> None:
        super().__init__(file, encoding="bytes")
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 pickles (CIFAR-10's are) name the builtins module __builtin__.
        module = {"__builtin__": "builtins"}.get(module, module)
        allowed = _allowed_globals()
        if (module, name) not in allowed:
            raise _RefusedGlobal(
                f"{self._path} asks to load the global '{module}.{name}', which daskpri "
                f"refuses: a dataset file may only hold dicts, lists, strings, integers and "
                f"numpy arrays, so this file is not a CIFAR-10 batch (or was tampered with)"
            )
        return allowed[(module, name)]


def _allowed_globals() -> dict[tuple[str, str], Any]:
    try:
        multiarray = importlib.import_module("numpy._core.multiarray")
        numeric = importlib.import_module("numpy._core.numeric")
    except ImportError:  # numpy < 2 has no numpy._core
        multiarray = importlib.import_module("numpy.core.multiarray")
        numeric = importlib.import_module("numpy.core.numeric")
    _reconstruct, _frombuffer = multiarray._reconstruct, numeric._frombuffer
    return {
        ("builtins", "dict"): dict,
        ("builtins", "list"): list,
        ("builtins", "bytes"): bytes,
        ("builtins", "str"): str,
        ("builtins", "int"): int,
        # Pickles written under numpy 1 name numpy.core, under numpy 2 numpy._core;
        # both resolve to the same function, imported without numpy.core's
        # deprecation shim.
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
        # Pickle protocol 5 rebuilds contiguous arrays from a buffer instead.
        ("numpy.core.numeric", "_frombuffer"): _frombuffer,
        ("numpy._core.numeric", "_frombuffer"): _frombuffer,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }


class _RefusedGlobal(pickle.UnpicklingError):
    """A pickle's global that :class:`_DataOnlyUnpickler` refuses (its message names the file)."""


#: What unpickling bytes that are not a pickle, or a pickle of something else,
#: raises: pickle's opcodes read as text ("garbage": ``ValueError``), a memo or
#: stack that is not there (``KeyError``, ``IndexError``), the allowed globals
#: called with the wrong arguments (``TypeError``, ``AttributeError``).
_UNPICKLING_ERRORS = (
    pickle.UnpicklingError, EOFError, ValueError, KeyError, TypeError, IndexError,
    AttributeError, OverflowError, RecursionError,
)


def load_pickle(path: str) -> Any:
    """Unpickle ``path`` allowing only data: containers, strings, numpy arrays.

    A file that is not such a pickle raises :class:`pickle.UnpicklingError`
    naming ``path``, in one line, whatever the unpickler stumbled on.
    """
    with open(path, "rb") as f:
        try:
            return _DataOnlyUnpickler(f, path).load()
        except _RefusedGlobal:
            raise
        except _UNPICKLING_ERRORS as e:
            why = " ".join(str(e).split())  # pickle's own messages may span lines
            raise pickle.UnpicklingError(
                f"{path} is not a pickle of data ({type(e).__name__}"
                + (f": {why})" if why else ")")
            ) from e


def _read_cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    batch = load_pickle(path)
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = list(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(
            f"{path} should hold a dict with keys b'data' and b'labels', but got {keys}"
        )
    try:
        data = np.asarray(batch[b"data"])
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (ValueError, TypeError, OverflowError) as e:  # ragged lists, labels not integers
        why = " ".join(str(e).split())
        raise ValueError(
            f"{path} should hold b'data' as an array and b'labels' as a list of integers, "
            f"but they could not be read so ({type(e).__name__}: {why})"
        ) from None
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(
            f"{path} should hold b'data' as uint8 of shape (n, 3072), "
            f"but got {data.dtype} of shape {data.shape}"
        )
    if labels.shape != (len(data),):
        raise ValueError(
            f"{path} should hold one label for each of its {len(data)} images, "
            f"but got labels of shape {labels.shape}"
        )
    return data.reshape(-1, 3, 32, 32), labels


def _open_maybe_gzip(path: str) -> IO[bytes]:
    if path.endswith(".gz"):
        return cast(IO[bytes], gzip.open(path, "rb"))
    return open(path, "rb")
