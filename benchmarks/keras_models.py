"""Keras 3 Model.fit jobs on models no test contains, for benchmarks/keras_profiler.py (unmodified: teye
instruments them from outside under `teye run`).

    python benchmarks/keras_models.py MODEL STEPS OUT.json PROFILE_DIR FIRST LAST

MODEL (each with an input pipeline slower than its step, by a different route):
  mlp   a 3-layer perceptron on flattened 32x32x3 images, Adam, dropout; batches of 128 through a
        numpy_function map that sleeps 50 ms per batch (a slow read after batching)
  aug   a small CNN, per-example augmentation (random flip and brightness) and a 1.5 ms sleep per example
        in a numpy_function, then batches of 32 (a slow decode before batching)
  text  a text classifier (embedding, 1-D convolution, global max pooling) over token sequences of 64,
        RMSprop; a per-batch py_function sleeping 40 ms, a parallel map (2 calls) and prefetch(2)
(A GRU was tried too: the profiler's analyzer finds no step in its trace, "No step time measured".)
The TensorFlow profiler traces batches FIRST..LAST (workloads.tfprofile.profile_callback: the oracle's
window).  OUT.json: the loss after the epoch and the wall time of fit.
"""
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf
import keras

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from workloads.tfprofile import profile_callback  # noqa: E402

name, steps, out, logdir, first, last = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], \
    int(sys.argv[5]), int(sys.argv[6])
keras.utils.set_random_seed(3)
rng = np.random.RandomState(3)


def sleeper(seconds):
    def read(a):
        time.sleep(seconds)
        return a
    return read


def slow(fn, a, kind=tf.numpy_function):
    return tf.ensure_shape(kind(fn, [a], tf.float32), a.shape)


if name == "mlp":
    batch = 128
    x = rng.rand(batch * steps, 32, 32, 3).astype("float32")
    y = rng.randint(0, 10, size=(batch * steps,)).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).map(lambda a, b: (slow(sleeper(0.05), a), b))
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(512, activation="relu"), keras.layers.Dropout(0.2),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    opt = keras.optimizers.Adam(1e-3)
elif name == "aug":
    batch = 32
    x = rng.rand(batch * steps, 32, 32, 3).astype("float32")
    y = rng.randint(0, 10, size=(batch * steps,)).astype("int32")

    def augment(a, b):
        return tf.image.random_brightness(tf.image.random_flip_left_right(a), 0.1), b

    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(augment).map(
        lambda a, b: (slow(sleeper(0.0015), a), b)).batch(batch)
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                              keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(10)])
    opt = keras.optimizers.Adam(1e-3)
elif name == "text":
    batch = 64
    x = rng.randint(0, 2000, size=(batch * steps, 64)).astype("float32")   # token ids (cast in the model)
    y = rng.randint(0, 5, size=(batch * steps,)).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).map(
        lambda a, b: (slow(sleeper(0.04), a, tf.py_function), b), num_parallel_calls=2).prefetch(2)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Embedding(2000, 32),
                              keras.layers.Conv1D(32, 5, activation="relu"), keras.layers.GlobalMaxPooling1D(),
                              keras.layers.Dense(5)])
    opt = keras.optimizers.RMSprop(1e-3)
else:
    sys.exit("unknown model %r" % name)
model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
t0 = time.perf_counter()
hist = model.fit(ds, epochs=1, verbose=0, callbacks=[profile_callback(logdir, first, last)])
json.dump({"loss": hist.history["loss"][-1], "fit_s": time.perf_counter() - t0}, open(out, "w"))
