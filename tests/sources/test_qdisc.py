"""Root qdiscs from rtnetlink, against iproute2's `tc -s -j qdisc show` (its own parser of the same kernel
messages) in a network namespace of the test's own, with a token-bucket shaper at a known rate and traffic
that overflows it; and the parser's refusals on garbled dumps."""
from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from agent.errors import ParseError
from agent.sources import qdisc as Q
from tests import netns
from tests.procs import REPO

READ = ("import json, sys; from agent.sources.qdisc import QdiscSource; "
        "r = QdiscSource().collect(); "
        "print(json.dumps([[d, q.kind, q.bytes, q.packets, q.drops, q.overlimits, q.requeues, q.rate_bps] "
        "for d, q in r.qdiscs]))")
FLOOD = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
         "[s.sendto(b'x' * 1400, ('{dst}', 9)) for _ in range(400)]")


def _tc(ns, dev):
    out = subprocess.run(netns.in_ns(ns, ["tc", "-s", "-j", "qdisc", "show", "dev", dev]), check=True,
                         capture_output=True, text=True).stdout
    (root,) = [q for q in json.loads(out) if q.get("root")]
    return root


@pytest.fixture(scope="module")
def shaped():
    why = netns.available()
    if why:
        pytest.skip(why)
    with netns.veth_pair("qd", rate_mbit=20, subnet=220) as pair:
        yield pair


def test_counters_lie_between_two_tc_readings_and_the_shaper_rate_is_tcs(shaped):
    ns, dev = shaped.ns[0], shaped.dev[0]
    subprocess.run(netns.in_ns(ns, [sys.executable, "-c", FLOOD.format(dst=shaped.addr[1])]), check=True)
    before = _tc(ns, dev)
    mine = json.loads(subprocess.run(netns.in_ns(ns, [sys.executable, "-c", READ]), check=True, cwd=REPO,
                                     capture_output=True, text=True).stdout)
    after = _tc(ns, dev)
    assert [m[0] for m in mine] == [dev]            # the namespace's one interface; loopback left out
    _, kind, nbytes, packets, drops, over, requeues, rate = mine[0]
    assert kind == before["kind"] == "tbf"
    assert before["bytes"] <= nbytes <= after["bytes"] and before["packets"] <= packets <= after["packets"]
    assert before["drops"] <= drops <= after["drops"] and before["overlimits"] <= over <= after["overlimits"]
    assert requeues == before["requeues"] == after["requeues"]
    assert over > 0   # 400 × 1.4 kB at once: more than a 20 Mbit/s bucket lets through at once
    assert rate == before["options"]["rate"] == 20_000_000 // 8   # bytes per second


def _msg(typ, body, flags=0):
    return struct.pack("=IHHII", 16 + len(body), typ, flags, 1, 0) + body


def _attr(typ, payload):
    pad = b"\0" * (-len(payload) % 4)
    return struct.pack("=HH", 4 + len(payload), typ) + payload + pad


def _qdisc(ifindex, kind, parent=Q.TC_H_ROOT, basic=(1000, 10), queue=(1, 200, 3, 4, 5), rate=None, rate64=None):
    attrs = _attr(Q.TCA_KIND, kind.encode() + b"\0")
    stats = _attr(Q.TCA_STATS_BASIC, struct.pack("=QI", *basic)) + _attr(Q.TCA_STATS_QUEUE, struct.pack("=5I", *queue))
    attrs += _attr(Q.TCA_STATS2, stats)
    if rate is not None or rate64 is not None:
        opts = _attr(Q.TCA_TBF_PARMS, struct.pack("=BBHhHI", 0, 1, 0, -1, 0, rate or 0) + b"\0" * 24)
        if rate64 is not None:
            opts += _attr(Q.TCA_TBF_RATE64, struct.pack("=Q", rate64))
        attrs += _attr(Q.TCA_OPTIONS, opts)
    return _msg(Q.RTM_NEWQDISC, struct.pack("=BxxxiIII", 0, ifindex, 0x80020000, parent, 0) + attrs)


DONE = _msg(Q.NLMSG_DONE, struct.pack("=i", 0))


def test_an_old_kernels_tc_stats_is_read_where_there_is_no_stats2():
    # struct tc_stats: bytes u64, packets, drops, overlimits, bps, pps, qlen, backlog (u32 each)
    old = _attr(Q.TCA_KIND, b"pfifo_fast\0") + _attr(Q.TCA_STATS, struct.pack("=Q7I", 9000, 90, 2, 1, 0, 0, 6, 700))
    data = _msg(Q.RTM_NEWQDISC, struct.pack("=BxxxiIII", 0, 2, 0, Q.TC_H_ROOT, 0) + old) + DONE
    (q,) = Q.parse_qdiscs(data)
    assert (q.kind, q.bytes, q.packets, q.drops, q.overlimits, q.qlen, q.backlog) == ("pfifo_fast", 9000, 90, 2, 1, 6, 700)


def test_a_replayed_dump_with_known_values():
    data = _qdisc(3, "tbf", rate=2_500_000) + _qdisc(3, "pfifo", parent=0x80020001) + \
        _qdisc(4, "tbf", rate=0xFFFFFFFF, rate64=50 * 10**9 // 8) + _qdisc(5, "mq", basic=(2**40, 7)) + DONE
    qs = Q.parse_qdiscs(data)
    assert [(q.ifindex, q.kind, q.root, q.rate_bps) for q in qs] == [
        (3, "tbf", True, 2_500_000), (3, "pfifo", False, None), (4, "tbf", True, 50 * 10**9 // 8), (5, "mq", True, None)]
    assert (qs[3].bytes, qs[3].packets, qs[0].qlen, qs[0].backlog, qs[0].drops, qs[0].requeues, qs[0].overlimits) == \
        (2**40, 7, 1, 200, 3, 4, 5)
    names = {3: "eth0", 4: "ib0", 5: "lo"}
    src = Q.QdiscSource(dump_fn=lambda: data, name_fn=names.get)
    reading = src.collect()
    assert [(d, q.kind) for d, q in reading.qdiscs] == [("eth0", "tbf"), ("ib0", "tbf")]  # roots, no loopback
    pts = {(p.spec.name, p.labels): p.value for p in reading.points()}
    assert pts[("teye_network_qdisc_rate_bytes", ("eth0", "tbf"))] == 2_500_000
    assert pts[("teye_network_qdisc_overlimits_total", ("eth0", "tbf"))] == 5


@pytest.mark.parametrize("data, words", [
    (_qdisc(3, "tbf"), "without NLMSG_DONE"),
    (_qdisc(3, "tbf")[:30], "runs past"),
    (_msg(Q.NLMSG_ERROR, struct.pack("=i", -1)), "error 1"),
    (_msg(Q.RTM_NEWQDISC, b"\0" * 8) + DONE, "too short for its header"),
    (_msg(Q.RTM_NEWQDISC, struct.pack("=BxxxiIII", 0, 1, 0, Q.TC_H_ROOT, 0) + struct.pack("=HH", 200, 1)) + DONE,
     "runs past its message"),
])
def test_garbled_dumps_are_refused_with_what_is_wrong(data, words):
    with pytest.raises(ParseError, match=words):
        Q.parse_qdiscs(data)
