"""process_* self-metrics: client_python's process collector's families, through both of teye's renderers."""
from __future__ import annotations

import os
import resource
from types import MappingProxyType

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector

from agent.sampler import Snapshot
from exporters.prometheus import make_registry
from exporters.render import render
from exporters.selfstats import PROCESS_FAMILIES, ProcessStats, chain
from exporters.webstats import WebStats
from tests.conftest import parse_exposition

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = resource.getpagesize()


def fake_proc(root, pid=4242, utime=250, stime=150, start=1000, vsize=123456789, rss_pages=2048, fds=7,
              max_fds=65536, btime=1700000000):
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    for i in range(fds):
        (d / "fd" / str(i)).write_text("")
    fields = ["S"] + ["0"] * 40
    fields[11], fields[12], fields[19], fields[20], fields[21] = map(str, (utime, stime, start, vsize, rss_pages))
    (d / "stat").write_text(f"{pid} (teye agent) " + " ".join(fields) + "\n")
    (d / "limits").write_text("Limit                     Soft Limit           Hard Limit           Units\n"
                              f"Max open files            {max_fds}                524288               files\n")
    (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {btime}\n")
    return pid


def empty_snapshot():
    return Snapshot(1, MappingProxyType({}))


def both(reg):
    fast = render(reg)[0].decode()
    slow = generate_latest(reg).decode()
    return fast, slow


def test_values_from_a_known_proc_tree_in_both_renderers(tmp_path):
    pid = fake_proc(tmp_path)
    stats = ProcessStats(proc=str(tmp_path), pid=lambda: pid)
    reg = make_registry(empty_snapshot, extra=chain(WebStats().state, stats.state))
    fast, slow = both(reg)
    assert fast == slow                       # the prepared body is prometheus_client's, byte for byte
    v = parse_exposition(fast)
    assert v[("process_cpu_seconds_total", ())] == (250 + 150) / TICKS
    assert v[("process_virtual_memory_bytes", ())] == 123456789
    assert v[("process_resident_memory_bytes", ())] == 2048 * PAGE
    assert v[("process_start_time_seconds", ())] == 1700000000 + 1000 / TICKS
    assert v[("process_open_fds", ())] == 7
    assert v[("process_max_fds", ())] == 65536
    # the web server's own series are still there, after the per-scrape process families
    assert v[("teye_web_requests_total", (("code", "200"), ("path", "/metrics")))] == 0


def test_headers_are_client_pythons_own(tmp_path):
    """HELP and TYPE lines as client_python's process collector writes them in its own registry."""
    pid = fake_proc(tmp_path)
    ours = render(make_registry(empty_snapshot, extra=ProcessStats(proc=str(tmp_path), pid=lambda: pid).state))[0]
    theirs = CollectorRegistry()
    ProcessCollector(proc=str(tmp_path), pid=lambda: pid, registry=theirs)
    want = [line for line in generate_latest(theirs).decode().splitlines()]
    got = [line for line in ours.decode().splitlines() if "process_" in line]
    assert got == want
    assert {n for n, _, _ in PROCESS_FAMILIES} == {line.split()[2] for line in want if line.startswith("# TYPE")}
    assert [f"# HELP {n} {h}" for n, _, h in PROCESS_FAMILIES] == [l for l in want if l.startswith("# HELP")]


@pytest.mark.measures("the process's CPU seconds against os.times()")
def test_live_process_values_match_the_kernels():
    v = parse_exposition(render(make_registry(empty_snapshot, extra=ProcessStats().state))[0].decode())
    with open("/proc/self/statm") as fh:
        rss = int(fh.read().split()[1]) * PAGE
    assert abs(v[("process_resident_memory_bytes", ())] - rss) < 0.2 * rss
    assert v[("process_max_fds", ())] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert abs(v[("process_open_fds", ())] - len(os.listdir("/proc/self/fd"))) <= 2
    t = os.times()
    assert 0 < v[("process_cpu_seconds_total", ())] <= t.user + t.system + 0.05


def test_unreadable_proc_drops_the_families_not_the_scrape(tmp_path):
    reg = make_registry(empty_snapshot, extra=chain(WebStats().state,
                                                    ProcessStats(proc=str(tmp_path), pid=lambda: 1).state))
    fast, slow = both(reg)
    assert fast == slow and "process_" not in fast and "teye_web_requests_total" in fast


def test_limits_without_the_open_files_line_drop_the_two_fd_families(tmp_path):
    """A limits file that does not name the open-files limit (a kernel that words it otherwise): both fd
    families are left out, the stat families and the scrape stay."""
    pid = fake_proc(tmp_path)
    (tmp_path / str(pid) / "limits").write_text("Limit   Soft Limit   Hard Limit   Units\n"
                                                "Max processes   100   100   processes\n")
    reg = make_registry(empty_snapshot, extra=ProcessStats(proc=str(tmp_path), pid=lambda: pid).state)
    fast, slow = both(reg)
    v = parse_exposition(fast)
    assert fast == slow and v[("process_cpu_seconds_total", ())] == (250 + 150) / TICKS
    assert "process_open_fds" not in fast and "process_max_fds" not in fast


def test_the_wall_clock_is_read_at_each_scrape_not_sampled():
    """teye_time_seconds (node_exporter's node_time_seconds, issue 49): the clock the producer is handed, at the call."""
    from exporters.selfstats import wall_clock
    ticks = iter([1795900000.25, 1795900015.5])
    state = wall_clock(lambda: next(ticks))
    (layout1, v1), (layout2, v2) = state(), state()
    assert (v1, v2) == ([1795900000.25], [1795900015.5]) and layout1 is layout2
    assert [spec.name for spec, _ in layout1.entries] == ["teye_time_seconds"] and layout1.per_scrape == 1
