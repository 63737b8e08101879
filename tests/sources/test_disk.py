"""Disk source against node_exporter's fixture /proc/diskstats and its golden values, plus garbled input."""
from __future__ import annotations

import os

import pytest
from prometheus_client import generate_latest

from agent.config import defaults
from agent.errors import ParseError
from agent.sampler import Sampler
from agent.sources import build
from agent.sources.cpu import CpuSource
from agent.sources.disk import DiskSource, parse_diskstats
from exporters.prometheus import make_registry
from tests.conftest import PROCFS, parse_exposition

DISKSTATS = os.path.join(PROCFS, "diskstats")

# teye metric -> (node_exporter metric, factor from node_exporter's unit to ours)
SAME = {
    "teye_disk_reads_completed_total": ("node_disk_reads_completed_total", 1),
    "teye_disk_reads_merged_total": ("node_disk_reads_merged_total", 1),
    "teye_disk_read_bytes_total": ("node_disk_read_bytes_total", 1),
    "teye_disk_read_time_seconds_total": ("node_disk_read_time_seconds_total", 1),
    "teye_disk_writes_completed_total": ("node_disk_writes_completed_total", 1),
    "teye_disk_writes_merged_total": ("node_disk_writes_merged_total", 1),
    "teye_disk_written_bytes_total": ("node_disk_written_bytes_total", 1),
    "teye_disk_write_time_seconds_total": ("node_disk_write_time_seconds_total", 1),
    "teye_disk_io_in_progress": ("node_disk_io_now", 1),
    "teye_disk_io_time_seconds_total": ("node_disk_io_time_seconds_total", 1),
    "teye_disk_io_time_weighted_seconds_total": ("node_disk_io_time_weighted_seconds_total", 1),
    "teye_disk_discards_completed_total": ("node_disk_discards_completed_total", 1),
    "teye_disk_discards_merged_total": ("node_disk_discards_merged_total", 1),
    "teye_disk_discarded_bytes_total": ("node_disk_discarded_sectors_total", 512),  # we export bytes
    "teye_disk_discard_time_seconds_total": ("node_disk_discard_time_seconds_total", 1),
    "teye_disk_flush_requests_total": ("node_disk_flush_requests_total", 1),
    "teye_disk_flush_time_seconds_total": ("node_disk_flush_requests_time_seconds_total", 1),
}

# What our default exclude keeps from the fixture (partitions, ram, loop, fd excluded).
DEFAULT_KEPT = {"sda", "sdb", "sdc", "vda", "nvme0n1", "mmcblk0", "sr0", "dm-0", "dm-1", "dm-2", "dm-3", "dm-4",
                "dm-5"}


def _read(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _by_name(points):
    out = {}
    for p in points:
        out[(p.spec.name, p.labels[0])] = p.value
    return out


def _node_devices(golden_values):
    return {dict(labels)["device"] for (name, labels) in golden_values if name == "node_disk_read_bytes_total"}


def test_every_device_node_exporter_exports_has_equal_values(node_exporter_golden):
    g = node_exporter_golden
    ours = _by_name(parse_diskstats(_read(DISKSTATS), DISKSTATS).points())  # no exclusion
    devices = _node_devices(g)
    assert len(devices) == 15
    compared = 0
    for dev in devices:
        for teye_name, (node_name, factor) in SAME.items():
            key = (node_name, (("device", dev),))
            if key not in g:
                # node_exporter omits discard/flush stats the kernel line lacks: so must we
                assert (teye_name, dev) not in ours, (teye_name, dev)
                continue
            assert ours[(teye_name, dev)] == pytest.approx(g[key] * factor, rel=1e-12), (teye_name, dev)
            compared += 1
    assert compared == 15 * 11 + 2 * 4 + 1 * 2  # 11 base stats, discards on sdb+sdc, flushes on sdc


def test_contract_values_by_hand():
    r = parse_diskstats(_read(DISKSTATS), DISKSTATS)
    sda = r.devices["sda"]
    # "8 0 sda 25354637 34367663 1003346126 18492372 28444756 11134226 505697032 63877960 0 9653880 82621804"
    assert sda.read_bytes == 1003346126 * 512
    assert sda.written_bytes == 505697032 * 512
    assert sda.reads == 25354637 and sda.writes == 28444756
    assert sda.read_time == 18492.372 and sda.write_time == 63877.96 and sda.io_time == 9653.88
    assert sda.discards is None and sda.flushes is None
    sdc = r.devices["sdc"]
    assert (sdc.discards, sdc.discarded_bytes, sdc.flushes, sdc.flush_time) == (18851, 125173784 * 512, 1555, 1.944)


def test_default_exclusion_drops_partitions_loop_ram_fd():
    cfg = defaults()
    src = build("disk", cfg)
    src.path = DISKSTATS  # the source the daemon builds, pointed at the fixture
    r = src.collect()
    assert set(r.devices) == DEFAULT_KEPT
    all_devices = set(parse_diskstats(_read(DISKSTATS), DISKSTATS).devices)
    excluded = all_devices - DEFAULT_KEPT
    expected = ({f"ram{i}" for i in range(16)} | {f"loop{i}" for i in range(8)} | {"fd0"}
                | {"sda1", "sda2", "sda3", "sda4", "sdb1", "sdb2", "sdc1", "vda1", "vda2", "nvme0n1p1", "nvme0n1p2",
                   "mmcblk0p1", "mmcblk0p2"})
    assert excluded == expected


def test_custom_exclusion_from_config():
    cfg = defaults()
    cfg["disk"]["exclude"] = r"^(dm-|sr)"
    src = build("disk", cfg)
    src.path = DISKSTATS
    devices = set(src.collect().devices)
    assert "sda1" in devices and "ram0" in devices
    assert not any(d.startswith(("dm-", "sr")) for d in devices)


def test_exposition_through_sampler_and_exporter(node_exporter_golden):
    s = Sampler({"disk": (DiskSource(PROCFS, defaults()["disk"]["exclude"]), 1.0)})
    assert s.read_once("disk").up
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    exported = {dict(labels)["device"] for (name, labels) in out if name == "teye_disk_read_bytes_total"}
    assert exported == DEFAULT_KEPT
    for dev in exported:
        for teye_name in ("teye_disk_read_bytes_total", "teye_disk_written_bytes_total"):
            node_name = SAME[teye_name][0]
            assert out[(teye_name, (("device", dev),))] == node_exporter_golden[(node_name, (("device", dev),))]


# --- garbled input --------------------------------------------------------------------------

LINE = "   8       0 sda 25354637 34367663 1003346126 18492372 28444756 11134226 505697032 63877960 0 9653880 82621804"


@pytest.mark.parametrize("text, why", [
    ("", "empty"),
    ("\n\n", "empty"),
    (LINE + "\n   8       1 sda1 250 0 2000 36", "truncated"),                   # cut mid-line
    (LINE + " 1 2\n", "truncated"),                                              # 13 stats: no kernel prints that
    (LINE.replace("1003346126", "10033x6126") + "\n", "expected an integer"),
    ("   8       x sda 1 2 3 4 5 6 7 8 9 10 11\n", "minor"),
    ("   8       0 sda 1 2 3 4 5 6 7 8 9 10 -11\n", "negative"),
])
def test_garbled_diskstats_raises_parse_error_naming_file(tmp_path, text, why):
    path = tmp_path / "diskstats"
    path.write_text(text)
    with pytest.raises(ParseError) as e:
        DiskSource(str(tmp_path)).collect()
    assert e.value.path == str(path) and str(path) in str(e.value)
    assert why in str(e.value)


def test_garbage_in_an_excluded_device_is_still_an_error(tmp_path):
    (tmp_path / "diskstats").write_text(LINE + "\n   7 0 loop0 0 0 zero 0 0 0 0 0 0 0 0\n")
    with pytest.raises(ParseError, match="loop0"):
        DiskSource(str(tmp_path), r"^loop\d+$").collect()


def test_missing_file_raises_oserror_naming_file(tmp_path):
    with pytest.raises(OSError) as e:
        DiskSource(str(tmp_path)).collect()
    assert e.value.filename == str(tmp_path / "diskstats")


def test_sampler_marks_disk_down_and_cpu_stays_up(tmp_path):
    (tmp_path / "diskstats").write_text(LINE[:40] + "\n")
    s = Sampler({"disk": (DiskSource(str(tmp_path)), 1.0), "cpu": (CpuSource(PROCFS), 1.0)})
    st = s.read_once("disk")
    assert not st.up and st.reading is None and str(tmp_path / "diskstats") in st.error
    assert s.read_once("cpu").up
    assert s.snapshot.state("cpu").reading.context_switches == 38014093


def test_vanished_device_disappears_from_next_reading(tmp_path):
    path = tmp_path / "diskstats"
    usb = "   8      16 sdb 10 0 80 1 0 0 0 0 0 1 1 0 0 0 0 0 0"
    path.write_text(LINE + "\n" + usb + "\n")
    src = DiskSource(str(tmp_path))
    assert set(src.collect().devices) == {"sda", "sdb"}
    path.write_text(LINE + "\n")  # sdb unplugged
    r = src.collect()
    assert set(r.devices) == {"sda"}
    assert {p.labels[0] for p in r.points()} == {"sda"}
