"""systemd units (issue 49): systemctl's own output as the fake at the command's one door, and this machine's
real systemctl (systemd is not PID 1 in the test container: the collector is absent, said, not down)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent.errors import HardwareAbsent, ParseError, SourceUnavailable
from agent.sampler import Sampler
from agent.sources import systemd
from agent.sources.systemd import STATES, SystemdSource
from tests.conftest import reading_series

SHOW = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "systemd", "show.txt")


def _fake():
    with open(SHOW) as fh:
        text = fh.read()
    return lambda: text


def test_units_by_state_and_type_with_node_exporters_default_exclusions():
    series = reading_series(SystemdSource(run=_fake()).collect())
    current = {dict(lbl)["name"]: (dict(lbl)["state"], dict(lbl)["type"]) for (n, lbl), v in series.items() if v == 1}
    assert current == {"nvidia-persistenced.service": ("active", "notify"), "teye.service": ("failed", "simple"),
                       "nvidia-fabricmanager-start.service": ("activating", "oneshot"),
                       "sshd.socket": ("active", ""), "apt-daily.timer": ("inactive", ""),
                       "slurmd.service": ("deactivating", "forking")}   # device, mount, slice, scope, automount out
    assert len(series) == 6 * len(STATES)   # one series per state, 0 for the others
    assert series[("teye_systemd_unit_state", (("name", "teye.service"), ("state", "active"), ("type", "simple")))] == 0


def test_include_and_exclude_are_whole_name_matches():
    r = SystemdSource(include=r"nvidia.*", exclude=r".+\.socket", run=_fake()).collect()
    assert [u[0] for u in r.units] == ["nvidia-fabricmanager-start.service", "nvidia-persistenced.service"]
    r = SystemdSource(include=r"nvidia", run=_fake()).collect()   # not a search: no unit is named just "nvidia"
    assert r.units == ()


@pytest.mark.parametrize("text", ["Id=x.service\nActiveState=sleeping\n", "Id=x.service\nActiveState\n",
                                  "Id=\nActiveState=active\n", "Id=a b.service\nActiveState=active\n"])
def test_garbled_output_is_a_parse_error_naming_the_unit(text):
    with pytest.raises(ParseError, match="unit 1"):
        SystemdSource(run=lambda: text).collect()


def test_a_hung_systemctl_is_killed_and_the_collector_down(monkeypatch):
    monkeypatch.setattr(systemd, "TIMEOUT_S", 0.5)
    cmd = (sys.executable, "-c", "import time; time.sleep(30)")
    s = Sampler({"systemd": (SystemdSource(run=lambda: systemd.run_systemctl(cmd)), 15.0)})
    st = s.read_once("systemd")
    assert not st.up and "killed" in st.error and st.duration_s < 5


def test_this_machines_systemctl():
    """The real command.  Where systemd is PID 1 its units equal `systemctl list-units --all` (another command, its
    own table); here (a container whose PID 1 is not systemd) the collector is absent, not a failure."""
    with open("/proc/1/comm") as fh:
        pid1 = fh.read().strip()
    if pid1 != "systemd":
        with pytest.raises(HardwareAbsent, match="not running|not a systemd host"):
            SystemdSource().collect()
        s = Sampler({"systemd": (SystemdSource(), 15.0)})
        st = s.read_once("systemd")
        assert st.absent and not st.up and st.failures == 0
        return
    r = SystemdSource(exclude=None).collect()
    table = subprocess.run(["systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager", "--full"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    listed = {w[0]: w[2] for w in (ln.split() for ln in table) if len(w) >= 4}
    mine = {name: state for name, state, _ in r.units}
    common = set(listed) & set(mine)
    assert len(common) >= 0.9 * len(listed), (len(common), len(listed))   # units load and unload between the two
    assert sum(listed[u] == mine[u] for u in common) >= 0.95 * len(common)


def test_a_failing_systemctl_is_down_with_its_message():
    cmd = (sys.executable, "-c", "import sys; sys.stderr.write('Access denied'); sys.exit(1)")
    with pytest.raises(SourceUnavailable, match="exited 1: Access denied"):
        systemd.run_systemctl(cmd)
