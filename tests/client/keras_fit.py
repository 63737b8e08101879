"""An unmodified Keras 3 Model.fit script (TensorFlow backend) for the zero-code tests.

    python keras_fit.py VARIANT STEPS OUT.json [PROFILE_DIR START END]

VARIANT: how the data reach fit and how the model trains:
  slow      tf.data with a slow map (each batch waits 300 ms in a numpy_function: a slow read, slower
            than a step of this model even on a loaded 2-core machine)
  fast      the same tf.data without the slow map
  generator a Python generator (Keras wraps it in tf.data.Dataset.from_generator)
  numpy     NumPy arrays (Keras makes the tf.data pipeline)
  mirrored  tf.data inside tf.distribute.MirroredStrategy (one CPU replica)
  spe8      tf.data, compile(steps_per_execution=8)
  custom    tf.data, a model with its own train_step
  eager     tf.data, compile(run_eagerly=True)
Writes OUT.json: the loss after every batch (what fit computed; compared with and without teye).
With PROFILE_DIR, the TensorFlow profiler traces batches START..END (each in a Trace("train", step_num)),
as the reference training loop does.
"""
import json
import sys
import time

import numpy as np
import tensorflow as tf
import keras

variant, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
prof = sys.argv[4:7]
BATCH = 64
keras.utils.set_random_seed(0)
rng = np.random.RandomState(0)
x = rng.rand(BATCH * steps, 32, 32, 3).astype("float32")
y = rng.randint(0, 4, size=(BATCH * steps,)).astype("int32")


def slow_read(a):
    time.sleep(0.3)
    return a


def dataset(slow):
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    if slow:
        ds = ds.map(lambda a, b: (tf.ensure_shape(tf.numpy_function(slow_read, [a], tf.float32), a.shape), b))
    return ds


class Custom(keras.Sequential):
    """Its own train_step, logging the running mean of the loss as Keras' own does (equal batches)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mean_loss = keras.metrics.Mean()

    def train_step(self, data):
        a, b = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=a, y=b, y_pred=self(a, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        self.mean_loss.update_state(loss)
        return {"loss": self.mean_loss.result()}


def build():
    layers = [keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
              keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
              keras.layers.Dense(4)]
    m = (Custom if variant == "custom" else keras.Sequential)(layers)
    m.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              steps_per_execution=8 if variant == "spe8" else 1, run_eagerly=variant == "eager")
    return m


class Losses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def gen():
    for i in range(steps):
        yield x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]


cb = [Losses()]
if prof:   # the oracle's window (workloads/tfprofile.py), not part of the job's own code
    from workloads.tfprofile import profile_callback
    cb.append(profile_callback(prof[0], int(prof[1]), int(prof[2])))
if variant == "mirrored":
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model = build()
    model.fit(dataset(False), epochs=1, verbose=0, callbacks=cb)
elif variant == "generator":
    model = build()
    model.fit(gen(), epochs=1, steps_per_epoch=steps, verbose=0, callbacks=cb)
elif variant == "numpy":
    model = build()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=cb)
else:
    model = build()
    model.fit(dataset(variant == "slow"), epochs=1, verbose=0, callbacks=cb)
json.dump({"losses": cb[0].losses}, open(out, "w"))
