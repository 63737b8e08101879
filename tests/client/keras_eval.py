"""An unmodified Keras 3 Model.fit script (TensorFlow backend) that evaluates while it trains, with its own clock.

    python keras_eval.py STEPS EVERY [--fast] [--out OUT.json]

fit() trains STEPS batches of 16 over a tf.data pipeline whose map sleeps 15 ms per batch (input-bound
training; --fast: no map, no sleep), in epochs of EVERY batches with validation_data every epoch over its
own pipeline, slower (30 ms per batch, 4 batches); after the first epoch a callback calls model.predict()
on the validation inputs (an evaluation between epochs); after fit, model.evaluate() and model.predict().
EVERY 0: one epoch, no evaluation at all.  The script's own clock (a Keras callback): each training step from
on_train_batch_begin to on_train_batch_end, each evaluation from on_test_begin to on_test_end (and around
its predict calls); the time between two epochs' batches and around the evaluate and predict after fit, an
upper bound of what evaluation can have taken; the steps again, each from the end of the one before, as the
phase protocol counts a step; and the time its training map spent reading (its input wait: tf.data's
injected prefetch is off, so each batch is read while the step waits for it); and what an eager fetch of a
batch costs beyond that reading (the wait's own overhead: op dispatch, the map's call into Python, the
handoff between tf.data's thread and this one, the wake-ups around the map's sleep): a twin of the training
pipeline fetched eagerly with get_next() as many times and in as many iterators as fit fetched, less its
map's own reading, before fit and after the last evaluation (the larger of the two: the load at either end).
Prints one JSON line with those timings; --out writes the losses and metrics Keras computed (compared with
and without teye).
"""
import json
import sys
import time

import numpy as np
import tensorflow as tf
import keras

args = sys.argv[1:]
fast = "--fast" in args
out = args[args.index("--out") + 1] if "--out" in args else None
total, every = int(args[0]), int(args[1])
epochs, steps = (total // every, every) if every else (1, total)
read_s = 0 if fast else 0.015
BATCH, VAL = 16, 4
clock = time.perf_counter
keras.utils.set_random_seed(0)
rng = np.random.RandomState(0)
x = rng.rand(BATCH * steps, 32).astype("float32")
y = rng.randint(0, 4, size=(BATCH * steps,)).astype("int32")
vx = rng.rand(BATCH * VAL, 32).astype("float32")
vy = rng.randint(0, 4, size=(BATCH * VAL,)).astype("int32")
reads = []   # the training map's own time per batch (s)


def slow(sleep_s, log):
    def read(a):
        t = clock()
        if sleep_s:
            time.sleep(sleep_s)
        if log is not None:
            log.append(clock() - t)
        return a
    return lambda a, b: (tf.ensure_shape(tf.numpy_function(read, [a], tf.float32), a.shape), b)


no_prefetch = tf.data.Options()   # tf.data would read the next batch ahead: the read would not be the wait
no_prefetch.experimental_optimization.inject_prefetch = False
no_prefetch.autotune.enabled = False
train = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
train = (train.map(slow(read_s, reads)) if read_s else train).with_options(no_prefetch)
val = tf.data.Dataset.from_tensor_slices((vx, vy)).batch(BATCH).map(slow(0.03, None))
val_inputs = tf.data.Dataset.from_tensor_slices(vx).batch(BATCH).map(lambda a: slow(0.03, None)(a, 0)[0])


def fetch_cost():
    """The eager fetch's own cost for fit's batches (`steps` in each of `epochs` iterators): a twin of the
    training pipeline (the same slicing, batching, map and options), each batch fetched with get_next() (not
    next(): an iterator teye times would be an evaluation), less the time the twin's map spent reading."""
    twin_reads = []
    twin = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    twin = (twin.map(slow(read_s, twin_reads)) if read_s else twin).with_options(no_prefetch)
    spent = 0.0
    for _ in range(epochs):
        it = iter(twin)
        for _ in range(steps):
            t = clock()
            it.get_next()
            spent += clock() - t
    return spent - sum(twin_reads)


fetch_before = fetch_cost()
traces = [0]   # the model's Python runs only while TensorFlow traces it: a batch during which this grew compiled


class Traced(keras.layers.Layer):
    """The identity, counting the times the model is traced (its own clock's compile_s; no change to the math)."""

    def call(self, a):
        traces[0] += 1
        return a


model = keras.Sequential([keras.Input((32,)), Traced(), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(4)])
model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])


class Clock(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.step_times, self.losses, self.predictions = [], [], []
        self.eval_s = 0.0    # inside the evaluations: on_test_begin..on_test_end, around each predict
        self.outer_s = 0.0   # ... and what surrounds them: between two epochs' batches, around the last ones
        self.loop_s = 0.0    # the training steps, each from the end of the one before (the first of an epoch
                             # from its begin): with outer_s, all of fit's time and the evaluations after it
        self.t = self.e = self.last = None
        self.compile_s = 0.0  # the batches that traced the train step: their time less their map's reads
        self.n = self.r = 0
        self.traced = []      # which of step_times they are

    def on_train_batch_begin(self, batch, logs=None):
        self.n, self.r = traces[0], len(reads)
        self.t = clock()
        if batch == 0:
            if self.last is not None:
                self.outer_s += self.t - self.last
            self.last = self.t

    def on_train_batch_end(self, batch, logs=None):
        t = clock()
        self.step_times.append(t - self.t)
        if traces[0] != self.n:
            self.compile_s += t - self.t - sum(reads[self.r:])
            self.traced.append(len(self.step_times) - 1)
        self.loop_s += t - self.last   # a step as the protocol's: from the previous one's end (docs/phases.md)
        self.last = t
        self.losses.append(float(logs["loss"]))

    def on_train_end(self, logs=None):
        self.outer_s += clock() - self.last
        self.last = None

    def on_test_begin(self, logs=None):
        self.e = clock()

    def on_test_end(self, logs=None):
        self.eval_s += clock() - self.e

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0 and every:   # an evaluation between epochs
            self.predict()

    def predict(self):
        t = clock()
        p = self.model.predict(val_inputs, verbose=0)
        self.eval_s += clock() - t
        if self.last is None:  # after fit (between epochs, outer_s holds it)
            self.outer_s += clock() - t
        self.predictions.append(float(np.sum(p)))


cb = Clock()
hist = model.fit(train, epochs=epochs, validation_data=val if every else None, validation_freq=1, verbose=0,
                 callbacks=[cb])
evaluated = None
if every:
    t = clock()
    evaluated = model.evaluate(val, verbose=0, callbacks=[cb], return_dict=True)
    cb.outer_s += clock() - t
    cb.predict()
fetch_s = max(fetch_before, fetch_cost())
if out:
    json.dump({"losses": cb.losses, "history": hist.history, "evaluate": evaluated, "predictions": cb.predictions},
              open(out, "w"))
print(json.dumps({"steps": len(cb.step_times), "samples": BATCH * len(cb.step_times), "train_s": sum(cb.step_times),
                  "compile_s": cb.compile_s, "traced": cb.traced,
                  "wait_s": sum(reads), "fetch_s": fetch_s, "wait_share": sum(reads) / sum(cb.step_times),
                  "reads": len(reads),
                  "eval_s": cb.eval_s, "outer_s": cb.outer_s, "loop_s": cb.loop_s, "step_times": cb.step_times}))
