"""Network source against a hand-written /proc/net/dev with known values, plus garbled input."""
from __future__ import annotations

import os

import pytest
from prometheus_client import generate_latest

from agent.config import defaults
from agent.errors import ParseError
from agent.sampler import Sampler
from agent.sources import build
from agent.sources.cpu import CpuSource
from agent.sources.network import COLUMNS, NetworkSource, parse_net_dev
from exporters.prometheus import make_registry
from tests.conftest import DATA, PROCFS, parse_exposition

NET_PROCFS = os.path.join(DATA, "net_dev", "proc")
NET_DEV = os.path.join(NET_PROCFS, "net", "dev")

# Ground truth: the values tests/data/net_dev/proc/net/dev was written with, in column order.
TRUTH = {
    "lo": (18570, 65, 0, 0, 0, 0, 0, 0, 18570, 65, 0, 0, 0, 0, 0, 0),
    "eth0": (123456789012, 98765432, 3, 4, 5, 6, 7, 8, 210987654321, 87654321, 11, 12, 13, 14, 15, 16),
    "enp129s0f0": (9876543210, 7654321, 21, 22, 23, 24, 25, 26, 1234567890, 1234567, 31, 32, 33, 34, 35, 36),
    "ib0": (4096, 32, 0, 1, 0, 0, 0, 2, 8192, 64, 0, 3, 0, 0, 0, 0),
    "docker0": (0,) * 16,
}

CONTRACT = {  # metric -> column
    "teye_network_receive_bytes_total": "rx_bytes",
    "teye_network_transmit_bytes_total": "tx_bytes",
    "teye_network_receive_packets_total": "rx_packets",
    "teye_network_transmit_packets_total": "tx_packets",
    "teye_network_receive_errors_total": "rx_errors",
    "teye_network_transmit_errors_total": "tx_errors",
    "teye_network_receive_drops_total": "rx_drops",
    "teye_network_transmit_drops_total": "tx_drops",
}

HEADER = ("Inter-|   Receive                                                |  Transmit\n"
          " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls "
          "carrier compressed\n")
LO = "    lo:   18570      65    0    0    0     0          0         0    18570      65    0    0    0     0       0          0\n"


def _read(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def test_every_column_of_every_interface_matches_ground_truth():
    r = NetworkSource(NET_PROCFS).collect()
    assert list(r.interfaces) == list(TRUTH)  # file order kept
    for dev, values in TRUTH.items():
        st = r.interfaces[dev]
        assert tuple(getattr(st, c) for c in COLUMNS) == values, dev


def test_counters_glued_to_the_colon():
    text = _read(NET_DEV)
    assert "  eth0:123456789012 " in text and "enp129s0f0:9876543210 " in text  # the fixture really has them
    r = parse_net_dev(text, NET_DEV)
    assert r.interfaces["eth0"].rx_bytes == 123456789012
    assert r.interfaces["enp129s0f0"].rx_bytes == 9876543210
    assert r.interfaces["enp129s0f0"].tx_compressed == 36


def test_exposition_through_sampler_and_exporter():
    src = build("network", defaults())
    src.path = NET_DEV  # the source the daemon builds, pointed at the fixture
    s = Sampler({"network": (src, 1.0)})
    assert s.read_once("network").up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    for dev, values in TRUTH.items():
        for name, col in CONTRACT.items():
            assert out[(name, (("device", dev),))] == values[COLUMNS.index(col)], (name, dev)
    assert out[("teye_network_transmit_collisions_total", (("device", "eth0"),))] == 14
    assert out[("teye_network_receive_multicast_total", (("device", "eth0"),))] == 8


def test_exclusion_from_config():
    cfg = defaults()
    cfg["network"]["exclude"] = r"^(lo|docker\d+)$"
    src = build("network", cfg)
    src.path = NET_DEV
    assert list(src.collect().interfaces) == ["eth0", "enp129s0f0", "ib0"]
    assert list(NetworkSource(NET_PROCFS, defaults()["network"]["exclude"]).collect().interfaces) == list(TRUTH)


# --- garbled input --------------------------------------------------------------------------

@pytest.mark.parametrize("text, why", [
    ("", "empty"),
    ("Inter-|   Receive    |  Transmit\n", "header"),                   # truncated inside the header
    (LO.replace("    lo:", "    lo "), "header"),                        # no header at all
    (HEADER, "no interface lines"),                                     # truncated right after the header
    (HEADER + LO + "  eth0: 1 2 3 4 5", "truncated"),                   # cut mid-line
    (HEADER + LO + "  eth0  1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n", "expected 'interface: counters'"),
    (HEADER + LO.replace("18570      65", "18570      6x5"), "expected an integer"),
    (HEADER + LO + "  eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n", "has 17 counters"),
    (HEADER + LO + "  eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 -16\n", "negative"),
])
def test_garbled_net_dev_raises_parse_error_naming_file(tmp_path, text, why):
    (tmp_path / "net").mkdir()
    path = tmp_path / "net" / "dev"
    path.write_text(text)
    with pytest.raises(ParseError) as e:
        NetworkSource(str(tmp_path)).collect()
    assert e.value.path == str(path) and str(path) in str(e.value)
    assert why in str(e.value)


def test_missing_file_raises_oserror_naming_file(tmp_path):
    with pytest.raises(OSError) as e:
        NetworkSource(str(tmp_path)).collect()
    assert e.value.filename == str(tmp_path / "net" / "dev")


def test_sampler_marks_network_down_and_cpu_stays_up(tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "dev").write_text(HEADER + "  eth0: 12")
    s = Sampler({"network": (NetworkSource(str(tmp_path)), 1.0), "cpu": (CpuSource(PROCFS), 1.0)})
    st = s.read_once("network")
    assert not st.up and st.reading is None and str(tmp_path / "net" / "dev") in st.error
    assert s.read_once("cpu").up


def test_vanished_interface_disappears_from_next_reading(tmp_path):
    (tmp_path / "net").mkdir()
    path = tmp_path / "net" / "dev"
    veth = "vethab12cd: 100 1 0 0 0 0 0 0 200 2 0 0 0 0 0 0\n"
    path.write_text(HEADER + LO + veth)
    src = NetworkSource(str(tmp_path))
    assert list(src.collect().interfaces) == ["lo", "vethab12cd"]
    path.write_text(HEADER + LO)  # the container's veth went away
    r = src.collect()
    assert list(r.interfaces) == ["lo"]
    assert {p.labels[0] for p in r.points()} == {"lo"}
