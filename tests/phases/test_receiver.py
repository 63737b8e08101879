"""The phase socket for real: kernel credentials, forgery, stale sockets, bad paths, a flood."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from agent.context import AgentContext
from agent.errors import ConfigError
from agent.phases.protocol import encode
from agent.phases.receiver import Receiver, bind_socket
from agent.phases.source import PhaseSource, from_config
from agent.sampler import Sampler
from agent.config import defaults
from tests.conftest import PROCFS
from tests.phases.helpers import MS, phases_cfg, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _wait(cond, timeout=5.0):
    return wait_for(cond, timeout)


def _send(path, data):
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(data, path)


def test_messages_are_attributed_with_kernel_credentials(sockdir):
    path = os.path.join(sockdir, "p.sock")
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    try:
        assert oct(os.stat(path).st_mode & 0o777) == "0o666"
        t = time.monotonic_ns()
        _send(path, encode("train", [("data_wait", t - 30 * MS, t - 20 * MS), ("compute", t - 20 * MS, t)],
                           [(t - 30 * MS, t, 16)]))
        _send(path, b"x" * 70_000)  # larger than max_message_bytes: the receiver sees it truncated
        assert _wait(lambda: src.receiver.received == 2)
        r = src.collect()
        (job,) = r.jobs
        assert (job.train_job, job.uid, job.pid, job.user) == ("train", os.getuid(), os.getpid(), "root")
        assert dict(job.phase_seconds)["data_wait"] == pytest.approx(0.010)
        assert dict(r.results)["too_large"] == 1 and dict(r.results)["accepted"] == 1
    finally:
        src.close()
    assert not os.path.exists(path)  # our socket file is removed on close


FORGER = textwrap.dedent("""
    import json, os, socket, sys, time
    os.setgid(65534); os.setuid(65534)
    t = time.monotonic_ns()
    msg = {"v": 1, "job": "victim", "phases": [["data_wait", t - 10**9, t]], "steps": [[t - 10**9, t, 999]]}
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(json.dumps(msg).encode(), sys.argv[1])
    print(os.getpid())
""")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to setuid() the child to nobody")
def test_forged_job_name_from_another_uid_is_attributed_to_its_sender(sockdir):
    path = os.path.join(sockdir, "p.sock")
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    try:
        t = time.monotonic_ns()
        _send(path, encode("victim", [("compute", t - 50 * MS, t)], [(t - 50 * MS, t, 8)]))
        out = subprocess.run([sys.executable, "-c", FORGER, path], capture_output=True, text=True, timeout=30,
                             check=True)
        forger_pid = int(out.stdout)
        assert _wait(lambda: src.receiver.received == 2)
        views = {j.train_job: j for j in src.collect().jobs}
        assert set(views) == {"victim", "nobody/victim"}
        victim, forged = views["victim"], views["nobody/victim"]
        assert (victim.steps, victim.samples, victim.uid) == (1, 8, 0)
        assert dict(victim.phase_seconds)["data_wait"] == 0
        assert (forged.steps, forged.samples, forged.uid, forged.user, forged.pid) == (1, 999, 65534, "nobody",
                                                                                     forger_pid)
    finally:
        src.close()


def test_a_failing_handler_is_logged_and_the_receiver_goes_on(sockdir, caplog):
    """A bug in handling one receive drops that receive, not the thread: the next datagram is handled."""
    path = os.path.join(sockdir, "p.sock")
    sock, ident = bind_socket(path)
    got = []

    def handle_batch(batch):
        for data, _, _ in batch:
            if data == b"boom":
                raise RuntimeError("a bug")
            got.append(data)

    r = Receiver(sock, path, ident, handle_batch, 4096, 100_000)
    r.start()
    try:
        _send(path, b"boom")
        assert _wait(lambda: r.received == 1)
        _send(path, b"after")
        assert _wait(lambda: got == [b"after"])
        assert r._thread.is_alive()
    finally:
        r.close()
    (rec,) = [rec for rec in caplog.records if "handling a datagram failed" in rec.getMessage()]
    assert rec.levelname == "ERROR" and "a bug" in rec.getMessage() and rec.exc_info[0] is RuntimeError


def test_stale_socket_file_is_replaced(sockdir):
    path = os.path.join(sockdir, "p.sock")
    old = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    old.bind(path)
    old.close()  # a crashed agent leaves the file behind; nobody receives on it
    assert os.path.exists(path)
    src = PhaseSource(phases_cfg(), AgentContext(), socket_path=path)
    try:
        _send(path, encode("j", [("compute", time.monotonic_ns() - 10, time.monotonic_ns())]))
        assert _wait(lambda: src.receiver.received == 1)
        assert [j.train_job for j in src.collect().jobs] == ["j"]
    finally:
        src.close()


def test_live_socket_regular_file_and_missing_dir_are_refused(sockdir):
    path = os.path.join(sockdir, "p.sock")
    live = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    live.bind(path)
    try:
        with pytest.raises(ConfigError, match="another process .* receives on"):
            bind_socket(path)
        assert os.path.exists(path)  # left alone
    finally:
        live.close()
    plain = os.path.join(sockdir, "notes.txt")
    with open(plain, "w") as fh:
        fh.write("keep me")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        bind_socket(plain)
    assert open(plain).read() == "keep me"
    with pytest.raises(ConfigError, match="directory /nonexistent/dir does not exist"):
        bind_socket("/nonexistent/dir/x.sock")
    with pytest.raises(ConfigError, match="longer than 107 bytes"):
        bind_socket(os.path.join(sockdir, "x" * 120))
    cfg = defaults()
    cfg["phases"]["socket"] = "/nonexistent/x.sock"
    with pytest.raises(ConfigError, match="phases.socket"):
        from_config(cfg, AgentContext())


@pytest.mark.measures("a timed assertion: the agent exits within its bound")
def test_agent_exits_2_on_a_socket_path_in_a_missing_dir(tmp_path):
    conf = tmp_path / "teye.yaml"
    conf.write_text("collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in
                                               ("memory", "disk", "network", "infiniband", "nfs", "nfsd",
                                                "pressure", "gpu")))
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "agent", "agent", "--config", str(conf), "--listen", "127.0.0.1:0",
                        "--procfs", PROCFS, "--phase-socket", "/nonexistent/x.sock"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 2
    assert "phases.socket" in p.stderr and "directory /nonexistent does not exist" in p.stderr
    assert "listening" not in p.stderr and time.monotonic() - t < 30


FLOODER = textwrap.dedent("""
    import json, os, socket, sys, time
    path, n = sys.argv[1], int(sys.argv[2])
    t = time.monotonic_ns()
    big = json.dumps({"v": 1, "job": "big", "phases": [["compute", t - 10**6, t - 10**6 + 10]] * 100}).encode()
    kinds = [
        lambda i: json.dumps({"v": 1, "job": f"job{i % 5000}", "phases": [["data_wait", t - 10**6, t]]}).encode(),
        lambda i: b"\\x00garbage" * (i % 7),
        lambda i: b'{"v": 9, "job": "x"}',
        lambda i: big,
        lambda i: json.dumps({"v": 1, "job": "neg", "phases": [["compute", t, t - 5]]}).encode(),
    ]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setblocking(False)
    ok = full = 0
    start = time.monotonic()
    for i in range(n):  # as fast as possible: most find the kernel queue full
        try:
            s.sendto(kinds[i % 5](i), path)
            ok += 1
        except BlockingIOError:
            full += 1
    s.setblocking(True)
    for i in range(n // 5):  # then at the receiver's pace, so that all of these reach the agent
        s.sendto(kinds[i % 5](i), path)
        ok += 1
    print(ok, full, time.monotonic() - start)
""")


@pytest.mark.measures("the sampler's pace under a flood against the test's own clock")
def test_flood_keeps_memory_bounded_counts_everything_and_the_sampler_on_time(sockdir):
    from agent.sources.cpu import CpuSource
    path = os.path.join(sockdir, "p.sock")
    ctx = AgentContext()
    ctx.timeline.add("0", 0, 1, 0.0)  # a GPU whose samples never cover the flood: intervals pile up (bounded)
    cfg = phases_cfg(max_pending_intervals=2000)
    src = PhaseSource(cfg, ctx, socket_path=path)
    # the test process is the receiver process; map every pid to GPU 0 so that intervals queue for attribution
    ctx.gpu_pids = _AllPids(frozenset({"0"}))
    reads = []

    class TimedCpu(CpuSource):
        def collect(self):
            reads.append(time.monotonic())
            return super().collect()

    sampler = Sampler({"cpu": (TimedCpu(PROCFS), 0.1), "phases": (src, 0.5)})
    proc = psutil.Process()
    try:
        sampler.start()
        time.sleep(0.5)
        rss_before = proc.memory_info().rss
        reads.clear()
        flood = subprocess.run([sys.executable, "-c", FLOODER, path, "100000"], capture_output=True, text=True,
                               timeout=120, check=True)
        sent, full, secs = flood.stdout.split()
        print("flood: sent", sent, "queue full", full, "in", secs, "s")
        sent = int(sent)
        assert _wait(lambda: src.receiver.received >= sent, timeout=60)
        time.sleep(0.6)
        rss_after = proc.memory_info().rss
        reading = sampler.snapshot.state("phases").reading
        assert reading is not None
        results = dict(reading.results)
        # every datagram the kernel delivered is counted exactly once, by its reason
        assert sum(results.values()) == sent
        assert results["not_json"] > 0 and results["unknown_version"] > 0 and results["bad_interval"] > 0
        assert results["job_limit"] > 0 and len(reading.jobs) == cfg["max_jobs_per_user"]  # one uid: 32 of 64
        assert reading.pending <= 64 * 2000
        # bounded: job table, pending queues and counters do not grow with the flood
        assert rss_after - rss_before < 64 * 2**20, (rss_before, rss_after)
        # the sampling loop kept its schedule (100 ms) while the receiver was busy
        gaps = [b - a for a, b in zip(reads, reads[1:])]
        print(f"flood: RSS {rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB; sampler gaps: "
              f"max {max(gaps) * 1000:.0f} ms, median {sorted(gaps)[len(gaps) // 2] * 1000:.0f} ms (period 100 ms)")
        assert len(gaps) > 5 and max(gaps) < 0.5, max(gaps)
    finally:
        sampler.stop()


class _AllPids(dict):
    def __init__(self, gpus):
        super().__init__()
        self._gpus = gpus

    def get(self, pid, default=None):
        return self._gpus


def test_the_kernel_queue_length_is_read(tmp_path):
    from agent.phases.receiver import queue_length
    f = tmp_path / "qlen"
    f.write_text("512\n")
    assert queue_length(str(f)) == 512
    f.write_text("garbage")
    assert queue_length(str(f)) == 10             # the kernel's default where the sysctl is unreadable
    assert queue_length(str(tmp_path / "missing")) == 10
    f.write_text("0")
    assert queue_length(str(f)) == 1


def test_an_idle_read_is_the_last_one_until_a_datagram_moves_a_counter(sockdir):
    """Issue 49: the phases collector is read every second; while no job reports, a read hands out the last
    reading again (the same object, so a scrape formats nothing) -- until a datagram moves a counter (a rejected
    one too), a job appears, or a job's reading would change with time alone (its last-message age)."""
    from tests.phases.helpers import S, ctx_with_clock
    ctx, clock = ctx_with_clock(time.monotonic_ns())
    src = PhaseSource(phases_cfg(), ctx, socket_path=os.path.join(sockdir, "p.sock"))
    try:
        first = src.collect()
        clock.t += S
        assert src.collect() is first and first.jobs == ()
        src.table.handle(b"{not json", 4321, os.getuid())                    # rejected: a counter moved
        rejected = src.collect()
        assert rejected is not first and sum(n for _, n in rejected.results) == 1
        assert src.collect() is rejected                                   # idle again
        t = clock.t
        ctx.timeline.add("0", t - S, t, 0.25)       # the GPU collector's first samples, GPU 1 not sampled
        clock.t += S
        assert src.collect() is rejected            # still idle: but the sampled GPUs are learnt (the next job's)
        t = clock.t
        src.table.handle(encode("train", [("compute", t - 2 * S, t - S)], [(t - 2 * S, t - S, 16)], cvd="0,1"),
                         4321, os.getuid())
        one = src.collect()
        (job,) = one.jobs
        assert dict(one.results)["accepted"] == 1
        # its first interval is credited at once, to GPU 0 (CUDA_VISIBLE_DEVICES, the sampled GPUs known)
        assert dict(((g, p), v) for g, p, v in job.gpu_idle_seconds) == pytest.approx({("0", "compute"): 0.75})
        clock.t += S
        two = src.collect()                         # (its counters settled: the attribution counted at `one`)
        clock.t += 3 * S                                                    # no datagram: the job's age grows
        later = src.collect()
        assert later is not two and later.jobs[0].last_message_age_s == pytest.approx(job.last_message_age_s + 4)
    finally:
        src.close()
