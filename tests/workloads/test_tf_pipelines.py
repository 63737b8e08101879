"""The tf.data pipeline: an epoch is exactly the shard's samples, with and without cache/latency."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from workloads import data  # noqa: E402
from workloads.pipelines import tfdata_dataset  # noqa: E402

pytestmark = pytest.mark.tf


def records(n=40, seed=0):
    (x, y), _ = data.synthetic_cifar10(n, 0, seed=seed)
    return data.encode_records(x, y), x, y[:, 0]


def as_keys(batches):
    out = []
    for bx, by in batches:
        for img, label in zip(bx.numpy(), by.numpy()):
            out.append((int(label), np.rint(img * 255).astype(np.uint8).tobytes()))
    return sorted(out)


@pytest.mark.parametrize("cache,latency", [(False, 0.0), (False, 1.0), (True, 1.0)])
def test_epochs_cover_each_sample_exactly_once(cache, latency):
    rec, x, y = records(40)
    ds = tfdata_dataset(rec, 8, io_latency_ms=latency, read_parallelism=4, cache=cache, augment=False)
    assert ds.element_spec[0].shape.as_list() == [8, 32, 32, 3] and ds.element_spec[0].dtype == tf.float32
    assert ds.element_spec[1].dtype == tf.int32
    want = sorted((int(l), img.tobytes()) for img, l in zip(x, y))
    it = iter(ds)
    assert as_keys(itertools.islice(it, 5)) == want      # epoch 1
    assert as_keys(itertools.islice(it, 5)) == want      # epoch 2 (repeat; from the cache when cache=True)


def test_shards_split_the_samples():
    rec, x, y = records(40)
    halves = []
    for k in range(2):
        ds = tfdata_dataset(rec, 5, shard_count=2, shard_index=k, augment=False)
        halves.append(as_keys(itertools.islice(iter(ds), 4)))
    want = {(int(l), img.tobytes()) for img, l in zip(x, y)}
    assert len(halves[0]) == len(halves[1]) == 20
    assert set(halves[0]) | set(halves[1]) == want
    assert not set(halves[0]) & set(halves[1])
    # shard k holds samples k, k+2, ... (by index)
    assert set(halves[1]) == {(int(y[i]), x[i].tobytes()) for i in range(1, 40, 2)}


def test_augmented_batches_keep_labels_and_range():
    rec, _, y = records(16)
    bx, by = next(iter(tfdata_dataset(rec, 16, augment=True)))
    assert bx.shape == (16, 32, 32, 3)
    assert float(tf.reduce_min(bx)) >= 0.0 and float(tf.reduce_max(bx)) <= 1.0
    assert sorted(by.numpy().tolist()) == sorted(y.tolist())
