"""An unmodified TensorFlow custom training loop that times itself (issue 46's oracle for a TensorFlow trace).

    python tf_traced_job.py STEPS SLEEP_MS READY_FILE

Each batch comes eagerly from a tf.data iterator whose map sleeps SLEEP_MS per batch (no prefetch asked for:
the wait is in next()); each step is a tf.function that applies a Keras optimizer to a small convolutional
model.  The script writes READY_FILE after its fifth step (the test then asks for a trace).  It prints one
JSON line: per step (numbered from 1), the time it spent in next() and the step's span from the end of the
previous step function's return to the end of its own, by its own perf_counter (the oracle); and its final
loss (bit for bit with and without a trace).
"""
import json
import sys
import time

import numpy as np
import tensorflow as tf
import keras

STEPS, SLEEP_MS, READY = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
BS = 8
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
keras.utils.set_random_seed(0)
rng = np.random.RandomState(0)


def read(a):
    time.sleep(SLEEP_MS / 1000)
    return a


xs = rng.rand(BS * STEPS, 32, 32, 3).astype("float32")
ys = rng.rand(BS * STEPS, 1).astype("float32")
data = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(BS).map(
    lambda a, b: (tf.ensure_shape(tf.numpy_function(read, [a], tf.float32), a.shape), b))
model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
                          keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.Flatten(), keras.layers.Dense(1)])
opt = keras.optimizers.SGD(0.01)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return loss


rows = []
it = iter(data)
last = time.perf_counter()
for n in range(1, STEPS + 1):
    t0 = time.perf_counter()
    x, y = next(it)
    t1 = time.perf_counter()
    loss = train_step(x, y)
    end = time.perf_counter()
    rows.append([n, t1 - t0, end - last])
    last = end
    if n == 5:
        with open(READY, "w") as f:
            f.write("ready")
sys.stdout.write(json.dumps({"rows": rows, "loss": float(loss)}) + "\n")
sys.stdout.flush()
