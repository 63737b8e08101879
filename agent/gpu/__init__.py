"""NVIDIA GPUs through NVML.

- ``nvml``: the only module that imports pynvml; one entry point per NVML call, every
  NVML error class mapped to a behaviour (absent value / GPU down / source down).
- ``ring``: integrates the driver's utilization-sample ring (busy seconds, losses, idle gaps).
- ``procinfo``: pid -> user, Slurm job, Kubernetes pod uid from procfs.
- ``events``: the XID event thread.
- ``source``: the ``gpu`` collector (metric declarations, reading, ``from_config``).
- ``record`` / ``replay``: JSON-lines traces of what the backend read (docs/gpu-trace-format.md).
"""
