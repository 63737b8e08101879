"""The step's parts and memory on the agent's side (issue 45): the protocol's ``parts`` and ``mem``, the job
table's sums (the parts never above the compute they came with; ``other`` the rest of it), the exported
series, resident memory from a fixture /proc and the creep criterion on known timelines."""
from __future__ import annotations

import os

import pytest

from agent.phases.jobs import JobTable
from agent.phases.memory import Creep, MemoryWatch
from agent.phases.procstat import PAGE_SIZE, ProcReader
from agent.phases.protocol import Limits, Rejected, decode, encode
from tests.phases.helpers import MS, S, ctx_with_clock, phases_cfg
from tests.phases.test_jobs import _exposition, _get

MiB = 2**20


def _msg(t, parts=None, mem=None, rank=None, job="j", compute_ms=40):
    a, b = t + 10 * MS, t + (10 + compute_ms) * MS
    return encode(job, [("data_wait", t, a), ("compute", a, b)], [(t, b, 8)], parts=parts, mem=mem,
                  rank=rank, world=None if rank is None else 2), b


@pytest.mark.parametrize("field,value,reason", [
    ("parts", [1, 2, 3], "wrong_type"), ("parts", [1, 2, 3, True], "wrong_type"), ("parts", "1,2,3,4", "wrong_type"),
    ("parts", [1, 2, 3, -4], "bad_value"), ("parts", [1, 2, 3, 2**63], "bad_value"), ("parts", [1.0, 2, 3, 4], "wrong_type"),
    ("mem", [1, 2], "wrong_type"), ("mem", [1, 2, -3], "bad_value"), ("mem", [1, 2, 2**57], "bad_value"),
    ("mem", {"a": 1}, "wrong_type")])
def test_bad_parts_and_memory_are_rejected_by_reason(field, value, reason):
    now = 1000 * S
    data = encode("j", [("compute", now - 2 * MS, now - MS)], [(now - 2 * MS, now - MS, 1)]).decode()
    data = data[:-1] + ',"%s":%s}' % (field, __import__("json").dumps(value))
    with pytest.raises(Rejected) as e:
        decode(data.encode(), now, Limits())
    assert e.value.reason == reason and field in e.value.detail


def test_parts_and_memory_decode_and_a_message_without_them_has_none():
    now = 1000 * S
    m = decode(encode("j", [("compute", now - 2 * MS, now - MS)], [(now - 2 * MS, now - MS, 1)],
                      parts=[1, 2, 3, 0], mem=[5, 6, 7]), now, Limits())
    assert (m.parts, m.mem) == ((1, 2, 3, 0), (5, 6, 7))
    m = decode(encode("j", [("compute", now - 2 * MS, now - MS)], [(now - 2 * MS, now - MS, 1)]), now, Limits())
    assert (m.parts, m.mem) == (None, None)


def test_parts_add_up_to_compute_per_job_and_per_rank_and_other_is_the_rest():
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    t = clock.t - 10 * S
    for i in range(10):
        for rank, pid in ((0, 500), (1, 501)):
            # 40 ms compute: rank 0 forward 10, backward 15, optimizer 5, h2d 2 (other 8); rank 1 half of it
            parts = [10 * MS, 15 * MS, 5 * MS, 2 * MS] if rank == 0 else [5 * MS, 7 * MS, 2 * MS, 0]
            data, _ = _msg(t, parts, rank=rank)
            assert table.handle(data, pid, 0) == "accepted"
        t += 60 * MS
    m = _exposition(table, clock.t)
    got = {p: _get(m, "teye_job_step_part_seconds_total", train_job="j", part=p)
           for p in ("forward", "backward", "optimizer", "h2d_copy", "other")}
    assert got == pytest.approx({"forward": 0.15, "backward": 0.22, "optimizer": 0.07, "h2d_copy": 0.02,
                                 "other": 0.8 - 0.46})
    assert sum(got.values()) == pytest.approx(_get(m, "teye_job_phase_seconds_total", train_job="j", phase="compute"))
    r0 = {p: _get(m, "teye_job_rank_step_part_seconds_total", train_job="j", rank="0", part=p)
          for p in ("forward", "backward", "optimizer", "h2d_copy", "other")}
    assert r0 == pytest.approx({"forward": 0.1, "backward": 0.15, "optimizer": 0.05, "h2d_copy": 0.02, "other": 0.08})
    assert _get(m, "teye_job_rank_step_part_seconds_total", train_job="j", rank="1", part="other") == pytest.approx(0.26)


def test_parts_above_the_compute_they_came_with_are_not_taken_and_other_never_goes_down():
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    t = clock.t - 10 * S
    data, t = _msg(t, [10 * MS, 10 * MS, 10 * MS, 0])          # 30 of 40 ms
    table.handle(data, 500, 0)
    before = _exposition(table, clock.t)
    data, t = _msg(t, [30 * MS, 10 * MS, 1 * MS, 0])           # 41 of 40 ms: refused whole
    table.handle(data, 500, 0)
    data, t = _msg(t, None)                                    # a message without parts: its compute is other
    table.handle(data, 500, 0)
    m = _exposition(table, clock.t)
    assert _get(m, "teye_job_step_part_seconds_total", train_job="j", part="forward") == pytest.approx(0.01)
    assert _get(m, "teye_job_step_part_seconds_total", train_job="j", part="other") == pytest.approx(0.09)
    assert (_get(m, "teye_job_step_part_seconds_total", train_job="j", part="other")
            >= _get(before, "teye_job_step_part_seconds_total", train_job="j", part="other"))
    j = table.views(clock.t)[0][0]
    assert sum(s for _p, s in j.inside.part_seconds) == pytest.approx(dict(j.phase_seconds)["compute"])


def test_a_job_without_parts_exports_none():
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    data, _ = _msg(clock.t - S)
    table.handle(data, 500, 0)
    m = _exposition(table, clock.t)
    assert not [k for k in m if k[0] == "teye_job_step_part_seconds_total"]
    assert table.views(clock.t)[0][0].inside is None


def _proc(root, pid, rss_pages, uid=0):
    d = os.path.join(root, str(pid))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "statm"), "w") as f:
        f.write("%d %d 100 10 0 200 0\n" % (rss_pages * 3, rss_pages))


def test_resident_memory_from_statm_and_device_memory_from_the_client(tmp_path):
    root = str(tmp_path)
    _proc(root, 500, 1000)
    _proc(root, 501, 3000)
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    t = clock.t - 10 * S
    table.handle(_msg(t, mem=[100 * MiB, 200 * MiB, 150 * MiB], rank=0)[0], 500, 0)
    table.handle(_msg(t, mem=[10 * MiB, 20 * MiB, 15 * MiB], rank=1)[0], 501, 0)
    views = table.views(clock.t)[0]
    mem = MemoryWatch(ProcReader(root)).observe(views, clock.t)
    (jm,) = mem
    assert jm.total("host_resident") == 4000 * PAGE_SIZE
    assert jm.total("device_peak") == 165 * MiB
    from agent.phases.source import PhasesReading
    from agent.sampler import Sampler
    from exporters.prometheus import make_registry
    from prometheus_client import generate_latest
    from tests.conftest import parse_exposition
    from tests.phases.test_jobs import _Src
    sampler = Sampler({"phases": (_Src(PhasesReading(views, (), (), 0, "", memory=mem)), 1.0)})
    sampler.read_once("phases")
    m = parse_exposition(generate_latest(make_registry(lambda: sampler.snapshot)).decode())
    assert _get(m, "teye_job_rank_memory_bytes", train_job="j", rank="1", kind="host_resident") == 3000 * PAGE_SIZE
    assert _get(m, "teye_job_rank_memory_bytes", train_job="j", rank="0", kind="device_reserved") == 200 * MiB
    assert _get(m, "teye_job_memory_bytes", train_job="j", kind="device_allocated") == 110 * MiB


def test_a_process_that_exited_has_no_resident_memory_and_nothing_raises(tmp_path):
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    table.handle(_msg(clock.t - S)[0], 500, 0)
    (jm,) = MemoryWatch(ProcReader(str(tmp_path))).observe(table.views(clock.t)[0], clock.t)
    assert jm.processes == () and jm.total("host_resident") is None
    os.makedirs(tmp_path / "500")
    (tmp_path / "500" / "statm").write_text("garbage\n")
    (jm,) = MemoryWatch(ProcReader(str(tmp_path))).observe(table.views(clock.t)[0], clock.t)
    assert jm.processes == ()


def _timeline(f, minutes=40, every_s=10, step_s=1.0):
    """Samples (t_ns, steps, {host_resident: bytes}) of f(seconds), one every every_s."""
    return [(int(k * every_s * S), int(k * every_s / step_s), {"host_resident": int(f(k * every_s))})
            for k in range(int(minutes * 60 / every_s) + 1)]


W = MemoryWatch(None)


def test_creep_a_steady_leak_is_creep_with_its_growth_steps_and_per_step_figure():
    # 3.2 MB a step, a step a second: 1800 steps in the window, 5.76 GB
    c = W.judge(_timeline(lambda s: 2e9 + 3.2e6 * s), rank=0)
    assert isinstance(c, Creep) and c.kind == "host_resident" and c.steps == 1800
    assert c.grew_bytes == pytest.approx(3.2e6 * 1800, rel=1e-6)
    assert c.sentence() == "rank 0's resident memory grew 5.8 GB over 1800 steps, 3.2 MB a step"


@pytest.mark.parametrize("name,f", [
    ("warm-up", lambda s: 1e9 + min(s, 300) * 2e6),                      # 600 MB in the first 5 minutes, then flat
    ("cache filling once", lambda s: 1e9 + (8e8 if s > 1500 else 0)),    # 800 MB at once, 25 minutes in
    ("sawtooth", lambda s: 1e9 + (s % 600) * 1e6),                       # up 600 MB, freed every 10 minutes
    ("slow growth", lambda s: 1e9 + s * 1e5),                            # 180 MB in 30 minutes: below 256 MiB
    ("noise", lambda s: 1e9 + (3e8 if int(s / 10) % 2 else 0)),          # 300 MB up and down
    ("fast sawtooth", lambda s: 1e9 + (s % 550) * 4e6),                  # up 2.2 GB in 550 s, freed (aliases the thirds)
    ("slow sawtooth", lambda s: 1e9 + (s % 2000) * 1e6),                 # up 2 GB over 33 minutes, freed
    # 900 MB over 29.5 minutes, then a cache of 500 MB freed: it fell back, not a creep (yet)
    ("a drop at the end", lambda s: 1e9 + s * 5e5 - (5e8 if s > 600 + 1770 else 0)),
])
def test_creep_warm_up_a_cache_a_sawtooth_slow_growth_and_noise_are_not(name, f):
    assert W.judge(_timeline(f)) is None


def test_creep_a_leak_with_noise_of_its_own_is_creep():
    # 2 MB a step (a second), the resident memory jittering by 30 MB around it
    c = W.judge(_timeline(lambda s: 1e9 + 2e6 * s + (3e7 if int(s / 10) % 3 == 0 else 0)))
    assert c is not None and c.grew_bytes == pytest.approx(3.6e9, rel=0.02)


def test_creep_needs_the_whole_window():
    assert W.judge(_timeline(lambda s: 1e9 + 3.2e6 * s, minutes=29)) is None
