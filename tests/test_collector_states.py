"""Collector states (issue 40): up, absent (the node has no such hardware), down, pending.

Absent only where the hardware is missing (HardwareAbsent), the collector never read anything and the
configuration did not turn it on explicitly; every other failure is down.  The exposition carries
``teye_collector_absent`` beside ``teye_collector_up``, the same bytes from both renderers; the defaults
agree across the embedded configuration, the shipped example, the installer and the DaemonSet."""
from __future__ import annotations

import os
import re

import pytest
import yaml

from agent import config as config_mod
from agent.daemon import collectors_line
from agent.errors import HardwareAbsent, ParseError, SourceUnavailable
from agent.sampler import Sampler
from agent.sources.infiniband import InfinibandSource
from agent.sources.nfsd import NfsdSource
from exporters.prometheus import make_registry
from exporters.render import Exposition
from tests.conftest import parse_exposition
from tests.procs import REPO


class Scripted:
    """A source whose reads raise or return what the test scripts, one item per read."""

    def __init__(self, name, script):
        self.name, self.script = name, list(script)

    def collect(self):
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item


class Empty:
    def points(self):
        return iter(())


def sampler(required=(), **scripts):
    return Sampler({n: (Scripted(n, s), 1.0) for n, s in scripts.items()}, required=required)


def test_absent_until_it_worked_then_down_and_failures_counted_only_for_down():
    s = sampler(gpu=[HardwareAbsent("no NVIDIA driver"), HardwareAbsent("no NVIDIA driver"), Empty(),
                     HardwareAbsent("driver unloaded")])
    st = s.read_once("gpu")
    assert (st.state, st.absent, st.up, st.failures, st.error) == ("absent", True, False, 0, "no NVIDIA driver")
    assert s.read_once("gpu").state == "absent" and s.snapshot.state("gpu").failures == 0
    assert s.read_once("gpu").state == "up"
    st = s.read_once("gpu")          # it worked once: the same error is now a failure that alerts
    assert (st.state, st.absent, st.failures) == ("down", False, 1)


def test_other_errors_are_down_never_absent():
    s = sampler(a=[SourceUnavailable("nvidia-ml-py not installed")], b=[ParseError("/proc/x", "truncated")],
                c=[FileNotFoundError(2, "No such file or directory", "/proc/net/dev")])
    assert [s.read_once(n).state for n in "abc"] == ["down", "down", "down"]
    assert [s.snapshot.state(n).failures for n in "abc"] == [1, 1, 1]


def test_explicitly_configured_collector_with_absent_hardware_is_down():
    s = sampler(required={"infiniband"}, infiniband=[HardwareAbsent("no InfiniBand devices")],
                pmu=[HardwareAbsent("no cpu PMU")])
    assert s.read_once("infiniband").state == "down" and s.read_once("pmu").state == "absent"


def test_a_source_that_cannot_even_be_built_keeps_its_kind(monkeypatch):
    """build_sources stands a DownSource in for a source whose construction failed: absent hardware stays
    absent, any other reason is down."""
    from agent import daemon, sources as sources_mod

    def fail(name, cfg, ctx):
        raise HardwareAbsent("no such device") if name == "infiniband" else SourceUnavailable("broken")

    monkeypatch.setattr(sources_mod, "build", fail)
    cfg = config_mod.defaults()
    for n, c in cfg["collectors"].items():
        c["enabled"] = n in ("infiniband", "nfs")
    s = Sampler(daemon.build_sources(cfg))
    assert (s.read_once("infiniband").state, s.read_once("nfs").state) == ("absent", "down")


def test_pending_before_the_first_read():
    assert sampler(a=[Empty()]).snapshot.state("a").state == "pending"


def test_the_real_sources_raise_hardware_absent_where_the_hardware_is_missing(tmp_path):
    (tmp_path / "sys" / "class" / "infiniband").mkdir(parents=True)
    with pytest.raises(HardwareAbsent):
        InfinibandSource(str(tmp_path / "sys" / "class" / "infiniband")).collect()
    (tmp_path / "proc" / "net" / "rpc").mkdir(parents=True)
    with pytest.raises(HardwareAbsent):
        NfsdSource(str(tmp_path / "proc")).collect()


def test_exposition_both_renderers_agree_and_name_the_absent():
    s = sampler(gpu=[HardwareAbsent("no driver")], cpu=[Empty()], nfs=[OSError(5, "I/O error")])
    for n in ("gpu", "cpu", "nfs"):
        s.read_once(n)
    reg = make_registry(lambda: s.snapshot, 10.0)
    from prometheus_client import generate_latest
    ref = generate_latest(reg).decode()
    v = parse_exposition(ref)
    assert {c: v[("teye_collector_absent", (("collector", c),))] for c in ("gpu", "cpu", "nfs")} == \
        {"gpu": 1.0, "cpu": 0.0, "nfs": 0.0}
    assert {c: v[("teye_collector_up", (("collector", c),))] for c in ("gpu", "cpu", "nfs")} == \
        {"gpu": 0.0, "cpu": 1.0, "nfs": 0.0}
    assert v[("teye_collector_failures_total", (("collector", "gpu"),))] == 0
    fast = Exposition(lambda: s.snapshot, 10.0).render()[0].decode()
    strip = lambda t: re.sub(r"(teye_collector_last_read_age_seconds\{[^}]*\}) \S+", r"\1", t)
    assert strip(fast) == strip(ref)


def test_start_up_line_counts_each_state():
    s = sampler(gpu=[HardwareAbsent("no driver")], pmu=[HardwareAbsent("no PMU")], cpu=[Empty()],
                nfs=[OSError(5, "I/O error")], jobs=[Empty()])
    for n in ("gpu", "pmu", "cpu", "nfs"):
        s.read_once(n)
    cfg = config_mod.defaults()
    line = collectors_line(cfg, s.snapshot)
    assert line == ("collectors running: cpu; absent (2, no such hardware here; not an alert): gpu (no driver); "
                    "pmu (no PMU); down (1): nfs ([Errno 5] I/O error); first read not finished: jobs; "
                    "disabled in the configuration: nfsd, systemd")


def test_explicit_collectors_from_the_file_and_the_flags(tmp_path):
    f = tmp_path / "t.yml"
    f.write_text("collectors:\n  gpu:\n    enabled: true\n  pmu:\n    enabled: false\n  infiniband: {}\n")
    got: set = set()
    cfg = config_mod.load(str(f), {"collectors": {"nfsd": {"enabled": True}}}, got)
    assert got == {"gpu", "nfsd"} and cfg["collectors"]["nfsd"]["enabled"] is True
    got = set()   # turned on in the file, off by a flag: not explicit (not running at all)
    config_mod.load(str(f), {"collectors": {"gpu": {"enabled": False}}}, got)
    assert got == set()


# -- defaults, one answer everywhere -----------------------------------------------------------------
def test_defaults_agree_across_embedded_example_installer_and_daemonset():
    embedded = {n: c["enabled"] for n, c in config_mod.defaults()["collectors"].items()}
    off = {"nfsd", "systemd"}   # systemd: off by default, as node_exporter's (issue 49)
    assert all(embedded[n] is False for n in off) and all(v for n, v in embedded.items() if n not in off)
    with open(os.path.join(REPO, "deploy", "teye.example.yml")) as fh:
        example = yaml.safe_load(fh)
    # the example sets no collector on explicitly (that would turn absent hardware into an alert) and
    # keeps nfsd off as the default does
    for name, c in (example.get("collectors") or {}).items():
        assert (c or {}).get("enabled") is not True, name
        if "enabled" in (c or {}):
            assert c["enabled"] == embedded[name], name
    with open(os.path.join(REPO, "deploy", "install.sh")) as fh:
        install = fh.read()
    assert "enabled: false" not in install and "gpu.enabled" not in install   # the installer changes no default
    with open(os.path.join(REPO, "deploy", "kubernetes", "daemonset.yaml")) as fh:
        docs = list(yaml.safe_load_all(fh))
    text = "\n".join(yaml.safe_dump(d) for d in docs if d)
    for name, on in embedded.items():   # any collector the DaemonSet's configuration names agrees
        for m in re.finditer(rf"\b{name}:\s*\n\s*enabled:\s*(\w+)", text):
            assert (m.group(1) == "true") == on, name
