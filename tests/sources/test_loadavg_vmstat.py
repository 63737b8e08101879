"""Load average and vmstat against node_exporter's fixture /proc and its golden values, plus garbled input."""
from __future__ import annotations

import shutil

import pytest
from prometheus_client import generate_latest

from agent.errors import ParseError
from agent.sampler import Sampler
from agent.sources.loadavg import LoadavgSource, parse_loadavg
from agent.sources.vmstat import FIELDS, VmstatSource, parse_vmstat
from exporters.prometheus import make_registry
from tests.conftest import PROCFS, golden, parse_exposition


def _exposition(name, src):
    s = Sampler({name: (src, 5.0)})
    assert s.read_once(name).up
    return parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())


def test_load_averages_equal_node_exporter(node_exporter_golden):
    out = _exposition("loadavg", LoadavgSource(PROCFS))
    for n in ("1", "5", "15"):
        assert out[(f"teye_load{n}", ())] == golden(node_exporter_golden, f"node_load{n}")
    # the fixture's 4th field is 1/719 (node_exporter does not export it: the file is the oracle)
    assert (out[("teye_load_runnable_tasks", ())], out[("teye_load_tasks", ())]) == (1, 719)


def test_vmstat_counters_equal_node_exporter(node_exporter_golden):
    out = _exposition("vmstat", VmstatSource(PROCFS))
    got = {n: v for (n, _), v in out.items() if n.startswith("teye_vmstat_")}
    assert set(got) == {f"teye_vmstat_{f}_total" for f in FIELDS}
    for f in FIELDS:
        assert got[f"teye_vmstat_{f}_total"] == golden(node_exporter_golden, f"node_vmstat_{f}"), f


def test_vmstat_field_the_kernel_lacks_is_absent_not_zero(tmp_path):
    (tmp_path / "vmstat").write_text("nr_free_pages 10\npgfault 5\npgmajfault 2\n")  # a kernel before 4.13
    r = VmstatSource(str(tmp_path)).collect()
    assert r.values == {"pgfault": 5, "pgmajfault": 2}
    assert {p.spec.name for p in r.points()} == {"teye_vmstat_pgfault_total", "teye_vmstat_pgmajfault_total"}


@pytest.mark.parametrize("text,why", [
    ("", "expected 5 fields"),
    ("0.1 0.2\n", "expected 5 fields"),
    ("0.1 x 0.3 1/2 3\n", "load5: expected a number"),
    ("0.1 -0.2 0.3 1/2 3\n", "finite and >= 0"),
    ("0.1 nan 0.3 1/2 3\n", "finite and >= 0"),
    ("0.1 0.2 0.3 12 3\n", "expected 'runnable/total'"),
    ("0.1 0.2 0.3 1/-2 3\n", "negative count"),
])
def test_garbled_loadavg_is_a_parse_error(text, why):
    with pytest.raises(ParseError, match=why):
        parse_loadavg(text, "loadavg")


@pytest.mark.parametrize("text,why", [
    ("", "none of"),
    ("nr_free_pages 1\n", "none of"),
    ("pgfault\n", "expected 'name value'"),
    ("pgfault 1 2\n", "expected 'name value'"),
    ("oom_kill x\n", "expected an integer"),
    ("pswpin -1\n", "negative count"),
])
def test_garbled_vmstat_is_a_parse_error(text, why):
    with pytest.raises(ParseError, match=why):
        parse_vmstat(text, "vmstat")


def test_a_garbled_file_marks_only_its_collector_down(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PROCFS, root, symlinks=True)
    (root / "loadavg").write_text("garbage\n")
    s = Sampler({"loadavg": (LoadavgSource(str(root)), 5.0), "vmstat": (VmstatSource(str(root)), 5.0)})
    assert not s.read_once("loadavg").up and s.read_once("vmstat").up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    assert out[("teye_collector_up", (("collector", "loadavg"),))] == 0
    assert out[("teye_vmstat_oom_kill_total", ())] == 0 and ("teye_load1", ()) not in out
