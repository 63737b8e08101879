"""The network's part in a communication-bound verdict: pure rules over the node's interface counters.

A job whose exposed exchange (``communication``) crosses ``communication_threshold`` gets one of
``COMMUNICATION_CAUSES``, from what the node's own interfaces did over the same window
(:class:`agent.context.LinkWindow`: /proc/net/dev bytes, errors and drops; /sys/class/net speed and
carrier changes; the root qdisc's rate, drops and overlimits), in this order:

1. ``network_errors``: an interface other than loopback that carried traffic saw at least
   ``ERRORS_PER_SECOND`` receive or transmit errors and drops per second, or its carrier went down or
   up: a bad cable or optic, a flapping port, a switch dropping frames.
2. ``network_bandwidth``: the busiest interface is full while the job exchanges: its throughput (the
   larger of receive and send) over the window, divided by the job's communication share (the exchange
   is where its traffic goes), reaches ``BUSY_RATIO`` of its limit, the lower of its negotiated speed and
   the rate its root qdisc shapes it to (tbf); or its shaper held packets back (overlimits) while it
   carried at least ``SHAPED_BUSY_RATIO`` of that rate scaled the same way (the communication share holds
   the waits for other ranks too, so the scaled throughput reads low where the exchange is bursty).  An interface that reports no speed
   and has no shaper has no known limit and is never called full.
3. ``straggler``: the job's ranks on this node differ in communication share by
   ``communication_threshold`` or more: some wait in the exchange for another that computes longer.
4. ``unknown``: none of these, with what was seen (the exchange may cross another node's link, or run
   on loopback between ranks of this node; the network collectors may be off).

The busiest interface is cited whatever the cause.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

COMMUNICATION_CAUSES = ("network_bandwidth", "network_errors", "straggler", "unknown")
ERRORS_PER_SECOND = 1.0
BUSY_RATIO = 0.7
SHAPED_BUSY_RATIO = 0.4


def _rate(bps: float) -> str:
    """Bytes per second as bits per second, in words: '19.6 Mbit/s'."""
    bits = 8 * bps
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.3g} {unit}"
    return f"{bits:.0f} bit/s"


def limit_of(link) -> Tuple[Optional[float], str]:
    """(bytes per second, what it is) of the interface's limit: the lower of its speed and its shaper's rate."""
    opts = []
    if link.speed_bps:
        opts.append((link.speed_bps, f"link speed {_rate(link.speed_bps)}"))
    if link.shaper_bps:
        opts.append((link.shaper_bps, f"{link.shaper or 'qdisc'} rate {_rate(link.shaper_bps)}"))
    return min(opts) if opts else (None, "no known limit (no speed reported, no shaper)")


def describe(link, comm_share: float) -> str:
    """What one interface did: 'vq1 sent 2.41 Mbit/s ... of its tbf rate 20 Mbit/s (...)'."""
    through = max(link.rx_bps, link.tx_bps)
    limit, what = limit_of(link)
    s = (f"{link.device} carried {_rate(link.rx_bps)} in, {_rate(link.tx_bps)} out over {link.seconds:.0f} s")
    if limit:
        s += (f", {100 * through / limit:.0f} % of its {what}"
              f" ({100 * min(1.0, through / limit / max(comm_share, 1e-9)):.0f} % while the job exchanges)")
    else:
        s += f", {what}"
    s += f"; {link.errors} errors and drops, {link.carrier_changes} carrier changes"
    if link.shaper_bps:
        s += f", its shaper held back {link.overlimits} packets and dropped {link.qdisc_drops}"
    return s


def network_cause(links: Optional[Sequence], comm_share: float, rank_spread: float = 0.0,
                  spread_threshold: float = 0.2) -> Tuple[str, str]:
    """(cause, evidence in words) for a job whose communication share is ``comm_share``; ``links`` the
    node's interfaces over the window (None: not sampled), ``rank_spread`` the largest less the least
    communication share of its ranks on this node."""
    if links is None:
        seen = "the node's interfaces were not sampled (network collector off)"
        carrying = []
    else:
        carrying = [l for l in links if l.rx_bps > 0 or l.tx_bps > 0]
        seen = "no interface but loopback carried traffic" if not carrying else ""
    busiest = None
    if carrying:
        def load(l):
            limit, _ = limit_of(l)
            through = max(l.rx_bps, l.tx_bps)
            return (through / limit if limit else 0.0, through)
        busiest = max(carrying, key=load)
        seen = describe(busiest, comm_share)
    bad = [l for l in carrying if l.errors / l.seconds >= ERRORS_PER_SECOND or l.carrier_changes]
    if bad:
        worst = max(bad, key=lambda l: (l.carrier_changes, l.errors))
        return "network_errors", (f"network errors: {describe(worst, comm_share)}"
                                  + (f"; busiest: {seen}" if worst is not busiest else ""))
    if busiest is not None:
        limit, _ = limit_of(busiest)
        if limit:
            in_exchange = max(busiest.rx_bps, busiest.tx_bps) / limit / max(comm_share, 1e-9)
            if in_exchange >= BUSY_RATIO or (busiest.shaper_bps and busiest.overlimits and
                                             max(busiest.rx_bps, busiest.tx_bps) / busiest.shaper_bps
                                             / max(comm_share, 1e-9) >= SHAPED_BUSY_RATIO):
                return "network_bandwidth", f"the link is full while the job exchanges: {seen}"
    if rank_spread >= spread_threshold:
        return "straggler", (f"its ranks on this node differ by {100 * rank_spread:.0f} points of communication "
                             f"share: some wait in the exchange for another that computes longer; {seen}")
    return "unknown", f"no saturated or failing link on this node: {seen}"
