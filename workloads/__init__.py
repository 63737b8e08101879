"""Reference TensorFlow training workloads (the optional ``teye[workloads]`` extra).

Modules: ``models`` (simple_cnn, resnet50, facenet), ``data`` (CIFAR-10 loader,
synthetic data), ``pipelines`` (naive vs tf.data), ``train`` (the timed training
loop and CLI), ``timing`` (PhaseTimer), ``callbacks`` (Keras callback), ``sweep``
(batch-size sweep and optimization matrix), ``launch`` (local multi-worker runs),
``phases`` (the phase client for the teye agent).  Importing the package, ``timing``,
``data`` or ``phases`` does not import TensorFlow.
"""


def train_command(python: str = "") -> list:
    """How sweep and launch start the train tool: ``python -m workloads.train`` in a checkout, ``python -m teye
    workloads train`` in an install (whose packages are private to teye: ``workloads`` is on no path of its own)."""
    import os
    import sys
    python = python or sys.executable
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.basename(os.path.dirname(here)) == "_lib":
        return [python, "-m", "teye", "workloads", "train"]
    return [python, "-m", "workloads.train"]
