"""The reference models of the studies and their losses (TensorFlow / Keras 3).

* ``simple_cnn``: the TensorFlow CNN tutorial model used in the CIFAR-10 study:
  three 3x3 convolutions (32, 64, 64 filters) with 2x2 max-pooling between them,
  flatten, dense 64 (ReLU), dense 10 (logits).
* ``resnet50``: ``keras.applications.ResNet50`` (random init, 10 classes, 32x32x3
  input, logits).
* ``facenet``: a small SqueezeNet-style backbone (fire modules) ending in an
  L2-normalized embedding, trained with the triplet loss and online *batch-hard*
  triplet selection (each anchor's farthest positive and closest negative in the
  batch; FaceNet's margin 0.2, squared Euclidean distances).  The labels are the
  identities.

Every loss is returned per example (float32) so the training loop can average it over
the global batch (``tf.nn.compute_average_loss``) under any distribution strategy.
Import this module only where TensorFlow is installed (``pip install teye[workloads]``).
"""
from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers

__all__ = ["MODELS", "EMBEDDING_DIM", "TRIPLET_MARGIN", "build_model", "loss_fn",
           "classification_loss", "batch_hard_triplet_loss"]

MODELS = ("simple_cnn", "resnet50", "facenet")
INPUT_SHAPE = (32, 32, 3)
EMBEDDING_DIM = 64
TRIPLET_MARGIN = 0.2


def simple_cnn(num_classes: int = 10, input_shape=INPUT_SHAPE) -> keras.Model:
    inputs = keras.Input(shape=input_shape, name="image")
    x = layers.Conv2D(32, 3, activation="relu")(inputs)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Conv2D(64, 3, activation="relu")(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Conv2D(64, 3, activation="relu")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(64, activation="relu")(x)
    logits = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, logits, name="simple_cnn")


def resnet50(num_classes: int = 10, input_shape=INPUT_SHAPE) -> keras.Model:
    return keras.applications.ResNet50(weights=None, include_top=True, classes=num_classes,
                                       input_shape=input_shape, classifier_activation=None)


def _conv_bn(x, filters: int, kernel: int, name: str):
    x = layers.Conv2D(filters, kernel, padding="same", use_bias=False, name=name)(x)
    x = layers.BatchNormalization(name=f"{name}_bn")(x)
    return layers.ReLU(name=f"{name}_relu")(x)


def _fire(x, squeeze: int, expand: int, name: str):
    s = _conv_bn(x, squeeze, 1, f"{name}_squeeze")
    e1 = layers.Conv2D(expand, 1, activation="relu", name=f"{name}_expand1x1")(s)
    e3 = layers.Conv2D(expand, 3, padding="same", activation="relu", name=f"{name}_expand3x3")(s)
    return layers.Concatenate(name=f"{name}_concat")([e1, e3])


def facenet(embedding_dim: int = EMBEDDING_DIM, input_shape=INPUT_SHAPE) -> keras.Model:
    inputs = keras.Input(shape=input_shape, name="image")
    x = _conv_bn(inputs, 64, 3, "conv1")
    x = layers.MaxPooling2D(2, name="pool1")(x)                       # 16x16
    x = _fire(x, 16, 64, "fire2")
    x = _fire(x, 16, 64, "fire3")
    x = layers.MaxPooling2D(2, name="pool3")(x)                       # 8x8
    x = _fire(x, 32, 128, "fire4")
    x = _fire(x, 32, 128, "fire5")
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    x = layers.Dense(embedding_dim, use_bias=False, name="bottleneck")(x)
    x = layers.BatchNormalization(name="bottleneck_bn")(x)  # centres the features: no collapsed start
    # The embedding lives on the unit hypersphere, in float32 even under mixed precision.
    emb = layers.UnitNormalization(axis=-1, dtype="float32", name="embedding")(x)
    return keras.Model(inputs, emb, name="facenet")


def build_model(name: str, num_classes: int = 10) -> keras.Model:
    """A freshly initialised model by name (uses the current Keras dtype policy)."""
    if name == "simple_cnn":
        return simple_cnn(num_classes)
    if name == "resnet50":
        return resnet50(num_classes)
    if name == "facenet":
        return facenet()
    raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")


def classification_loss(labels, logits):
    """Per-example sparse softmax cross-entropy on float32 logits."""
    labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.cast(logits, tf.float32))


def batch_hard_triplet_loss(labels, embeddings, margin: float = TRIPLET_MARGIN):
    """Per-anchor batch-hard triplet loss: relu(d(a, hardest p) - d(a, hardest n) + margin).

    ``d`` is the squared Euclidean distance between embeddings.  Anchors with no
    positive (no other sample of the same identity) or no negative in the batch
    contribute 0.
    """
    labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
    emb = tf.cast(embeddings, tf.float32)
    dot = tf.matmul(emb, emb, transpose_b=True)
    sq = tf.linalg.diag_part(dot)
    dist = tf.maximum(sq[:, None] - 2.0 * dot + sq[None, :], 0.0)
    same = tf.equal(labels[:, None], labels[None, :])
    not_self = tf.logical_not(tf.eye(tf.shape(labels)[0], dtype=tf.bool))
    pos_mask = tf.logical_and(same, not_self)
    neg_mask = tf.logical_not(same)
    hardest_pos = tf.reduce_max(tf.where(pos_mask, dist, 0.0), axis=1)
    big = tf.reduce_max(dist) + 1.0
    hardest_neg = tf.reduce_min(tf.where(neg_mask, dist, big), axis=1)
    valid = tf.logical_and(tf.reduce_any(pos_mask, axis=1), tf.reduce_any(neg_mask, axis=1))
    per_anchor = tf.nn.relu(hardest_pos - hardest_neg + margin)
    return tf.where(valid, per_anchor, 0.0)


def loss_fn(model_name: str):
    """The per-example loss ``f(labels, model_output)`` for a model."""
    return batch_hard_triplet_loss if model_name == "facenet" else classification_loss
