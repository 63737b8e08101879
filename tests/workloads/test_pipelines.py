"""The naive pipeline (plain Python, no TensorFlow): reads, latency, decode, sharding, epochs."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from workloads import data
from workloads.pipelines import SlowStore, augment_np, make_batches, naive_batches


def records(n=40, seed=0):
    (x, y), _ = data.synthetic_cifar10(n, 0, seed=seed)
    return data.encode_records(x, y), x, y[:, 0]


def test_slow_store_sleeps_once_per_read():
    rec, _, _ = records(8)
    slept = []
    store = SlowStore(rec, 0.005, sleep=slept.append)
    gen = naive_batches(store, 4, augment=False)
    next(gen)
    next(gen)
    assert store.reads == 8 and slept == [0.005] * 8


def test_one_epoch_visits_every_sample_once_decoded_exactly():
    rec, x, y = records(40)
    gen = naive_batches(SlowStore(rec), 8, seed=1, augment=False)
    xs, ys = zip(*itertools.islice(gen, 5))              # 40 samples = one epoch
    bx, by = np.concatenate(xs), np.concatenate(ys)
    assert bx.dtype == np.float32 and bx.shape == (40, 32, 32, 3) and by.dtype == np.int32
    got = sorted((int(l), np.rint(img * 255).astype(np.uint8).tobytes()) for img, l in zip(bx, by))
    want = sorted((int(l), img.tobytes()) for img, l in zip(x, y))
    assert got == want
    # the next epoch is a different order of the same samples
    xs2, _ = zip(*itertools.islice(gen, 5))
    assert not np.array_equal(np.concatenate(xs2), bx)


def test_shards_are_disjoint_and_cover_the_data():
    rec, _, y = records(30)
    seen = []
    for k in range(3):
        gen = naive_batches(SlowStore(rec), 5, augment=False, shard_count=3, shard_index=k)
        imgs = np.concatenate([b[0] for b in itertools.islice(gen, 2)])   # 10 samples = this shard's epoch
        seen.append({np.rint(i * 255).astype(np.uint8).tobytes() for i in imgs})
    assert all(len(s) == 10 for s in seen)
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])


def test_augment_is_a_flip_and_a_shifted_crop():
    img = np.arange(32 * 32 * 3, dtype=np.float32).reshape(32, 32, 3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        out = augment_np(img, rng)
        assert out.shape == (32, 32, 3)
        # every non-padding value comes from the image or its mirror image, shifted by at most 4 pixels
        found = False
        for src in (img, img[:, ::-1, :]):
            padded = np.pad(src, ((4, 4), (4, 4), (0, 0)))
            for dy in range(9):
                for dx in range(9):
                    if np.array_equal(padded[dy:dy + 32, dx:dx + 32], out):
                        found = True
        assert found


def test_bad_arguments():
    rec, _, _ = records(10)
    with pytest.raises(ValueError, match="batch size 20"):
        next(naive_batches(SlowStore(rec), 20))
    with pytest.raises(ValueError, match="shard"):
        next(naive_batches(SlowStore(rec), 2, shard_count=2, shard_index=2))
    with pytest.raises(ValueError, match="records must be uint8"):
        SlowStore(np.zeros((3, 5), np.uint8))
    with pytest.raises(ValueError, match="unknown pipeline 'fast'; valid: naive, tfdata"):
        make_batches("fast", rec, 2)
