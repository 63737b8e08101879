"""The network's part in a communication verdict (agent.phases.links) and the interface history it reads
(agent.context.LinkHistory): values computed by hand."""
from __future__ import annotations

import os

import pytest

from agent.context import LinkHistory, LinkWindow
from agent.phases import links
from agent.phases.verdict import Evidence, decide

S = 10**9
MBIT = 1e6 / 8   # bytes per second in a Mbit/s


def L(dev="eth0", rx=0.0, tx=0.0, errors=0, changes=0, drops=0, over=0, speed=None, shaper=None, seconds=60.0):
    return LinkWindow(dev, seconds, rx, tx, errors, changes, drops, over, speed, shaper, "tbf" if shaper else "")


def test_a_link_full_at_its_shaper_rate_while_the_job_exchanges_is_bandwidth():
    # 14 Mbit/s on average over a minute, the job exchanging 70 % of it: 20 Mbit/s while it does, the tbf rate
    cause, why = links.network_cause([L(tx=14 * MBIT, rx=13 * MBIT, speed=10e9 / 8, shaper=20 * MBIT)], 0.7)
    assert cause == "network_bandwidth"
    assert why == ("the link is full while the job exchanges: eth0 carried 13 Mbit/s in, 14 Mbit/s out over 60 s, "
                   "70 % of its tbf rate 20 Mbit/s (100 % while the job exchanges); 0 errors and drops, 0 carrier "
                   "changes, its shaper held back 0 packets and dropped 0")
    # the same traffic on a 10 Gbit/s link without a shaper is nowhere near full
    assert links.network_cause([L(tx=14 * MBIT, speed=10e9 / 8)], 0.7)[0] == "unknown"
    # just under BUSY_RATIO while exchanging (0.69 × 0.7 × 20 Mbit/s on average) is not full, unless the shaper held
    # packets back and it carried at least SHAPED_BUSY_RATIO (0.4) of its rate while exchanging
    assert links.network_cause([L(tx=0.69 * 0.7 * 20 * MBIT, shaper=20 * MBIT)], 0.7)[0] == "unknown"
    assert links.network_cause([L(tx=0.71 * 0.7 * 20 * MBIT, shaper=20 * MBIT)], 0.7)[0] == "network_bandwidth"
    assert links.network_cause([L(tx=0.41 * 0.7 * 20 * MBIT, shaper=20 * MBIT, over=5)], 0.7)[0] == "network_bandwidth"
    assert links.network_cause([L(tx=0.39 * 0.7 * 20 * MBIT, shaper=20 * MBIT, over=5)], 0.7)[0] == "unknown"
    # a link with no speed and no shaper has no known limit: never full
    assert links.network_cause([L(tx=1e9)], 0.9)[0] == "unknown"


def test_errors_and_a_flapping_carrier_come_before_bandwidth():
    full = L("eth0", tx=20 * MBIT, shaper=20 * MBIT)
    cause, why = links.network_cause([full, L("ib0", rx=MBIT, errors=60, speed=100e9 / 8)], 0.8)
    assert cause == "network_errors"             # 60 errors in 60 s: 1 per second
    assert why.startswith("network errors: ib0 carried 1 Mbit/s in") and "; busiest: eth0 carried" in why
    assert links.network_cause([full, L("ib0", rx=MBIT, errors=59, speed=100e9 / 8)], 0.8)[0] == "network_bandwidth"
    assert links.network_cause([L(tx=MBIT, changes=1, speed=1e9 / 8)], 0.5)[0] == "network_errors"
    # an interface that carried nothing does not count, whatever its counters
    assert links.network_cause([L(errors=600, changes=3)], 0.5)[0] == "unknown"


def test_straggler_where_no_link_explains_it_and_unknown_says_what_was_seen():
    assert links.network_cause([L(tx=MBIT, speed=1e9 / 8)], 0.6, rank_spread=0.2)[0] == "straggler"
    assert links.network_cause([L(tx=MBIT, speed=1e9 / 8)], 0.6, rank_spread=0.19)[0] == "unknown"
    assert links.network_cause(None, 0.6) == ("unknown", "no saturated or failing link on this node: the node's "
                                                          "interfaces were not sampled (network collector off)")
    assert links.network_cause([], 0.6)[1].endswith("no interface but loopback carried traffic")


def test_the_communication_verdict_names_the_cause_and_its_advice_first():
    ev = Evidence(window_s=60, phase_seconds={"communication": 7.0, "compute": 3.0}, step_seconds=10.0, steps=100,
                  network=(L(tx=14 * MBIT, shaper=20 * MBIT),))
    v = decide(ev)
    assert (v.kind, v.cause) == ("communication", "network_bandwidth")
    assert v.evidence.startswith("communication 70 % of step time (threshold 20 %); the link is full while the job "
                                 "exchanges: eth0 carried 0 bit/s in, 14 Mbit/s out")
    assert v.recommendation.startswith("The link between the nodes is full while the job exchanges gradients")
    assert "Time goes to exchanging gradients" in v.recommendation


def test_history_differences_counters_over_the_window():
    h = LinkHistory(horizon_s=130)
    for k, t in enumerate(range(0, 100, 10)):       # a reading every 10 s: 1 MB/s out, 2 errors per reading
        h.add("eth0", "tx_bytes", t * S, k * 10_000_000)
        h.add("eth0", "rx_bytes", t * S, 5 * k)
        h.add("eth0", "errors", t * S, 2 * k)
    h.set("eth0", "speed_bps", 0, 1e9 / 8)
    h.set("eth0", "shaper_bps", 0, 2_500_000, "tbf")
    h.set("eth0", "shaper_bps", 90 * S, None)       # the shaper taken off after the window: still shaped in it
    (w,) = h.window(25 * S, 85 * S)                 # from the reading at 20 s to the one at 80 s
    assert w == LinkWindow("eth0", 60.0, 0.5, 1_000_000.0, 12, 0, 0, 0, 1e9 / 8, 2_500_000, "tbf")
    h.set("eth0", "shaper_bps", 95 * S, None)       # unchanged: no new reading
    assert h.window(85 * S, 99 * S)[0].shaper_bps is None   # a window ending after the shaper went
    h.add("lo2", "tx_bytes", 80 * S, 1)             # byte counters covering under a second: left out
    h.add("lo2", "rx_bytes", 80 * S, 1)
    assert [x.device for x in h.window(25 * S, 85 * S)] == ["eth0"]
    small = LinkHistory(max_devices=1)
    small.add("a", "tx_bytes", 0, 0)
    small.add("b", "tx_bytes", 0, 0)
    small.set("b", "speed_bps", 0, 1.0)
    assert list(small._data) == ["a"]


def test_a_data_parallel_job_whose_exchange_is_not_timed_is_not_observed_never_compute():
    """Issue 37: TensorFlow's multi-worker exchange runs inside its steps: what rule 4 would call compute is
    'communication not observed'; an input-bound job stays input (its wait is observed)."""
    base = dict(window_s=60, step_seconds=10.0, steps=100, source="tf.data")
    v = decide(Evidence(phase_seconds={"compute": 9.5, "data_wait": 0.5}, exchange_observed=False, **base))
    assert v.kind == "not_observed" and "communication not observed" in v.evidence
    assert v.recommendation.startswith("teye cannot say whether this job computes or exchanges gradients")
    assert decide(Evidence(phase_seconds={"compute": 9.5, "data_wait": 0.5}, **base)).kind == "compute"
    assert decide(Evidence(phase_seconds={"compute": 5.0, "data_wait": 5.0}, exchange_observed=False,
                           **base)).kind == "input"


def test_infiniband_ports_join_the_history_so_rdma_traffic_counts(tmp_path):
    """NCCL over verbs never passes /proc/net/dev: the InfiniBand ports are in the history as '<hca>/<port>'
    with their data (4-byte words), errors, downs and rate.  Fixture port mlx4_0/1 (40 Gb/sec 4X QDR), its
    xmit data raised by 1,250,000 words (5 MB) and link_downed by 1 between two reads 10 s apart."""
    import itertools
    import shutil
    from agent.context import AgentContext
    from agent.sources.infiniband import InfinibandSource
    from tests.conftest import SYSFS
    sys_copy = tmp_path / "sys"
    shutil.copytree(os.path.join(SYSFS, "class", "infiniband"), sys_copy / "class" / "infiniband", symlinks=True)
    t = itertools.count(0, 10 * S)
    ctx = AgentContext(clock=lambda: next(t))
    src = InfinibandSource(str(sys_copy), ctx)
    src.collect()
    port = sys_copy / "class" / "infiniband" / "mlx4_0" / "ports" / "1"
    xmit = port / "counters_ext" / "port_xmit_data_64"
    xmit.write_text(f"{int(xmit.read_text()) + 1_250_000}\n")
    down = port / "counters" / "link_downed"
    down.write_text(f"{int(down.read_text()) + 1}\n")
    src.collect()
    w = {x.device: x for x in ctx.links.window(0, 10 * S)}["mlx4_0/1"]
    assert (w.seconds, w.tx_bps, w.rx_bps, w.carrier_changes, w.speed_bps) == (10.0, 500_000.0, 0.0, 1, 40e9 / 8)
    assert ctx.links.sampled
    cause, why = links.network_cause([w], 0.5)
    assert cause == "network_errors" and why.startswith("network errors: mlx4_0/1 carried 0 bit/s in, 4 Mbit/s out")
