"""Input pipelines: the studies' "before" (``naive``) and "after" (``tfdata``).

Both read CIFAR binary records (see :func:`workloads.data.encode_records`) one sample
at a time from a store that can add a per-read storage latency (``io_latency_ms``,
an NFS-like slow read, spent sleeping), decode them (bytes -> float32 HWC image in [0, 1];
``decode_cost_ms`` adds that much CPU work per sample, a busy loop standing for a costly
decoder such as JPEG, so input can be made slow by storage or by host CPU at will) and
augment them (random horizontal flip, random 32x32 crop of the 4-pixel padded image):

* ``naive``: a Python generator; every read, decode and augment happens in the
  training loop's thread when it asks for the next batch, nothing runs ahead.
* ``tfdata``: ``tf.data``: indices -> ``interleave`` of per-sample reads
  (``read_parallelism`` reads in flight, as when reading many files) ->
  ``map(decode, num_parallel_calls=AUTOTUNE)`` -> optional ``cache()`` -> shuffle ->
  ``map(augment, AUTOTUNE)`` -> ``batch`` -> ``prefetch(AUTOTUNE)``; ``parallel_map=False``
  runs the maps sequentially and ``prefetch=False`` drops the prefetch (the studies' "off"
  positions of those optimizations).

Both shard by sample index (``shard_count``/``shard_index``) for multi-worker runs.
TensorFlow is imported only by :func:`tfdata_dataset`.
"""
from __future__ import annotations

import time
from typing import Iterator, Tuple

import numpy as np

from .data import RECORD_BYTES, decode_record

__all__ = ["PIPELINES", "SlowStore", "naive_batches", "tfdata_dataset", "augment_np", "burn_cpu"]

PIPELINES = ("naive", "tfdata")
PAD = 4


class SlowStore:
    """CIFAR binary records with a fixed delay per read (seconds), like a slow file system."""

    def __init__(self, records: np.ndarray, latency_s: float = 0.0, sleep=time.sleep):
        records = np.asarray(records)
        if records.dtype != np.uint8 or records.ndim != 2 or records.shape[1] != RECORD_BYTES:
            raise ValueError(f"records must be uint8 (N, {RECORD_BYTES}), got {records.dtype} {records.shape}")
        if latency_s < 0:
            raise ValueError(f"latency must be >= 0 s, got {latency_s}")
        self.records = records
        self.latency_s = float(latency_s)
        self._sleep = sleep
        self.reads = 0

    def __len__(self) -> int:
        return self.records.shape[0]

    def read(self, i: int) -> np.ndarray:
        """The raw bytes of record ``i`` (a copy, as a read from storage would return)."""
        if self.latency_s:
            self._sleep(self.latency_s)
        self.reads += 1
        return self.records[i].copy()


def burn_cpu(seconds: float) -> None:
    """Busy-loop until this thread has used ``seconds`` of CPU time (a decoder's work, not a sleep)."""
    if seconds <= 0:
        return
    end = time.thread_time() + seconds
    x = 1.0
    while time.thread_time() < end:
        for _ in range(200):
            x = x * 1.0000001 + 1e-9


def augment_np(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random horizontal flip and random 32x32 crop of the zero-padded (40x40) image."""
    if rng.random() < 0.5:
        img = img[:, ::-1, :]
    padded = np.pad(img, ((PAD, PAD), (PAD, PAD), (0, 0)))
    dy, dx = rng.integers(0, 2 * PAD + 1, size=2)
    return padded[dy:dy + 32, dx:dx + 32, :]


def _shard(n: int, shard_count: int, shard_index: int) -> np.ndarray:
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise ValueError(f"bad shard {shard_index} of {shard_count}")
    return np.arange(shard_index, n, shard_count)


def naive_batches(store: SlowStore, batch_size: int, *, seed: int = 0, augment: bool = True,
                  shard_count: int = 1, shard_index: int = 0,
                  decode_cost_ms: float = 0.0) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Endless (x float32 (B, 32, 32, 3), y int32 (B,)) batches from a plain Python generator.

    Each epoch visits this shard's samples in a new random order (dropping the last
    partial batch); each sample is read, decoded and augmented on demand, serially.
    """
    idx = _shard(len(store), shard_count, shard_index)
    if decode_cost_ms < 0:
        raise ValueError(f"decode cost must be >= 0 ms, got {decode_cost_ms}")
    cost_s = decode_cost_ms / 1000.0
    if batch_size < 1 or batch_size > idx.size:
        raise ValueError(f"batch size {batch_size} must be within 1..{idx.size} (samples in this shard)")
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(idx)
        for b in range(idx.size // batch_size):
            xs = np.empty((batch_size, 32, 32, 3), dtype=np.float32)
            ys = np.empty((batch_size,), dtype=np.int32)
            for j, i in enumerate(order[b * batch_size:(b + 1) * batch_size]):
                img, label = decode_record(store.read(int(i)))
                burn_cpu(cost_s)
                xs[j] = augment_np(img, rng) if augment else img
                ys[j] = label
            yield xs, ys


def _sleep_each(ds, microseconds: int):
    """``ds`` with a blocking delay before each element (the C++ SleepDataset op, via
    public APIs: it sleeps in tf.data's own worker thread, without the GIL)."""
    import tensorflow as tf

    variant = tf.data.experimental.to_variant(ds)
    slept = tf.raw_ops.SleepDataset(
        input_dataset=variant, sleep_microseconds=microseconds,
        output_types=[ds.element_spec.dtype], output_shapes=[ds.element_spec.shape])
    return tf.data.experimental.from_variant(slept, ds.element_spec)


def _burn_tf(tf, x, seconds: float):
    """``x`` after ``seconds`` of CPU work by :func:`burn_cpu` in a ``tf.py_function``: Python work in
    tf.data's map threads, as a decoder wrapped in py_function (it holds the GIL, so parallel calls
    overlap little).  A graph-side busy loop (``tf.while_loop`` on ``tf.timestamp``) would avoid the
    GIL, but with one in the map function the TensorFlow profiler measures no step time at all."""
    return tf.py_function(lambda a: (burn_cpu(seconds), a)[1], [x], x.dtype)


def tfdata_dataset(records: np.ndarray, batch_size: int, *, io_latency_ms: float = 0.0,
                   read_parallelism: int = 16, cache: bool = False, seed: int = 0, augment: bool = True,
                   shard_count: int = 1, shard_index: int = 0, shuffle_buffer: int = 10000,
                   decode_cost_ms: float = 0.0, parallel_map: bool = True, prefetch: bool = True):
    """The ``tf.data`` pipeline over CIFAR binary ``records`` yielding (x float32, y int32) batches."""
    import tensorflow as tf

    records = np.asarray(records)
    if records.dtype != np.uint8 or records.ndim != 2 or records.shape[1] != RECORD_BYTES:
        raise ValueError(f"records must be uint8 (N, {RECORD_BYTES}), got {records.dtype} {records.shape}")
    n_local = _shard(records.shape[0], shard_count, shard_index).size
    if batch_size < 1 or batch_size > n_local:
        raise ValueError(f"batch size {batch_size} must be within 1..{n_local} (samples in this shard)")
    if read_parallelism < 1:
        raise ValueError(f"read parallelism must be >= 1, got {read_parallelism}")
    if decode_cost_ms < 0:
        raise ValueError(f"decode cost must be >= 0 ms, got {decode_cost_ms}")
    autotune = tf.data.AUTOTUNE
    map_calls = autotune if parallel_map else None
    cost_s = decode_cost_ms / 1000.0
    table = tf.constant(records)
    latency_us = int(round(io_latency_ms * 1000))

    ds = tf.data.Dataset.range(records.shape[0]).shard(shard_count, shard_index)
    if not cache:  # shuffle the read order every epoch (with cache, shuffle after the cache)
        ds = ds.shuffle(n_local, seed=seed, reshuffle_each_iteration=True)
    if latency_us > 0:
        ds = ds.interleave(lambda i: _sleep_each(tf.data.Dataset.from_tensors(i), latency_us),
                           cycle_length=read_parallelism, block_length=1,
                           num_parallel_calls=autotune, deterministic=False)

    def decode(i):
        rec = tf.cast(tf.gather(table, i), tf.float32)
        img = tf.transpose(tf.reshape(rec[1:], (3, 32, 32)), (1, 2, 0))
        if cost_s > 0:
            img = tf.ensure_shape(_burn_tf(tf, img, cost_s), (32, 32, 3))
        return img * (1.0 / 255.0), tf.cast(rec[0], tf.int32)

    ds = ds.map(decode, num_parallel_calls=map_calls)
    if cache:
        ds = ds.cache().shuffle(min(n_local, shuffle_buffer), seed=seed, reshuffle_each_iteration=True).repeat()
    else:
        # Repeat after the parallel reads, not before: the reads finish out of order, so a repeat
        # upstream of them let the next epoch's samples overtake this one's last ones.
        ds = ds.repeat()

    if augment:
        def aug(img, label):
            img = tf.image.random_flip_left_right(img)
            img = tf.image.pad_to_bounding_box(img, PAD, PAD, 32 + 2 * PAD, 32 + 2 * PAD)
            return tf.image.random_crop(img, (32, 32, 3)), label

        ds = ds.map(aug, num_parallel_calls=map_calls)
    ds = ds.batch(batch_size, drop_remainder=True)
    if prefetch:
        ds = ds.prefetch(autotune)
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF  # sharded above
    return ds.with_options(opts)


def make_batches(kind: str, records: np.ndarray, batch_size: int, *, io_latency_ms: float = 0.0,
                 read_parallelism: int = 16, cache: bool = False, seed: int = 0,
                 shard_count: int = 1, shard_index: int = 0, augment: bool = True, decode_cost_ms: float = 0.0,
                 parallel_map: bool = True, prefetch: bool = True):
    """An iterable of batches for pipeline ``kind`` (a generator for naive, a Dataset for tfdata)."""
    if kind == "naive":
        store = SlowStore(records, io_latency_ms / 1000.0)
        return naive_batches(store, batch_size, seed=seed, augment=augment,
                             shard_count=shard_count, shard_index=shard_index, decode_cost_ms=decode_cost_ms)
    if kind == "tfdata":
        return tfdata_dataset(records, batch_size, io_latency_ms=io_latency_ms, read_parallelism=read_parallelism,
                              cache=cache, seed=seed, augment=augment,
                              shard_count=shard_count, shard_index=shard_index, decode_cost_ms=decode_cost_ms,
                              parallel_map=parallel_map, prefetch=prefetch)
    raise ValueError(f"unknown pipeline {kind!r}; valid: {', '.join(PIPELINES)}")
