"""Link state: this machine's interfaces against iproute2's own view, a veth pair taken up and down with its
carrier counters, and fixture trees for what the kernel says of virtual, vanished and garbled interfaces."""
from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from prometheus_client import generate_latest

from agent.sampler import Sampler
from agent.sources.netclass import NetclassSource
from exporters.prometheus import make_registry
from tests.conftest import parse_exposition


def _exposition(src):
    s = Sampler({"netclass": (src, 5.0)})
    st = s.read_once("netclass")
    assert st.up, st.error
    return parse_exposition(generate_latest(make_registry(lambda: s.snapshot)).decode())


def _per_device(out, name):
    return {dict(l)["device"]: v for (n, l), v in out.items() if n == name}


def test_interfaces_equal_iproute2():
    """The oracle: `ip -j link` (netlink, not sysfs) for MTU, operational state and hardware address."""
    ip = {d["ifname"]: d for d in json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True,
                                                            text=True, check=True).stdout)}
    out = _exposition(NetclassSource("/sys"))
    mtu = _per_device(out, "teye_network_mtu_bytes")
    assert set(mtu) == set(ip)
    for dev, d in ip.items():
        assert mtu[dev] == d["mtu"], dev
        assert _per_device(out, "teye_network_up")[dev] == (1 if d["operstate"] == "UP" else 0), dev
    info = {dict(l)["device"]: dict(l) for (n, l), _ in out.items() if n == "teye_network_info"}
    for dev, d in ip.items():
        assert info[dev]["operstate"] == d["operstate"].lower() and info[dev]["address"] == d.get("address", ""), dev


@pytest.fixture
def veth():
    """A veth pair: va here, vb in a network namespace of the test's own (no address, no traffic)."""
    if os.geteuid() != 0:
        pytest.skip("creating a veth pair needs root")
    tag = uuid.uuid4().hex[:6]
    ns, a, b = f"teye-nc-{tag}", f"tva{tag}", f"tvb{tag}"
    run = lambda *c: subprocess.run(c, check=True, capture_output=True)  # noqa: E731
    run("ip", "netns", "add", ns)
    try:
        run("ip", "link", "add", a, "type", "veth", "peer", "name", b, "netns", ns)
        yield a, lambda *c: run("ip", "-n", ns, *c), run
    finally:
        subprocess.run(["ip", "link", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_link_going_down_and_up_is_seen_with_its_carrier_changes(veth):
    a, in_ns, here = veth
    b = "tvb" + a[3:]
    src = NetclassSource("/sys", exclude=f"^(?!{a}$)")  # this test's interface alone
    out = _exposition(src)
    # administratively down: no carrier to read (EINVAL): absent, not 0
    assert _per_device(out, "teye_network_up") == {a: 0} and _per_device(out, "teye_network_carrier") == {}
    assert _per_device(out, "teye_network_speed_bytes") == {}  # no speed either while down (EINVAL)
    changes0 = _per_device(out, "teye_network_carrier_changes_total")[a]
    here("ip", "link", "set", a, "up", "mtu", "1280")  # the peer is still down: no carrier
    out = _exposition(src)
    assert _per_device(out, "teye_network_carrier") == {a: 0} and _per_device(out, "teye_network_mtu_bytes") == {a: 1280}
    info = {dict(l)["operstate"] for (n, l), _ in out.items() if n == "teye_network_info"}
    ip = json.loads(subprocess.run(["ip", "-j", "link", "show", a], capture_output=True, text=True).stdout)[0]
    assert info == {ip["operstate"].lower()} and info <= {"down", "lowerlayerdown"}  # not up: no peer
    in_ns("link", "set", b, "up")
    out = _exposition(src)
    assert _per_device(out, "teye_network_carrier") == {a: 1} and _per_device(out, "teye_network_up") == {a: 1}
    assert _per_device(out, "teye_network_speed_bytes") == {a: 10_000_000_000 // 8}  # veth says 10000 Mbit/s
    up1 = _per_device(out, "teye_network_carrier_up_changes_total")[a]
    in_ns("link", "set", b, "down")  # the peer goes away: the carrier drops, the counters move
    out = _exposition(src)
    assert _per_device(out, "teye_network_carrier") == {a: 0}
    assert _per_device(out, "teye_network_carrier_changes_total")[a] >= changes0 + 2
    assert _per_device(out, "teye_network_carrier_down_changes_total")[a] >= 1 and up1 >= 1


def _iface(root, name, **attrs):
    d = root / "class" / "net" / name
    d.mkdir(parents=True)
    for k, v in attrs.items():
        (d / k).write_text(f"{v}\n")
    return d


def test_fixture_interfaces_virtual_vanished_and_garbled(tmp_path):
    _iface(tmp_path, "ib0", operstate="up", carrier=1, mtu=4092, speed=100000, duplex="full",
           address="80:00:02:08:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0f:75:42", carrier_changes=4,
           carrier_up_count=2, carrier_down_count=2)
    _iface(tmp_path, "bond0", operstate="up", carrier=1, mtu=9000, speed=-1, address="aa:bb:cc:dd:ee:ff")
    _iface(tmp_path, "bad0", operstate="sideways", mtu=1500)
    os.symlink(str(tmp_path / "gone"), tmp_path / "class" / "net" / "veth9")  # removed while listed
    src = NetclassSource(str(tmp_path))
    out = _exposition(src)
    assert _per_device(out, "teye_network_speed_bytes") == {"ib0": 100000 * 125000}  # bond0's -1: unknown
    assert _per_device(out, "teye_network_mtu_bytes") == {"ib0": 4092, "bond0": 9000}
    assert _per_device(out, "teye_network_carrier_changes_total") == {"ib0": 4}  # bond0 has none: absent
    assert _per_device(out, "teye_network_carrier_down_changes_total") == {"ib0": 2}
    assert out[("teye_network_interfaces_vanished_total", ())] == 1
    assert out[("teye_network_interfaces_unreadable_total", ())] == 1  # bad0 alone is left out
    info = {dict(l)["device"]: dict(l) for (n, l), _ in out.items() if n == "teye_network_info"}
    assert info["ib0"]["duplex"] == "full" and info["ib0"]["address"].startswith("80:00:02:08")
    assert set(info) == {"ib0", "bond0"}
