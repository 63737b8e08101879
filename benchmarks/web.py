"""/metrics under attack and under TLS, `teye agent` side by side with Debian's prometheus-node-exporter.

    python benchmarks/web.py [--scrapes 100] [--slow 2000] [--scrapers 50] [--nofile 8192] [--baseline DIR]
    python benchmarks/web.py --auth-flood 16,64,256 [--flood-scrapes 20]     # the password-flood rows only

Both exporters run on this host under the same fd limit (prlimit, default the systemd unit's
LimitNOFILE) and, for the TLS rows, the same exporter-toolkit web config file (a throwaway CA
and certificate, basic auth with a cost-10 bcrypt hash).  Scenarios, each run against both
exporters, scrapes alternating between them so that machine noise hits both alike:

- plain:      sequential scrapes, one new connection each (Connection: close)
- slow-N:     the same while N connections each hold half a request (re-opened as soon as the
              server closes one, as a determined attacker would)
- parallel-N: N threads scraping at once
- tls+auth:   sequential scrapes over https with basic auth, one new connection (handshake) each
- restart:    kill -9, start again, seconds until /healthz (teye) or / (node_exporter) answers
- slow-N at a lower fd limit (--evict-nofile, default 1024, the systemd default): more slow
              connections than descriptors; teye closes the longest-waiting ones to make room

Per row: scrape latency p50/p99 (ms), failed scrapes, peak threads and peak RSS of the exporter
(/proc/<pid>/status, sampled after every scrape), and the teye/node_exporter ratio of p50.

``--auth-flood 16,64,256`` (issue 36) runs only the password-flood rows: both exporters with the same
TLS + basic auth (bcrypt cost 10) web config; scrape p50/p99 quiet, then while N keep-alive TLS clients
(in child processes, at most 64 threads each, so they share no interpreter lock with the scraper) send a
new wrong password per request as fast as they are answered, one exporter at a time.  A scrape is failed
when it takes over 10 s (Prometheus' default scrape timeout) or is not 200.  Each flood row also says
what the attackers got back (codes, answers per second).

``--conn-cost N`` (issue 48) runs only the memory rows: N connections held at once against each exporter, plain
and idle, TLS cut in the middle of its ClientHello, TLS idle after a completed handshake; the resident set's
growth per connection (KiB) and where it stands 7 s after they left (MiB above its start); then the TLS idle
round again, and where it stands after the second round.

``--render N`` first times the /metrics body in-process, N times each way, alternating: teye's registry on
the node_exporter fixture trees and the 8-GPU replay, rendered with the web server's own counters
(exporters/webstats.py, formatted on every scrape) and without them; medians in µs and their ratio.

``--baseline DIR`` adds a second teye run from another checkout (``git archive <commit> | tar -x -C DIR``)
as ``teye-base``, scraped in the same rounds, so a change to the serving path is measured before/after in
one run (teye/teye-base ratio of p50 per row).  Without node_exporter installed, a --baseline run compares
the two teyes only.
"""
from __future__ import annotations

import argparse
import base64
import http.client
import os
import selectors
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.procs import REPO, free_port  # noqa: E402
from benchmarks._proc import status  # noqa: E402
from tests.web.agentproc import stop_process  # noqa: E402
from tests.web.certs import bcrypt_hash, write_pki  # noqa: E402

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
PASSWORD = "bench-password"


class Exporter:
    def __init__(self, name: str, cmd, port: int, health: str, nofile: int, tls: bool, ca: str, tmp: str,
                 cwd: str = REPO):
        self.name, self.port, self.health, self.tls, self.cwd = name, port, health, tls, cwd
        self.env = dict(os.environ, PYTHONPATH=cwd) if cwd != REPO else None
        self.cmd = ["prlimit", f"--nofile={nofile}:{nofile}", "--"] + cmd
        self.ctx = ssl.create_default_context(cafile=ca) if tls else None
        self.log = open(os.path.join(tmp, f"{name}-{'tls' if tls else 'plain'}.log"), "a")
        self.start()

    def start(self) -> float:
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: see {self.log.name}")
            try:
                self.get(self.health, timeout=1)
                return time.perf_counter() - t0
            except (OSError, http.client.HTTPException):
                time.sleep(0.005)

    def get(self, path: str = "/metrics", timeout: float = 10.0) -> int:
        if self.tls:
            c = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=self.ctx)
        else:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        headers = {"Connection": "close", "Accept-Encoding": "gzip"}
        if self.tls:
            headers["Authorization"] = "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
        try:
            c.request("GET", path, headers=headers)
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                raise OSError(f"HTTP {r.status}")
            return len(body)
        finally:
            c.close()

    def status(self):
        st = status(self.proc.pid)
        return st.get("Threads", 0), st.get("VmRSS", 0) / 1024

    def stop(self, sig=15) -> None:
        stop_process(self.proc, sig)


class Row:
    def __init__(self):
        self.lat, self.fail, self.threads, self.rss = [], 0, 0, 0.0

    def sample(self, ex: Exporter) -> None:
        t, r = ex.status()
        self.threads, self.rss = max(self.threads, t), max(self.rss, r)

    def scrape(self, ex: Exporter) -> None:
        t0 = time.perf_counter()
        try:
            ex.get()
            self.lat.append(time.perf_counter() - t0)
        except (OSError, http.client.HTTPException):
            self.fail += 1
        self.sample(ex)


class SlowLoris(threading.Thread):
    """n connections, each having sent half a request; those the server closes are re-opened."""

    def __init__(self, port: int, n: int):
        super().__init__(daemon=True)
        self.port, self.n = port, n
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.reopened = 0

    def _open(self, sel) -> None:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        sel.register(s, selectors.EVENT_WRITE)

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        for _ in range(self.n):
            self._open(sel)
        self.ready.set()
        while not self.stop.is_set():
            for key, ev in sel.select(0.05):
                s = key.fileobj
                try:
                    if key.events == selectors.EVENT_WRITE:
                        s.send(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                        sel.modify(s, selectors.EVENT_READ)
                        continue
                    if s.recv(4096):
                        continue
                except OSError:
                    pass
                sel.unregister(s)
                s.close()
                self.reopened += 1
                self._open(sel)
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        sel.close()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def sequential(exs, n):
    rows = {ex.name: Row() for ex in exs}
    for _ in range(n):
        for ex in exs:
            rows[ex.name].scrape(ex)
    return rows


def under_attack(exs, n, slow, rounds=1):
    """One attack at a time (the attacker and the client share this machine); with rounds=2 the exporters
    take turns twice, in opposite orders, half the scrapes each turn, so slow drifts of the machine hit all."""
    rows, notes = {ex.name: Row() for ex in exs}, []
    order = [ex for r in range(rounds) for ex in (exs if r % 2 == 0 else exs[::-1])]
    for ex in order:
        attack = SlowLoris(ex.port, slow)
        attack.start()
        attack.ready.wait(60)
        time.sleep(1.0)
        row = rows[ex.name]
        for _ in range(n // rounds):
            row.scrape(ex)
        attack.stop.set()
        attack.join(30)
        t0 = time.perf_counter()
        try:
            ex.get()
            after = f"{1000 * (time.perf_counter() - t0):.1f} ms"
        except (OSError, http.client.HTTPException) as e:
            after = f"failed ({e})"
        notes.append(f"{ex.name}: {attack.reopened} attacker connections closed by the server; "
                     f"first scrape after the attack {after}")
    return rows, notes


def parallel(exs, n, scrapers):
    rows = {}
    for ex in exs:
        row = rows[ex.name] = Row()
        lock = threading.Lock()
        per = max(1, n // scrapers) * 2

        def worker():
            for _ in range(per):
                t0 = time.perf_counter()
                try:
                    ex.get()
                    with lock:
                        row.lat.append(time.perf_counter() - t0)
                except (OSError, http.client.HTTPException):
                    with lock:
                        row.fail += 1

        ts = [threading.Thread(target=worker) for _ in range(scrapers)]
        for t in ts:
            t.start()
        while any(t.is_alive() for t in ts):
            row.sample(ex)
            time.sleep(0.02)
        for t in ts:
            t.join()
    return rows


def restart(exs):
    rows = {}
    for ex in exs:
        row = rows[ex.name] = Row()
        for _ in range(5):
            ex.stop(sig=9)
            row.lat.append(ex.start())
            row.sample(ex)
    return rows


def print_rows(title, rows, unit=1000.0, what="scrape"):
    names = list(rows)
    print(f"\n{title}")
    print(f"  {'exporter':<16}{what + ' p50':>14}{'p99':>10}{'failed':>8}{'threads':>9}{'RSS MiB':>9}")
    for name in names:
        r = rows[name]
        print(f"  {name:<16}{pct(r.lat, 0.5) * unit:>11.1f} ms{pct(r.lat, 0.99) * unit:>7.1f} ms{r.fail:>8d}"
              f"{r.threads:>9d}{r.rss:>9.1f}")
    for other in names[1:]:
        if rows[other].lat and rows[names[0]].lat:
            print(f"  p50 ratio {names[0]}/{other}: "
                  f"{statistics.median(rows[names[0]].lat) / statistics.median(rows[other].lat):.3f}")


def render_cost(n: int) -> None:
    """In-process: the /metrics body with and without the web server's counters (the scrape path's share)."""
    from exporters.http import registry_renderer
    from exporters.prometheus import make_registry
    from exporters.webstats import WebStats
    from tests.test_render import PROMETHEUS_ACCEPT, node_sampler
    sampler = node_sampler()
    stats = WebStats()
    stats.attach({}, 4096, None)
    for code in (200, 401, 404, 503):
        stats.request("/metrics", code)
    ways = {"with web counters": registry_renderer(make_registry(lambda: sampler.snapshot, extra=stats.state)),
            "without": registry_renderer(make_registry(lambda: sampler.snapshot))}
    for accept, encoding, what in (("", "", "text"), (PROMETHEUS_ACCEPT, "gzip", "OpenMetrics+gzip")):
        times = {k: [] for k in ways}
        for _ in range(n):
            for name, render in ways.items():
                stats.request("/metrics", 200)   # a new value every scrape, as served
                t0 = time.perf_counter()
                body = render(accept, encoding)[0]
                times[name].append(time.perf_counter() - t0)
        series = render(accept, "")[0].count(b"\n")
        print(f"\nrender in-process ({what}, ~{series} lines, {n} renders each, alternating)")
        for name, ts in times.items():
            print(f"  {name:<20}{statistics.median(ts) * 1e6:>9.1f} µs p50{pct(ts, 0.99) * 1e6:>9.1f} µs p99")
        a, b = (statistics.median(times[k]) for k in ways)
        print(f"  p50 ratio with/without: {a / b:.3f} ({(a - b) * 1e6:+.1f} µs per scrape); body {len(body)} bytes")


def flood_worker(port: int, n: int, ca: str) -> int:
    """A child process: n keep-alive TLS clients sending distinct wrong passwords until a line arrives on stdin;
    prints what they got back (status -> count) as one line of JSON."""
    import json
    ctx = ssl.create_default_context(cafile=ca)
    stop = threading.Event()
    lock = threading.Lock()
    codes: dict = {}

    def one(i: int) -> None:
        conn, k = None, 0
        while not stop.is_set():
            k += 1
            if conn is None:
                conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=ctx)
            auth = base64.b64encode(f"prometheus:wrong-{os.getpid()}-{i}-{k}".encode()).decode()
            try:
                conn.request("GET", "/metrics", headers={"Authorization": "Basic " + auth})
                r = conn.getresponse()
                r.read()
                code = str(r.status)
                if r.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                code = type(e).__name__
                conn.close()
                conn = None
            with lock:
                codes[code] = codes.get(code, 0) + 1
        if conn is not None:
            conn.close()

    ts = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    print("ready", flush=True)
    sys.stdin.readline()
    stop.set()
    for t in ts:
        t.join(35)
    print(json.dumps(codes), flush=True)
    return 0


class PasswordFlood:
    """``n`` wrong-password clients against one exporter, in child processes of at most 64 threads each."""

    def __init__(self, ex: "Exporter", n: int, ca: str):
        self.t0 = time.perf_counter()
        self.procs = []
        left = n
        while left > 0:
            k = min(64, left)
            left -= k
            self.procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--flood-worker", f"{ex.port},{k},{ca}"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for p in self.procs:
            p.stdout.readline()                      # "ready"
        time.sleep(1.0)                              # connections up and hashing saturated

    def stop(self) -> str:
        import json
        codes: dict = {}
        for p in self.procs:
            p.stdin.write("stop\n")
            p.stdin.flush()
        for p in self.procs:
            try:
                out = p.communicate(timeout=60)[0]
                for k, v in json.loads(out.strip().splitlines()[-1]).items():
                    codes[k] = codes.get(k, 0) + v
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                p.kill()
                p.wait()
        dt = time.perf_counter() - self.t0
        total = sum(codes.values())
        return f"attackers got {dict(sorted(codes.items()))} ({total / dt:.0f} answers/s)"


def auth_flood(exs, sizes, n_quiet: int, n_flood: int, ca: str) -> None:
    rows = {ex.name: Row() for ex in exs}
    for _ in range(n_quiet):
        for ex in exs:
            rows[ex.name].scrape(ex)
    print_rows(f"auth quiet: {n_quiet} sequential scrapes over https + basic auth (bcrypt cost 10), "
               "verified credential", rows)
    for n in sizes:
        rows, notes = {ex.name: Row() for ex in exs}, []
        for ex in exs:
            flood = PasswordFlood(ex, n, ca)
            try:
                row = rows[ex.name]
                for _ in range(n_flood):
                    t0 = time.perf_counter()
                    try:
                        ex.get(timeout=10.0)
                        row.lat.append(time.perf_counter() - t0)
                    except (OSError, http.client.HTTPException):
                        row.fail += 1
                    row.sample(ex)
            finally:
                notes.append(f"{ex.name}: {flood.stop()}")
        print_rows(f"auth flood-{n}: {n_flood} scrapes while {n} keep-alive TLS clients send distinct wrong "
                   "passwords (failed: not 200 within 10 s)", rows)
        for note in notes:
            print("  " + note)


def _flood_worker_main(arg: str) -> int:
    port, n, ca = arg.split(",", 2)
    return flood_worker(int(port), int(n), ca)


def _hello(ca: str) -> bytes:
    ctx = ssl.create_default_context(cafile=ca)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="127.0.0.1")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def _rss_settled(ex: "Exporter", seconds: float) -> float:
    """The exporter's lowest VmRSS (MiB) over ``seconds``."""
    end, best = time.monotonic() + seconds, None
    while time.monotonic() < end:
        r = ex.status()[1]
        best = r if best is None else min(best, r)
        time.sleep(0.1)
    return best


def _hold(ex: "Exporter", n: int, kind: str, hello: bytes, ctx) -> float:
    """Hold ``n`` connections of ``kind`` (plain, half, idle) to ``ex`` for a second; the resident set's growth
    per connection (KiB) over its settled level before them."""
    for _ in range(3):
        ex.get("/metrics")
    base = _rss_settled(ex, 1.0)
    socks = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", ex.port), timeout=10)
            if kind == "half":
                s.sendall(hello[:-5])
            elif kind == "idle":
                s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
            socks.append(s)
        time.sleep(1.0)
        return (ex.status()[1] - base) * 1024 / n
    finally:
        for s in socks:
            s.close()


def conn_cost(plain, tls, n: int, ca: str) -> None:
    """Issue 48: resident memory per connection held (plain idle, TLS half handshake, TLS idle after its
    handshake), each exporter in turn, and where its resident set stands 7 s after the peers left; then the
    TLS-idle round again: what a second round costs, and where it stands after (memory handed back once is
    handed back again, not kept for the next round)."""
    hello = _hello(ca)
    ctx = ssl.create_default_context(cafile=ca)
    print(f"\nRSS per connection held, {n} at once (KiB each), and MiB above the start 7 s after they left")
    print(f"{'exporter':16} {'plain idle':>11} {'TLS half':>9} {'TLS idle':>9} {'after':>7} {'TLS idle 2':>11} "
          f"{'after 2':>8} {'start MiB':>10}")
    for p_ex, t_ex in zip(plain, tls):
        plain_kib = _hold(p_ex, n, "plain", hello, ctx)
        start = _rss_settled(t_ex, 1.0)         # (before any TLS peer)
        half_kib = _hold(t_ex, n, "half", hello, ctx)
        idle_kib = _hold(t_ex, n, "idle", hello, ctx)
        after = _rss_settled(t_ex, 7.0) - start
        idle2_kib = _hold(t_ex, n, "idle", hello, ctx)
        after2 = _rss_settled(t_ex, 7.0) - start
        print(f"{p_ex.name:16} {plain_kib:11.1f} {half_kib:9.1f} {idle_kib:9.1f} {after:7.1f} {idle2_kib:11.1f} "
              f"{after2:8.1f} {start:10.1f}")


def _warm(exs) -> None:
    for ex in exs:  # warm up (first renders, bcrypt cache, page-ins)
        for _ in range(5):
            ex.get()


def serving_rows(make, args, skip) -> dict:
    """plain, slow-N, parallel-N, plain again and restart, without TLS; the plain-again rows (the TLS rows'
    baseline)."""
    exs = make(tls=False)
    try:
        _warm(exs)
        print_rows(f"plain: {args.scrapes} sequential scrapes", sequential(exs, args.scrapes))
        if "slow" not in skip:
            rows, notes = under_attack(exs, args.scrapes, args.slow, rounds=2 if args.baseline else 1)
            print_rows(f"slow-{args.slow}: {args.scrapes} scrapes while {args.slow} connections hold half a "
                       "request" + (" (two turns each, in opposite orders)" if args.baseline else ""), rows)
            for n in notes:
                print("  " + n)
        if "parallel" not in skip:
            print_rows(f"parallel-{args.scrapers}: {args.scrapers} concurrent scrapers",
                       parallel(exs, args.scrapes, args.scrapers))
        plain_again = sequential(exs, args.scrapes)
        print_rows(f"plain again: {args.scrapes} sequential scrapes", plain_again)
        if "restart" not in skip:
            print_rows("restart: kill -9, start again, seconds until serving (5 times)", restart(exs),
                       unit=1000.0, what="ready")
    finally:
        for ex in exs:
            ex.stop()
    return plain_again


def tls_rows(make, args, plain_again: dict) -> None:
    """tls+auth: sequential scrapes over https with basic auth, and their p50 against plain's."""
    exs = make(tls=True)
    try:
        _warm(exs)
        rows = sequential(exs, args.scrapes)
        print_rows(f"tls+auth: {args.scrapes} sequential scrapes over https + basic auth (handshake each)", rows)
        for name in rows:
            print(f"  {name}: tls+auth p50 / plain p50 = "
                  f"{statistics.median(rows[name].lat) / statistics.median(plain_again[name].lat):.2f}")
    finally:
        for ex in exs:
            ex.stop()


def evict_rows(make, args) -> None:
    """slow-N at a lower fd limit: more slow connections than descriptors."""
    exs = make(tls=False, nofile=args.evict_nofile)
    try:
        n = min(15, args.scrapes)  # a blinded exporter costs the 10 s timeout per scrape
        rows, notes = under_attack(exs, n, args.slow)
        print_rows(f"slow-{args.slow} at fd limit {args.evict_nofile}: {n} scrapes, more slow "
                   "connections than descriptors", rows)
        for note in notes:
            print("  " + note)
    finally:
        for ex in exs:
            ex.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scrapes", type=int, default=100)
    ap.add_argument("--slow", type=int, default=2000)
    ap.add_argument("--scrapers", type=int, default=50)
    ap.add_argument("--nofile", type=int, default=8192, help="fd limit of both exporters (the unit's LimitNOFILE)")
    ap.add_argument("--evict-nofile", type=int, default=1024, help="fd limit for the last slow-N row (0: skip)")
    ap.add_argument("--render", type=int, default=0, help="in-process renders each way first (0: skip)")
    ap.add_argument("--baseline", help="another teye checkout to run beside this one (before/after)")
    ap.add_argument("--auth-flood", default="", help="only the password-flood rows, e.g. 16,64,256 clients")
    ap.add_argument("--flood-scrapes", type=int, default=20, help="scrapes per password-flood row")
    ap.add_argument("--flood-worker", help=argparse.SUPPRESS)
    ap.add_argument("--conn-cost", type=int, default=0, help="only the memory-per-connection rows, N connections")
    ap.add_argument("--skip", default="", help="comma-separated rows to leave out: slow,parallel,restart,tls")
    args = ap.parse_args()
    if args.flood_worker:
        return _flood_worker_main(args.flood_worker)
    skip = set(args.skip.split(",")) - {""}
    if args.render:
        render_cost(args.render)
    if args.baseline and not os.path.isdir(os.path.join(args.baseline, "agent")):
        print(f"--baseline {args.baseline}: not a teye checkout (no agent/ there)", file=sys.stderr)
        return 2
    if not NODE_EXPORTER and not args.baseline:
        print("prometheus-node-exporter not installed (apt-get install prometheus-node-exporter)", file=sys.stderr)
        return 1
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.slow + 1000)), hard))

    tmp = tempfile.mkdtemp(prefix="teye-bench-web-")
    pki = write_pki(tmp)
    web = os.path.join(tmp, "web.yml")
    with open(web, "w") as fh:
        fh.write(f"tls_server_config:\n  cert_file: {pki['server']}\n  key_file: {pki['server-key']}\n"
                 f"basic_auth_users:\n  prometheus: '{bcrypt_hash(PASSWORD, cost=10)}'\n")

    def make(tls: bool, nofile: int = args.nofile):
        extra = ["--web.config.file", web] if tls else []

        def teye(name, cwd):
            tp = free_port()
            return Exporter(name, [sys.executable, "-m", "agent", "agent", "--listen", f"127.0.0.1:{tp}",
                                   "--phase-socket", os.path.join(tmp, f"p{tp}.sock")] + extra,
                            tp, "/healthz", nofile, tls, pki["ca"], tmp, cwd=cwd)
        out = [teye("teye", REPO)]
        if args.baseline:
            out.append(teye("teye-base", os.path.abspath(args.baseline)))
        if NODE_EXPORTER:
            np_ = free_port()
            out.append(Exporter("node_exporter", [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{np_}"] + extra,
                                np_, "/", nofile, tls, pki["ca"], tmp))
        return out

    print(f"teye: {sys.executable} -m agent agent; teye-base: {args.baseline or '-'}; node_exporter: "
          f"{NODE_EXPORTER or '-'}; fd limit {args.nofile} each; {os.cpu_count()} CPUs; "
          f"scrapes use a new connection each")
    if args.conn_cost:
        plain, tls = make(tls=False), make(tls=True)
        try:
            conn_cost(plain, tls, args.conn_cost, pki["ca"])
        finally:
            for ex in plain + tls:
                ex.stop()
        return 0
    if args.auth_flood:
        exs = make(tls=True)
        try:
            for ex in exs:  # warm up: the scraper's credential verified once
                for _ in range(5):
                    ex.get()
            auth_flood(exs, [int(n) for n in args.auth_flood.split(",")], args.scrapes, args.flood_scrapes, pki["ca"])
        finally:
            for ex in exs:
                ex.stop()
        return 0
    plain_again = serving_rows(make, args, skip)
    if "tls" not in skip:
        tls_rows(make, args, plain_again)
    if args.evict_nofile:
        evict_rows(make, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
