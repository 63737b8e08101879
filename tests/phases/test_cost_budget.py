"""The receiver charges by cost (issue 48): a uid's budget is spent by what its datagrams cost to handle, not by
their count, so three uids flooding the most expensive shape (64 KiB of small sum windows, about 10 ms each to
decode and apply) are shed and a fourth uid's job loses nothing.

Real processes: three flooders, each as its own uid (``setpriv``: daemon, sys, nobody), sending one valid
expensive datagram as fast as a non-blocking socket takes it; a legitimate job (teye_client.Reporter, 20 ms
flushes) as this test's uid, on one live receiver.  Oracles: the victim's own count of its steps and of what
it could not send, the kernel's count of what each flooder got into the socket (its "sent"), the receive
thread's CPU time from /proc (the kernel's clock, not the receiver's)."""
from __future__ import annotations

import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from agent.phases import receiver
from tests.client.helpers import LiveAgent

pytestmark = [pytest.mark.e2e, pytest.mark.measures("the receiver's CPU cost per datagram and a flood's rate")]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOODERS = {1: "daemon", 3: "sys", 65534: "nobody"}
SECONDS = 4.0

# One datagram of as many one-name windows of 2 steps as fit in 64 KiB (benchmarks/datagram_cost.py: "small
# windows", the most expensive shape found), valid for the whole flood, sent again and again.
# (the datagram, built from ``job``: the flooders' shared part)
SHAPE = """
    t = time.monotonic_ns() - 10**9
    ws, size = [], 60
    while True:
        w = [t + len(ws) * 10000, t + len(ws) * 10000 + 10000, 2, 16, 2000, [["compute", 100, 50]], [2]]
        size += len(json.dumps(w, separators=(",", ":"))) + 1
        if size > 65000 or len(ws) >= 1000:
            break
        ws.append(w)
    msg = json.dumps({"v": 2, "job": job, "sums": ws}, separators=(",", ":")).encode()

    def flood(path, end):   # msg to path until end, non-blocking as a client sends: (sent, found it full)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.connect(path)
        s.setblocking(False)
        sent = full = 0
        while time.monotonic() < end:
            try:
                s.send(msg)
                sent += 1
            except BlockingIOError:
                full += 1
        return sent, full
"""
FLOODER = textwrap.dedent("""
    import json, socket, sys, time
    path, seconds, job = sys.argv[1], float(sys.argv[2]), sys.argv[3]
""" + SHAPE + """
    print("ready", len(msg), flush=True)
    sent, full = flood(path, time.monotonic() + seconds)
    print(json.dumps({"sent": sent, "full": full, "bytes": len(msg), "windows": len(ws)}))
""")

VICTIM = textwrap.dedent("""
    import json, sys, time
    from teye_client import Reporter
    path, n = sys.argv[1], int(sys.argv[2])
    rep = Reporter("victim", socket_path=path, flush_ms=20)
    for i in range(n):
        with rep.phase("data_wait"):
            time.sleep(0.002)
        with rep.phase("compute"):
            time.sleep(0.003)
        rep.step(samples=8)
    rep.close()
    print(json.dumps({"steps": n, "samples": 8 * n, "sent": rep.sent, "dropped": rep.dropped,
                      "dropped_messages": rep.dropped_messages}))
""")


def _thread_cpu_s(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv for four uids")
def test_three_uids_flooding_expensive_datagrams_are_shed_and_a_fourth_uids_job_is_exact(sockdir):
    agent = LiveAgent(sockdir)    # the default budget: 20,000 units a second
    os.chmod(sockdir, 0o755)
    py = shutil.which("python3", path="/usr/bin:/bin")
    per_slice = agent.src.receiver._per_slice
    try:
        tid = agent.src.receiver._thread.native_id
        cpu0, t0 = _thread_cpu_s(tid), time.monotonic()
        floods = {}
        for uid, name in FLOODERS.items():
            floods[uid] = subprocess.Popen(
                ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", py, "-c", FLOODER, agent.path,
                 str(SECONDS), "flood"], stdout=subprocess.PIPE, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
        for p in floods.values():
            assert p.stdout.readline().startswith("ready")
        victim = subprocess.run([sys.executable, "-c", VICTIM, agent.path, "400"], capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": REPO}, timeout=60)
        sent = {uid: json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for uid, p in floods.items()}
        cpu, wall = _thread_cpu_s(tid) - cpu0, time.monotonic() - t0
        assert victim.returncode == 0, victim.stderr
        v = json.loads(victim.stdout.strip().splitlines()[-1])
        jobs = agent.jobs()
        units = dict(getattr(agent.src.receiver, "spent_units", {}))   # (absent before issue 48: benchmarks)
        print("flooders", sent, "victim", v, "jobs", {k: (j.steps, j.shed) for k, j in jobs.items()},
              "units", units, f"receive thread {cpu:.2f} CPU s in {wall:.2f} s")
        # the victim: every step it took, none dropped at either end, none shed
        assert v["dropped_messages"] == 0 and v["dropped"] == 0, v
        assert jobs["victim"].steps == v["steps"] and jobs["victim"].samples == v["samples"]
        assert jobs["victim"].shed == 0
        # each flooder got into the socket more than its share could pay for, and was shed (how many of its
        # datagrams got in at all, and so what share of them was shed, is the scheduler's: on 2 loaded cores
        # a third to a half; what it had handled is the budget's, below)
        # the flood was shed (each of its datagrams costs more than a uid's share of a slice).  How much of it
        # depends on how its datagrams reach the socket slice by slice, the machine's speed and scheduler's: on
        # earlier machines over a fifth (CI x9: one flooder 31 in and 5 shed, at 7,517 units against the others'
        # 14-15 k), on stop 59's faster one 8-12 % in each of 7 runs, its flooders' units under their share.  What
        # holds on every machine: each uid's units within its share (below) and the victim exact (above)
        shed = sum(jobs[f"{name}/flood"].shed for name in FLOODERS.values())
        assert shed > 0, (shed, sent)
        for uid, name in FLOODERS.items():
            f = sent[uid]
            assert f["bytes"] > 60000 and f["sent"] > 10 and f["full"] > 1000, f   # it flooded (the queue was full)
            # what it had handled, at most its share of the budget over the flood plus a slice's burst (and
            # the one datagram over it), in the receiver's units of measured handling time
            share = per_slice * receiver.SHED_UID_SHARE / receiver._SLICE_S
            assert units[uid] <= share * wall + per_slice + 2 * f["bytes"] // receiver.BYTES_PER_UNIT * 4, (
                name, units[uid], share * wall)
        # the agent's receive thread: at most one core while it drains the flood
        assert cpu <= 1.05 * wall + 0.1
    finally:
        agent.close()


def test_an_expensive_sender_is_shed_first_on_the_receivers_own_loop():
    """The rule itself, with no scheduler in the way: a handler that costs 50 units for a big datagram and 1
    for a small one; one uid sends big ones, another small ones, interleaved.  Once the big sender's uid has
    spent a slice's budget beyond its share, its datagrams are shed on sight while every small one is
    handled; counted by count alone, both would have been handled alike."""
    spent_ns = {b"B": 50 * receiver.UNIT_NS, b"s": receiver.UNIT_NS // 2}   # (of CPU: the thread spins)
    handled, charged = [], {}

    def handle(batch):
        for data, pid, uid in batch:
            end = time.perf_counter_ns() + spent_ns[data[:1]]
            while time.perf_counter_ns() < end:
                pass
            handled.append(uid)

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        r = receiver.Receiver(sock, "test", None, handle, 1024, 4000,      # 40 units a slice
                              shed=lambda d: [charged.__setitem__(k, charged.get(k, 0) + n) for k, n in d.items()])
        for _ in range(40):
            r._take([(b"B" * 10, 7, 1000), (b"s", 8, 1001)])
    finally:
        sock.close()
    big, small = handled.count(1000), handled.count(1001)
    assert small == 40 and sum(n for (uid, _), n in charged.items() if uid == 1001) == 0
    # the big sender: handled until its debt passed one slice's budget (40 units: a datagram of 50 did), then
    # shed while its debt drains at 20 units a slice (the loop above takes well under a slice)
    assert 1 <= big <= 3 and sum(charged.values()) == 40 - big


def _spin(units: float) -> None:
    end = time.thread_time_ns() + int(units * receiver.UNIT_NS)
    while time.thread_time_ns() < end:
        pass


def test_a_job_beside_its_own_uids_flooder_is_never_shed_on_sight():
    """One process floods (a datagram of one unit as fast as the loop goes), another process of the same uid
    sends a DDP rank's flushes: two datagrams of five units together, every 5 ms, a fifth of the uid's share.
    The uid's spending passes its share, so its processes that spend are shed on sight; the flooder is, the
    job beside it is not (before, each second datagram of its pairs was: its debt was over SHED_MIN)."""
    handled, charged = {7: 0, 8: 0}, {}

    def handle(batch):
        for data, pid, uid in batch:
            _spin(float(data))
            handled[pid] += 1

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        r = receiver.Receiver(sock, "test", None, handle, 1024, 20_000,      # 200 units a slice, 100 a uid's
                              shed=lambda d: [charged.__setitem__(k, charged.get(k, 0) + n) for k, n in d.items()])
        sent = 0
        end = time.monotonic() + 0.6
        next_pair = time.monotonic()
        while time.monotonic() < end:
            r._take([(b"1", 7, 1000)])
            if time.monotonic() >= next_pair:
                r._take([(b"5", 8, 1000), (b"5", 8, 1000)])
                sent += 2
                next_pair += 0.005
        uid_debt = r._debt(r._debts, 1000, receiver.SHED_UID_SHARE, time.monotonic_ns())
    finally:
        sock.close()
    print("handled", handled, "charged", charged, "victim sent", sent, "uid debt", uid_debt)
    assert charged.get((1000, 7), 0) > 1000          # the flooder: shed on sight
    assert sent > 60 and handled[8] == sent and (1000, 8) not in charged


def test_a_full_collection_is_the_budgets_not_the_senders(monkeypatch):
    """A full collection runs in whichever datagram's handling crossed its threshold and costs what the whole
    heap does (in a big process, tens of ms: a thousand units): it is spent from the receiver's budget, not
    charged to that datagram's sender, who would be shed on sight for it.  Younger collections stay the
    sender's.  Driven on the receiver's own loop with a real collection of a heap made big here."""
    heap = [[i] for i in range(1_500_000)]           # a collection of this takes tens of ms
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    young = []

    def handle(batch):
        for data, pid, uid in batch:
            if data == b"young":                     # the younger generations' collection of what came before
                gc.enable()
                gc.collect(1)
            else:
                gc.collect(int(data))

    try:
        r = receiver.Receiver(sock, "test", None, handle, 1024, 4000)   # 40 units a slice
        gc.callbacks.append(r._on_gc)
        r._gc_ident = threading.get_ident()          # (as the receive thread sets it)
        t0 = time.thread_time_ns()
        gc.collect()
        full_units = (time.thread_time_ns() - t0) // receiver.UNIT_NS
        assert full_units > 4 * 40, full_units       # (the heap is big enough to matter)
        r._take([(b"2", 9, 1000)])
        spent = r._spent
        assert not r._in_debt(1000, 9, time.monotonic_ns())
        assert r.spent_units[1000] < full_units / 4 and spent > full_units / 2, (r.spent_units, spent, full_units)
        gc.disable()                                 # a million young objects (as recent datagrams leave)
        young.extend([i] for i in range(1_000_000))
        r._take([(b"young", 10, 1001)])             # their collection, a younger generation's: the sender's
        assert r._in_debt(1001, 10, time.monotonic_ns()), r.spent_units
    finally:
        gc.enable()
        gc.callbacks.remove(r._on_gc)
        sock.close()
        del heap


# FLOODER's datagram from N processes forked from one (all of one uid), each flooding as FLOODER does; the
# parent prints their sums.
FORKED = textwrap.dedent("""
    import json, os, socket, sys, time
    path, seconds, job, n = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
""" + SHAPE + """
    r, w = os.pipe()
    go = time.monotonic() + 1.0
    for _ in range(n):
        if os.fork() == 0:
            os.close(r)
            while time.monotonic() < go:
                time.sleep(0.01)
            sent, full = flood(path, go + seconds)
            os.write(w, (json.dumps([sent, full]) + "\\n").encode())
            os._exit(0)
    os.close(w)
    time.sleep(max(0.0, go - time.monotonic()))
    print("ready", flush=True)
    got = [json.loads(line) for line in os.fdopen(r).read().splitlines()]
    for _ in range(n):
        os.wait()
    print(json.dumps({"processes": len(got), "sent": sum(g[0] for g in got), "full": sum(g[1] for g in got),
                      "bytes": len(msg)}))
""")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv for two uids")
def test_sixty_four_processes_of_one_uid_get_one_uids_share_and_a_job_of_another_uid_is_exact(sockdir):
    """Issue 48's bad input: the most expensive shape from 64 processes of one uid (nobody).  Each process alone
    is new and not in debt; together they are one uid, held to one uid's share of the budget, and the job of
    another uid beside them loses nothing."""
    agent = LiveAgent(sockdir)
    os.chmod(sockdir, 0o755)
    py = shutil.which("python3", path="/usr/bin:/bin")
    per_slice = agent.src.receiver._per_slice
    try:
        tid = agent.src.receiver._thread.native_id
        flood = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", py, "-c", FORKED,
                                  agent.path, str(SECONDS), "flood", "64"], stdout=subprocess.PIPE, text=True,
                                 cwd="/", env={"PATH": "/usr/bin:/bin"})
        assert flood.stdout.readline().startswith("ready")
        cpu0, t0 = _thread_cpu_s(tid), time.monotonic()
        victim = subprocess.run([sys.executable, "-c", VICTIM, agent.path, "400"], capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": REPO}, timeout=60)
        f = json.loads(flood.communicate(timeout=120)[0].strip().splitlines()[-1])
        cpu, wall = _thread_cpu_s(tid) - cpu0, time.monotonic() - t0
        assert victim.returncode == 0, victim.stderr
        v = json.loads(victim.stdout.strip().splitlines()[-1])
        jobs = agent.jobs()
        units = dict(agent.src.receiver.spent_units)
        print("flood", f, "victim", v, "jobs", {k: (j.steps, j.shed) for k, j in jobs.items()}, "units", units,
              f"receive thread {cpu:.2f} CPU s in {wall:.2f} s")
        # it flooded: the queue was full (64 busy senders on 2 cores also take the CPU the agent's thread would
        # drain it with: on this VM they got 20 datagrams in, and met a full queue 640,000 times)
        assert f["processes"] == 64 and f["sent"] > 10 and f["full"] > 1000, f
        assert v["dropped_messages"] == 0 and v["dropped"] == 0, v
        assert jobs["victim"].steps == v["steps"] and jobs["victim"].shed == 0
        # the flooding uid: its share over the flood, a slice's burst, and each process's first datagram
        share = per_slice * receiver.SHED_UID_SHARE / receiver._SLICE_S
        first = 64 * 2 * f["bytes"] // receiver.BYTES_PER_UNIT * 4
        assert units[65534] <= share * wall + per_slice + first, (units[65534], share * wall, first)
        assert cpu <= 1.05 * wall + 0.1
    finally:
        agent.close()
