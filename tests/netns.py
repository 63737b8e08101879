"""Two network namespaces joined by a veth pair, made by the test and removed after it: simulated nodes
whose traffic stays between them (no route leaves them).  Optionally each end's egress is shaped with
a token bucket (``tc qdisc ... tbf``: the kernels here have no netem), so the link between the two
"nodes" runs at a known rate in both directions."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from typing import Iterator, List, NamedTuple, Optional


class Pair(NamedTuple):
    ns: List[str]          # the two namespaces
    dev: List[str]         # the veth end in each
    addr: List[str]        # the IPv4 address of each end (/24 between them)
    rate_mbit: Optional[float]
    mgmt: List[str] = []   # with mgmt=True: each namespace's address on its own unshaped link to this one


def shape(pair: Pair, rate_mbit: Optional[float]) -> None:
    """Put a tbf of rate_mbit on both ends' egress of the pair's link (None: take it off)."""
    for n, d in zip(pair.ns, pair.dev):
        subprocess.run(["tc", "-n", n, "qdisc", "del", "dev", d, "root"], capture_output=True)
        if rate_mbit:
            burst_kbit = max(64, int(rate_mbit * 1000 / 10))
            subprocess.run(["tc", "-n", n, "qdisc", "add", "dev", d, "root", "tbf", "rate", f"{rate_mbit}mbit",
                            "burst", f"{burst_kbit}kbit", "latency", "400ms"], check=True, capture_output=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def available() -> Optional[str]:
    """None where namespaces can be made here, else why not (not root, no ip or tc)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no {tool} command (iproute2)"
    return None


@contextlib.contextmanager
def veth_pair(tag: str, rate_mbit: Optional[float] = None, subnet: int = 213, mgmt: bool = False) -> Iterator[Pair]:
    """Namespaces teye-<tag>-<pid>-{a,b} with veth ends ta<pid>/tb<pid> at 10.<subnet>.<pid%250>.1 and .2;
    ``rate_mbit``: tbf on both ends' egress (burst 64 kbit or a tenth of a second's worth, latency 400 ms).
    ``mgmt``: each namespace also gets an unshaped link to this namespace (a management network, for the
    agents' scrapes): 10.<subnet+1>.<pid%250>.{1,2}/30 for a, .{5,6}/30 for b, this side first."""
    pid = os.getpid() % 100000
    ns = [f"teye-{tag}-{pid}-a", f"teye-{tag}-{pid}-b"]
    dev = [f"ta{tag[:3]}{pid}", f"tb{tag[:3]}{pid}"]
    net = f"10.{subnet}.{pid % 250}"
    addr = [f"{net}.1", f"{net}.2"]
    made = []
    try:
        for n in ns:
            _ip("netns", "add", n)
            made.append(n)
        _ip("link", "add", dev[0], "netns", ns[0], "type", "veth", "peer", "name", dev[1], "netns", ns[1])
        for n, d, a in zip(ns, dev, addr):
            _ip("-n", n, "addr", "add", f"{a}/24", "dev", d)
            _ip("-n", n, "link", "set", "lo", "up")
            _ip("-n", n, "link", "set", d, "up")
        pair = Pair(ns, dev, addr, rate_mbit, [])
        shape(pair, rate_mbit)
        if mgmt:
            m = f"10.{subnet + 1}.{pid % 250}"
            for i, n in enumerate(ns):
                here, there = f"tm{'ab'[i]}{tag[:3]}{pid}", f"tn{'ab'[i]}{tag[:3]}{pid}"
                _ip("link", "add", here, "type", "veth", "peer", "name", there, "netns", n)
                _ip("addr", "add", f"{m}.{1 + 4 * i}/30", "dev", here)
                _ip("link", "set", here, "up")
                _ip("-n", n, "addr", "add", f"{m}.{2 + 4 * i}/30", "dev", there)
                _ip("-n", n, "link", "set", there, "up")
                pair.mgmt.append(f"{m}.{2 + 4 * i}")
        yield pair
    finally:
        for n in made:   # their veth ends go with them, and so do the peers on this side
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def in_ns(ns: str, argv: List[str]) -> List[str]:
    """argv run inside namespace ns (its own /sys mounted by `ip netns exec`)."""
    return ["ip", "netns", "exec", ns, *argv]
