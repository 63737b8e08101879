"""Memory source against node_exporter's fixture /proc/meminfo and its golden values, plus garbled input."""
from __future__ import annotations

import os

import pytest
from prometheus_client import generate_latest

from agent.errors import ParseError
from agent.sampler import Sampler
from agent.sources import build
from agent.config import defaults
from agent.sources.cpu import CpuSource
from agent.sources.memory import AVAILABLE, USED, MemorySource, parse_meminfo
from exporters.prometheus import make_registry
from tests.conftest import PROCFS, golden, parse_exposition

MEMINFO = os.path.join(PROCFS, "meminfo")
KB = 1024

# The fixture's own kB values (proc/meminfo), for the estimate node_exporter does not make.
MEM_FREE, BUFFERS, CACHED, SRECLAIMABLE, MEM_TOTAL = 225472, 22040, 930888, 44772, 3742148

MODERN = """MemTotal:       32792716 kB
MemFree:         1234567 kB
MemAvailable:   24149316 kB
Buffers:          100000 kB
Cached:         20000000 kB
SwapCached:            0 kB
SwapTotal:             0 kB
SwapFree:              0 kB
Dirty:               512 kB
Writeback:             0 kB
Shmem:             65536 kB
SReclaimable:     300000 kB
HugePages_Total:       0
"""


def _read(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def test_values_equal_node_exporter(node_exporter_golden):
    r = MemorySource(PROCFS).collect()
    g = node_exporter_golden
    assert r.total == golden(g, "node_memory_MemTotal_bytes")
    assert r.free == golden(g, "node_memory_MemFree_bytes")
    assert r.cached == golden(g, "node_memory_Cached_bytes")
    assert r.buffers == golden(g, "node_memory_Buffers_bytes")
    assert r.swap_total == golden(g, "node_memory_SwapTotal_bytes")
    assert r.swap_free == golden(g, "node_memory_SwapFree_bytes")
    assert r.swap_cached == golden(g, "node_memory_SwapCached_bytes")
    assert r.shmem == golden(g, "node_memory_Shmem_bytes")
    assert r.slab_reclaimable == golden(g, "node_memory_SReclaimable_bytes")
    assert r.dirty == golden(g, "node_memory_Dirty_bytes")
    assert r.writeback == golden(g, "node_memory_Writeback_bytes")


def test_available_is_estimated_without_memavailable():
    r = parse_meminfo(_read(MEMINFO), MEMINFO)
    assert r.available_estimated is True
    # hand-computed: 225472 + 22040 + 930888 + 44772 = 1223172 kB
    assert r.available == (MEM_FREE + BUFFERS + CACHED + SRECLAIMABLE) * KB == 1223172 * KB
    assert next(p.value for p in r.points() if p.spec.name == "teye_memory_available_estimated") == 1


def test_used_is_total_minus_available():
    r = parse_meminfo(_read(MEMINFO), MEMINFO)
    assert r.used == (MEM_TOTAL - 1223172) * KB == 2518976 * KB


def test_memavailable_is_read_when_present():
    r = parse_meminfo(MODERN, "meminfo")
    assert r.available_estimated is False
    assert r.available == 24149316 * KB
    assert r.used == (32792716 - 24149316) * KB
    assert r.total == 32792716 * KB and r.cached == 20000000 * KB and r.buffers == 100000 * KB
    pts = {p.spec.name: p.value for p in r.points()}
    assert pts["teye_memory_available_estimated"] == 0


def test_help_text_says_when_estimated():
    for spec in (AVAILABLE, USED):
        assert "MemFree + Buffers + Cached + SReclaimable" in spec.help
        assert "3.14" in spec.help


def test_exposition_through_sampler_and_exporter(node_exporter_golden):
    src = build("memory", defaults())
    s = Sampler({"memory": (src, 1.0)})
    src.path = MEMINFO  # same source the daemon builds, pointed at the fixture
    assert s.read_once("memory").up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    g = node_exporter_golden
    assert out[("teye_memory_total_bytes", ())] == golden(g, "node_memory_MemTotal_bytes")
    assert out[("teye_memory_cached_bytes", ())] == golden(g, "node_memory_Cached_bytes")
    assert out[("teye_memory_buffers_bytes", ())] == golden(g, "node_memory_Buffers_bytes")
    assert out[("teye_memory_available_bytes", ())] == 1223172 * KB
    assert out[("teye_memory_used_bytes", ())] == 2518976 * KB
    assert out[("teye_memory_available_estimated", ())] == 1
    assert out[("teye_memory_swap_free_bytes", ())] == golden(g, "node_memory_SwapFree_bytes")


def test_optional_fields_absent_when_kernel_lacks_them():
    text = "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 10 kB\nCached: 200 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n"
    r = parse_meminfo(text, "meminfo")
    assert r.shmem is None and r.slab_reclaimable is None
    assert r.available == 310 * KB  # no SReclaimable (pre-2.6.19): counted as 0
    exported = {p.spec.name for p in r.points() if p.value is not None}
    assert "teye_memory_shmem_bytes" not in exported and "teye_memory_total_bytes" in exported


# --- garbled input --------------------------------------------------------------------------

@pytest.mark.parametrize("text, why", [
    ("", "empty"),
    ("\n \n", "empty"),
    ("MemTotal:       3742148 kB\nMemFree:          225472 kB\nBuff", "expected 'Key: value'"),  # cut mid-line
    ("MemTotal:       3742148 kB\nMemFree:          225472 kB\nBuffers:", "no value"),          # cut after key
    ("MemTotal:       3742148 kB\nMemFree:          225472 kB\n", "missing field(s) Buffers"),  # cut at a line
    ("MemTotal: lots kB\n", "expected an integer"),
    ("MemTotal: 12 MB\n", "unexpected value"),
    ("MemTotal: -5 kB\n", "negative"),
])
def test_garbled_meminfo_raises_parse_error_naming_file(tmp_path, text, why):
    path = tmp_path / "meminfo"
    path.write_text(text)
    with pytest.raises(ParseError) as e:
        MemorySource(str(tmp_path)).collect()
    assert e.value.path == str(path) and str(path) in str(e.value)
    assert why in str(e.value)


def test_missing_file_raises_oserror_naming_file(tmp_path):
    with pytest.raises(OSError) as e:
        MemorySource(str(tmp_path)).collect()
    assert e.value.filename == str(tmp_path / "meminfo")


def test_sampler_marks_memory_down_and_cpu_stays_up(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal: 12 kB\nMemFree: x kB\n")
    s = Sampler({"memory": (MemorySource(str(tmp_path)), 1.0), "cpu": (CpuSource(PROCFS), 1.0)})
    st = s.read_once("memory")
    assert not st.up and st.reading is None
    assert str(tmp_path / "meminfo") in st.error and "MemFree" in st.error
    assert s.read_once("cpu").up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    assert out[("teye_collector_up", (("collector", "memory"),))] == 0
    assert out[("teye_collector_up", (("collector", "cpu"),))] == 1
    assert not any(name.startswith("teye_memory_") for name, _ in out)


def test_recovers_after_file_is_fixed(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("")
    src = MemorySource(str(tmp_path))
    s = Sampler({"memory": (src, 1.0)})
    assert not s.read_once("memory").up
    path.write_text(MODERN)
    st = s.read_once("memory")
    assert st.up and st.error is None and st.reading.available == 24149316 * KB


def test_the_rest_of_meminfo_equals_node_exporter(node_exporter_golden):
    """Every field of the fixture's meminfo that node_exporter exports, under teye's names, exactly."""
    from agent.sources.memory import _HUGE, _MORE
    s = Sampler({"memory": (MemorySource(PROCFS), 1.0)})
    assert s.read_once("memory").up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    with open(os.path.join(PROCFS, "meminfo")) as fh:
        in_file = {line.split(":")[0] for line in fh if ":" in line}
    checked = 0
    for field, name, _ in _MORE:
        teye = f"teye_memory_{name}_bytes"
        if field not in in_file:
            assert (teye, ()) not in out, field  # the fixture lacks it: absent here too
            continue
        node = f"node_memory_{field.replace('(', '_').replace(')', '')}_bytes"
        assert out[(teye, ())] == golden(node_exporter_golden, node), field
        checked += 1
    assert checked == len({f for f, _, _ in _MORE} & in_file) >= 25
    for field, state in _HUGE:
        assert out[("teye_memory_huge_pages", (("state", state),))] == golden(node_exporter_golden,
                                                                               f"node_memory_{field}")


def test_a_kernel_without_the_newer_fields_exports_the_rest(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemFree: 10 kB\nBuffers: 1 kB\nCached: 2 kB\n"
                                      "SwapTotal: 0 kB\nSwapFree: 0 kB\nMlocked: 4 kB\nHugePages_Total: 8\n")
    r = MemorySource(str(tmp_path)).collect()
    assert dict(r.more) == {"Mlocked": 4096, "HugePages_Total": 8}
    names = {(p.spec.name, p.labels) for p in r.points() if p.value is not None}
    assert ("teye_memory_mlocked_bytes", ()) in names and ("teye_memory_huge_pages", ("total",)) in names
    assert ("teye_memory_hugetlb_bytes", ()) not in names and ("teye_memory_huge_pages", ("free",)) not in names
