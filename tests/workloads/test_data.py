"""CIFAR-10 loader on files the test writes, synthetic data, record encoding (numpy only)."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from workloads import data
from workloads.data import DataError, load_cifar10


def make_arrays(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8),
            rng.integers(0, 10, size=n).astype(np.int64))


def write_batch(path, x, y, protocol=2):
    """A batch in the CIFAR-10 python layout: data rows are 1024 R, 1024 G, 1024 B bytes."""
    d = {b"batch_label": b"testing batch", b"labels": [int(v) for v in y],
         b"data": x.transpose(0, 3, 1, 2).reshape(len(x), 3072).copy(),
         b"filenames": [b"img%d.png" % i for i in range(len(x))]}
    with open(path, "wb") as fh:
        pickle.dump(d, fh, protocol=protocol)


def write_dataset(root, sizes=(3, 4, 2, 5, 1), n_test=3, protocol=2):
    xs, ys = [], []
    for i, n in enumerate(sizes, 1):
        x, y = make_arrays(n, seed=i)
        write_batch(os.path.join(root, f"data_batch_{i}"), x, y, protocol)
        xs.append(x)
        ys.append(y)
    xt, yt = make_arrays(n_test, seed=99)
    write_batch(os.path.join(root, "test_batch"), xt, yt, protocol)
    return (np.concatenate(xs), np.concatenate(ys)), (xt, yt)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_round_trip_exact_arrays_dtypes_and_shapes(tmp_path, protocol):
    (x, y), (xt, yt) = write_dataset(str(tmp_path), protocol=protocol)
    (x_train, y_train), (x_test, y_test) = load_cifar10(str(tmp_path))
    assert x_train.dtype == np.uint8 and x_train.shape == (15, 32, 32, 3)
    assert y_train.dtype == np.uint8 and y_train.shape == (15, 1)
    assert x_test.shape == (3, 32, 32, 3) and y_test.shape == (3, 1) and y_test.dtype == np.uint8
    np.testing.assert_array_equal(x_train, x)          # batch order 1..5, pixel layout RGB planes -> HWC
    np.testing.assert_array_equal(y_train[:, 0], y)
    np.testing.assert_array_equal(x_test, xt)
    np.testing.assert_array_equal(y_test[:, 0], yt)


def test_tarball_layout_subfolder(tmp_path):
    sub = tmp_path / "cifar-10-batches-py"
    sub.mkdir()
    (x, _), _ = write_dataset(str(sub))
    (x_train, _), _ = load_cifar10(str(tmp_path))
    np.testing.assert_array_equal(x_train, x)


def test_pixel_layout_is_red_green_blue_planes(tmp_path):
    """One hand-made image: red plane 10, green 20, blue 30, one marked red pixel at row 1, col 2."""
    row = np.concatenate([np.full(1024, 10), np.full(1024, 20), np.full(1024, 30)]).astype(np.uint8)
    row[1 * 32 + 2] = 255
    for name in data.TRAIN_BATCHES + (data.TEST_BATCH,):
        with open(tmp_path / name, "wb") as fh:
            pickle.dump({b"data": row[None, :], b"labels": [7]}, fh, protocol=2)
    (x, y), _ = load_cifar10(str(tmp_path))
    assert x.shape == (5, 32, 32, 3) and list(y[:, 0]) == [7] * 5
    assert tuple(x[0, 0, 0]) == (10, 20, 30)
    assert tuple(x[0, 1, 2]) == (255, 20, 30)


def test_missing_batch_names_the_file(tmp_path):
    write_dataset(str(tmp_path))
    os.remove(tmp_path / "data_batch_3")
    with pytest.raises(DataError) as e:
        load_cifar10(str(tmp_path))
    assert e.value.path == str(tmp_path / "data_batch_3")
    assert "data_batch_3" in str(e.value) and "missing" in str(e.value)


def test_missing_directory(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_cifar10(str(tmp_path / "nope"))


def _corrupt_truncated(p):
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) // 2])


def _corrupt_garbage(p):
    p.write_bytes(b"this is not a pickle at all")


def _corrupt_shape(p):
    with open(p, "wb") as fh:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, fh)


def _corrupt_labels(p):
    with open(p, "wb") as fh:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 12]}, fh)


def _corrupt_count(p):
    with open(p, "wb") as fh:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, fh)


def _corrupt_no_data(p):
    with open(p, "wb") as fh:
        pickle.dump({b"labels": [0]}, fh)


def _corrupt_not_dict(p):
    with open(p, "wb") as fh:
        pickle.dump([1, 2, 3], fh)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def _corrupt_code(p):
    with open(p, "wb") as fh:
        pickle.dump({b"data": Evil(), b"labels": []}, fh)


@pytest.mark.parametrize("corrupt,reason", [
    (_corrupt_truncated, "corrupt"), (_corrupt_garbage, "corrupt"), (_corrupt_shape, "uint8 \\(n, 3072\\)"),
    (_corrupt_labels, "labels must be 0..9"), (_corrupt_count, "1 labels for 2 images"),
    (_corrupt_no_data, "no 'data'"), (_corrupt_not_dict, "expected a dict"), (_corrupt_code, "refusing to load"),
])
def test_corrupt_batch_names_the_file(tmp_path, corrupt, reason):
    write_dataset(str(tmp_path))
    target = tmp_path / "data_batch_2"
    corrupt(target)
    with pytest.raises(DataError, match=reason) as e:
        load_cifar10(str(tmp_path))
    assert e.value.path == str(target)
    assert str(e.value).startswith(str(target) + ":")


def test_synthetic_deterministic_shapes_and_learnable():
    (x, y), (xt, yt) = data.synthetic_cifar10(2000, 500, seed=3)
    (x2, y2), _ = data.synthetic_cifar10(2000, 500, seed=3)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert x.dtype == np.uint8 and x.shape == (2000, 32, 32, 3) and y.dtype == np.uint8 and y.shape == (2000, 1)
    assert xt.shape == (500, 32, 32, 3) and set(np.unique(y)) == set(range(10))
    other, _ = data.synthetic_cifar10(2000, 0, seed=4)
    assert not np.array_equal(other[0], x)
    # learnable: a nearest-class-mean classifier fitted on train does far better than chance (10 %) on test
    means = np.stack([x[y[:, 0] == c].reshape(-1, 3072).astype(np.float64).mean(0) for c in range(10)])
    d = ((xt.reshape(-1, 3072)[:, None, :].astype(np.float64) - means[None]) ** 2).sum(-1)
    acc = float((d.argmin(1) == yt[:, 0]).mean())
    assert acc > 0.9
    # ... but not trivially: samples are noisy (no two identical images)
    assert len({row.tobytes() for row in x.reshape(len(x), -1)}) == len(x)


def test_encode_decode_records_round_trip():
    x, y = make_arrays(6, seed=5)
    rec = data.encode_records(x, y.astype(np.uint8))
    assert rec.shape == (6, data.RECORD_BYTES) and rec.dtype == np.uint8
    for i in range(6):
        img, label = data.decode_record(rec[i])
        assert label == y[i]
        assert img.dtype == np.float32
        np.testing.assert_array_equal(np.rint(img * 255).astype(np.uint8), x[i])
    with pytest.raises(ValueError):
        data.encode_records(x.astype(np.float32), y)
