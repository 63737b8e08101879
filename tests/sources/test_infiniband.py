"""InfiniBand source: values equal node_exporter's on its own sysfs fixture; garbled input; vanishing ports."""
from __future__ import annotations

import os
import shutil

import pytest
from prometheus_client import generate_latest

from agent.config import defaults
from agent.errors import ParseError, SourceUnavailable
from agent.sampler import Sampler
from agent.sources import build
from agent.sources.cpu import CpuSource
from agent.sources.infiniband import (COUNTERS, InfinibandSource, parse_counter, parse_port, parse_rate,
                                      parse_state)
from exporters.prometheus import make_registry
from tests.conftest import PROCFS, SYSFS, golden, parse_exposition, reading_series as series

IB = os.path.join(SYSFS, "class", "infiniband")




def by_name(values, name):
    """{sorted label pairs: value} of one metric."""
    return {labels: v for (n, labels), v in values.items() if n == name}


def raw(*parts):
    with open(os.path.join(IB, *parts)) as fh:
        return int(fh.read())


# teye name -> node_exporter name for the same value. node_exporter exports counters/ as
# node_infiniband_port_* / *_packets_* and counters_ext/ as node_infiniband_legacy_*; teye prefers
# counters_ext (64-bit) when present, so its data/packet counters equal node_exporter's legacy ones.
FROM_COUNTERS_EXT = {
    "teye_infiniband_receive_bytes_total": "node_infiniband_legacy_data_received_bytes_total",
    "teye_infiniband_transmit_bytes_total": "node_infiniband_legacy_data_transmitted_bytes_total",
    "teye_infiniband_receive_packets_total": "node_infiniband_legacy_packets_received_total",
    "teye_infiniband_transmit_packets_total": "node_infiniband_legacy_packets_transmitted_total",
    "teye_infiniband_unicast_receive_packets_total": "node_infiniband_legacy_unicast_packets_received_total",
    "teye_infiniband_unicast_transmit_packets_total": "node_infiniband_legacy_unicast_packets_transmitted_total",
    "teye_infiniband_multicast_receive_packets_total": "node_infiniband_legacy_multicast_packets_received_total",
    "teye_infiniband_multicast_transmit_packets_total":
        "node_infiniband_legacy_multicast_packets_transmitted_total",
}
FROM_COUNTERS = {
    "teye_infiniband_link_downed_total": "node_infiniband_link_downed_total",
    "teye_infiniband_link_error_recovery_total": "node_infiniband_link_error_recovery_total",
    "teye_infiniband_receive_constraint_errors_total": "node_infiniband_port_constraint_errors_received_total",
    "teye_infiniband_transmit_constraint_errors_total": "node_infiniband_port_constraint_errors_transmitted_total",
    "teye_infiniband_receive_discards_total": "node_infiniband_port_discards_received_total",
    "teye_infiniband_transmit_discards_total": "node_infiniband_port_discards_transmitted_total",
    "teye_infiniband_receive_errors_total": "node_infiniband_port_errors_received_total",
    "teye_infiniband_transmit_wait_total": "node_infiniband_port_transmit_wait_total",
    "teye_infiniband_link_rate_bytes_per_second": "node_infiniband_rate_bytes_per_second",
}


@pytest.fixture(scope="module")
def fixture_reading():
    return InfinibandSource(SYSFS).collect()


@pytest.mark.parametrize("ours, theirs", sorted({**FROM_COUNTERS_EXT, **FROM_COUNTERS}.items()))
def test_every_port_value_equals_node_exporter(fixture_reading, node_exporter_golden, ours, theirs):
    mine = by_name(series(fixture_reading), ours)
    expected = by_name(node_exporter_golden, theirs)
    assert expected, theirs
    assert mine == expected  # same (device, port) set, same values; i40iw0's 'N/A (no PMA)' counters absent


def test_data_counters_count_4_byte_words_and_prefer_counters_ext(fixture_reading, node_exporter_golden):
    g = node_exporter_golden
    p1, p2 = fixture_reading.port("mlx4_0", "1"), fixture_reading.port("mlx4_0", "2")
    # x4 rule, against the raw files and against node_exporter's counters/ value (both files agree on port 1)
    assert p1.counters["receive_bytes"] == 4 * raw("mlx4_0", "ports", "1", "counters_ext", "port_rcv_data_64")
    assert p1.counters["receive_bytes"] == golden(g, "node_infiniband_port_data_received_bytes_total",
                                                  device="mlx4_0", port="1") == 18527668
    assert p1.counters["transmit_bytes"] == golden(g, "node_infiniband_port_data_transmitted_bytes_total",
                                                   device="mlx4_0", port="1") == 4 * 3733440
    # port 2: the 32-bit counters/ file reads 0, the 64-bit counters_ext file 4631917 words -> ext wins
    assert raw("mlx4_0", "ports", "2", "counters", "port_rcv_data") == 0
    assert golden(g, "node_infiniband_port_data_received_bytes_total", device="mlx4_0", port="2") == 0
    assert p2.counters["receive_bytes"] == 4 * 4631917
    assert p2.counter_files["receive_bytes"] == "counters_ext/port_rcv_data_64"
    # counters only in counters/ come from there
    assert p1.counter_files["transmit_discards"] == "counters/port_xmit_discards"
    assert p1.counters["transmit_discards"] == 5


def test_state_info_and_rate_equal_node_exporter(fixture_reading, node_exporter_golden):
    s = series(fixture_reading)
    g = node_exporter_golden
    states = by_name(s, "teye_infiniband_port_state")
    phys = by_name(s, "teye_infiniband_port_physical_state")
    for (dev, port) in (("i40iw0", "1"), ("mlx4_0", "1"), ("mlx4_0", "2")):
        assert states[(("device", dev), ("port", port), ("state", "ACTIVE"))] == \
            golden(g, "node_infiniband_state_id", device=dev, port=port) == 4
        assert phys[(("device", dev), ("port", port), ("state", "LinkUp"))] == \
            golden(g, "node_infiniband_physical_state_id", device=dev, port=port) == 5
    assert len(states) == len(phys) == 3
    assert by_name(s, "teye_infiniband_info") == by_name(g, "node_infiniband_info")
    assert fixture_reading.port("mlx4_0", "1").link_layer == "InfiniBand"


def test_no_pma_device_has_no_counters_but_keeps_state(fixture_reading):
    p = fixture_reading.port("i40iw0", "1")
    assert p.counters == {}  # every counter file reads 'N/A (no PMA)'
    assert p.rate_bytes_per_second == 10e9 / 8 and p.state == (4, "ACTIVE")


def test_exposition_through_sampler_and_exporter(node_exporter_golden):
    cfg = defaults()
    cfg["sysfs"] = SYSFS
    s = Sampler({"infiniband": (build("infiniband", cfg), 1.0)})
    assert s.read_once("infiniband").up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    g = node_exporter_golden
    assert out[("teye_collector_up", (("collector", "infiniband"),))] == 1
    for ours, theirs in {**FROM_COUNTERS_EXT, **FROM_COUNTERS}.items():
        assert by_name(out, ours) == by_name(g, theirs), ours
    assert out[("teye_infiniband_receive_packets_total", (("device", "mlx4_0"), ("port", "1")))] == 0


# --- constructed trees: every counter, fallbacks, vanishing ports --------------------------------

def make_port(root, device, port, files):
    d = os.path.join(root, "class", "infiniband", device, "ports", port)
    for rel, text in files.items():
        path = os.path.join(d, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
    return d


BASE = {"state": "4: ACTIVE\n", "phys_state": "5: LinkUp\n", "rate": "100 Gb/sec (4X EDR)\n",
        "link_layer": "InfiniBand\n"}


def test_every_declared_counter_is_read_with_its_multiplier(tmp_path):
    files = dict(BASE)
    expected = {}
    for i, (key, (_, candidates, mult)) in enumerate(COUNTERS.items(), start=1):
        files[candidates[-1]] = f"{1000 + i}\n"  # the counters/ (last-resort) file only
        expected[key] = (1000 + i) * mult
    make_port(str(tmp_path), "mlx5_0", "1", files)
    r = InfinibandSource(str(tmp_path)).collect()
    p = r.port("mlx5_0", "1")
    assert p.counters == expected
    assert p.counters["receive_bytes"] == 4 * int(files["counters/port_rcv_data"])
    assert p.counters["symbol_errors"] == int(files["counters/symbol_error"])
    assert p.counters["vl15_dropped"] == int(files["counters/VL15_dropped"])
    assert p.rate_bytes_per_second == 12.5e9
    names = {k[0] for k in series(r)}
    assert "teye_infiniband_excessive_buffer_overrun_errors_total" in names
    assert "teye_infiniband_local_link_integrity_errors_total" in names


def test_counters_ext_na_or_unreadable_falls_back_to_counters(tmp_path):
    d = make_port(str(tmp_path), "mlx4_0", "1", {**BASE,
                  "counters_ext/port_rcv_data_64": "N/A (no PMA)\n", "counters/port_rcv_data": "10\n",
                  "counters/port_xmit_data": "20\n", "counters/port_rcv_packets": "7\n"})
    os.makedirs(os.path.join(d, "counters_ext", "port_xmit_data_64"))  # read fails (EISDIR): skipped
    p = InfinibandSource(str(tmp_path)).collect().port("mlx4_0", "1")
    assert p.counters == {"receive_bytes": 40, "transmit_bytes": 80, "receive_packets": 7}
    assert p.counter_files["receive_bytes"] == "counters/port_rcv_data"


def test_unreadable_counter_is_skipped_not_fatal(tmp_path):
    d = make_port(str(tmp_path), "mlx4_0", "1", {**BASE, "counters/port_rcv_data": "10\n"})
    os.makedirs(os.path.join(d, "counters", "port_xmit_data"))
    p = InfinibandSource(str(tmp_path)).collect().port("mlx4_0", "1")
    assert p.counters == {"receive_bytes": 40}


def test_missing_attribute_files_leave_those_values_absent(tmp_path):
    make_port(str(tmp_path), "hfi1_0", "1", {"counters/port_xmit_data": "3\n", "state": "1: DOWN\n"})
    r = InfinibandSource(str(tmp_path)).collect()
    p = r.port("hfi1_0", "1")
    assert (p.counters, p.state, p.physical_state, p.rate_bytes_per_second) == ({"transmit_bytes": 12}, (1, "DOWN"),
                                                                                None, None)
    assert r.devices[0].board_id == "" and r.devices[0].hca_type == ""  # no board_id/hca_type files
    names = {k[0] for k in series(r)}
    assert "teye_infiniband_link_rate_bytes_per_second" not in names
    assert "teye_infiniband_port_physical_state" not in names


def test_port_that_vanishes_between_listing_and_reading_is_skipped(tmp_path):
    make_port(str(tmp_path), "mlx4_0", "1", {**BASE, "counters/port_rcv_data": "10\n"})
    ports = tmp_path / "class" / "infiniband" / "mlx4_0" / "ports"
    os.symlink(str(tmp_path / "gone"), ports / "2")  # listed by readdir, gone by the time it is read
    r = InfinibandSource(str(tmp_path)).collect()
    assert [(p.device, p.port) for p in r.ports] == [("mlx4_0", "1")]
    assert r.port("mlx4_0", "1").counters == {"receive_bytes": 40}


def test_device_that_vanishes_is_skipped_and_port_removed_between_reads(tmp_path):
    make_port(str(tmp_path), "mlx4_0", "1", {**BASE, "counters/port_rcv_data": "10\n"})
    make_port(str(tmp_path), "mlx4_0", "2", {**BASE, "counters/port_rcv_data": "30\n"})
    # real sysfs class entries are symlinks into /sys/devices; a hot-unplugged one dangles
    os.symlink(str(tmp_path / "devices" / "gone"), tmp_path / "class" / "infiniband" / "mlx4_1")
    src = InfinibandSource(str(tmp_path))
    first = src.collect()
    assert [d.name for d in first.devices] == ["mlx4_0"]
    assert [p.port for p in first.ports] == ["1", "2"]
    shutil.rmtree(tmp_path / "class" / "infiniband" / "mlx4_0" / "ports" / "2")
    second = src.collect()
    assert [p.port for p in second.ports] == ["1"]
    assert second.port("mlx4_0", "1").counters["receive_bytes"] == 40


def test_no_infiniband_class_is_unavailable(tmp_path):
    with pytest.raises(SourceUnavailable, match="no InfiniBand devices under .*class/infiniband"):
        InfinibandSource(str(tmp_path)).collect()
    os.makedirs(tmp_path / "class" / "infiniband")
    with pytest.raises(SourceUnavailable, match="no InfiniBand devices"):
        InfinibandSource(str(tmp_path)).collect()


# --- parsers: garbled input -----------------------------------------------------------------------

def test_parse_counter():
    assert parse_counter("4631917\n", "f") == 4631917
    assert parse_counter("18446744073709551615\n", "f") == 2 ** 64 - 1
    assert parse_counter("N/A (no PMA)\n", "f") is None


@pytest.mark.parametrize("text", ["", "\n", "12 34", "0x10", "-1", "1.5", "abc", "N/"])
def test_parse_counter_garbled(text):
    with pytest.raises(ParseError, match=r"^/sys/x/port_rcv_data: "):
        parse_counter(text, "/sys/x/port_rcv_data")


@pytest.mark.parametrize("text, expected", [
    ("40 Gb/sec (4X QDR)\n", 5e9), ("10 Gb/sec (4X)", 1.25e9), ("2.5 Gb/sec (1X SDR)", 2.5e9 / 8),
    ("100 Gb/sec (4X EDR)", 12.5e9), ("400 Gb/sec (4X NDR)", 50e9)])
def test_parse_rate(text, expected):
    assert parse_rate(text, "rate") == expected


@pytest.mark.parametrize("text", ["", "40", "40 Gb", "fast Gb/sec", "40 Mb/sec (4X)", "Gb/sec 40"])
def test_parse_rate_garbled(text):
    with pytest.raises(ParseError, match=r"^/sys/p/rate: "):
        parse_rate(text, "/sys/p/rate")


def test_parse_state():
    assert parse_state("4: ACTIVE\n", "s") == (4, "ACTIVE")
    assert parse_state("5: LinkUp", "s") == (5, "LinkUp")
    assert parse_state("4: PORT_CONFIGURATION TRAINING", "s") == (4, "PORT_CONFIGURATION TRAINING")


@pytest.mark.parametrize("text", ["", "4", "4:", "ACTIVE", "x: ACTIVE", ": ACTIVE"])
def test_parse_state_garbled(text):
    with pytest.raises(ParseError, match=r"^/sys/p/state: "):
        parse_state(text, "/sys/p/state")


@pytest.mark.parametrize("rel, text", [
    ("counters/port_rcv_data", "lots\n"), ("counters/port_rcv_data", ""), ("counters_ext/port_xmit_data_64", "1 2"),
    ("rate", "unknown\n"), ("state", "ACTIVE\n"), ("phys_state", "\n")])
def test_parse_port_names_the_garbled_file(rel, text):
    files = {**BASE, rel: text}
    with pytest.raises(ParseError) as e:
        parse_port("mlx4_0", "1", files, "/sys/class/infiniband/mlx4_0/ports/1")
    assert e.value.path == f"/sys/class/infiniband/mlx4_0/ports/1/{rel}"


def test_garbled_tree_takes_collector_down_others_stay_up(tmp_path):
    sysfs = tmp_path / "sys"
    shutil.copytree(SYSFS, sysfs, symlinks=True)
    bad = sysfs / "class" / "infiniband" / "mlx4_0" / "ports" / "1" / "counters" / "port_xmit_discards"
    bad.write_text("five\n")
    s = Sampler({"infiniband": (InfinibandSource(str(sysfs)), 1.0), "cpu": (CpuSource(PROCFS), 1.0)})
    ib, cpu = s.read_once("infiniband"), s.read_once("cpu")
    assert not ib.up and ib.reading is None
    assert str(bad) in ib.error and "'five'" in ib.error
    assert cpu.up and cpu.reading.seconds
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    assert out[("teye_collector_up", (("collector", "infiniband"),))] == 0
    assert out[("teye_collector_up", (("collector", "cpu"),))] == 1
    assert not by_name(out, "teye_infiniband_receive_bytes_total")
    # repaired: up again with the fixture's values
    bad.write_text("5\n")
    assert s.read_once("infiniband").up
