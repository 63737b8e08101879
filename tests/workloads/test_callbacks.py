"""The Keras callback gives model.fit users the same phases (approximately) through PhaseTimer."""
from __future__ import annotations

import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import keras  # noqa: E402

from workloads.callbacks import PhaseCallback, InputProbe  # noqa: E402
from workloads.timing import PhaseTimer  # noqa: E402
from tests.workloads.sinks import RecordingSink  # noqa: E402

pytestmark = pytest.mark.tf

SLEEP_S = 0.060   # ground truth: the generator needs this long per batch, far longer than a step


def slow_batches(n, batch):
    rng = np.random.default_rng(0)
    for _ in range(n):
        time.sleep(SLEEP_S)
        x = rng.random((batch, 8), dtype=np.float32)
        yield x, (x.sum(axis=1, keepdims=True) > 4).astype(np.float32)




def test_fit_with_slow_generator_reports_the_input_wait():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    sink = RecordingSink()
    timer = PhaseTimer(sink=sink)
    steps = 10
    probe = InputProbe()
    model.fit(probe.wrap(slow_batches(steps, 16)), steps_per_epoch=steps, epochs=1, verbose=0,
              shuffle=False, callbacks=[PhaseCallback(timer, inputs=probe)])
    assert len(timer.steps) == steps
    assert [s.samples for s in timer.steps] == [16] * steps
    # Keras reads the first batches ahead (to learn their shapes); from then on each step waits
    # for the generator, which needs SLEEP_S per batch
    waits = [s.phase_seconds("data_wait") for s in timer.steps[3:]]
    assert min(waits) > 0.5 * SLEEP_S and np.median(waits) < 2.5 * SLEEP_S
    summary = timer.summary(warmup_steps=3)
    assert summary.input_wait_fraction > 0.6
    for s in timer.steps:
        assert s.phase_seconds("compute") > 0
    assert {p[0] for p in sink.phases} == {"data_wait", "compute", "host"}
    assert len(sink.steps) == steps


def test_fit_without_input_probe_reports_compute_and_host():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((64, 4), np.float32)
    timer = PhaseTimer()
    model.fit(x, x[:, :1], batch_size=16, epochs=2, verbose=0, callbacks=[PhaseCallback(timer, batch_size=16)])
    assert len(timer.steps) == 8
    names = {n for s in timer.steps for n, _ in s.phases_ns}
    assert names == {"compute", "host"}
    # host gaps are counted between batches of one epoch only (restart at each epoch end)
    assert [("host" in dict(s.phases_ns)) for s in timer.steps] == [False, True, True, True] * 2
