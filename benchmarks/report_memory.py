"""`teye report`'s peak memory on the largest Prometheus answer it accepts (issue 36).

    python benchmarks/report_memory.py [--sizes 1K,16M,64M] [--bound 64M] [--series 10000]

A loopback stand-in for Prometheus answers `time()` at once and the report's first range query (the jobs'
identity) with a matrix of --series series padded with points to each size (the default bound, 64 MiB, is the
largest the report accepts; one byte more is refused); every other query gets an empty answer.  Each size
runs the real CLI (`python -m agent report --slurm-job 1 --format json`) as a child; its peak resident set is
the child's `ru_maxrss` (getrusage(RUSAGE_CHILDREN) of a fresh helper process, so runs do not mix).  The
smallest size is the baseline (interpreter and imports).  Prints size, exit status, seconds and peak RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from agent.report.main import parse_bytes  # noqa: E402

NOW = 1_800_000_000.0


def matrix(size: int, series: int) -> bytes:
    """A range answer of exactly ``size`` bytes (or the smallest one possible): points spread over the series,
    then spaces."""
    head = b'{"status":"success","data":{"resultType":"matrix","result":['
    tail = b"]}}"
    point = b'[%d,"1"]' % int(NOW)
    metas = [b'{"metric":{"instance":"node-%d","gpu":"0","slurm_job":"x%d","user":"u"},"values":[' % (i % 100, i)
             for i in range(series)]
    fixed = len(head) + len(tail) + sum(len(m) + 2 for m in metas) + series - 1
    room = max(series, (size - fixed) // (len(point) + 1))
    per = [room // series + (1 if i < room % series else 0) for i in range(series)]
    body = head + b",".join(m + b",".join([point] * max(1, n)) + b"]}" for m, n in zip(metas, per)) + tail
    return body + b" " * max(0, size - len(body))


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        params = urllib.parse.parse_qs(self.rfile.read(n).decode())
        q = params.get("query", [""])[0]
        if q == "time()":
            body = json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [NOW, str(NOW)]}})
            body = body.encode()
        elif self.path.endswith("query_range") and not self.server.sent:
            self.server.sent = True
            body = self.server.big
        else:
            kind = "matrix" if self.path.endswith("query_range") else "vector"
            body = json.dumps({"status": "success", "data": {"resultType": kind, "result": []}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def measure(size: int, series: int, bound: int):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.handle_error = lambda *a: None      # the refused answer's reader hangs up early: expected
    srv.big, srv.sent = matrix(size, series), False
    actual = len(srv.big)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    helper = ("import resource, subprocess, sys, time; t = time.monotonic(); "
              "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE); "
              "print(p.returncode, round(time.monotonic() - t, 2), "
              "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, repr(p.stderr.decode().strip()[-160:]))")
    cmd = [sys.executable, "-c", helper, sys.executable, "-m", "agent", "report", "--prometheus",
           f"http://127.0.0.1:{srv.server_address[1]}", "--slurm-job", "1", "--format", "json",
           "--max-answer-size", str(bound), "--timeout", "600", "--deadline", "1200"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO).stdout.split(maxsplit=3)
    srv.shutdown()
    srv.server_close()
    rc, secs, kib, err = out
    return actual, int(rc), float(secs), int(kib) / 1024, err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1K,16M,64M")
    ap.add_argument("--bound", default="64M")
    ap.add_argument("--series", type=int, default=10000)
    a = ap.parse_args()
    bound = int(parse_bytes(a.bound))
    print(f"{'answer bytes':>14} {'exit':>4} {'seconds':>8} {'peak RSS MiB':>13}  stderr (tail)")
    for s in a.sizes.split(","):
        size = int(parse_bytes(s))
        actual, rc, secs, mib, err = measure(size, a.series, bound)
        print(f"{actual:>14} {rc:>4} {secs:>8.2f} {mib:>13.1f}  {err.strip()}", flush=True)
    over = measure(bound + 1, a.series, bound)
    print(f"{over[0]:>14} {over[1]:>4} {over[2]:>8.2f} {over[3]:>13.1f}  {over[4].strip()}  (one byte above the bound)")


if __name__ == "__main__":
    main()
