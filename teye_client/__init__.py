"""teye's client side: what runs inside users' training processes (standard library only, Python 3.8+).

- ``teye_client.Reporter``: send a loop's phases to the node's teye agent (docs/phases.md).
- ``teye_client.auto``: zero-code instrumentation, loaded at interpreter start by the
  ``sitecustomize`` in ``teye_client/_site`` (``teye run``, a Slurm TaskProlog, a pod's env;
  docs/zero-code.md).  It patches PyTorch and TensorFlow only once the job imports them.

The import name is teye's own, so installing teye into a user's environment never shadows a
user's module (``agent``, ``workloads`` ...).  Importing this package costs nothing: the
reporter (sockets, threads) is imported on first use.
"""

__all__ = ["Reporter", "PHASES", "default_socket_path"]


def __getattr__(name):  # PEP 562: `import teye_client` at interpreter start must not import socket & co.
    if name in __all__:
        from . import reporter
        return getattr(reporter, name)
    raise AttributeError("module 'teye_client' has no attribute %r" % (name,))
