"""Training-job phases: the wire protocol, the socket receiver, GPU idle attribution and the verdict.

See docs/phases.md for the protocol and workloads/phases.py for the reference client.
"""
