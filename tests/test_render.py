"""The prepared /metrics body is byte for byte prometheus_client's output for the same snapshot."""
from __future__ import annotations

import gzip
import os
import urllib.request
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest
from prometheus_client.registry import CollectorRegistry

from agent import config as config_mod
from agent.context import AgentContext
from agent.daemon import build_sources
from agent.metrics import COUNTER, GAUGE, HISTOGRAM, Point, histogram_value, metric, point
from agent.phases.jobs import JobTable
from agent.phases.protocol import encode
from agent.phases.source import PhasesReading
from agent.sampler import Sampler, Snapshot, SourceState
from agent.sources.network import NetworkSource
from exporters.http import MetricsServer, registry_renderer
from exporters.prometheus import SnapshotCollector, make_registry
from exporters.render import Exposition
from tests.conftest import DATA, PROCFS, SYSFS
from tests.gpu.conftest import TRACE_8GPU
from tests.phases.helpers import MS, S, phases_cfg

R_GAUGE = metric("teye_test_render_value_celsius", GAUGE, 'Gauge with "quotes", a \\ backslash.', ["gpu", "device"])
R_COUNT = metric("teye_test_render_events_total", COUNTER, "Counter.", ["zone", "alpha"])
R_PLAIN = metric("teye_test_render_plain_ratio", GAUGE, "No labels.")
R_HIST = metric("teye_test_render_wait_seconds", HISTOGRAM, "Histogram.", ["gpu"], buckets=[0.001, 0.5, 2])

NOW = 50 * S
NET_PROCFS = os.path.join(DATA, "net_dev", "proc")
OM = "application/openmetrics-text; version=1.0.0; charset=utf-8"
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


@dataclass(frozen=True)
class Reading:
    values: tuple

    def points(self):
        self.calls.append(1)
        yield from self.values

    @property
    def calls(self):  # how often points() ran (the renderer must not repeat it for one reading)
        return self.__dict__.setdefault("_calls", [])


class Broken:
    def points(self):
        raise KeyError("bug in formatting")


def both(get, clock=lambda: NOW, stale=10.0, extra=None):
    """(prepared renderer, prometheus_client registry) over the same snapshot getter and clock."""
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(get, stale, clock=clock, extra=extra))
    return Exposition(get, stale, clock=clock, fallback=reg, extra=extra), reg


def assert_same(expo, reg):
    """Text, OpenMetrics and gzip bodies equal prometheus_client's encoders."""
    text, ctype, extra = expo.render("", "")
    assert ctype == "text/plain; version=0.0.4; charset=utf-8" and extra == []
    assert text == generate_latest(reg)
    om, ctype, _ = expo.render(PROMETHEUS_ACCEPT, "")
    assert ctype.startswith("application/openmetrics-text; version=1.0.0")
    assert om == om_generate_latest(reg)
    gz, _, extra = expo.render(PROMETHEUS_ACCEPT, "gzip, deflate")
    assert extra == [("Content-Encoding", "gzip")] and gzip.decompress(gz) == om
    gz, _, _ = expo.render("", "gzip")
    assert gzip.decompress(gz) == text
    return text.decode()


def node_sampler(extra_sources=()):
    """Every collector on the node_exporter fixture trees and the 8-GPU replay, read once."""
    cfg = config_mod.load(None, {"procfs": PROCFS, "sysfs": SYSFS, "gpu": {"replay": TRACE_8GPU}})
    cfg["collectors"]["phases"]["enabled"] = False
    srcs = build_sources(cfg, AgentContext())
    srcs["network"] = (NetworkSource(NET_PROCFS), 1.0)  # the node_exporter tree has no net/dev
    srcs.update(extra_sources)
    sampler = Sampler(srcs)
    for name in sampler.names:
        sampler.read_once(name)
    return sampler


class Fixed:
    """A source handing out a fixed reading."""

    def __init__(self, name, reading):
        self.name = name
        self.reading = reading

    def collect(self):
        return self.reading


def jobs_reading(n_jobs: int, now: int = 1000 * S) -> PhasesReading:
    """The phases collector's reading with n_jobs jobs that each reported 5 steps."""
    from tests.phases.helpers import ctx_with_clock
    ctx, _ = ctx_with_clock(now)
    table = JobTable(phases_cfg(max_jobs=max(64, n_jobs), max_jobs_per_user=max(64, n_jobs)), ctx, own_uid=0)
    for j in range(n_jobs):
        t = now - 2 * S
        for _ in range(5):
            a, b = t + 30 * MS, t + 100 * MS
            table.handle(encode(f"job-{j}", [("data_wait", t, a), ("compute", a, b)], [(t, b, 64)]), 4000 + j, 0)
            t = b
    return PhasesReading(*table.views(now))


def test_fixture_node_8gpu_replay_and_jobs_render_identically():
    sampler = node_sampler({"phases": (Fixed("phases", jobs_reading(3)), 1.0)})
    sampler.read_once("phases")
    expo, reg = both(lambda: sampler.snapshot, clock=lambda: sampler.snapshot.taken_ns + 7 * S // 10)
    text = assert_same(expo, reg)
    assert 'teye_gpu_idle_gap_seconds_bucket{gpu="7",le="+Inf"}' in text
    assert 'teye_job_steps_total{train_job="job-2"} 5.0' in text
    sampler.read_once("gpu")  # a new reading of one source: re-rendered, the others reused
    assert_same(expo, reg)


def test_the_web_servers_counters_render_identically_and_follow_every_scrape():
    """The extra (per-scrape) points: byte for byte prometheus_client's output, in all four bodies, new values
    on every scrape while the snapshot's part is reused."""
    from exporters.webstats import WebStats
    sampler = node_sampler()
    stats = WebStats()
    stats.attach({"c1": None, "c2": None}, 512, None)
    expo, reg = both(lambda: sampler.snapshot, clock=lambda: sampler.snapshot.taken_ns, extra=stats.state)
    text = assert_same(expo, reg)
    assert text.index("# TYPE teye_collector_last_read_age") < text.index("# TYPE teye_web_requests_total") < \
        text.index("# TYPE teye_collector_failures_total")
    assert 'teye_web_connections 2.0' in text and 'teye_web_connections_max 512.0' in text
    for code in (200, 200, 401, 404):
        stats.request("/metrics" if code != 404 else "/x/../secret", code)
    stats.timeout("idle")
    stats.in_flight = 1
    text = assert_same(expo, reg)
    assert 'teye_web_requests_total{code="200",path="/metrics"} 2.0' in text
    assert 'teye_web_requests_total{code="404",path="other"} 1.0' in text and "secret" not in text
    assert 'teye_web_timeouts_total{kind="idle"} 1.0' in text and "teye_web_requests_in_flight 1.0" in text
    stats.timeout("write")       # only a family near the end changes: still the same bytes
    assert 'teye_web_timeouts_total{kind="write"} 1.0' in assert_same(expo, reg)
    stats.evicted = 3
    assert_same(expo, reg)
    never = Snapshot(1, MappingProxyType({"never": SourceState("never")}))   # no age family: the extras end it
    expo, reg = both(lambda: never, extra=stats.state)
    text = assert_same(expo, reg)
    assert text.index("# TYPE teye_collector_failures_total") < text.index("# TYPE teye_web_requests_total")
    assert text.endswith('teye_web_timeouts_total{kind="write"} 1.0\n')


def test_histograms_escaping_absent_values_duplicates_and_failures():
    hist = histogram_value([0.001, 0.5, 2], [3, 0, 1, 2], 12.5)
    good = Reading((point(R_GAUGE, 61.5, 'a"b', "c\\d\ne"), point(R_GAUGE, 1e22, "0", "ünïcode"),
                    point(R_GAUGE, float("nan"), "1", "x"), point(R_GAUGE, None, "2", "x"),
                    point(R_COUNT, 4096, "z", "a"), point(R_COUNT, 7, "z", "a"), point(R_PLAIN, 0.25),
                    point(R_HIST, hist, "0"), point(R_HIST, histogram_value([0.001, 0.5, 2], [0, 0, 0, 0], 0), "1"),
                    Point(R_GAUGE, ("3", "y"), -0.0)))
    never = SourceState("never")  # never read: no age line, so the age family comes after failures
    snap = Snapshot(1, MappingProxyType({
        "never": never,
        "good": SourceState("good", up=True, reading=good, duration_s=0.00123, updated_ns=NOW - 3 * S, reads=4),
        "down": SourceState("down", error="x: file is empty", updated_ns=NOW - S, failures=3),
        "broken": SourceState("broken", up=True, reading=Broken(), updated_ns=NOW - 2 * S),
        "empty": SourceState("empty", up=True, reading=None, updated_ns=NOW - S)}))
    current = [snap]
    expo, reg = both(lambda: current[0])
    text = assert_same(expo, reg)
    assert 'teye_test_render_value_celsius{device="c\\\\d\\ne",gpu="a\\"b"} 61.5' in text
    assert 'teye_test_render_value_celsius{device="ünïcode",gpu="0"} 1e+22' in text
    assert 'teye_test_render_wait_seconds_bucket{gpu="0",le="0.5"} 3.0' in text
    assert 'teye_collector_up{collector="broken"} 0.0' in text
    assert text.index("# TYPE teye_collector_failures_total") < text.index("# TYPE teye_collector_last_read_age")
    formatted = len(good.calls)
    states = dict(snap.sources)
    states["down"] = SourceState("down", error="x: file is empty", updated_ns=NOW, failures=4)
    current[0] = Snapshot(2, MappingProxyType(states))  # another source changed; "good" did not
    assert expo.render("", "")[0] == generate_latest(reg)
    assert len(good.calls) == formatted + 1  # prometheus_client read it once more; the renderer did not


def test_scrape_time_values_follow_the_clock_and_staleness():
    r = Reading((point(R_PLAIN, 0.5),))
    snap = Snapshot(1, MappingProxyType({"nfs": SourceState("nfs", up=True, reading=r, updated_ns=S,
                                                            in_flight_since_ns=2 * S)}))
    now = [5 * S]
    expo, reg = both(lambda: snap, clock=lambda: now[0], stale=10)
    fresh = assert_same(expo, reg)
    assert 'teye_collector_last_read_age_seconds{collector="nfs"} 4.0' in fresh
    now[0] = 13 * S  # the read started at 2 s is stuck past stale_after: down, its series gone
    stuck = assert_same(expo, reg)
    assert 'teye_collector_up{collector="nfs"} 0.0' in stuck and "teye_test_render_plain_ratio" not in stuck
    assert 'teye_collector_last_read_age_seconds{collector="nfs"} 12.0' in stuck


def test_fallbacks_match_prometheus_client():
    dup = Reading((Point(R_PLAIN, (), 1.0),))
    snap = Snapshot(1, MappingProxyType({"a": SourceState("a", up=True, reading=dup, updated_ns=S),
                                         "b": SourceState("b", up=True, reading=dup, updated_ns=S)}))
    expo, reg = both(lambda: snap)
    assert_same(expo, reg)  # the same series from two collectors: only the first, as before
    for accept in ("text/plain;version=1.0.0;escaping=dots", OM + "; escaping=values",
                   "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8"):
        body, ctype, _ = expo.render(accept, "")
        from prometheus_client.exposition import choose_encoder
        encoder, want_ctype = choose_encoder(accept)
        assert (body, ctype) == (encoder(reg), want_ctype)


def test_http_server_serves_the_prepared_body():
    sampler = node_sampler()
    reg = make_registry(lambda: sampler.snapshot)
    srv = MetricsServer("127.0.0.1", 0, registry_renderer(reg))
    srv.start()
    try:
        host, port = srv.address
        req = urllib.request.Request(f"http://{host}:{port}/metrics",
                                     headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.headers["Content-Encoding"] == "gzip"
            body = gzip.decompress(resp.read()).decode()
    finally:
        srv.stop()
    assert body.endswith("# EOF\n")
    # the age lines differ by the time between the two encodings; everything else is identical
    strip = lambda s: [ln for ln in s.splitlines() if not ln.startswith("teye_collector_last_read_age")]  # noqa
    assert strip(body) == strip(om_generate_latest(reg).decode())


def test_a_source_whose_value_cannot_be_formatted_is_down_not_a_failed_scrape():
    bad = Point(R_PLAIN, (), "not a number")  # prometheus_client's path failed the whole scrape here
    snap = Snapshot(1, MappingProxyType({"s": SourceState("s", up=True, reading=Reading((bad,)), updated_ns=S)}))
    expo, _ = both(lambda: snap)
    text = expo.render("", "")[0].decode()
    assert 'teye_collector_up{collector="s"} 0.0' in text and "teye_test_render_plain_ratio" not in text


ACCEPTS = ("", "*/*", "text/html", PROMETHEUS_ACCEPT, "text/plain", "text/plain;version=0.0.4",
           "text/plain; version=1.0.0", "text/plain;version=1.0.0;escaping=allow-utf-8",
           "text/plain;version=1.0.0;escaping=bogus", "text/plain;version=2.0.0;escaping=values",
           "text/plain;version=0.9;escaping=dots, application/openmetrics-text", "application/openmetrics-text",
           "application/openmetrics-text;version=0.0.1", "application/openmetrics-text;version=0.0.1,text/plain",
           "application/openmetrics-text;version=0.0.1,text/plain;version=1.0.0",
           "application/openmetrics-text; version=1.0.0; escaping=underscores; version=2.0.0",
           "application/openmetrics-text;version=1.1.0;escaping=allow-utf-8", " application/openmetrics-text ;q=0.5",
           "application/openmetrics-text;escaping=dots", "text/plain;version=;escaping=dots",
           "application/openmetrics-text;version=", "text/plain;version=10")


def test_negotiation_is_prometheus_clients():
    """teye picks format, Content-Type and escaping itself (so the agent never imports prometheus_client
    for a scrape); the oracle is prometheus_client's own choose_encoder."""
    from prometheus_client.exposition import choose_encoder
    from exporters.render import negotiate
    for accept in ACCEPTS:
        encoder, ctype = choose_encoder(accept)
        fmt, got, escaping = negotiate(accept)
        assert got == ctype, accept
        assert fmt == ("om" if ctype.startswith("application/openmetrics-text") else "text"), accept
        assert escaping == (ctype.split("escaping=")[1] if "escaping=" in ctype else "underscores"), accept


def test_a_version_that_is_not_all_numbers_goes_to_prometheus_client():
    from prometheus_client.exposition import choose_encoder
    from exporters.render import negotiate
    snap = node_sampler().snapshot
    expo, reg = both(lambda: snap)
    accept = "application/openmetrics-text;version=2.x"
    assert negotiate(accept) is None
    encoder, ctype = choose_encoder(accept)
    body, got, _ = expo.render(accept, "")
    strip = lambda s: [ln for ln in s.splitlines() if not ln.startswith(b"teye_collector_last_read_age")]  # noqa
    assert got == ctype and strip(body) == strip(encoder(reg))


def test_values_are_written_as_prometheus_client_writes_them():
    from prometheus_client.utils import floatToGoString
    from exporters.render import go_float
    values = [0.5, -0.5, 1.0, 123456.0, 1234567.0, 12345678.0, 10000000.0, 123456789.125, 1e16, 1e17, 1.5e300,
              -12345678.0, 1e-7, 3.14159e-300, float("inf"), float("-inf"), float("nan"), 2.0 ** 53, 99999999.99]
    for v in values:
        assert go_float(v) == floatToGoString(v), v


def test_a_fallback_factory_is_called_only_when_a_scrape_needs_prometheus_clients_encoder():
    """The agent's Exposition has a function that makes prometheus_client's registry: the prepared body
    never calls it; a name escaping that rewrites names calls it once, and its body is prometheus_client's."""
    snap = node_sampler().snapshot
    made = []

    def registry():
        made.append(make_registry(lambda: snap))
        return made[-1]
    expo = Exposition(lambda: snap, fallback=registry)
    plain, _, _ = expo.render("", "")
    assert made == [] and b"teye_collector_up" in plain
    from prometheus_client.exposition import choose_encoder
    for _ in range(2):
        body, ctype, _ = expo.render("text/plain;version=1.0.0;escaping=dots", "")
        assert len(made) == 1
        encoder, want = choose_encoder("text/plain;version=1.0.0;escaping=dots")
        strip = lambda s: [ln for ln in s.splitlines() if b"last_read_age" not in ln.replace(b"__", b"_")]  # noqa
        assert ctype == want and strip(body) == strip(encoder(made[0]))


def test_a_new_reading_equal_to_the_last_reuses_its_lines_and_a_changed_value_is_written_at_the_next_scrape():
    """Issue 49: a source read again with nothing changed (an idle node's link state, timex, the phases table)
    is not formatted again; a reading whose values changed is, at the very next scrape."""
    def snap(reading, t):
        return Snapshot(t, MappingProxyType({"s": SourceState("s", up=True, reading=reading, updated_ns=t)}))
    first = Reading((point(R_PLAIN, 0.25), point(R_COUNT, 7, "z", "a")))
    current = [snap(first, S)]
    expo, reg = both(lambda: current[0])
    assert 'teye_test_render_plain_ratio 0.25' in assert_same(expo, reg)
    again = Reading((point(R_PLAIN, 0.25), point(R_COUNT, 7, "z", "a")))   # a new object, equal values
    current[0] = snap(again, 2 * S)
    assert expo.render("", "")[0] == generate_latest(reg)
    assert again.calls == [1]            # prometheus_client's encoder read it; teye's renderer did not
    changed = Reading((point(R_PLAIN, 0.5), point(R_COUNT, 7, "z", "a")))
    current[0] = snap(changed, 3 * S)
    text = assert_same(expo, reg)
    assert 'teye_test_render_plain_ratio 0.5' in text and 'teye_test_render_plain_ratio 0.25' not in text
    back = Reading((point(R_PLAIN, 0.25), point(R_COUNT, 8, "z", "a")))      # and back, with the counter moved
    current[0] = snap(back, 4 * S)
    text = assert_same(expo, reg)
    assert 'teye_test_render_plain_ratio 0.25' in text and 'teye_test_render_events_total{alpha="a",zone="z"} 8.0' in text


def test_each_format_is_joined_when_first_asked_for_and_kept():
    """The body of one set of states is joined per format on the first scrape asking for it (Prometheus asks for
    one): OpenMetrics first, then the text format, then each again, all as prometheus_client writes them."""
    sampler = node_sampler()
    expo, reg = both(lambda: sampler.snapshot, clock=lambda: sampler.snapshot.taken_ns + S)
    for _ in range(2):
        assert expo.render(PROMETHEUS_ACCEPT, "")[0] == om_generate_latest(reg)
        assert expo.render("", "")[0] == generate_latest(reg)
    assert gzip.decompress(expo.render("", "gzip")[0]) == generate_latest(reg)
    assert gzip.decompress(expo.render(PROMETHEUS_ACCEPT, "gzip")[0]) == om_generate_latest(reg)
