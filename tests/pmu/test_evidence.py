"""The pmu source offers each poll interval's figures to the phase verdicts through the shared context."""
import pytest

from agent.context import AgentContext
from agent.errors import SourceUnavailable
from agent.pmu.perf import Counters
from agent.pmu.source import LiveReader, PmuSource
from tests.pmu.conftest import tree
from tests.pmu.test_source import CAS_READ, CAS_WRITE, CPU, CYCLES, IMC0, INSTR


def source(fake, clock, ctx):
    sysfs, procfs = tree("cascadelake")
    counters = Counters(fake)
    return PmuSource(lambda: LiveReader(counters), sysfs=sysfs, procfs=procfs, clock=clock, ctx=ctx)


def test_each_poll_interval_becomes_one_host_note(fake, clock):
    ctx = AgentContext(clock=clock)
    s = source(fake, clock, ctx)
    s.collect()
    assert ctx.host_notes == ()                 # one poll: no interval yet
    clock.ns += 5_000_000_000
    fake.set(CPU, CYCLES, 0, 30_000_000_000)    # 3e10 cycles / 1.5e10 instructions: CPI 2
    fake.set(CPU, INSTR, 0, 15_000_000_000)
    fake.set(IMC0, CAS_READ, 0, 781_250_000)    # x 64 B = 50 GB in 5 s: 10 GB/s read
    fake.set(IMC0, CAS_WRITE, 0, 78_125_000)    # 5 GB: 1 GB/s written
    s.collect()
    (topic, note), = ctx.host_notes
    assert topic == "host"
    assert note.startswith("host counters over the last 5 s: CPI 2.00, ")
    assert "memory 10.00 GB/s read, 1.00 GB/s written" in note


def test_a_source_without_counters_publishes_nothing(fake, clock):
    ctx = AgentContext(clock=clock)
    ctx.host_notes = (("host", "stale"),)
    sysfs, procfs = tree("vm")
    s = PmuSource(lambda: LiveReader(Counters(fake)), sysfs=sysfs, procfs=procfs, clock=clock, ctx=ctx)
    for _ in range(2):
        with pytest.raises(SourceUnavailable):   # the VM tree has no PMU: the source is down ...
            s.collect()
        clock.ns += 5_000_000_000
    assert ctx.host_notes == (("host", "stale"),)   # ... and publishes nothing


def test_phase_verdicts_read_the_notes_the_context_holds(tmp_path):
    from agent.config import defaults
    from agent.phases.source import PhaseSource
    ctx = AgentContext()
    src = PhaseSource(defaults()["phases"], ctx, socket_path=str(tmp_path / "p.sock"))
    try:
        assert src.table.extra_evidence() == ()
        ctx.host_notes = (("host", "host counters over the last 5 s: CPI 2.00"),)
        assert src.table.extra_evidence() == ctx.host_notes
    finally:
        src.close()
