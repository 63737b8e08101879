"""The Prometheus side: formatting a Snapshot, failures isolated per source, exposition validity."""
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from types import MappingProxyType

import pytest
from prometheus_client import generate_latest

from agent.errors import ParseError
from agent.metrics import COUNTER, GAUGE, HISTOGRAM, histogram_value, metric, point
from agent.sampler import Sampler, Snapshot, SourceState
from exporters.prometheus import SnapshotCollector, families, make_registry
from tests.conftest import parse_exposition

T_BYTES = metric("teye_test_read_bytes_total", COUNTER, "Test counter.", ["device"])
T_TEMP = metric("teye_test_temperature_celsius", GAUGE, "Test gauge.", ["gpu"])
T_GAP = metric("teye_test_gap_seconds", HISTOGRAM, "Test histogram.", ["gpu"], buckets=[0.1, 1])


@dataclass(frozen=True)
class Reading:
    values: tuple

    def points(self):
        yield from self.values


class Broken:
    def points(self):
        raise KeyError("bug in formatting")


def snap(**states):
    return Snapshot(1, MappingProxyType({n: SourceState(n, **kw) for n, kw in states.items()}))


def scrape(snapshot, clock=lambda: 10**9, stale=10.0):
    from prometheus_client.registry import CollectorRegistry
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(lambda: snapshot, stale, clock=clock))
    return generate_latest(reg).decode(), parse_exposition(generate_latest(reg).decode())


def test_values_labels_and_help_are_exported():
    r = Reading((point(T_BYTES, 4096, "sda"), point(T_TEMP, 61.5, "0"),
                 point(T_GAP, histogram_value([0.1, 1], [2, 1, 1], 7.25), "0")))
    text, v = scrape(snap(fake={"up": True, "reading": r, "duration_s": 0.002, "updated_ns": 5 * 10**8}))
    assert v[("teye_test_read_bytes_total", (("device", "sda"),))] == 4096
    assert v[("teye_test_temperature_celsius", (("gpu", "0"),))] == 61.5
    assert v[("teye_test_gap_seconds_bucket", (("gpu", "0"), ("le", "0.1")))] == 2
    assert v[("teye_test_gap_seconds_bucket", (("gpu", "0"), ("le", "1.0")))] == 3
    assert v[("teye_test_gap_seconds_bucket", (("gpu", "0"), ("le", "+Inf")))] == 4
    assert v[("teye_test_gap_seconds_count", (("gpu", "0"),))] == 4
    assert v[("teye_test_gap_seconds_sum", (("gpu", "0"),))] == 7.25
    assert v[("teye_collector_up", (("collector", "fake"),))] == 1
    assert v[("teye_collector_duration_seconds", (("collector", "fake"),))] == 0.002
    assert v[("teye_collector_last_read_age_seconds", (("collector", "fake"),))] == 0.5
    assert "# HELP teye_test_read_bytes_total Test counter." in text
    assert "# TYPE teye_test_read_bytes_total counter" in text


def test_failed_and_broken_sources_do_not_fail_the_scrape():
    good = Reading((point(T_TEMP, 40, "1"),))
    _, v = scrape(snap(good={"up": True, "reading": good},
                       down={"up": False, "error": "x: file is empty", "failures": 3},
                       broken={"up": True, "reading": Broken()}))
    assert v[("teye_collector_up", (("collector", "good"),))] == 1
    assert v[("teye_collector_up", (("collector", "down"),))] == 0
    assert v[("teye_collector_up", (("collector", "broken"),))] == 0
    assert v[("teye_collector_failures_total", (("collector", "down"),))] == 3
    assert v[("teye_test_temperature_celsius", (("gpu", "1"),))] == 40


def test_a_read_stuck_longer_than_stale_after_is_down():
    r = Reading((point(T_TEMP, 40, "1"),))
    s = snap(nfs={"up": True, "reading": r, "in_flight_since_ns": 0})
    _, fresh = scrape(s, clock=lambda: 5 * 10**9, stale=10)
    _, stuck = scrape(s, clock=lambda: 11 * 10**9, stale=10)
    assert fresh[("teye_collector_up", (("collector", "nfs"),))] == 1
    assert stuck[("teye_collector_up", (("collector", "nfs"),))] == 0
    assert ("teye_test_temperature_celsius", (("gpu", "1"),)) not in stuck


def test_unsupported_values_are_absent_not_nan_and_duplicates_dropped():
    fams = families([point(T_TEMP, None, "0"), point(T_TEMP, float("nan"), "1"), point(T_TEMP, 3, "2"),
                     point(T_TEMP, 4, "2")])
    (fam,) = fams
    assert [(s.labels, s.value) for s in fam.samples] == [({"gpu": "2"}, 3.0)]


class Hangs:
    name = "hangs"

    def __init__(self):
        self.release = threading.Event()

    def collect(self):
        self.release.wait(5)
        time.sleep(0.3)   # (released, it still takes a while: stop() waits for it, and its failure is published)
        raise OSError(5, "Input/output error", "/proc/self/mountstats")


class Counts:
    name = "counts"

    def __init__(self):
        self.n = 0

    def collect(self):
        self.n += 1
        return Reading((point(T_TEMP, self.n, "0"),))


@pytest.mark.measures("a timed assertion: a scrape's time beside a hung source")
def test_hung_source_never_hangs_a_scrape_and_others_keep_sampling():
    hang, counts = Hangs(), Counts()
    sampler = Sampler({"hangs": (hang, 0.05), "counts": (counts, 0.05)})
    reg = make_registry(lambda: sampler.snapshot, stale_after_s=0.2)
    sampler.start()
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        v = parse_exposition(generate_latest(reg).decode())
        assert time.monotonic() - t0 < 1.0  # a scrape is formatting only (generous bound, not a benchmark)
        assert v[("teye_collector_up", (("collector", "hangs"),))] == 0
        assert v[("teye_collector_up", (("collector", "counts"),))] == 1
        assert counts.n >= 5
    finally:
        hang.release.set()
        sampler.stop()
    st = sampler.snapshot.state("hangs")
    assert not st.up and "/proc/self/mountstats" in st.error


def test_sampler_translates_errors_and_recovers():
    class Flaky:
        name = "flaky"
        calls = 0

        def collect(self):
            self.calls += 1
            if self.calls == 1:
                raise ParseError("/proc/stat", "line 2: cpu0 has 3 columns, expected >= 7")
            if self.calls == 2:
                raise ZeroDivisionError("bug")
            return Reading((point(T_TEMP, 1, "0"),))

    s = Sampler({"flaky": (Flaky(), 1.0)})
    st = s.read_once("flaky")
    assert not st.up and st.error.startswith("/proc/stat: line 2") and st.failures == 1
    st = s.read_once("flaky")
    assert not st.up and "internal error: ZeroDivisionError" in st.error and st.failures == 2
    st = s.read_once("flaky")
    assert st.up and st.error is None and st.reads == 3


def test_promtool_accepts_the_exposition():
    assert shutil.which("promtool"), "promtool missing: install Debian's prometheus package (.ci/run does)"
    r = Reading((point(T_BYTES, 4096, "sda"), point(T_GAP, histogram_value([0.1, 1], [2, 1, 1], 7.25), "0")))
    text, _ = scrape(snap(fake={"up": True, "reading": r}, down={"up": False}))
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "" and p.stderr.strip() == "", p.stdout + p.stderr


def test_steady_failures_log_once_and_recovery_is_logged(caplog):
    import logging

    class Absent:
        name = "ib"
        present = False

        def collect(self):
            from agent.errors import SourceUnavailable
            if not self.present:
                raise SourceUnavailable("no InfiniBand devices under /sys/class/infiniband")
            return Reading(())

    src = Absent()
    s = Sampler({"ib": (src, 1.0)})
    with caplog.at_level(logging.INFO, logger="teye.sampler"):
        for _ in range(5):
            s.read_once("ib")
        src.present = True
        s.read_once("ib")
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["collector ib unavailable: no InfiniBand devices under /sys/class/infiniband",
                    "collector ib is up again"]


def test_a_hidden_collector_is_sampled_but_its_families_are_not_exported_by_either_renderer():
    """The node_exporter mode (host.node_exporter): network and netclass feed the communication cause, node_exporter
    exports the host.  Both the prepared /metrics renderer and prometheus_client's encoder leave the hidden
    collector's families out and keep its teye_collector_* series and every other collector's families."""
    s = snap(net={"up": True, "reading": Reading((point(T_BYTES, 1, "eth0"),)), "updated_ns": 5 * 10**8},
             gpu={"up": True, "reading": Reading((point(T_TEMP, 40.0, "0"),)), "updated_ns": 5 * 10**8})
    for hidden, want in ((frozenset(), True), (frozenset({"net"}), False)):
        reg = make_registry(lambda: s, hidden=hidden)
        body, _, _ = reg.teye_exposition.render("text/plain", "")
        for text in (body.decode(), generate_latest(reg).decode()):
            v = parse_exposition(text)
            assert (("teye_test_read_bytes_total", (("device", "eth0"),)) in v) is want, text
            assert v[("teye_test_temperature_celsius", (("gpu", "0"),))] == 40.0
            assert v[("teye_collector_up", (("collector", "net"),))] == 1
