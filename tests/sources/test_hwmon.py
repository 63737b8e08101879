"""Host sensors against sysfs trees built as drivers lay them out (Documentation/hwmon/sysfs-interface),
with known values: labelled and unlabelled sensors, probes that fail, a chip that vanishes, thermal zones."""
from __future__ import annotations

import os

import pytest
from prometheus_client import generate_latest

from agent.sampler import Sampler
from agent.sources.hwmon import HwmonSource
from exporters.prometheus import make_registry
from tests.conftest import parse_exposition


def _write(d, **files):
    os.makedirs(d, exist_ok=True)
    for k, v in files.items():
        with open(os.path.join(d, k), "w") as fh:
            fh.write(f"{v}\n")


def _tree(root):
    sysfs = str(root)
    # coretemp on the platform bus, labelled sensors
    dev = os.path.join(sysfs, "devices", "platform", "coretemp.0")
    _write(dev)
    os.makedirs(os.path.join(sysfs, "bus", "platform"), exist_ok=True)
    os.symlink(os.path.join(sysfs, "bus", "platform"), os.path.join(dev, "subsystem"))
    h0 = os.path.join(sysfs, "devices", "platform", "coretemp.0", "hwmon", "hwmon0")
    _write(h0, name="coretemp", temp1_input=45000, temp1_label="Package id 0", temp1_crit=100000,
           temp1_max=84000, temp2_input=43500, temp2_label="Core 0")
    os.symlink(dev, os.path.join(h0, "device"))
    # a PCI chip (a NIC's sensor), no labels, a fan, a power meter and a probe that is not fitted
    pdev = os.path.join(sysfs, "devices", "pci0000:00", "0000:00:03.1", "0000:09:00.0")
    _write(pdev)
    h1 = os.path.join(sysfs, "devices", "hwmon1")
    _write(h1, name="acpi_power", temp1_input=61000, fan1_input=5400, power1_input=123456789, in0_input=12050)
    os.symlink(pdev, os.path.join(h1, "device"))
    os.mkdir(os.path.join(h1, "temp9_input"))  # reading it fails (EISDIR): that sensor alone is left out
    # no device at all
    h2 = os.path.join(sysfs, "devices", "hwmon2")
    _write(h2, name="virtual", temp1_input=-5000)
    cls = os.path.join(sysfs, "class", "hwmon")
    os.makedirs(cls)
    for n, d in (("hwmon0", h0), ("hwmon1", h1), ("hwmon2", h2)):
        os.symlink(d, os.path.join(cls, n))
    os.symlink(os.path.join(sysfs, "devices", "gone"), os.path.join(cls, "hwmon3"))  # unplugged while listed
    th = os.path.join(sysfs, "class", "thermal")
    _write(os.path.join(th, "thermal_zone0"), type="x86_pkg_temp", temp=47000)
    _write(os.path.join(th, "thermal_zone1"), type="acpitz", temp=27800)
    _write(os.path.join(th, "cooling_device0"), type="Processor")
    return sysfs


def test_sensors_and_zones_with_their_values(tmp_path):
    sysfs = _tree(tmp_path)
    s = Sampler({"hwmon": (HwmonSource(sysfs), 5.0)})
    st = s.read_once("hwmon")
    assert st.up, st.error
    out = parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())
    got = {(n, tuple(v for _, v in l)): val for (n, l), val in out.items()
           if n.startswith(("teye_hwmon_", "teye_thermal_"))}
    pci = "pci0000:00_0000:00:03.1_0000:09:00.0"
    assert got == {
        ("teye_hwmon_chip_info", ("platform_coretemp.0", "coretemp")): 1,
        ("teye_hwmon_chip_info", (pci, "acpi_power")): 1,
        ("teye_hwmon_chip_info", ("hwmon2", "virtual")): 1,
        ("teye_hwmon_temp_celsius", ("platform_coretemp.0", "Package_id_0")): 45.0,
        ("teye_hwmon_temp_celsius", ("platform_coretemp.0", "Core_0")): 43.5,
        ("teye_hwmon_temp_crit_celsius", ("platform_coretemp.0", "Package_id_0")): 100.0,
        ("teye_hwmon_temp_max_celsius", ("platform_coretemp.0", "Package_id_0")): 84.0,
        ("teye_hwmon_temp_celsius", (pci, "temp1")): 61.0,
        ("teye_hwmon_fan_rpm", (pci, "fan1")): 5400,
        ("teye_hwmon_power_watts", (pci, "power1")): pytest.approx(123.456789),
        ("teye_hwmon_in_volts", (pci, "in0")): pytest.approx(12.05),
        ("teye_hwmon_temp_celsius", ("hwmon2", "temp1")): -5.0,
        ("teye_thermal_zone_temp_celsius", ("x86_pkg_temp", "0")): 47.0,
        ("teye_thermal_zone_temp_celsius", ("acpitz", "1")): 27.8,
        ("teye_hwmon_sensor_errors_total", ()): 0,
    }


def test_a_node_without_sensors_exports_nothing_and_is_up(tmp_path):
    s = Sampler({"hwmon": (HwmonSource(str(tmp_path)), 5.0)})
    assert s.read_once("hwmon").up
    assert list(HwmonSource(str(tmp_path)).collect().points()) == []


def test_a_garbled_sensor_value_leaves_out_that_sensor_alone_counted(tmp_path, caplog):
    _write(str(tmp_path / "class" / "hwmon" / "hwmon0"), name="x", temp1_input="hot", temp2_input=30000)
    src = HwmonSource(str(tmp_path))
    caplog.set_level("WARNING", logger="teye.hwmon")
    r = src.collect()
    vals = {(p.spec.name, p.labels): p.value for p in r.points()}
    assert vals[("teye_hwmon_temp_celsius", ("hwmon0", "temp2"))] == 30.0
    assert ("teye_hwmon_temp_celsius", ("hwmon0", "temp1")) not in vals
    assert vals[("teye_hwmon_sensor_errors_total", ())] == 1
    assert any("temp1_input" in r.getMessage() and "expected an integer" in r.getMessage() for r in caplog.records)
    assert dict(((p.spec.name, p.labels), p.value) for p in src.collect().points())[
        ("teye_hwmon_sensor_errors_total", ())] == 2
