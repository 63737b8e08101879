"""A wall clock that steps backwards (issue 40's bad input: an NTP step, an admin's `date -s`).

The host path never reads the wall clock: the sampler schedules, and /metrics ages its readings, on
CLOCK_MONOTONIC, which no step moves.  Checked three ways:

* statically: no module of the host path (the sources node_exporter's families come from, the sampler, the
  exporters' formatting) calls the wall clock;
* live: a sampler and its exposition while ``time.time``/``time.time_ns`` step back an hour between reads (as
  a process sees a step): every collector keeps reading, ages stay small and positive, values unchanged;
* what a step leaves behind is exported as it is, as node_exporter does: a textfile whose mtime is now in the
  future, and the kernel's clock state right after the step (adjtimex returns TIME_ERROR, STA_UNSYNC set).
"""
from __future__ import annotations

import ast
import os
import time

import pytest
from prometheus_client import generate_latest

from agent.sampler import Sampler
from agent.sources import FACTORIES
from agent.sources.loadavg import LoadavgSource
from agent.sources.textfile import TextfileSource
from agent.sources.timex import STA_UNSYNC, TimexSource
from exporters.prometheus import make_registry
from tests.conftest import parse_exposition
from tests.procs import REPO

HOST_SOURCES = ("cpu", "memory", "disk", "network", "netclass", "netstat", "pressure", "loadavg", "filesystem",
                "vmstat", "timex", "os", "edac", "hwmon", "textfile", "qdisc", "nfs", "nfsd", "infiniband")
WALL = {("time", "time"), ("time", "time_ns"), ("datetime", "now"), ("datetime", "utcnow"), ("time", "localtime"),
        ("time", "gmtime")}
# (file, function): wall-clock reads that are the value itself, never a schedule or an age.  The time zone's
# offset in force now (node_exporter's node_time_zone_offset_seconds) depends on today's date by definition.
ALLOWED = {("agent/sources/timex.py", "local_zone")}


def _wall_calls(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    rel = os.path.relpath(path, REPO)
    allowed = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and (rel, fn.name) in ALLOWED:
            allowed.update(id(n) for n in ast.walk(fn))
    out = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in WALL:
            out.append(f"{os.path.relpath(path, REPO)}:{node.lineno} {node.func.value.id}.{node.func.attr}()")
        if isinstance(node, ast.ImportFrom) and node.module == "time" and \
                any(a.name in ("time", "time_ns") for a in node.names):
            out.append(f"{os.path.relpath(path, REPO)}:{node.lineno} from time import time")
    return out


def test_no_module_of_the_host_path_reads_the_wall_clock():
    files = [os.path.join(REPO, FACTORIES[s].split(":")[0].replace(".", "/") + ".py") for s in HOST_SOURCES]
    files += [os.path.join(REPO, "agent", "sources", "_files.py"), os.path.join(REPO, "agent", "sampler.py"),
              os.path.join(REPO, "exporters", "prometheus.py"), os.path.join(REPO, "exporters", "render.py")]
    assert all(os.path.isfile(f) for f in files)
    assert [c for f in files for c in _wall_calls(f)] == []


def test_the_checker_sees_a_wall_clock_call(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import time\nfrom time import time_ns\ndef f():\n    return time.time()\n"
                 "def local_zone():\n    return time.localtime()\n")
    assert len(_wall_calls(str(p))) == 3   # ALLOWED names timex.py's local_zone, not every local_zone


def test_a_sampler_and_its_exposition_go_on_while_the_wall_clock_steps_back(tmp_path, monkeypatch):
    (tmp_path / "site.prom").write_text("site_ok 1\n")
    s = Sampler({"loadavg": (LoadavgSource("/proc"), 0.2), "textfile": (TextfileSource(str(tmp_path)), 0.2)})
    reg = make_registry(lambda: s.snapshot)
    real, real_ns = time.time, time.time_ns
    steps = {"n": 0}

    def stepping():       # an hour back at every call after the first: as a step seen from inside
        steps["n"] += 1
        return real() - 3600.0 * steps["n"]
    monkeypatch.setattr(time, "time", stepping)
    monkeypatch.setattr(time, "time_ns", lambda: int(stepping() * 1e9))
    s.start()
    try:
        deadline = real() + 10
        while not all(st.reads >= 3 for st in s.snapshot.sources.values()) and real() < deadline:
            real_sleep = 0.05
            time.sleep(real_sleep)
        v = parse_exposition(generate_latest(reg).decode())
    finally:
        s.stop()
    assert all(st.reads >= 3 for st in s.snapshot.sources.values())
    for c in ("loadavg", "textfile"):
        assert v[("teye_collector_up", (("collector", c),))] == 1.0
        assert 0.0 <= v[("teye_collector_last_read_age_seconds", (("collector", c),))] < 5.0
    assert v[("site_ok", ())] == 1.0 and v[("teye_textfile_scrape_error", ())] == 0.0
    with open("/proc/loadavg") as fh:
        assert abs(v[("teye_load1", ())] - float(fh.read().split()[0])) < 1.0


def test_a_textfile_from_the_future_is_exported_with_its_mtime(tmp_path):
    """After the clock stepped back, a file written before the step has an mtime ahead of now: exported as it
    is (node_exporter's node_textfile_mtime_seconds), not an error."""
    f = tmp_path / "health.prom"
    f.write_text("site_ok 1\n")
    future = int(time.time()) + 3600
    os.utime(f, (future, future))
    s = Sampler({"textfile": (TextfileSource(str(tmp_path)), 15.0)})
    st = s.read_once("textfile")
    assert st.up
    v = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    assert v[("teye_textfile_mtime_seconds", (("file", str(f)),))] == future
    assert v[("site_ok", ())] == 1.0 and v[("teye_textfile_scrape_error", ())] == 0.0


@pytest.mark.parametrize("state", [5, 0])   # TIME_ERROR (the kernel after a step), TIME_OK
def test_the_kernels_state_after_a_step_is_exported_and_the_collector_stays_up(state):
    fields = {"offset": 0, "freq": 0, "maxerror": 16_000_000, "esterror": 16_000_000, "status": STA_UNSYNC,
              "tai": 0}
    s = Sampler({"timex": (TimexSource(adjtimex=lambda: (state, fields)), 15.0)})
    assert s.read_once("timex").up
    v = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    assert v[("teye_timex_sync_status", ())] == 0.0 and v[("teye_timex_maxerror_seconds", ())] == 16.0
    assert v[("teye_timex_status", ())] == STA_UNSYNC
