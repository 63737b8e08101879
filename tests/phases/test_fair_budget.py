"""Fair budget (issue 29, item 6): one process's or one uid's flood never makes another job on the node
lose records; what the receiver discards is counted against the job that sent it.

A real flooder (a process sending valid one-step datagrams as fast as it can, non-blocking, as a client
does) and a real victim (teye_client.Reporter, 20 ms flushes: a DDP rank's rate and more) on one live
agent whose rate budget the flood exceeds many times over.  The oracle is each client's own count: the
steps the victim took and the datagrams it could not send (Reporter.dropped_messages), the datagrams the
flooder sent."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import types

import pytest

from tests.client.helpers import LiveAgent

pytestmark = pytest.mark.e2e
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLOODER = textwrap.dedent("""
    import json, os, socket, sys, time
    path, seconds = sys.argv[1], float(sys.argv[2])
    job = sys.argv[3].encode() if len(sys.argv) > 3 else b"flood"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.connect(path)
    s.setblocking(False)
    sent = full = 0
    t = time.monotonic_ns()
    end = time.monotonic() + seconds
    print("ready", flush=True)
    while time.monotonic() < end:
        for _ in range(200):
            t += 1000
            msg = b'{"v":1,"job":"%s","steps":[[%d,%d,1]]}' % (job, t, t + 500)
            try:
                s.send(msg)
                sent += 1
            except BlockingIOError:
                full += 1
    print(json.dumps({"sent": sent, "full": full}))
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


NOBODY = 65534
def _as_nobody():
    os.setgid(NOBODY)
    os.setuid(NOBODY)


@pytest.mark.measures(
    "records a flooder gets through in its time, against a rate (a loaded run sent 8,785, not 64,000)")
@pytest.mark.parametrize("flooder", ["same-uid", "other-uid"])
def test_a_flood_does_not_make_another_job_lose_records(sockdir, flooder):
    """The flooder runs under the victim's uid (one process against another), or under another uid (where
    the test runs as root: a second user's job); either way the victim loses nothing."""
    if flooder == "other-uid" and os.geteuid() != 0:
        pytest.skip("needs root to run the flooder as another uid")
    # a budget of 4,000 datagrams a second: the flood (one Python process) sends 25-100 times that
    agent = LiveAgent(sockdir, max_messages_per_second=4000)
    env = {**os.environ, "PYTHONPATH": REPO}
    other = flooder == "other-uid"
    if other:
        os.chmod(sockdir, 0o755)   # the socket itself is 0666: another user may send
    try:
        # (the flooder is standard library only: another user runs it with the system's Python, which it may
        # execute where this test's virtualenv is private)
        py = shutil.which("python3", path="/usr/bin:/bin") if other else sys.executable
        # (and nothing of this tree's: it may sit in a directory only root can enter)
        fenv = {k: v for k, v in env.items() if k != "PYTHONPATH"} if other else env
        flood = subprocess.Popen([py, "-c", FLOODER, agent.path, "4"], stdout=subprocess.PIPE, text=True,
                                 env=fenv, preexec_fn=_as_nobody if other else None, cwd="/" if other else None)
        assert flood.stdout.readline().strip() == "ready"
        victim = subprocess.run([sys.executable, "-c", VICTIM, agent.path, "400"], capture_output=True,
                                text=True, env=env, timeout=60)
        out, _ = flood.communicate(timeout=60)
        assert victim.returncode == 0, victim.stderr
        v = json.loads(victim.stdout.strip().splitlines()[-1])
        f = json.loads(out.strip().splitlines()[-1])
        jobs = agent.jobs()
        fname = "nobody/flood" if other else "flood"   # another uid's job is labelled with its user
        if other and fname not in jobs:
            fname = f"uid{NOBODY}/flood"
        print("flood", f, "victim", v, {k: (j.steps, j.client_dropped, getattr(j, "shed", None))
                                         for k, j in jobs.items()})
        # the flood exceeded the budget several times over (two CPU hogs beside it: 50-60 k in 4 s, 3-4 times)
        assert f["sent"] > 2 * 4 * 4000, f
        # the victim lost nothing: every step it took is in the agent, none dropped at either end
        results = dict(agent.src.collect(force=True).results)
        why = (v, jobs["victim"], results)   # (CI stop 56 saw 384 of 400 steps, its cause not in the log)
        assert v["dropped_messages"] == 0 and v["dropped"] == 0, why
        assert jobs["victim"].steps == v["steps"] and jobs["victim"].samples == v["samples"], why
        assert jobs["victim"].client_dropped == 0 and jobs["victim"].shed == 0, why
        # what the receiver discarded is charged to the flooder: with what it handled, every datagram the
        # flooder got into the socket (the kernel's count is the flooder's "sent")
        assert jobs[fname].shed > 0 and jobs[fname].shed == results["shed"]
        assert jobs[fname].steps + jobs[fname].shed == f["sent"], (jobs[fname].steps, f)
        points = {(p.spec.name, p.labels): p.value for p in agent.src.collect(force=True).points()}
        assert points[("teye_job_shed_messages_total", (fname,))] == f["sent"] - jobs[fname].steps
        assert jobs[fname].uid == (NOBODY if other else os.getuid())
        assert points[("teye_job_shed_messages_total", ("victim",))] == 0
    finally:
        agent.close()


def test_the_per_uid_share_of_a_slice(monkeypatch):
    """The share itself, datagram by datagram, on the receiver's own shedding loop (no clock, no scheduler):
    once a slice's budget is spent, 16 processes of one uid flooding (their per-process shares add up to
    four times the uid's) get their uid's share handed on, no more; another uid's three-process job and a
    lone process of a third uid, each within its per-process share, get every datagram through although
    the flood came first in the queue.  What is not handed on is charged to the (uid, pid) that sent it."""
    from agent.phases import receiver
    monkeypatch.setattr(receiver, "SHARE_RENEW_S", 60.0)   # one slice's shares, however slow the machine
    per_slice = 40                                   # 4,000 datagrams a second, 10 ms slices
    pid_cap = max(receiver.SHED_MIN, int(per_slice * receiver.SHED_PID_SHARE))
    uid_cap = max(4 * receiver.SHED_MIN, int(per_slice * receiver.SHED_UID_SHARE))
    assert 16 * pid_cap >= 4 * uid_cap               # the per-process caps alone would not hold the uid back
    queue = []
    for k in range(50):                              # the flood first: 16 pids of uid 65534, 50 each
        queue += [(b"f", 5000 + p, NOBODY) for p in range(16)]
    queue += [(b"v", 100 + r, 1000) for r in range(3) for _ in range(pid_cap)]   # a DDP job of uid 1000
    queue += [(b"w", 200, 1001)] * 2
    handed, charged = [], {}
    batches = [queue[i:i + receiver.BATCH] for i in range(0, len(queue), receiver.BATCH)]

    def receive():
        if not batches:
            raise OSError("drained")                 # the loop ends: the main loop would report it
        return batches.pop(0)

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        r = receiver.Receiver(sock, "test", None, handed.extend, 1024, per_slice * 100,
                              shed=lambda d: [charged.__setitem__(k, charged.get(k, 0) + n) for k, n in d.items()])
        assert r._per_slice == per_slice
        r._shed_until(time.monotonic() + 60, receive)
    finally:
        sock.close()
    by_uid = {}
    for _, pid, uid in handed:
        by_uid[uid] = by_uid.get(uid, 0) + 1
    print("handed on", by_uid, "caps", pid_cap, uid_cap)
    assert by_uid[NOBODY] == uid_cap                 # the flooding uid: its share, however many processes
    assert by_uid[1000] == 3 * pid_cap and by_uid[1001] == 2       # the others: every datagram
    assert sum(charged.values()) == 16 * 50 - uid_cap
    assert {uid for uid, _ in charged} == {NOBODY}


def _shed_loop(queue, per_slice, receive=None, end=None):
    """Run the receiver's shedding loop over ``queue`` (one datagram a receive) with a handler of no cost;
    (handed on, charged)."""
    from agent.phases import receiver
    handed, charged = [], {}

    def take():
        if not queue:
            raise OSError("drained")
        return [queue.pop(0)]

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        r = receiver.Receiver(sock, "test", None, handed.extend, 1024, per_slice * 100,
                              shed=lambda d: [charged.__setitem__(k, charged.get(k, 0) + n) for k, n in d.items()])
        r._shed_until(time.monotonic() + 60 if end is None else end, receive or take)
    finally:
        sock.close()
    return handed, charged


def test_a_process_s_flush_retry_and_close_in_one_slice_pass_whatever_their_size(monkeypatch):
    """A client's flush, its retry of what a full queue refused and its close can come in one slice, together larger
    than a process's share of it (a retried batch holds several flushes' records): the first SHED_MIN of them
    pass while the process is not in debt (only the first did before); one more is over its share and shed, on
    the receiver's own loop."""
    from agent.phases import receiver
    monkeypatch.setattr(receiver, "SHARE_RENEW_S", 60.0)   # one slice's shares, however slow the machine
    per_slice = 200
    pid_cap = max(receiver.SHED_MIN, int(per_slice * receiver.SHED_PID_SHARE))
    uid_cap = max(4 * receiver.SHED_MIN, int(per_slice * receiver.SHED_UID_SHARE))
    units = min(pid_cap - 1, uid_cap // receiver.SHED_MIN)      # two above the process's share, four within its uid's
    assert 2 * units > pid_cap and receiver.SHED_MIN * units <= uid_cap
    big = b"x" * (receiver.BYTES_PER_UNIT * units)
    handed, charged = _shed_loop([(big, 300, 1002)] * (receiver.SHED_MIN + 1), per_slice)
    assert len(handed) == receiver.SHED_MIN and charged == {(1002, 300): 1}, (len(handed), charged)


def test_a_jobs_datagrams_that_waited_together_pass_and_a_burst_past_its_bucket_does_not(monkeypatch):
    """On a machine so busy that the receive thread did not run for 100 ms, a job's five flushes (20 ms apart)
    arrive together in one slice, one of them larger (it held what a full queue refused): together half again
    a slice's share of the process, within its bucket of PID_BURST_SLICES slices' shares: every one is handed
    on (a per-slice share shed the fifth: the 64-process test's victim lost 1-5 of 80).  A process sending
    the same again and again in that slice gets its bucket, no more."""
    from agent.phases import receiver
    monkeypatch.setattr(receiver, "SHARE_RENEW_S", 60.0)   # one slice, however slow the machine
    monkeypatch.setattr(receiver, "SHED_UID_SHARE", 1.0)   # (the uid's share out of the bucket's way)
    per_slice = 200
    pid_cap = max(receiver.SHED_MIN, int(per_slice * receiver.SHED_PID_SHARE))     # 25 units
    burst = receiver.PID_BURST_SLICES * pid_cap
    unit = b"x" * receiver.BYTES_PER_UNIT
    job = [(unit * 2, 300, 1002)] * 4 + [(unit * 30, 300, 1002), (unit * 2, 300, 1002)]
    assert pid_cap < sum(len(d) // receiver.BYTES_PER_UNIT for d, _, _ in job) <= burst
    handed, charged = _shed_loop(list(job), per_slice)
    assert len(handed) == len(job) and charged == {}, charged
    flood = [(unit * 10, 301, 1003)] * 30                 # 300 units of estimate from one process
    handed, charged = _shed_loop(flood, per_slice)
    assert len(handed) == burst // 10 and charged == {(1003, 301): 30 - burst // 10}, (len(handed), charged)


def test_a_processs_bucket_refills_at_its_share_of_each_slice_up_to_the_bucket(monkeypatch):
    """A process sending 6 units of estimate every 5 ms (a half of its 25-unit share of a 10 ms slice) for
    0.3 s of a shedding spell: every datagram is handed on (its bucket of 75 units refills at 25 a slice;
    without the refill, the 13th would be shed).  One that sends once, waits 0.2 s (20 slices' shares) and
    then floods 10-unit datagrams gets one bucket's worth after its wait, not what it saved over it.  On the
    receiver's clock, moved by the receives here (no scheduler in the way)."""
    from agent.phases import receiver
    monkeypatch.setattr(receiver, "SHED_UID_SHARE", 1.0)   # (the uid's share out of the bucket's way)
    clock = [1000.0]
    monkeypatch.setattr(receiver, "time", types.SimpleNamespace(monotonic=lambda: clock[0],
                                                                monotonic_ns=lambda: int(clock[0] * 1e9)))
    per_slice = 200
    unit = b"x" * receiver.BYTES_PER_UNIT
    queue = [(unit * 6, 302, 1004)] * 60

    def paced():
        if not queue:
            raise OSError("drained")
        clock[0] += 0.005
        return [queue.pop(0)]

    handed, charged = _shed_loop(None, per_slice, receive=paced, end=clock[0] + 60)
    assert len(handed) == 60 and charged == {}, (len(handed), charged)
    burst = receiver.PID_BURST_SLICES * max(receiver.SHED_MIN, int(per_slice * receiver.SHED_PID_SHARE))
    flood = [(unit * 10, 303, 1005)] * 40

    def waits_then_floods():
        if not flood:
            raise OSError("drained")
        if len(flood) == 39:
            clock[0] += 0.2
        return [flood.pop(0)]

    handed, charged = _shed_loop(None, per_slice, receive=waits_then_floods, end=clock[0] + 60)
    # (what it saved over the wait would be 20 datagrams: the uid's share)
    assert len(handed) == 1 + burst // 10, (len(handed), charged)


def test_datagrams_shed_before_their_job_exists_are_charged_to_it():
    """A flooder whose first datagrams are all shed has no job yet: the charge waits (bounded) until a
    job holds its pid, then lands on that job; one never claimed is forgotten after the expiry."""
    from agent.phases.jobs import JobTable
    from agent.phases.protocol import encode
    from tests.phases.helpers import S, ctx_with_clock, phases_cfg
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(job_expiry_seconds=60.0), ctx, own_uid=0, alive=lambda pid: True)
    table.shed({(NOBODY, 501): 40, (NOBODY, 502): 7})
    table.shed({(NOBODY, 501): 2})
    assert dict(table.views(clock.t)[1])["shed"] == 49 and not table.views(clock.t)[0]
    t = clock.t
    assert table.handle(encode("flood", [("compute", t - 10, t)]), 501, NOBODY) == "accepted"
    (view,) = table.views(clock.t)[0]
    assert (view.train_job, view.shed) == ("nobody/flood", 42)
    clock.t += 60 * S
    table.views(clock.t)
    assert not table._unclaimed                      # 502 never sent a datagram that was kept: forgotten
