"""CPU source against node_exporter's fixture /proc/stat and its golden values, plus garbled input."""
from __future__ import annotations

import os

import pytest
from prometheus_client import generate_latest

from agent.errors import ParseError
from agent.sampler import Sampler
from agent.sources.cpu import MODES, CpuSource, parse_stat
from agent.sources.memory import MemorySource
from exporters.prometheus import make_registry
from tests.conftest import PROCFS, golden, parse_exposition

STAT = os.path.join(PROCFS, "stat")
CPUS = [str(i) for i in range(8)]


def _read(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def test_every_cpu_and_mode_equals_node_exporter(node_exporter_golden):
    src = CpuSource(PROCFS)
    assert src.user_hz == 100  # USER_HZ, what node_exporter assumes
    r = src.collect()
    assert sorted(r.seconds) == CPUS
    checked = 0
    for cpu in CPUS:
        for mode, value in zip(MODES, r.seconds[cpu]):
            assert value == pytest.approx(golden(node_exporter_golden, "node_cpu_seconds_total", cpu=cpu, mode=mode),
                                          rel=1e-12), (cpu, mode)
            checked += 1
        # node_exporter calls guest "user" and guest_nice "nice"
        for mode, value in zip(("user", "nice"), r.guest_seconds[cpu]):
            assert value == pytest.approx(golden(node_exporter_golden, "node_cpu_guest_seconds_total",
                                                 cpu=cpu, mode=mode), rel=1e-12)
    assert checked == 8 * 8


def test_system_wide_counters_equal_node_exporter(node_exporter_golden):
    r = parse_stat(_read(STAT), STAT)
    g = node_exporter_golden
    assert r.context_switches == golden(g, "node_context_switches_total") == 38014093
    assert r.interrupts == golden(g, "node_intr_total")
    assert r.forks == golden(g, "node_forks_total")
    assert r.procs_running == golden(g, "node_procs_running")
    assert r.procs_blocked == golden(g, "node_procs_blocked")
    assert r.boot_time == golden(g, "node_boot_time_seconds")


def test_exposition_through_sampler_and_exporter(node_exporter_golden):
    s = Sampler({"cpu": (CpuSource(PROCFS), 1.0)})
    assert s.read_once("cpu").up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    for cpu in CPUS:
        for mode in MODES:
            key = ("teye_cpu_seconds_total", (("cpu", cpu), ("mode", mode)))
            assert out[key] == pytest.approx(golden(node_exporter_golden, "node_cpu_seconds_total", cpu=cpu, mode=mode))
    assert out[("teye_cpus", ())] == 8
    assert out[("teye_context_switches_total", ())] == 38014093
    assert out[("teye_collector_up", (("collector", "cpu"),))] == 1


def test_user_hz_scales_ticks():
    r = parse_stat("cpu  10 0 0 0 0 0 0 0 0 0\ncpu0 250 0 0 0 0 0 0 0 0 0\n", "stat", user_hz=250)
    assert r.seconds["0"][MODES.index("user")] == 1.0


def test_older_kernel_layouts():
    # 2.6.24-2.6.32: 9 columns (guest but no guest_nice); before 2.6.11: 7 columns (no steal).
    nine = parse_stat("cpu  1 2 3 4 5 6 7 8 9\ncpu0 1 2 3 4 5 6 7 8 9\n", "stat", user_hz=1)
    assert nine.seconds["0"] == (1, 2, 3, 4, 5, 6, 7, 8)
    assert nine.guest_seconds["0"] == (9,)
    seven = parse_stat("cpu0 1 2 3 4 5 6 7\n", "stat", user_hz=1)
    assert seven.seconds["0"] == (1, 2, 3, 4, 5, 6, 7, 0)
    assert seven.guest_seconds == {}


def test_missing_system_lines_are_absent_not_zero():
    r = parse_stat("cpu0 1 2 3 4 5 6 7 8 9 10\n", "stat", user_hz=1)
    names = {p.spec.name: p.value for p in r.points()}
    assert names["teye_context_switches_total"] is None  # exporter drops None
    assert names["teye_boot_time_seconds"] is None
    assert names["teye_cpus"] == 1


# --- garbled input --------------------------------------------------------------------------

@pytest.mark.parametrize("text, why", [
    ("", "empty"),
    ("   \n\n", "empty"),
    ("ctxt 5\nbtime 7\n", "no cpuN lines"),
    ("cpu0 44490 19 21045\n", "columns"),                                           # truncated line
    ("cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 1 2 3 4 5 6 7 8\n", "truncated"),
    ("cpu0 44490 19 21045 10870 220 1 3410 0 2 x1\n", "expected an integer"),     # non-numeric
    ("cpuX 1 2 3 4 5 6 7 8\n", "bad CPU name"),
    ("cpu0 1 2 3 4 5 6 7 8 9 10\nctxt\n", "no value"),
    ("cpu0 1 2 3 4 5 6 7 8 9 10\nctxt lots\n", "expected an integer"),
])
def test_garbled_stat_raises_parse_error_naming_file(tmp_path, text, why):
    path = tmp_path / "stat"
    path.write_text(text)
    with pytest.raises(ParseError) as e:
        CpuSource(str(tmp_path)).collect()
    assert str(path) in str(e.value) and e.value.path == str(path)
    assert why in str(e.value)


def test_missing_file_raises_oserror_naming_file(tmp_path):
    with pytest.raises(OSError) as e:
        CpuSource(str(tmp_path)).collect()
    assert e.value.filename == str(tmp_path / "stat")


def test_sampler_marks_cpu_down_and_memory_stays_up(tmp_path):
    (tmp_path / "stat").write_text("cpu0 1 2 oops\n")
    s = Sampler({"cpu": (CpuSource(str(tmp_path)), 1.0), "memory": (MemorySource(PROCFS), 1.0)})
    st = s.read_once("cpu")
    assert not st.up and st.reading is None and st.failures == 1
    assert str(tmp_path / "stat") in st.error
    assert s.read_once("memory").up
    assert s.snapshot.state("memory").reading.total == 3742148 * 1024


def test_vanished_cpu_disappears_from_next_reading(tmp_path):
    path = tmp_path / "stat"
    path.write_text("cpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 1 2 3 4 5 6 7 8 9 10\n")
    src = CpuSource(str(tmp_path))
    assert sorted(src.collect().seconds) == ["0", "1"]
    path.write_text("cpu0 2 2 3 4 5 6 7 8 9 10\n")  # cpu1 hot-unplugged
    r = src.collect()
    assert sorted(r.seconds) == ["0"]
    assert {p.labels[0] for p in r.points() if p.spec.name == "teye_cpu_seconds_total"} == {"0"}
