"""The batching Reporter: at most one datagram per flush_ms or full buffer, the rest on exit; src once per connection."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from teye_client import Reporter
from tests.client.helpers import REPO, base_env


def _drain(s, timeout=0.5):
    out = []
    s.settimeout(timeout)
    try:
        while True:
            out.append(json.loads(s.recv(65536)))
    except socket.timeout:
        return out


def test_at_most_one_datagram_per_flush_and_nothing_lost(listener):
    path, s = listener
    rep = Reporter(train_job="b", socket_path=path, flush_ms=50)
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < 0.6:
        with rep.phase("data_wait"):
            pass
        with rep.phase("compute"):
            time.sleep(0.0005)
        rep.step(samples=2)
        n += 1
    elapsed = time.monotonic() - t0
    during = _drain(s, 0.2)  # what came while the loop ran (and its last flush, by the thread)
    rep.close()
    after = _drain(s, 0.2)
    assert after == []       # the thread had sent it all within one flush
    assert 3 <= len(during) <= elapsed / 0.05 + 2, (len(during), n)
    assert sum(len(m["steps"]) for m in during) == n and sum(len(m["phases"]) for m in during) == 2 * n
    assert rep.sent == len(during) and rep.dropped == 0 and n > 10 * len(during)


def test_a_full_buffer_goes_at_once(listener):
    path, s = listener
    rep = Reporter(train_job="b", socket_path=path, flush_ms=60000, max_batch=6)
    for _ in range(2):
        with rep.phase("compute"):
            pass
        rep.step()
    assert _drain(s, 0.2) == []
    rep.record_phase("compute", time.monotonic_ns(), time.monotonic_ns())
    rep.record_phase("compute", time.monotonic_ns(), time.monotonic_ns())
    (m,) = _drain(s, 0.5)
    assert (len(m["phases"]), len(m["steps"])) == (4, 2)


def test_the_rest_goes_on_exit(listener):
    path, s = listener
    code = ("import sys\nfrom teye_client import Reporter\nrep = Reporter('exit', sys.argv[1], flush_ms=60000)\n"
            "for i in range(3):\n    rep.step(samples=i)\nprint('done')\n")
    r = subprocess.run([sys.executable, "-c", code, path], env=base_env(), capture_output=True, text=True, cwd=REPO)
    assert (r.returncode, r.stdout, r.stderr) == (0, "done\n", "")
    (m,) = _drain(s, 1.0)
    assert [n for _, _, n in m["steps"]] == [0, 1, 2]


def test_source_goes_once_per_connection(sockdir):
    path = os.path.join(sockdir, "a.sock")
    a = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.bind(path)
    rep = Reporter(train_job="s", socket_path=path, flush_ms=0, source="torch")
    rep.step()
    rep.step()
    first, second = _drain(a, 0.3)
    assert first["src"] == "torch" and "src" not in second
    a.close()
    os.unlink(path)  # the agent restarts
    b = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    b.bind(path)
    try:
        rep.step()
        rep.step()
        first, second = _drain(b, 0.3)
        assert first["src"] == "torch" and "src" not in second  # the new agent hears it too
    finally:
        b.close()


def test_a_forked_child_sends_only_its_own_records(listener):
    path, s = listener
    rep = Reporter(train_job="f", socket_path=path, flush_ms=60000)
    rep.step(samples=1)
    rep.step(samples=2)  # buffered in the parent
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            rep.step(samples=7)
            rep.close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    (child,) = _drain(s, 0.5)
    rep.close()
    (parent,) = _drain(s, 0.5)
    assert [n for _, _, n in child["steps"]] == [7] and [n for _, _, n in parent["steps"]] == [1, 2]


def test_a_reporter_dropped_with_records_buffered_sends_them(listener):
    """A loop's local reporter, freed before exit (workloads.train's timer does so): its atexit flush holds
    only a weak reference, so it sends what it buffered when it goes."""
    path, s = listener

    def loop():
        rep = Reporter(train_job="local", socket_path=path, flush_ms=60000)
        for i in range(3):
            rep.step(samples=i)

    loop()
    (m,) = _drain(s, 0.5)
    assert [n for _, _, n in m["steps"]] == [0, 1, 2]
