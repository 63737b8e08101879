"""Connections (issue 48's flood, mended at its cause): each client sends on a SOCK_SEQPACKET connection of its
own, a queue no other sender can fill; the shared datagram socket stays for clients of older versions and for
a client the agent refused.  The oracle of each test is what the test's own client sent, counted by the test."""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from agent.context import AgentContext
from agent.phases import receiver
from agent.phases.protocol import encode
from agent.phases.source import PhaseSource
from teye_client import reporter
from tests.phases.helpers import MS, phases_cfg, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _wait(cond, timeout=10.0):
    return wait_for(cond, timeout)


def _steps(src, job):
    got = {j.train_job: j for j in src.collect(force=True).jobs}.get(job)
    return None if got is None else (got.steps, got.samples)


def _run_steps(rep, n, samples=4):
    """n steps of two 1 ms phases each (so each goes as its intervals, not summed: the test counts records)."""
    for _ in range(n):
        with rep.phase("data_wait"):
            time.sleep(0.001)
        with rep.phase("compute"):
            time.sleep(0.011)
        rep.step(samples=samples)


def test_the_client_and_the_agent_agree_on_the_suffix():
    assert reporter.SEQ_SUFFIX == receiver.SEQ_SUFFIX


def test_a_reporter_sends_on_a_connection_of_its_own_attributed_by_the_kernel(sockdir):
    path = os.path.join(sockdir, "p.sock")
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    seq = path + receiver.SEQ_SUFFIX
    try:
        st = os.stat(seq)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666   # any user's job may connect
        rep = reporter.Reporter("conn", socket_path=path, flush_ms=0)
        _run_steps(rep, 5)
        assert rep._sock.type == socket.SOCK_SEQPACKET
        assert _wait(lambda: _steps(src, "conn") == (5, 20))
        assert src.receiver.connections == 1
        (job,) = src.collect(force=True).jobs
        assert (job.uid, job.pid, job.user) == (os.getuid(), os.getpid(), "root")   # SO_PEERCRED's, not claimed
        rep.close()
        assert _wait(lambda: src.receiver.connections == 0)   # the client's close is read as the end
        assert (rep.dropped, rep.dropped_messages) == (0, 0)
    finally:
        src.close()
    assert not os.path.exists(seq) and not os.path.exists(path)   # both files removed on close


def test_an_agent_without_connections_gets_datagrams(sockdir):
    """An agent of an earlier version binds the datagram socket only: the reporter sends there."""
    path = os.path.join(sockdir, "old.sock")
    old = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    old.bind(path)
    old.settimeout(5)
    try:
        rep = reporter.Reporter("old", socket_path=path, flush_ms=0)
        _run_steps(rep, 1)
        rep.close()
        got = []
        while sum(len(o["steps"]) for o in got) < 1:
            got.append(json.loads(old.recv(65536)))
        assert {o["job"] for o in got} == {"old"} and rep.sent == len(got) and rep._sock is None
        assert (rep.dropped, rep.dropped_messages) == (0, 0)
    finally:
        old.close()


def test_a_uid_over_its_connection_limit_is_refused_and_its_client_loses_nothing(sockdir, monkeypatch):
    """Bad input: more connections of one uid than MAX_CONNS_PER_UID.  The one over is refused (its read side
    shut, what it sent before read), its client learns it on the next send (EPIPE) and sends datagrams: every
    step is in the agent, none dropped."""
    monkeypatch.setattr(receiver, "MAX_CONNS_PER_UID", 2)
    path = os.path.join(sockdir, "p.sock")
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    held = []
    try:
        for _ in range(2):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(path + receiver.SEQ_SUFFIX)
            held.append(s)
        assert _wait(lambda: src.receiver.connections == 2)
        rep = reporter.Reporter("over", socket_path=path, flush_ms=0)
        # the client's first step goes on its connection before the agent refuses it (so that what it sent there is
        # what the refusal must hand on): the receive thread is held in the job table (its lock, taken here) by a
        # datagram of the test's own, while the client connects and sends
        with src.table._lock:
            before = src.receiver.received
            t = time.monotonic_ns()
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as d:
                d.sendto(encode("hold", [("compute", t - 20 * MS, t)], [(t - 20 * MS, t, 1)]), path)
            assert _wait(lambda: src.receiver.received == before + 1)   # taken: the thread waits for the lock
            _run_steps(rep, 1)
            sent_first = rep.sent
            assert rep._sock is not None and rep._sock.type == socket.SOCK_SEQPACKET and sent_first >= 1
        _run_steps(rep, 29)
        rep.close()
        assert _wait(lambda: _steps(src, "over") == (30, 120)), _steps(src, "over")
        assert src.receiver.refused_connections == 1 and src.receiver.connections == 2
        served = {p.spec.name: p.value for p in src.collect(force=True).points()
                  if p.spec.name.startswith("teye_phase_connections")}
        assert served == {"teye_phase_connections": 2, "teye_phase_connections_refused_total": 1}, served
        assert (rep.dropped, rep.dropped_messages) == (0, 0)
        # every message it sent was handled: those it sent before the agent refused it too
        assert dict(src.collect(force=True).results)["accepted"] == rep.sent + 1   # (and the test's own datagram)
        assert time.monotonic_ns() < rep._seq_after_ns   # it sends datagrams for a while, not a refused connect a flush
    finally:
        for s in held:
            s.close()
        src.close()


FLOOD_CONN = textwrap.dedent("""
    import json, socket, sys, time
    path, seconds = sys.argv[1], float(sys.argv[2])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    s.setblocking(False)
    t = time.monotonic_ns()
    msg = json.dumps({"v": 1, "job": "flood", "phases": [["compute", t - 2000, t - 1000]], "steps": []}).encode()
    print("ready", flush=True)
    sent = full = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            s.send(msg)
            sent += 1
        except BlockingIOError:
            full += 1
    print(json.dumps({"sent": sent, "full": full}))
""")


@pytest.mark.measures("a flooding process beside the victim loads a core for 3 s")
def test_a_flooding_connection_fills_only_its_own_queue(sockdir):
    """A process flooding its own connection as fast as it can: its queue is full (it meets EAGAIN), the
    victim's is not; the victim's steps are all in the agent and none of its records was dropped or shed."""
    path = os.path.join(sockdir, "p.sock")
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    try:
        flood = subprocess.Popen([sys.executable, "-c", FLOOD_CONN, path + receiver.SEQ_SUFFIX, "3"],
                                 stdout=subprocess.PIPE, text=True)
        assert flood.stdout.readline().strip() == "ready"
        rep = reporter.Reporter("victim", socket_path=path, flush_ms=20)
        _run_steps(rep, 100)
        rep.close()
        f = json.loads(flood.communicate(timeout=30)[0].strip().splitlines()[-1])
        assert f["full"] > 0, f   # its queue was full
        assert _wait(lambda: _steps(src, "victim") == (100, 400)), _steps(src, "victim")
        victim = {j.train_job: j for j in src.collect(force=True).jobs}["victim"]
        assert (rep.dropped, rep.dropped_messages, victim.shed) == (0, 0, 0)
    finally:
        src.close()


SIGPIPE_CLIENT = textwrap.dedent("""
    import json, signal, sys, time
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # as some jobs set it: a send to a closed peer would kill
    from teye_client import Reporter
    rep = Reporter("pipe", socket_path=sys.argv[1], flush_ms=0)
    rep.step(samples=1)
    print("sent", rep._sock.type, flush=True)
    sys.stdin.readline()        # the agent is gone now
    rep.step(samples=1)
    rep.step(samples=1)
    print(json.dumps({"sent": rep.sent, "dropped": rep.dropped}), flush=True)
""")


def test_a_job_that_restores_sigpipe_survives_the_agent_closing_its_connection(sockdir):
    path = os.path.join(sockdir, "p.sock")
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    p = subprocess.Popen([sys.executable, "-c", SIGPIPE_CLIENT, path], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
    try:
        line = p.stdout.readline()
        assert line.split()[:2] == ["sent", str(int(socket.SOCK_SEQPACKET))], (line, p.stderr.read())
    finally:
        src.close()
    out, err = p.communicate("\n", timeout=30)
    assert p.returncode == 0, (p.returncode, -signal.SIGPIPE, err)   # not killed by SIGPIPE
    got = json.loads(out.strip().splitlines()[-1])
    assert got["dropped"] >= 1, got   # the agent is gone: counted, as with datagrams


def test_a_seq_path_that_is_not_a_socket_is_left_alone_and_datagrams_still_flow(sockdir, caplog):
    """Bad input: the listener's path is taken by a regular file (and, below, too long): the agent says so,
    leaves the file, and receives datagrams; its clients send them."""
    path = os.path.join(sockdir, "p.sock")
    with open(path + receiver.SEQ_SUFFIX, "w") as fh:
        fh.write("mine")
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    try:
        assert open(path + receiver.SEQ_SUFFIX).read() == "mine"
        assert any("exists and is not a socket" in r.getMessage() for r in caplog.records)
        rep = reporter.Reporter("dg", socket_path=path, flush_ms=0)
        _run_steps(rep, 3)
        assert rep._sock.type == socket.SOCK_DGRAM
        assert _wait(lambda: _steps(src, "dg") == (3, 12))
    finally:
        src.close()
    long_path = os.path.join(sockdir, "x" * (receiver._MAX_PATH - len(sockdir) - 3))
    assert len(os.fsencode(long_path)) <= receiver._MAX_PATH < len(os.fsencode(long_path + receiver.SEQ_SUFFIX))
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=long_path)
    try:
        assert src.receiver._listener is None
        t = time.monotonic_ns()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(encode("long", [("compute", t - 20 * MS, t)], [(t - 20 * MS, t, 2)]), long_path)
        assert _wait(lambda: _steps(src, "long") == (1, 2))
    finally:
        src.close()


def test_a_rebind_listens_again(sockdir):
    """The socket file removed while the agent runs: the collector binds both paths again, and a new client
    connects to the new listener."""
    path = os.path.join(sockdir, "p.sock")
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    try:
        os.unlink(path)
        with pytest.raises(Exception, match="bound it again"):
            src.collect(force=True)
        rep = reporter.Reporter("again", socket_path=path, flush_ms=0)
        _run_steps(rep, 2)
        assert rep._sock.type == socket.SOCK_SEQPACKET
        assert _wait(lambda: _steps(src, "again") == (2, 8))
        rep.close()
    finally:
        src.close()


def test_an_idle_read_follows_connections_that_carry_no_message(sockdir):
    """The idle read (no job: the last reading handed out again, issue 49) is new once a client connects or
    leaves without a message: the served connections are never stale."""
    path = os.path.join(sockdir, "p.sock")
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    try:
        assert src.collect().connections == 0
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(path + receiver.SEQ_SUFFIX)
        assert _wait(lambda: src.receiver.connections == 1)
        assert src.collect().connections == 1
        s.close()
        assert _wait(lambda: src.receiver.connections == 0)
        assert src.collect().connections == 0
    finally:
        src.close()
