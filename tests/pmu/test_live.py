"""This machine as it is: the live agent with the real /proc and /sys."""
import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import parse_exposition
from tests.procs import REPO, Agent

HAS_PMU = os.path.isdir("/sys/bus/event_source/devices/cpu")


@pytest.mark.skipif(HAS_PMU, reason="this machine has a hardware PMU: the pmu collector may run here")
def test_agent_without_a_pmu_has_the_pmu_collector_absent_with_its_reason_and_the_rest_up(tmp_path):
    log = tmp_path / "agent.log"
    a = Agent(["--log-level", "info"], log_path=str(log))
    try:
        deadline = time.monotonic() + 20
        while True:
            v = parse_exposition(a.metrics())
            up = {dict(k[1])["collector"]: val for k, val in v.items() if k[0] == "teye_collector_up"}
            # the pmu collector's first read done: absent, up or failed (up 0 alone is also its state before
            # that read, which the sampler staggers over the first interval: x30 read it there, absent 0)
            read = (v.get(("teye_collector_absent", (("collector", "pmu"),))) == 1 or up.get("pmu") == 1
                    or (v.get(("teye_collector_failures_total", (("collector", "pmu"),))) or 0) > 0)
            if up.get("cpu") == 1 and read or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        a.stop()
    assert up["pmu"] == 0
    assert v[("teye_collector_absent", (("collector", "pmu"),))] == 1     # no PMU at all: absent, not failing
    for host in ("cpu", "memory", "disk", "network"):
        assert up[host] == 1, host
    assert not any(k[0].startswith(("teye_cpu_cycles", "teye_memory_read", "teye_pmu_")) for k in v)
    text = log.read_text()
    assert "collector pmu absent: no hardware PMU: /sys/bus/event_source/devices has no 'cpu' PMU" in text
    assert "Traceback" not in text


@pytest.mark.skipif(HAS_PMU, reason="this machine has a hardware PMU")
def test_profile_says_why_there_are_no_host_counters(tmp_path):
    p = subprocess.run([sys.executable, "-m", "agent", "profile", "--output", str(tmp_path), "--",
                        sys.executable, "-c", "pass"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr
    host = json.loads((tmp_path / "summary.json").read_text())["host"]
    assert host["counters"] is None and host["counters_note"].startswith("no hardware PMU: ")
    assert "host counters: not available (no hardware PMU: " in p.stdout
