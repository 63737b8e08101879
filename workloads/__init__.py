"""Reference TensorFlow training workloads (the optional ``teye[workloads]`` extra).

Modules: ``models`` (simple_cnn, resnet50, facenet), ``data`` (CIFAR-10 loader,
synthetic data), ``pipelines`` (naive vs tf.data), ``train`` (the timed training
loop and CLI), ``timing`` (PhaseTimer), ``callbacks`` (Keras callback), ``sweep``
(batch-size sweep and optimization matrix), ``launch`` (local multi-worker runs),
``phases`` (the phase client for the teye agent).  Importing the package, ``timing``,
``data`` or ``phases`` does not import TensorFlow.
"""
