"""No alert fires on a fresh agent (issue 40), in well under a minute.

A fresh agent on this machine's live /proc and /sys with the built-in defaults (what ``./dev.sh agent`` runs),
a real Prometheus scraping it every second with every shipped rule file, each alert's ``for:`` divided by 60
(minutes become seconds: 15 min of the shipped rules in 15 s, and an alert that holds for a sixtieth of its
``for:`` fires; benchmarks/fresh_agent_alerts.py runs the shipped files unchanged for the full 15 minutes).
After ~30 s of scrapes and evaluations no alert may have fired, except one whose condition this machine
itself shows, checked here without teye: the kernel's clock not synchronised
(adjtimex(2) through libc: STA_UNSYNC set and maxerror at its 16 s ceiling), which node-mixin's
NodeClockNotSynchronising reports on such a machine too, and node-mixin's saturation alerts where the
machine is saturated during the run (load per CPU, CPU busy, memory, major faults, disk queue, conntrack:
``MachineWatch``).
"""
from __future__ import annotations

import ctypes
import os
import re
import threading
import time

import pytest

from tests.deploy.rulefiles import RULE_FILES
from tests.procs import Agent, Prometheus

pytestmark = pytest.mark.e2e

STA_UNSYNC = 0x0040


def clock_unsynchronised() -> bool:
    """adjtimex(2) read-only (modes 0) from libc: STA_UNSYNC and maxerror >= 16 s (node-mixin's condition)."""
    buf = ctypes.create_string_buffer(512)   # struct timex is 208 bytes on 64-bit Linux
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.adjtimex(buf) < 0:
        raise OSError(ctypes.get_errno(), "adjtimex")
    # struct timex: unsigned modes (padded to 8); long offset, freq, maxerror, esterror; int status
    maxerror_us = ctypes.c_long.from_buffer(buf, 24).value
    status = ctypes.c_int.from_buffer(buf, 40).value
    return bool(status & STA_UNSYNC) and maxerror_us >= 16_000_000


class MachineWatch:
    """What the kernel shows during the run, read here without teye (libc's getloadavg, /proc directly): sampled
    twice a second in a thread, and counters at the start and the end.  node-mixin's saturation alerts
    (issue 49) are true alarms on a loaded machine: this shared test machine often runs a load of 4 per CPU."""

    def __init__(self):
        self.samples = []      # (load1 per CPU, MemAvailable/MemTotal, conntrack entries/limit or 0)
        self._stop = threading.Event()
        self.start = self._counters()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _counters():
        with open("/proc/stat") as fh:
            cpu = [float(x) for x in fh.readline().split()[1:9]]   # user nice system idle iowait irq softirq steal
        with open("/proc/vmstat") as fh:
            majflt = next(float(line.split()[1]) for line in fh if line.startswith("pgmajfault "))
        weighted = {}
        with open("/proc/diskstats") as fh:
            for line in fh:
                f = line.split()
                weighted[f[2]] = float(f[13]) / 1000.0        # weighted ms doing I/O -> s
        return time.monotonic(), cpu, majflt, weighted

    def _sample(self):
        mem = {}
        with open("/proc/meminfo") as fh:
            for line in fh:
                k, v = line.split(":")
                mem[k] = float(v.split()[0])
        try:
            with open("/proc/sys/net/netfilter/nf_conntrack_count") as a, \
                    open("/proc/sys/net/netfilter/nf_conntrack_max") as b:
                conntrack = float(a.read()) / float(b.read())
        except OSError:       # nf_conntrack not loaded: teye exports no such series either
            conntrack = 0.0
        return os.getloadavg()[0] / os.cpu_count(), mem["MemAvailable"] / mem["MemTotal"], conntrack

    def _run(self):
        while not self._stop.wait(0.5):
            self.samples.append(self._sample())

    def stop(self):
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.samples.append(self._sample())
        self.end = self._counters()

    # each alert's condition, from these readings (thresholds node-mixin's, a 5 % margin for sampling apart)
    def saturated(self):
        return max(s[0] for s in self.samples) > 2 * 0.95

    def memory_full(self):
        return 1 - min(s[1] for s in self.samples) > 0.90 * 0.95

    def conntrack_full(self):
        return max(s[2] for s in self.samples) > 0.75 * 0.95

    def _span(self):
        return self.end[0] - self.start[0]

    def cpu_busy(self):
        d = [b - a for a, b in zip(self.start[1], self.end[1])]
        return (sum(d) - d[3] - d[4]) / sum(d) > 0.90 * 0.95

    def major_faults(self):
        return (self.end[2] - self.start[2]) / self._span() > 500 * 0.95

    def disk_queue(self):
        return any((self.end[3][d] - w) / self._span() > 10 * 0.95 for d, w in self.start[3].items()
                   if d in self.end[3])


# alert -> what this machine must show, independently of teye, for it to be a true alarm here
CONFIRMED_BY_THE_MACHINE = {"TeyeClockNotSynchronising": lambda watch: clock_unsynchronised(),
                            "TeyeSystemSaturation": MachineWatch.saturated,
                            "TeyeCPUHighUsage": MachineWatch.cpu_busy,
                            "TeyeMemoryHighUtilization": MachineWatch.memory_full,
                            "TeyeMemoryMajorPagesFaults": MachineWatch.major_faults,
                            "TeyeDiskIOSaturation": MachineWatch.disk_queue,
                            "TeyeHighNumberConntrackEntriesUsed": MachineWatch.conntrack_full}


def _sixtieth(m) -> str:
    seconds = int(m.group(2)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(3)]
    return f"{m.group(1)}{max(1, seconds // 60)}s"


def shortened_rules(tmp) -> list:
    """The shipped rule files with every alert's ``for:`` divided by 60 (text edit: comments and layout kept)."""
    out = []
    for path in RULE_FILES:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        new = re.sub(r"^(\s+for:\s*)(\d+)([smhd])\s*$", _sixtieth, text, flags=re.M)
        dst = os.path.join(str(tmp), os.path.basename(path))
        with open(dst, "w", encoding="utf-8") as fh:
            fh.write(new)
        out.append(dst)
    return out


def test_shortening_cuts_every_for(tmp_path):
    files = shortened_rules(tmp_path)
    text = "".join(open(f).read() for f in files)
    shipped = "".join(open(f).read() for f in RULE_FILES)
    assert len(re.findall(r"^\s+for:", shipped, flags=re.M)) >= 20
    fors = re.findall(r"^\s+for:\s*(\S+)", text, flags=re.M)
    assert len(fors) == len(re.findall(r"^\s+for:", shipped, flags=re.M))
    assert {"10s", "15s", "60s", "1s"} <= set(fors) and all(f.endswith("s") and int(f[:-1]) <= 60 for f in fors)


@pytest.mark.usefixtures("failing_collector")   # started now: test_the_check_is_not_blind's alert comes on meanwhile
def test_a_fresh_agent_under_the_shipped_rules_fires_no_alert(tmp_path):
    watch = MachineWatch()
    agent = Agent([], log_path=str(tmp_path / "agent.log"))
    prom = None
    try:
        prom = Prometheus(str(tmp_path), targets=[f"127.0.0.1:{agent.port}"], rule_files=shortened_rules(tmp_path))
        prom.wait_for('count_over_time(teye_build_info[1m]) >= 25', timeout=90)
        time.sleep(2.5)    # two more evaluations after the last of those scrapes
        groups = prom.api("rules")["groups"]
        alerts = [r for g in groups for r in g["rules"] if r["type"] == "alerting"]
        assert len(alerts) >= 30, len(alerts)
        assert [r["name"] for r in alerts if r.get("health") == "err"] == []
        # every firing ALERTS series over the whole run (a range query: one that came and went is seen too)
        end = time.time()
        seen = {s["metric"]["alertname"] for s in
                prom.api("query_range", query='ALERTS{alertstate="firing"}', start=end - 90, end=end,
                         step="1s")["result"]}
        watch.stop()
        unexplained = {a for a in seen if not CONFIRMED_BY_THE_MACHINE.get(a, lambda w: False)(watch)}
        assert unexplained == set(), (seen, watch.samples[-1], (tmp_path / "agent.log").read_text()[-2000:])
    finally:
        watch.stop()
        if prom:
            prom.stop()
        agent.stop()


@pytest.fixture(scope="module")
def failing_collector(tmp_path_factory):
    """An agent configured to require InfiniBand on a machine without it, and a Prometheus of its own with the
    same shortened rules; None where the machine has InfiniBand.  Started once for the module, before the
    fresh agent's test, so that its alert comes on during that test's 30 s instead of after them."""
    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        yield None
        return
    tmp = tmp_path_factory.mktemp("blind")
    cfg = tmp / "teye.yml"
    cfg.write_text("collectors:\n  infiniband:\n    enabled: true\n")
    agent = Agent(["--config", str(cfg)])
    prom = None
    try:
        prom = Prometheus(str(tmp), targets=[f"127.0.0.1:{agent.port}"], rule_files=shortened_rules(tmp))
        yield prom
    finally:
        if prom:
            prom.stop()
        agent.stop()


def test_the_check_is_not_blind(failing_collector):
    """The same harness sees an alert fire: an agent configured to require InfiniBand on a machine without it
    (TeyeCollectorFailing), or, where the machine has InfiniBand, nothing to show (skipped)."""
    if failing_collector is None:
        pytest.skip("this machine has InfiniBand")
    res = failing_collector.wait_for(
        'ALERTS{alertname="TeyeCollectorFailing",collector="infiniband",alertstate="firing"}', timeout=60)
    assert res
