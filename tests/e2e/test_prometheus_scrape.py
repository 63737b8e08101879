"""A real Prometheus (Debian package) scrapes `teye agent` and sees exactly what the agent serves."""
import pytest

from tests.conftest import PROCFS, SYSFS, parse_exposition
from tests.procs import Agent, Prometheus

pytestmark = pytest.mark.e2e

# Families read from the static fixture trees: their values cannot change between reads.
STATIC = r"teye_(cpu|memory|disk|infiniband|nfs|nfsd|pressure)_.*"


def test_prometheus_sees_the_same_series_and_values(tmp_path):
    agent = Agent(["--procfs", PROCFS, "--sysfs", SYSFS, "--collector.nfsd"])  # the fixture node serves NFS
    try:
        prom = Prometheus(str(tmp_path), [f"127.0.0.1:{agent.port}"])
        try:
            up = prom.wait_for('up{job="teye"} == 1')
            assert len(up) == 1
            prom.wait_for('teye_collector_up{collector="cpu"}')
            # an empty label value is no label to Prometheus (teye_disk_info's udev labels where udev has none)
            served = {(n, tuple(kv for kv in lbl if kv[1] != "")): v
                      for (n, lbl), v in parse_exposition(agent.metrics()).items()
                      if __import__("re").fullmatch(STATIC, n)}
            got = {}
            for r in prom.query('{__name__=~"%s"}' % STATIC):
                m = dict(r["metric"])
                name = m.pop("__name__")
                assert m.pop("job") == "teye" and m.pop("instance") == f"127.0.0.1:{agent.port}"
                got[(name, tuple(sorted(m.items())))] = float(r["value"][1])
            assert len(served) > 300  # every host source contributes (cpu, memory, disk, IB, NFS, nfsd, PSI)
            assert got == served
            # every collector reading the fixture trees is up, as Prometheus records it
            ups = {r["metric"]["collector"]: r["value"][1] for r in prom.query("teye_collector_up")}
            for c in ("cpu", "memory", "disk", "infiniband", "nfs", "nfsd", "pressure"):
                assert ups[c] == "1", (c, ups)
        finally:
            prom.stop()
    finally:
        assert agent.stop() == 0
