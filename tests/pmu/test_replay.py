"""Record through the syscall fake, replay the trace: the same decoding gives the same values."""
import json

import pytest

from agent.errors import ParseError
from agent.pmu import trace
from agent.pmu.perf import Counters
from agent.pmu.record import RecordingReader, record
from agent.pmu.replay import ReplayReader
from agent.pmu.source import LiveReader, PmuSource
from tests.pmu.conftest import tree

CPU, IMC0 = 4, 14


def _script(fake, step):
    fake.set(CPU, 0x3c, 0, 1000 * step, enabled=step * 1_000_000_000, running=step * 500_000_000)
    fake.set(CPU, 0xc0, 0, 2000 * step, enabled=step * 1_000_000_000, running=step * 500_000_000)
    fake.set(IMC0, 0x0304, 2, 10 * step, enabled=step * 1_000_000_000)


def test_record_then_replay_gives_the_live_values(fake, clock, tmp_path):
    sysfs, procfs = tree("cascadelake")
    path = tmp_path / "pmu.jsonl"
    live = []
    with open(path, "w") as out:
        rec = RecordingReader(LiveReader(Counters(fake)), out, clock, {"note": "test"})
        s = PmuSource(lambda: rec, sysfs, procfs, clock=clock)
        for step in (1, 2, 3):
            _script(fake, step)
            live.append(s.collect())
            rec.flush()
            clock.ns += 1_000_000_000
        s.close()
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    assert head["format"] == "teye-pmu-trace" and head["version"] == 1 and head["note"] == "test"
    first = json.loads(lines[1])
    assert first["t"] == 0.0
    assert {"pmu": "cpu", "event": "cpu-cycles", "cpu": 0, "value": 1000, "enabled_ns": 1_000_000_000,
            "running_ns": 500_000_000} in first["reads"]
    assert json.loads(lines[2])["t"] == 1.0 and len(lines) == 4

    rclock = type(clock)()
    replay = ReplayReader.load(str(path), rclock)
    r = PmuSource(lambda: replay, sysfs, procfs, clock=rclock)
    got = []
    for _ in range(3):
        got.append(r.collect())
        rclock.ns += 1_000_000_000
    for a, b in zip(live, got):
        assert (a.cycles, a.instructions, a.flops, a.memory_read) == (b.cycles, b.instructions, b.flops, b.memory_read)
    assert dict(got[0].cycles)["0"] == 2000.0     # 1000 counted in half the time enabled
    # past the end the trace loops: counters restart from their first values and totals keep growing
    assert dict(r.collect().cycles)["0"] == 6000.0 + 2000.0


def test_replay_holds_between_lines_and_absent_when_missing(tmp_path):
    sysfs, procfs = tree("zen3")
    path = tmp_path / "t.jsonl"
    rd = lambda cpu, v: {"pmu": "cpu", "event": "fp_ret_sse_avx_ops.all", "cpu": cpu, "value": v,  # noqa: E731
                         "enabled_ns": v, "running_ns": v}
    path.write_text("\n".join(json.dumps(x) for x in (
        {"format": "teye-pmu-trace", "version": 1},
        {"t": 0, "reads": [rd(0, 10), rd(1, 10)]},
        {"t": 2.5, "reads": [rd(0, 30)]})) + "\n")
    clock = [0]
    replay = ReplayReader.load(str(path), lambda: clock[0])
    s = PmuSource(lambda: replay, sysfs, procfs, clock=lambda: clock[0])
    r = s.collect()
    assert r.flops == (("0", "all", "all", 10.0), ("1", "all", "all", 10.0)) and r.cycles == ()  # never recorded
    clock[0] = 2_000_000_000
    assert dict((k[0], k[-1]) for k in s.collect().flops) == {"0": 10.0, "1": 10.0}
    clock[0] = 2_600_000_000
    assert dict((k[0], k[-1]) for k in s.collect().flops) == {"0": 30.0}        # cpu 1 not in this line: absent


@pytest.mark.parametrize("body,message", [
    ('{"format": "other", "version": 1}', "not a teye-pmu-trace file"),
    ('{"format": "teye-pmu-trace", "version": 2}', "unsupported version 2"),
    ('{"format": "teye-pmu-trace", "version": 1}\n{"t": "x", "reads": []}', "line 2: 't' must be a number"),
    ('{"format": "teye-pmu-trace", "version": 1}\n{"t": 1, "reads": []}\n{"t": 0.5, "reads": []}',
     "line 3: 't' goes backwards"),
    ('{"format": "teye-pmu-trace", "version": 1}\n{"t": 0, "reads": [{"pmu": "cpu"}]}',
     "line 2: reads\\[0\\].event must be a string"),
    ('{"format": "teye-pmu-trace", "version": 1}\n{"t": 0, "reads": [{"pmu": "cpu", "event": "e", "cpu": 0, '
     '"value": -1, "enabled_ns": 0, "running_ns": 0}]}', "reads\\[0\\].value must be a non-negative integer"),
    ('{"format": "teye-pmu-trace", "version": 1}\nnot json', "line 2: not JSON"),
    ('', "empty trace"),
])
def test_bad_traces_are_named(tmp_path, body, message):
    p = tmp_path / "bad.jsonl"
    p.write_text(body + "\n")
    with pytest.raises(ParseError, match=message):
        trace.read(str(p))


def test_record_loop_writes_one_line_per_poll_and_removes_the_file_without_a_pmu(fake, tmp_path):
    sysfs, procfs = tree("cascadelake")
    t = [0]
    path = tmp_path / "r.jsonl"
    polls = record(str(path), 3.0, 1.0, sysfs, procfs, inner=LiveReader(Counters(fake)),
                   sleep=lambda s: t.__setitem__(0, t[0] + int(s * 1e9)), clock_ns=lambda: t[0])
    assert polls == 3 and len(path.read_text().splitlines()) == 4 and fake.fds == {}
    head = json.loads(path.read_text().splitlines()[0])
    assert head["cpu"] == {"vendor": "GenuineIntel", "family": 6, "model": 85,
                           "name": "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz"}
    vm_sys, vm_proc = tree("vm")
    from agent.errors import SourceUnavailable
    with pytest.raises(SourceUnavailable, match="no hardware PMU"):
        record(str(path), 1.0, 1.0, vm_sys, vm_proc, inner=LiveReader(Counters(fake)))
    assert not path.exists()


def test_cli_record_pmu_and_agent_pmu_replay_flags(tmp_path, capsys):
    from agent.cli import build_parser, main
    from agent.config import load
    from agent.pmu.source import from_config
    args = build_parser().parse_args(["agent", "--pmu-replay", "t.jsonl"])
    assert load(None, {"pmu": {"replay": "t.jsonl"}})["pmu"]["replay"] == args.pmu_replay
    vm_sys, vm_proc = tree("vm")
    out = tmp_path / "rec.jsonl"
    assert main(["record", "--pmu", "--output", str(out), "--duration", "1", "--sysfs", vm_sys,
                 "--procfs", vm_proc]) == 1
    assert "teye record: nothing to record: no hardware PMU" in capsys.readouterr().err and not out.exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "teye-gpu-trace", "version": 1}\n')
    assert main(["agent", "--pmu-replay", str(bad), "--listen", "127.0.0.1:0"]) == 2
    assert "config key 'pmu.replay': cannot replay" in capsys.readouterr().err
    good = tmp_path / "good.jsonl"
    good.write_text('{"format": "teye-pmu-trace", "version": 1}\n{"t": 0, "reads": [{"pmu": "cpu", "event": '
                    '"fp_ret_sse_avx_ops.all", "cpu": 2, "value": 7, "enabled_ns": 4, "running_ns": 2}]}\n')
    z_sys, z_proc = tree("zen3")
    cfg = load(None, {"sysfs": z_sys, "procfs": z_proc, "pmu": {"replay": str(good)}})
    assert from_config(cfg).collect().flops == (("2", "all", "all", 14.0),)
