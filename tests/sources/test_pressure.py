"""Pressure (PSI) source against node_exporter's fixture /proc/pressure and its golden values."""
from __future__ import annotations

import errno
import os
import shutil

import pytest
from prometheus_client import generate_latest

from agent.errors import ParseError, SourceUnavailable
from agent.sampler import Sampler
from agent.sources.cpu import CpuSource
from agent.sources.pressure import PressureSource, parse_psi
from exporters.prometheus import make_registry
from tests.conftest import PROCFS, golden, parse_exposition

# node_exporter names "some" waiting and "full" stalled; it skips system-wide cpu full (undefined).
NODE = {
    ("cpu", "some"): "node_pressure_cpu_waiting_seconds_total",
    ("io", "some"): "node_pressure_io_waiting_seconds_total",
    ("io", "full"): "node_pressure_io_stalled_seconds_total",
    ("memory", "some"): "node_pressure_memory_waiting_seconds_total",
    ("memory", "full"): "node_pressure_memory_stalled_seconds_total",
    ("irq", "full"): "node_pressure_irq_stalled_seconds_total",
}


def _exposition(sampler):
    return parse_exposition(generate_latest(make_registry(lambda: sampler.snapshot)).decode())


def test_totals_equal_node_exporter(node_exporter_golden):
    r = PressureSource(PROCFS).collect()
    assert sorted(r.resources) == ["cpu", "io", "irq", "memory"]
    assert sorted(r.resources["irq"]) == ["full"]  # irq has no "some" line
    for (res, kind), node_name in NODE.items():
        assert r.resources[res][kind].total_seconds == pytest.approx(golden(node_exporter_golden, node_name),
                                                                      rel=1e-12), (res, kind)


def test_exported_series_equal_node_exporter_and_skip_cpu_full(node_exporter_golden):
    s = Sampler({"pressure": (PressureSource(PROCFS), 5.0)})
    assert s.read_once("pressure").up
    out = _exposition(s)
    stalled = {dict(l)["resource"] + "/" + dict(l)["kind"]: v for (n, l), v in out.items()
               if n == "teye_pressure_stalled_seconds_total"}
    assert set(stalled) == {f"{r}/{k}" for r, k in NODE}  # no cpu/full
    for (res, kind), node_name in NODE.items():
        assert stalled[f"{res}/{kind}"] == pytest.approx(golden(node_exporter_golden, node_name), rel=1e-12)


def test_averages_are_ratios():
    # io: "some avg10=0.18 avg60=0.34 avg300=0.10 total=159886802"
    r = PressureSource(PROCFS).collect()
    io = r.resources["io"]["some"]
    assert (io.avg10, io.avg60, io.avg300) == pytest.approx((0.0018, 0.0034, 0.0010))
    s = Sampler({"pressure": (PressureSource(PROCFS), 5.0)})
    s.read_once("pressure")
    out = _exposition(s)
    key = ("teye_pressure_stalled_ratio", (("kind", "full"), ("resource", "io"), ("window", "60s")))
    assert out[key] == pytest.approx(0.0034)
    ratio_keys = [l for (n, l) in out if n == "teye_pressure_stalled_ratio"]
    assert len(ratio_keys) == 6 * 3


def test_parse_psi_by_hand():
    lines = parse_psi("some avg10=5.05 avg60=7.31 avg300=2.43 total=9888567\n"
                      "full avg10=100.00 avg60=0.00 avg300=0.00 total=0\n", "pressure/cpu")
    assert lines["some"] == pytest.approx((0.0505, 0.0731, 0.0243, 9.888567))
    assert lines["full"].avg10 == 1.0


def test_missing_pressure_directory_is_unavailable(tmp_path):
    with pytest.raises(SourceUnavailable, match="no such directory"):
        PressureSource(str(tmp_path)).collect()


def test_sampler_reports_unavailable_reason_and_cpu_stays_up(tmp_path):
    s = Sampler({"pressure": (PressureSource(str(tmp_path)), 5.0), "cpu": (CpuSource(PROCFS), 1.0)})
    st = s.read_once("pressure")
    assert not st.up and str(tmp_path / "pressure") in st.error and "PSI" in st.error
    assert s.read_once("cpu").up
    out = _exposition(s)
    assert out[("teye_collector_up", (("collector", "pressure"),))] == 0
    assert out[("teye_collector_up", (("collector", "cpu"),))] == 1


def test_psi_disabled_at_boot_is_unavailable(tmp_path, monkeypatch):
    # With psi=0 some kernels keep /proc/pressure but every read fails with EOPNOTSUPP.
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "cpu").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    import agent.sources.pressure as mod

    def refuse(files, path, allow_empty=False, limit=None):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP), path)
    monkeypatch.setattr(mod.KeptFiles, "read_text", refuse)
    with pytest.raises(SourceUnavailable, match="psi=1"):
        PressureSource(str(tmp_path)).collect()


def test_empty_pressure_directory_is_unavailable(tmp_path):
    (tmp_path / "pressure").mkdir()
    with pytest.raises(SourceUnavailable, match="none of"):
        PressureSource(str(tmp_path)).collect()


def test_only_present_files_are_read(tmp_path):
    shutil.copytree(os.path.join(PROCFS, "pressure"), tmp_path / "pressure")
    os.unlink(tmp_path / "pressure" / "irq")  # kernels before 6.1
    r = PressureSource(str(tmp_path)).collect()
    assert sorted(r.resources) == ["cpu", "io", "memory"]


# --- garbled input --------------------------------------------------------------------------

@pytest.mark.parametrize("text, why", [
    ("", "empty"),
    ("\n", "empty"),
    ("some avg10=0.18 avg60=0.34 avg30", "got 'avg30'"),              # cut mid-word
    ("some avg10=0.18 avg60=0.34 ", "missing avg300, total"),         # cut between fields
    ("some avg10=0.18 avg60=0.34 avg300=0.10 total=1598x6802\n", "expected an integer"),
    ("some avg10=zero avg60=0.34 avg300=0.10 total=1\n", "expected a number"),
    ("some avg10=0.18 avg60=0.34 avg300=0.10 total\n", "key=value"),
    ("most avg10=0.18 avg60=0.34 avg300=0.10 total=1\n", "'some' or 'full'"),
    ("some avg10=180.0 avg60=0.34 avg300=0.10 total=1\n", "percentages"),
    ("some avg10=0.18 avg60=0.34 avg300=0.10 total=-1\n", "negative"),
])
def test_garbled_psi_raises_parse_error_naming_file(tmp_path, text, why):
    shutil.copytree(os.path.join(PROCFS, "pressure"), tmp_path / "pressure")
    path = tmp_path / "pressure" / "io"
    path.write_text(text)
    with pytest.raises(ParseError) as e:
        PressureSource(str(tmp_path)).collect()
    assert e.value.path == str(path) and str(path) in str(e.value)
    assert why in str(e.value)


def test_a_directory_in_place_of_a_file_is_refused_and_the_others_kept(tmp_path, node_exporter_golden):
    shutil.copytree(os.path.join(PROCFS, "pressure"), tmp_path / "pressure")
    os.unlink(tmp_path / "pressure" / "memory")
    os.mkdir(tmp_path / "pressure" / "memory")  # not a regular file: refused (agent/sources/_files.py), counted
    r = PressureSource(str(tmp_path)).collect()
    assert sorted(r.resources) == ["cpu", "io", "irq"]
    for (res, kind), node_name in NODE.items():
        if res != "memory":
            assert r.resources[res][kind].total_seconds == pytest.approx(golden(node_exporter_golden, node_name),
                                                                          rel=1e-12), (res, kind)
    assert r.refused == (("not_regular", 1),)


def test_sampler_marks_garbled_pressure_down_and_cpu_stays_up(tmp_path):
    shutil.copytree(os.path.join(PROCFS, "pressure"), tmp_path / "pressure")
    (tmp_path / "pressure" / "memory").write_text("some avg10=")
    s = Sampler({"pressure": (PressureSource(str(tmp_path)), 5.0), "cpu": (CpuSource(PROCFS), 1.0)})
    st = s.read_once("pressure")
    assert not st.up and str(tmp_path / "pressure" / "memory") in st.error
    assert s.read_once("cpu").up


def test_vanished_resource_disappears_from_next_reading(tmp_path):
    shutil.copytree(os.path.join(PROCFS, "pressure"), tmp_path / "pressure")
    src = PressureSource(str(tmp_path))
    assert "irq" in src.collect().resources
    os.unlink(tmp_path / "pressure" / "irq")
    r = src.collect()
    assert "irq" not in r.resources
    assert not any(p.labels[0] == "irq" for p in r.points())
