"""No alarm for hardware a node does not have, under a real Prometheus with the shipped rules (issue 40).

Two agents on this machine's live /proc and /sys: one fresh with the built-in defaults, one whose
configuration turns the InfiniBand collector on explicitly.  A real Prometheus scrapes both every second with
every shipped rule file loaded.  The oracle for "absent" is the machine itself, checked here directly (no
InfiniBand device in sysfs, no ``cpu`` PMU, no loadable NVML library), not what the agent says.  Then:

* every collector whose hardware this machine lacks is ``teye_collector_absent`` 1 on the fresh agent, every
  other one 0;
* the TeyeCollectorFailing expression, as the shipped rule file has it, evaluated by Prometheus over the
  scraped series, returns nothing for the fresh agent, and no ``ALERTS`` series (pending included: the
  rule's ``for:`` is left as shipped) exists for it;
* the same expression returns the explicitly enabled InfiniBand collector of the second agent where the
  machine has no InfiniBand (configured on and not working is a failure), and its ``ALERTS`` series is pending.
"""
from __future__ import annotations

import ctypes
import os
import time

import pytest

from tests.conftest import parse_exposition
from tests.deploy.rulefiles import RULE_FILES, load_rules
from tests.procs import Agent, Prometheus

pytestmark = pytest.mark.e2e


def machine_lacks() -> set:
    """Collectors whose hardware this machine does not have, from the machine (not from teye)."""
    out = set()
    ib = "/sys/class/infiniband"
    if not os.path.isdir(ib) or not os.listdir(ib):
        out.add("infiniband")
    if not os.path.isdir("/sys/bus/event_source/devices/cpu") and \
            not os.path.isdir("/sys/bus/event_source/devices/cpu_core"):
        out.add("pmu")
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        out.add("gpu")
    return out


def failing_expr() -> str:
    (rule,) = [r for r in load_rules() if r.get("alert") == "TeyeCollectorFailing"]
    return rule["expr"]


@pytest.fixture
def cluster(tmp_path):
    cfg = tmp_path / "explicit.yml"
    cfg.write_text("collectors:\n  infiniband:\n    enabled: true\n")
    fresh = Agent([], log_path=str(tmp_path / "fresh.log"))
    explicit = Agent(["--config", str(cfg)], log_path=str(tmp_path / "explicit.log"))
    prom = None
    try:
        prom = Prometheus(str(tmp_path), targets=[f"127.0.0.1:{fresh.port}", f"127.0.0.1:{explicit.port}"],
                          rule_files=RULE_FILES)
        yield fresh, explicit, prom, tmp_path
    finally:
        if prom:
            prom.stop()
        fresh.stop()
        explicit.stop()


def test_a_fresh_agent_fires_no_collector_alert_for_hardware_the_node_lacks(cluster):
    fresh, explicit, prom, tmp = cluster
    lacks = machine_lacks()
    fi, ei = f"127.0.0.1:{fresh.port}", f"127.0.0.1:{explicit.port}"
    # the agent's own view first: absent exactly where the machine lacks the hardware
    deadline = time.monotonic() + 30
    while True:
        v = parse_exposition(fresh.metrics())
        absent = {dict(k[1])["collector"]: val for k, val in v.items() if k[0] == "teye_collector_absent"}
        if all(c in absent for c in lacks) and not any(
                val == 0 and c in lacks for c, val in absent.items()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {c for c, val in absent.items() if val == 1} == lacks & set(absent), absent
    assert "nfsd" not in absent          # off by default: only NFS servers turn it on
    # Prometheus has scraped both agents and evaluated the rules a few times
    prom.wait_for(f'count_over_time(teye_collector_up{{instance="{fi}",collector="cpu"}}[1m]) >= 3', timeout=60)
    prom.wait_for(f'count_over_time(teye_collector_up{{instance="{ei}",collector="cpu"}}[1m]) >= 3', timeout=60)
    time.sleep(2.5)   # two more rule evaluations after those scrapes
    expr = failing_expr()
    firing = {(s["metric"]["instance"], s["metric"]["collector"]) for s in prom.query(expr)}
    alerts = {(s["metric"]["instance"], s["metric"]["collector"], s["metric"]["alertstate"])
              for s in prom.query('ALERTS{alertname="TeyeCollectorFailing"}')}
    log = (tmp / "fresh.log").read_text()
    assert {c for i, c in firing if i == fi} == set(), (firing, log)
    assert {a for a in alerts if a[0] == fi} == set(), alerts
    # the rule is not blind: the absent collectors are down (teye_collector_up 0) in what Prometheus holds
    down = {s["metric"]["collector"] for s in prom.query(f'teye_collector_up{{instance="{fi}"}} == 0')}
    assert lacks <= down, down
    # the start-up line counts them as absent, not down
    line = next(x for x in log.splitlines() if "listening on" in x)
    if lacks:
        assert f"absent ({len(lacks)}, no such hardware here; not an alert)" in line, line
        assert all(f"{c} (" in line.split("absent (")[1] for c in lacks), line
    assert "down (" not in line, line
    # configured on explicitly and absent: a failure, pending under the shipped for:
    if "infiniband" in lacks:
        assert (ei, "infiniband") in firing, firing
        assert (ei, "infiniband", "pending") in alerts, alerts
    else:
        pytest.skip("this machine has InfiniBand: the explicit-configuration half needs a node without it")
