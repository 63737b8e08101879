"""An unmodified TensorFlow custom training loop that evaluates while it trains, with its own clock.

    python tf_eval_loop.py STEPS EVERY [optstep] [--fast]

A batch-size probe (next(iter(train))) first; then STEPS training steps, each a batch taken eagerly from a
tf.data iterator whose map sleeps (input-bound training) and a tf.function applying a Keras optimizer; every
EVERY steps, and once after the last step, a validation pass over its own tf.data pipeline (its map sleeps
too) through a tf.function that only computes the loss.  optstep: the validation step also applies the
optimizer (it is then training, by definition).  EVERY 0: no evaluation at all (neither the probe nor a
validation pass).  --fast: no sleep in either map.  Prints its losses, then one JSON line: its training steps'
time (from asking for a batch to the train step's return), their input wait, the samples trained, and the
time spent evaluating (the probe's and each validation pass's: from its first batch asked for, once its
iterator is made, to the next training batch asked for; the final pass to its last batch).
"""
import sys
import time

import numpy as np
import tensorflow as tf
import keras

from tests.client.own_clock import OwnClock

fast = "--fast" in sys.argv[1:]
argv = [a for a in sys.argv if a != "--fast"]
steps, every = int(argv[1]), int(argv[2])
optstep = len(argv) > 3 and argv[3] == "optstep"
BS, VAL = 8, 5
keras.utils.set_random_seed(0)
rng = np.random.RandomState(0)


def slow(sleep_s):
    def read(a):
        time.sleep(sleep_s)
        return a
    return lambda a, b: (tf.ensure_shape(tf.numpy_function(read, [a], tf.float32), a.shape), b)


def pipeline(n, sleep_s):
    ds = tf.data.Dataset.from_tensor_slices((rng.rand(n, 16).astype("float32"), rng.rand(n, 1).astype("float32")))
    return ds.batch(BS).map(slow(sleep_s)) if sleep_s else ds.batch(BS)


train = pipeline(BS * steps, 0 if fast else 0.004)
val = pipeline(BS * VAL, 0 if fast else 0.006)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
opt = keras.optimizers.SGD(0.01)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return loss


@tf.function
def val_step(x, y):
    return tf.reduce_mean((model(x) - y) ** 2)


own = OwnClock()
opt_in_eval = 0
own.eval_last = None
if every:
    first = iter(train)
    own.eval_from = own.clock()            # a batch-size probe, not training: eval to its next training batch
    probe = next(first)
    print("probe batch", int(probe[0].shape[0]), flush=True)


def evaluate():
    global opt_in_eval
    total = 0.0
    batches = iter(val)   # a few ms in tf.data, before its first batch: neither training nor eval to teye
    own.eval_from = own.clock()
    for x, y in batches:
        total += float(train_step(x, y) if optstep else val_step(x, y))
        opt_in_eval += optstep
        own.eval_last = own.clock()
    print("val %.6f" % total, flush=True)


it = iter(train)


def train_one(batch):
    x, y = batch
    traced = train_step.experimental_get_tracing_count()
    t = own.clock()
    loss = train_step(x, y)
    if train_step.experimental_get_tracing_count() != traced:   # this call traced and compiled it
        own.compile_s += own.clock() - t
    print("loss %.6f" % float(loss), flush=True)
    return int(x.shape[0])


for i in range(steps):
    own.step(lambda: next(it), train_one)
    if every and (i + 1) % every == 0:
        own.evaluate(evaluate)
own.report(steps, final_end=own.eval_last, opt_in_eval=opt_in_eval)
