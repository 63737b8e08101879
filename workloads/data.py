"""CIFAR-10 data for the reference workloads (numpy only; no TensorFlow, never downloads).

* :func:`load_cifar10` reads the standard CIFAR-10 python-pickle batches
  (``data_batch_1`` .. ``data_batch_5``, ``test_batch``) and returns
  ``(x_train, y_train), (x_test, y_test)`` exactly like
  ``keras.datasets.cifar10.load_data()``: ``x`` uint8 ``(N, 32, 32, 3)``, ``y`` uint8 ``(N, 1)``.
* :func:`synthetic_cifar10` makes deterministic CIFAR-shaped data that a model can
  learn (every class has its own low-frequency colour pattern), for machines without
  the data set.
* :func:`encode_records` / :func:`decode_record` convert to and from the CIFAR-10
  *binary* record layout (one label byte, then 1024 red, 1024 green, 1024 blue bytes):
  the "files" the input pipelines read and decode per sample.
"""
from __future__ import annotations

import os
import pickle
from typing import Tuple

import numpy as np

__all__ = [
    "DataError", "TRAIN_BATCHES", "TEST_BATCH", "IMAGE_SHAPE", "RECORD_BYTES", "NUM_CLASSES",
    "load_cifar10", "load_batch", "synthetic_cifar10", "encode_records", "decode_record",
]

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
IMAGE_SHAPE = (32, 32, 3)
PIXELS = 32 * 32 * 3
RECORD_BYTES = 1 + PIXELS
NUM_CLASSES = 10

Arrays = Tuple[Tuple[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray]]


class DataError(ValueError):
    """A CIFAR-10 batch file is missing, unreadable or corrupt (``path`` names the file)."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


# The CIFAR-10 pickles (written by Python 2 cPickle) hold a dict of bytes keys, a numpy
# uint8 array and a list of ints.  Only the globals numpy needs to rebuild an array are
# allowed (plus _codecs.encode, which Python 3 protocol-2 pickles use for bytes), so a
# hostile file cannot run code.
_ALLOWED_GLOBALS = {
    ("_codecs", "encode"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name} (not a CIFAR-10 batch)")


def _field(d: dict, key: str):
    for k in (key.encode("ascii"), key):
        if k in d:
            return d[k]
    raise KeyError(key)


def load_batch(path: str) -> Tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python batch -> (x uint8 (n, 3, 32, 32) channels-first, y uint8 (n,)).

    Raises :class:`DataError` naming ``path`` when the file is missing, unreadable or
    does not hold a well-formed batch.
    """
    try:
        with open(path, "rb") as fh:
            obj = _RestrictedUnpickler(fh, encoding="bytes").load()
    except FileNotFoundError:
        raise DataError(path, "missing CIFAR-10 batch file") from None
    except IsADirectoryError:
        raise DataError(path, "is a directory, expected a CIFAR-10 batch file") from None
    except OSError as e:
        raise DataError(path, f"cannot read: {e.strerror or e}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, UnicodeDecodeError, MemoryError) as e:
        raise DataError(path, f"corrupt CIFAR-10 batch (not a readable pickle: {type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise DataError(path, f"corrupt CIFAR-10 batch: expected a dict, got {type(obj).__name__}")
    try:
        data = _field(obj, "data")
        labels = _field(obj, "labels")
    except KeyError as e:
        raise DataError(path, f"corrupt CIFAR-10 batch: no {e.args[0]!r} entry") from None
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != PIXELS:
        desc = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(path, f"corrupt CIFAR-10 batch: 'data' must be uint8 (n, {PIXELS}), got {desc}")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise DataError(path, "corrupt CIFAR-10 batch: 'labels' is not a list of integers") from None
    if y.ndim != 1 or y.shape[0] != data.shape[0]:
        raise DataError(path, f"corrupt CIFAR-10 batch: {y.size} labels for {data.shape[0]} images")
    if y.size and (y.min() < 0 or y.max() >= NUM_CLASSES):
        raise DataError(path, f"corrupt CIFAR-10 batch: labels must be 0..{NUM_CLASSES - 1}, "
                              f"found {int(y.min())}..{int(y.max())}")
    return data.reshape(data.shape[0], 3, 32, 32), y.astype(np.uint8)


def _batch_dir(data_dir: str) -> str:
    """``data_dir`` itself, or its ``cifar-10-batches-py`` folder (the tarball's layout)."""
    if not os.path.isdir(data_dir):
        raise DataError(data_dir, "data directory does not exist")
    sub = os.path.join(data_dir, "cifar-10-batches-py")
    if not os.path.exists(os.path.join(data_dir, TRAIN_BATCHES[0])) and os.path.isdir(sub):
        return sub
    return data_dir


def load_cifar10(data_dir: str) -> Arrays:
    """Read CIFAR-10 from ``data_dir`` (or ``data_dir/cifar-10-batches-py``); never downloads.

    Returns ``(x_train, y_train), (x_test, y_test)`` with the dtypes and shapes of
    ``keras.datasets.cifar10.load_data()``: x uint8 (N, 32, 32, 3), y uint8 (N, 1).
    """
    d = _batch_dir(os.fspath(data_dir))
    xs, ys = [], []
    for name in TRAIN_BATCHES:
        x, y = load_batch(os.path.join(d, name))
        xs.append(x)
        ys.append(y)
    x_test, y_test = load_batch(os.path.join(d, TEST_BATCH))
    x_train = np.concatenate(xs).transpose(0, 2, 3, 1)
    y_train = np.concatenate(ys).reshape(-1, 1)
    return (x_train, y_train), (x_test.transpose(0, 2, 3, 1), y_test.reshape(-1, 1))


def synthetic_cifar10(n_train: int = 10000, n_test: int = 1000, num_classes: int = NUM_CLASSES,
                      seed: int = 0) -> Arrays:
    """Deterministic, learnable CIFAR-shaped data with the dtypes/shapes of :func:`load_cifar10`.

    Each class (or identity) has a fixed random 4x4 colour pattern upscaled to 32x32;
    a sample is its class pattern at a random contrast plus Gaussian pixel noise, so the
    classes are separable but not trivially so.  Same arguments, same arrays.
    """
    if n_train < 1 or n_test < 0 or num_classes < 2:
        raise ValueError("need n_train >= 1, n_test >= 0 and num_classes >= 2")
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0.0, 255.0, size=(num_classes, 4, 4, 3)).astype(np.float32)
    patterns = coarse.repeat(8, axis=1).repeat(8, axis=2)  # (classes, 32, 32, 3)

    def make(n: int) -> Tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, num_classes, size=n).astype(np.uint8)
        contrast = rng.uniform(0.6, 1.0, size=(n, 1, 1, 1)).astype(np.float32)
        noise = rng.normal(0.0, 40.0, size=(n,) + IMAGE_SHAPE).astype(np.float32)
        x = 127.5 + (patterns[y] - 127.5) * contrast + noise
        return np.clip(np.rint(x), 0, 255).astype(np.uint8), y.reshape(-1, 1)

    return make(n_train), make(n_test)


def encode_records(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(N, 32, 32, 3) uint8 images + (N,) or (N, 1) labels -> (N, 3073) uint8 CIFAR binary records."""
    x = np.asarray(x)
    y = np.asarray(y).reshape(-1)
    if x.dtype != np.uint8 or x.shape[1:] != IMAGE_SHAPE or y.shape[0] != x.shape[0]:
        raise ValueError(f"expected uint8 (N, 32, 32, 3) images and N labels, got {x.dtype} {x.shape}, {y.shape}")
    out = np.empty((x.shape[0], RECORD_BYTES), dtype=np.uint8)
    out[:, 0] = y
    out[:, 1:] = x.transpose(0, 3, 1, 2).reshape(x.shape[0], PIXELS)
    return out


def decode_record(record: np.ndarray) -> Tuple[np.ndarray, int]:
    """One CIFAR binary record -> (float32 (32, 32, 3) image in [0, 1], label)."""
    img = record[1:].reshape(3, 32, 32).transpose(1, 2, 0).astype(np.float32) * (1.0 / 255.0)
    return img, int(record[0])
