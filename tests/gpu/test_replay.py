"""teye record / --gpu-replay: a recording replays to the same metric values through the same backend
and source; the shipped synthetic 8-GPU trace yields the gaps its generator documents."""
from __future__ import annotations

import importlib.util
import json
import os
import time

import pynvml
import pytest

from agent.cli import main as cli_main
from agent.context import AgentContext
from agent.errors import ConfigError, ParseError
from agent.gpu.record import record
from agent.gpu.replay import Replay
from agent.gpu.source import GpuSource, from_config
from agent.config import defaults
from tests.gpu.conftest import GPU_DATA, GPU_PROCFS, TRACE_8GPU
from tests.gpu.fake_pynvml import FakeGpu, FakeNvml, Timeline
from tests.procs import Agent
from tests.conftest import parse_exposition

T0 = 1_700_000_000_000_000
P = 166_667


def _generator():
    spec = importlib.util.spec_from_file_location("make_synthetic_trace",
                                                  os.path.join(GPU_DATA, "make_synthetic_trace.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _replay_source(path, start_us=5_000_000_000_000_000, **kw):
    now = [start_us]
    rp = Replay.load(path, wall_us=lambda: now[0], sleep=lambda s: None)
    ctx = AgentContext(clock=lambda: now[0] * 1000 - 10 ** 18)
    kw.setdefault("events", False)
    src = GpuSource(lambda: rp, procfs=GPU_PROCFS, ctx=ctx, wall_ns=lambda: now[0] * 1000, **kw)
    return src, now, rp


def _busy_fake():
    tl = Timeline([(T0 + k * 1_000_000, T0 + k * 1_000_000 + 650_000) for k in range(-20, 40)])
    gpus = [FakeGpu(i, timeline=tl, ring_start_us=T0 - 80 * P) for i in range(3)]
    gpus[0].processes = [(1001, 3 << 30), (1003, None)]
    gpus[0].process_util = [(1001, T0 + 1_500_000, 40), (1001, T0 + 2_500_000, 90), (1003, T0 + 3_200_000, 5)]
    gpus[1].enable_mig([3])
    gpus[1].mig[0].processes = [(1004, 1 << 30)]
    gpus[2].gpm = False
    gpus[2].ecc = None
    gpus[2].retired = {pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x1000, 0x2000]}
    return FakeNvml(gpus, now_us=T0)


def _points(reading):
    return sorted((p.spec.name, p.labels, p.value) for p in reading.points())


def test_record_against_the_fake_replays_to_the_same_metric_values(tmp_path):
    fake = _busy_fake()
    path = str(tmp_path / "rec.jsonl")
    live = []

    def sleep(seconds):  # the simulated clock: readings change between polls
        fake.advance(seconds)
        for g in fake.gpus:
            g.power_mw += 1000
            g.energy_mj += 250_000
            g.util_gpu = (g.util_gpu + 7) % 100
        if fake.now_us - T0 >= 4_000_000:
            fake.gpus[0].processes = [(1003, None)]  # 1001 exits

    ctx = AgentContext(clock=lambda: fake.now_us * 1000 - 10 ** 18)
    cfg = defaults()
    cfg["procfs"] = GPU_PROCFS
    cfg["gpu"]["events"] = False
    polls = record(fake, path, duration_s=8, interval_s=1, cfg=cfg, clock_us=lambda: fake.now_us, sleep=sleep,
                   ctx=ctx, wall_ns=lambda: fake.now_us * 1000, readings=live)
    assert polls == 8
    with open(path) as fh:
        header = json.loads(fh.readline())
    assert header["format"] == "teye-gpu-trace" and header["synthetic"] is False
    with open(path) as fh:
        fv = [json.loads(line) for line in fh if '"nvmlDeviceGetFieldValues"' in line]
    # written without NVML's per-value stamps, so 8 polls of unchanged values are one record per GPU
    assert sorted(r["dev"] for r in fv if "ret" in r) == ["0", "1", "2"]
    assert all(set(v) >= {"fieldId", "nvmlReturn", "value"} and "timestamp" not in v and "latencyUsec" not in v
               for r in fv if "ret" in r for v in r["ret"])

    src, now, _ = _replay_source(path, start_us=9_000_000_000_000_000)
    replayed = []
    for _ in range(polls):
        replayed.append(src.collect())
        now[0] += 1_000_000
    assert len(live) == len(replayed)
    for a, b in zip(live, replayed):
        assert _points(a) == _points(b)
    last = replayed[-1]
    assert last.gpu("0").busy_seconds == pytest.approx(live[-1].gpu("0").busy_seconds)
    assert [p.pid for p in last.processes] == [1003, 1004]
    assert [g.gpu for g in last.gpus] == ["0", "1", "1/3", "2"]
    assert dict(last.gpu("2").retired_pages) == {"multiple_single_bit_ecc": 0.0, "double_bit_ecc": 2.0}
    # issue 40's counters travel through the recording (field values, PCIe replays, codecs, memory info v2)
    g0 = last.gpu("0")
    assert (g0.memory_temperature_celsius, g0.pcie_replays, g0.encoder_utilization, g0.decoder_utilization,
            g0.memory_reserved) == (71, 4, 0.12, 0.30, 512 * 1024 ** 2)
    assert dict(g0.gpm)["graphics_active"] == pytest.approx(0.80)


def test_a_recording_made_before_issue_40_replays_without_its_counters():
    """The shipped synthetic trace predates the memory temperature, PCIe replay, codec and graphics-engine
    counters: it replays as before, those series absent (the replay answers FunctionNotFound for a call never
    recorded, NotSupported for a GPM metric not recorded), the collector up, nothing else missing."""
    src, now, rp = _replay_source(TRACE_8GPU)
    for _ in range(3):
        r = src.collect()
        now[0] += 1_000_000
    with open(TRACE_8GPU) as fh:
        text = fh.read()
    for fn in ("nvmlDeviceGetFieldValues", "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetEncoderUtilization"):
        assert fn not in text                                   # the oracle: the file never had them
    for g in r.gpus:
        assert g.up and g.power_watts is not None and g.busy_seconds is not None
        assert (g.memory_temperature_celsius, g.pcie_replays, g.encoder_utilization, g.decoder_utilization) == \
            (None, None, None, None)
        assert "graphics_active" not in dict(g.gpm) and "sm_active" in dict(g.gpm)


def test_replay_shifts_samples_to_look_live_and_feeds_the_timeline():
    src, now, rp = _replay_source(TRACE_8GPU)
    for _ in range(5):
        src.collect()
        now[0] += 1_000_000
    got = src.ctx.timeline.window("0", 0, 1 << 62)
    assert got, "no samples published"
    mono_now = now[0] * 1000 - 10 ** 18
    assert mono_now - 5.5e9 < got[0].start_ns < got[-1].end_ns <= mono_now  # the last 5 s, in monotonic ns
    # samples start in the trace's first (busy) 0.6 s of GPU 0
    assert got[0].busy == 1.0


def _expected_gaps(gen, gpu, start_us, end_us):
    """Documented gaps of one GPU over replay time [start_us, end_us] (trace µs), loops unrolled."""
    d = gen.DURATION_US
    out = []
    for loop in range(int(end_us // d) + 2):
        iv = [(loop * d + a, loop * d + b) for a, b in gen.busy_intervals(gpu)]
        nxt = [((loop + 1) * d + a, (loop + 1) * d + b) for a, b in gen.busy_intervals(gpu)[:1]]
        for (_, e0), (s1, _) in zip(iv, iv[1:] + nxt):
            if s1 > e0 and e0 > start_us and s1 < end_us:
                out.append((s1 - e0) / 1e6)
    return out


def test_synthetic_trace_replay_yields_the_documented_gaps():
    gen = _generator()
    src, now, rp = _replay_source(TRACE_8GPU)
    assert rp.header["synthetic"] is True
    t = rp.header["truth"]
    assert t["0"]["gaps_s"].count(0.4) == 80 and t["0"]["gaps_s"].count(8.4) == 1
    for _ in range(96):  # one loop and 6 s of the next
        r = src.collect()
        now[0] += 1_000_000
    d = gen.DURATION_US
    for dev in src.devices:
        gpu = int(dev.label)
        g = r.gpu(dev.label)
        end = dev.ring.last_ts - rp._wall0  # replay time of the newest sample integrated
        expected = [x for x in _expected_gaps(gen, gpu, 0, end - P) if x >= 2 * P / 1e6]
        hist = dict(g.idle_gaps.buckets)
        for le in (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf")):
            assert hist[le] == sum(1 for x in expected if x <= le), (gpu, le)
        assert g.idle_gaps.sum == pytest.approx(sum(expected), abs=0.01 * max(1, len(expected)))
        assert g.samples_lost == 0
        # busy seconds over the integrated window [0, end] within 1 % of the truth
        truth = sum(max(0, min(e + k * d, end) - max(s + k * d, 0))
                    for k in range(int(end // d) + 1) for s, e in gen.busy_intervals(gpu)) / 1e6
        assert g.busy_seconds == pytest.approx(truth, rel=0.01), gpu
        assert g.sampled_seconds == pytest.approx(end / 1e6, abs=1e-3)
    assert r.gpu("6").idle_gaps.count == 1 and dict(r.gpu("6").idle_gaps.buckets)[60.0] == 0  # 86.5 s: +Inf
    assert r.gpu("5").idle_gaps.count == 0  # its 10 ms gaps are invisible to the ring
    assert r.gpu("0").idle_gaps.count == 80 + 1 + 4  # the first loop, and the 4 gaps ending before 95 s


def test_replay_loops_and_keeps_serving():
    src, now, rp = _replay_source(TRACE_8GPU)
    energies = []
    for _ in range(30):  # 3 loops in 10 s polls (the 100-sample ring holds 16.7 s)
        r = src.collect()
        energies.append(r.gpu("4").energy_joules)
        now[0] += 10_000_000
    g = r.gpu("4")
    assert g.samples_lost == 0
    assert g.sampled_seconds == pytest.approx(290.0, abs=0.2)
    assert all(b >= a for a, b in zip(energies, energies[1:]))  # cumulative counters never go back
    assert energies[-1] > energies[0] + 2 * 40_000  # about 600 W x 290 s
    assert r.gpu("6").idle_gaps.count == 3  # the 86.5 s gap of GPU 6 ends at every loop seam
    assert dict(r.gpu("4").idle_gaps.buckets)[2.5] == 3  # the 2.2 s gap once per loop


def test_replay_serves_xid_events_when_their_time_comes():
    now = [1_000_000_000_000]
    slept = []
    rp = Replay.load(TRACE_8GPU, wall_us=lambda: now[0], sleep=slept.append)
    rp.nvmlInit()
    es = rp.nvmlEventSetCreate()
    now[0] += 1_900_000
    ev = rp.nvmlEventSetWait_v2(es, 500)  # XID 13 on GPU 2 at 2.0 s: waits 0.1 s for it
    assert (ev.device.key, ev.eventType, ev.eventData) == ("2", pynvml.nvmlEventTypeXidCriticalError, 13)
    assert slept == [pytest.approx(0.1)]
    with pytest.raises(pynvml.NVMLError_Timeout):
        rp.nvmlEventSetWait_v2(es, 500)  # the next one is at 45 s
    now[0] += 44_000_000
    assert rp.nvmlEventSetWait_v2(es, 500).eventData == 31
    now[0] += rp.duration_us  # next loop: XID 13 again
    assert rp.nvmlEventSetWait_v2(es, 500).eventData == 13


def test_replay_unknown_functions_and_bad_files(tmp_path):
    rp = Replay.load(TRACE_8GPU)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        rp.nvmlDeviceGetFanSpeed(rp.nvmlDeviceGetHandleByIndex(0))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "teye-gpu-trace", "version": 1}\n{"t": 5, "fn": "x", "ret": 1}\nnot json\n')
    with pytest.raises(ParseError, match="line 3: not JSON"):
        Replay.load(str(bad))
    other = tmp_path / "other.jsonl"
    other.write_text('{"hello": 1}\n')
    with pytest.raises(ParseError, match="not a teye-gpu-trace file"):
        Replay.load(str(other))
    cfg = defaults()
    cfg["gpu"]["replay"] = str(other)
    with pytest.raises(ConfigError, match="gpu.replay"):
        from_config(cfg)
    cfg["gpu"]["replay"] = str(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="gpu.replay"):
        from_config(cfg)


def test_teye_record_without_nvml_exits_1_and_leaves_no_file(tmp_path, capsys):
    out = tmp_path / "rec.jsonl"
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here: this test is for a machine without a GPU")
    except pynvml.NVMLError:
        pass
    assert cli_main(["record", "--output", str(out), "--duration", "1", "--interval", "0.5"]) == 1
    assert not out.exists()
    assert "nothing to record" in capsys.readouterr().err


def test_agent_serves_the_replayed_8gpu_node(tmp_path):
    cfg = tmp_path / "teye.yaml"
    cfg.write_text("collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in
                                             ("cpu", "memory", "disk", "network", "infiniband", "nfs", "nfsd",
                                              "pressure", "phases")))
    agent = Agent(["--config", str(cfg), "--gpu-replay", TRACE_8GPU])
    try:
        deadline = time.monotonic() + 15
        v = {}
        while time.monotonic() < deadline:
            v = parse_exposition(agent.metrics())
            if v.get(("teye_gpu_xid_errors_total", (("gpu", "2"), ("xid", "13")))) == 1 and \
                    v.get(("teye_gpu_sampled_seconds_total", (("gpu", "7"),)), 0) > 0:
                break
            time.sleep(0.3)
        assert v[("teye_collector_up", (("collector", "gpu"),))] == 1
        ups = {dict(labels)["gpu"]: x for (n, labels), x in v.items() if n == "teye_gpu_up"}
        assert ups == {str(i): 1.0 for i in range(8)}
        infos = [dict(labels) for n, labels in v if n == "teye_gpu_info"]
        assert sorted(i["uuid"] for i in infos) == [f"GPU-5e7e0000-0000-4000-8000-{i:012d}" for i in range(8)]
        assert v[("teye_gpu_xid_errors_total", (("gpu", "2"), ("xid", "13")))] == 1
        assert v[("teye_gpu_sampled_seconds_total", (("gpu", "7"),))] > 0
        assert v[("teye_gpu_memory_total_bytes", (("gpu", "0"),))] == 80 * 1024 ** 3
    finally:
        assert agent.stop() == 0


def test_a_looping_replay_never_takes_the_pcie_replay_counter_back(tmp_path):
    """PCIe replays are cumulative like energy: each loop of a replay adds one loop's increase."""
    fake = _busy_fake()
    path = str(tmp_path / "rec.jsonl")

    def sleep(seconds):
        fake.advance(seconds)
        for g in fake.gpus:
            g.pcie_replays += 3

    ctx = AgentContext(clock=lambda: fake.now_us * 1000 - 10 ** 18)
    cfg = defaults()
    cfg["procfs"] = GPU_PROCFS
    cfg["gpu"]["events"] = False
    live = []
    record(fake, path, duration_s=4, interval_s=1, cfg=cfg, clock_us=lambda: fake.now_us, sleep=sleep,
           ctx=ctx, wall_ns=lambda: fake.now_us * 1000, readings=live)
    first, last = live[0].gpu("0").pcie_replays, live[-1].gpu("0").pcie_replays
    assert (first, last) == (4, 13)
    src, now, rp = _replay_source(path, gauge_seconds=0.0)
    got = []
    for _ in range(14):  # three and a half loops of the 4 s trace
        got.append(src.collect().gpu("0").pcie_replays)
        now[0] += 1_000_000
    assert all(b >= a for a, b in zip(got, got[1:])), got
    # replay second n is trace second n % 4 of loop n // 4, which adds n // 4 loops' increase (13 - 4)
    assert got == [first + 3 * (n % 4) + (n // 4) * (last - first) for n in range(14)]
