"""Host hardware counters through the kernel's perf events.

- ``perf``: the only module calling perf_event_open/read/ioctl/close (ctypes); errno -> behaviour.
- ``sysfs``: PMU descriptions under <sysfs>/bus/event_source/devices, resolved like ``perf stat -e pmu/event/``.
- ``events``: floating-point events by CPU vendor/family/model (no sysfs alias), each citing its source.
- ``source``: the ``pmu`` collector (plan, group reads, multiplex scaling, monotonic totals, metrics).
- ``record`` / ``replay`` / ``trace``: JSON-lines traces of raw reads (docs/pmu-trace-format.md).
"""
