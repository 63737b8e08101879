"""Job limits that cannot lock others out, and pods as tenants (issue 36), on the job table itself with
the machine's real uid numbers (nobody and daemon flood, bin is the victim, root the agent): the
oracle is the limits' own rule (max-min fair shares of phases.max_jobs) and the datagrams the test
sent, counted by the test."""
from __future__ import annotations

import logging
import os
import pwd

from agent.phases.jobs import RUN_END_SILENCE_NS, JobTable
from agent.phases.pods import PodResolver
from agent.phases.protocol import encode
from tests.phases.helpers import DAEMON, MS, NOBODY, S, ctx_with_clock, phases_cfg
from tests.phases.test_jobs import _exposition

AGENT = 0                                   # the agent's own uid here
VICTIM = pwd.getpwnam("bin").pw_uid
TRUSTED = pwd.getpwnam("sys").pw_uid


def _msg(name, t, ms=10):
    return encode(name, [("compute", t - ms * MS, t)], [(t - ms * MS, t, 4)])


def _uids(table):
    out = {}
    for v in table.views(table.ctx.clock())[0]:
        out[v.uid] = out.get(v.uid, 0) + 1
    return out


def test_two_flooding_uids_never_lock_out_a_victims_first_job(caplog):
    """nobody and daemon hold 32 live jobs each (the per-user cap) and fill max_jobs 64: bin's, the
    agent's own and a trusted uid's first jobs still get in, at the expense of the flooders; the flooders'
    further new jobs are refused and logged per uid with their counts."""
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(trusted_uids=[TRUSTED]), ctx, own_uid=AGENT)
    assert (table.max_jobs, table.max_per_user) == (64, 32)
    for i in range(32):
        clock.t += MS
        assert table.handle(_msg(f"n{i}", clock.t), 1000 + i, NOBODY) == "accepted"
        clock.t += MS
        assert table.handle(_msg(f"d{i}", clock.t), 2000 + i, DAEMON) == "accepted"
    assert _uids(table) == {NOBODY: 32, DAEMON: 32}
    caplog.set_level(logging.WARNING, logger="teye.phases")
    clock.t += MS
    assert table.handle(_msg("more", clock.t), 1000, NOBODY) == "job_limit"        # its own cap
    first = [r.getMessage() for r in caplog.records if "refused over the limits" in r.getMessage()]
    assert len(first) == 1 and f"uid {NOBODY}: 1 datagrams" in first[0] and "64 jobs in the table" in first[0]
    caplog.clear()
    clock.t += MS
    assert table.handle(_msg("victim", clock.t), 3000, VICTIM) == "accepted"      # today: job_limit
    assert _uids(table) == {NOBODY: 31, DAEMON: 32, VICTIM: 1}                     # nobody's oldest went
    assert "n0" not in {v.train_job.split("/")[-1] for v in table.views(clock.t)[0]}
    assert any(f"uid {NOBODY} dropped" in r.getMessage() and f"job of uid {VICTIM}" in r.getMessage()
               for r in caplog.records)
    # the flooders keep trying new names: refused (daemon at its cap, nobody not over daemon's share)
    for i in range(7):
        clock.t += MS
        assert table.handle(_msg(f"dx{i}", clock.t), 2000, DAEMON) == "job_limit"
    for i in range(5):
        clock.t += MS
        assert table.handle(_msg(f"nx{i}", clock.t), 1001, NOBODY) == "job_limit"
    clock.t += MS
    assert table.handle(_msg("own", clock.t), 4000, AGENT) == "accepted"           # the agent's own uid
    clock.t += MS
    assert table.handle(_msg("t", clock.t), 5000, TRUSTED) == "accepted"           # a trusted uid
    assert _uids(table) == {NOBODY: 30, DAEMON: 31, VICTIM: 1, AGENT: 1, TRUSTED: 1}   # the most-held lost one each
    clock.t += MS
    assert table.handle(_msg("victim2", clock.t), 3000, VICTIM) == "accepted"      # still far below its share
    # the flooders' remaining jobs keep reporting
    clock.t += MS
    assert table.handle(_msg("n31", clock.t), 1031, NOBODY) == "accepted"
    assert table.handle(_msg("d31", clock.t), 2031, DAEMON) == "accepted"
    # one line per REFUSED_LOG_NS names every refused uid with its count, never only the first one's
    assert not [r for r in caplog.records if "refused over the limits" in r.getMessage()]
    clock.t += 10 * S
    table.views(clock.t)
    lines = [r.getMessage() for r in caplog.records if "refused over the limits" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"uid {DAEMON}: 7 datagrams" in lines[0] and f"uid {NOBODY}: 5 datagrams" in lines[0]
    assert dict(table.views(clock.t)[1])["job_limit"] == 1 + 7 + 5


def test_max_min_fair_shares_converge_and_a_uid_over_its_share_is_the_one_refused():
    """A victim keeps getting new jobs while a flooder holds two more than it; then both are refused:
    the table settles at equal shares, never swapping one job back and forth."""
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(max_jobs=9, max_jobs_per_user=9), ctx, own_uid=AGENT)
    for i in range(9):
        clock.t += MS
        assert table.handle(_msg(f"n{i}", clock.t), 1000, NOBODY) == "accepted"
    got = []
    for i in range(8):
        clock.t += MS
        got.append(table.handle(_msg(f"v{i}", clock.t), 3000, VICTIM))
    assert got == ["accepted"] * 4 + ["job_limit"] * 4
    assert _uids(table) == {NOBODY: 5, VICTIM: 4}       # 9 jobs: one more for nobody is as even as it gets
    for i in range(3):                                  # and it stays so: no job swapped back and forth
        clock.t += MS
        assert table.handle(_msg(f"n-new{i}", clock.t), 1000, NOBODY) == "job_limit"
        clock.t += MS
        assert table.handle(_msg(f"v-new{i}", clock.t), 3000, VICTIM) == "job_limit"
    assert _uids(table) == {NOBODY: 5, VICTIM: 4}


def test_a_trusted_uids_first_job_gets_in_where_every_uid_holds_one():
    """Four untrusted uids hold one job each in a table of four: a fifth untrusted uid is refused (nobody
    is over its share), the agent's own uid and a trusted uid still get their first job."""
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(max_jobs=4, max_jobs_per_user=4, trusted_uids=[TRUSTED]), ctx, own_uid=AGENT)
    for k, uid in enumerate((NOBODY, DAEMON, VICTIM, 4242)):
        clock.t += MS
        assert table.handle(_msg("j", clock.t), 100 + k, uid) == "accepted"
    clock.t += MS
    assert table.handle(_msg("j", clock.t), 200, 4343) == "job_limit"
    clock.t += MS
    assert table.handle(_msg("j", clock.t), 300, AGENT) == "accepted"
    clock.t += MS
    assert table.handle(_msg("j", clock.t), 301, TRUSTED) == "accepted"
    clock.t += MS
    assert table.handle(_msg("k", clock.t), 300, AGENT) == "job_limit"            # its first only
    assert _uids(table) == {VICTIM: 1, 4242: 1, AGENT: 1, TRUSTED: 1}             # the oldest two gave way


def test_a_thousand_short_lived_senders_of_one_uid_are_bounded_counted_and_harm_no_one():
    """1,000 processes of nobody, each sending once under its own name and exiting: nobody holds at most
    its per-user cap (live runs, then ended runs kept for their export time), every other datagram is
    counted as job_limit, and daemon's job beside them loses nothing."""
    ctx, clock = ctx_with_clock()
    alive = set()
    table = JobTable(phases_cfg(), ctx, own_uid=AGENT, alive=lambda pid: pid in alive)
    alive.add(7)
    sent_steps = 0
    results = {}
    for i in range(1000):
        clock.t += 10 * MS
        pid = 10000 + i
        alive.add(pid)
        r = table.handle(_msg(f"s{i}", clock.t), pid, NOBODY)
        results[r] = results.get(r, 0) + 1
        alive.discard(pid)                                    # it exits at once
        if i % 10 == 0:
            assert table.handle(_msg("steady", clock.t), 7, DAEMON) == "accepted"
            sent_steps += 1
        if i % 100 == 99:
            views = table.views(clock.t)[0]                   # the sampler's pass ends the exited runs
            assert sum(1 for v in views if v.uid == NOBODY) <= 32
            assert len(views) <= 64
    assert results == {"accepted": 32, "job_limit": 968}
    counts = dict(table.views(clock.t)[1])
    assert counts["job_limit"] == 968 and counts["accepted"] == 32 + sent_steps
    steady = [v for v in table.views(clock.t)[0] if v.uid == DAEMON]
    assert [(v.steps, v.samples, v.ended) for v in steady] == [(sent_steps, 4 * sent_steps, False)]
    assert len(table._unclaimed) == 0 and len(table.refused) <= 64
    # the same 1,000 under one name: one job, at most 64 pids kept, every step counted
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=AGENT, alive=lambda pid: False)
    for i in range(1000):
        clock.t += 10 * MS
        assert table.handle(_msg("same", clock.t), 20000 + i, NOBODY) == "accepted"
    (v,) = table.views(clock.t)[0]
    assert (v.processes, v.steps, v.samples) == (64, 1000, 4000)


# -- pods are tenants -----------------------------------------------------------------------------

POD_A = "1f0e6a3c-54b2-4c1e-9a0e-6f0c2d7e8b91"
POD_B = "9d3c1b2a-0e4f-4a6b-8c7d-5e6f7a8b9c0d"


def _procfs(tmp_path, pods):
    """A fixture procfs: /proc/<pid>/cgroup for each pid (a pod uid, or None for a host process)."""
    root = tmp_path / "proc"
    for pid, pod in pods.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        if pod is None:
            text = "0::/user.slice/user-0.slice/session-1.scope\n"
        elif pod == POD_A:   # cgroup v2, systemd driver (the uid's dashes as underscores)
            text = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                    f"{pod.replace('-', '_')}.slice/cri-containerd-abc.scope\n")
        else:                # cgroup v1, cgroupfs driver
            text = (f"12:memory:/kubepods/besteffort/pod{pod}/0123abcd\n"
                    f"4:cpu,cpuacct:/kubepods/besteffort/pod{pod}/0123abcd\n")
        (d / "cgroup").write_text(text)
    logs = tmp_path / "pods"
    (logs / f"team-a_trainer-0_{POD_A}").mkdir(parents=True)   # the kubelet's /var/log/pods: B not named
    return str(root), str(logs)


def test_two_pods_of_one_uid_are_kept_apart(tmp_path):
    """Two pods both running as uid 0 and naming their job "resnet" are two jobs, each with its own
    counters and namespace/pod; a host process of that uid and name is a third; a process whose cgroup
    is gone keys as the host's (documented)."""
    procfs, logs = _procfs(tmp_path, {101: POD_A, 102: POD_A, 201: POD_B, 301: None})
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(pods=True), ctx, own_uid=AGENT, pods=PodResolver(procfs, logs))
    sent = {101: 3, 102: 2, 201: 7, 301: 1, 999: 1}
    for pid, n in sent.items():
        for _ in range(n):
            clock.t += MS
            batch = [(_msg("resnet", clock.t), pid, 0)]
            table.handle_batch(batch)
    views = {v.train_job: v for v in table.views(clock.t)[0]}
    assert sorted(views) == ["pod:" + POD_B + "/resnet", "resnet", "team-a/trainer-0/resnet"]
    a, b, host = views["team-a/trainer-0/resnet"], views["pod:" + POD_B + "/resnet"], views["resnet"]
    assert (a.namespace, a.pod, a.steps, a.processes) == ("team-a", "trainer-0", 5, 2)
    assert (b.namespace, b.pod, b.steps, b.processes) == ("", POD_B, 7, 1)
    assert (host.namespace, host.pod, host.steps, host.processes) == ("", "", 2, 2)
    m = _exposition(table, clock.t)
    info = {dict(lbl)["train_job"]: dict(lbl) for (name, lbl) in m if name == "teye_job_info"}
    assert (info["team-a/trainer-0/resnet"]["namespace"], info["team-a/trainer-0/resnet"]["pod"]) == \
        ("team-a", "trainer-0")
    assert (info["pod:" + POD_B + "/resnet"]["namespace"], info["pod:" + POD_B + "/resnet"]["pod"]) == ("", POD_B)
    assert m[("teye_job_steps_total", (("train_job", "team-a/trainer-0/resnet"),))] == 5
    assert m[("teye_job_steps_total", (("train_job", "pod:" + POD_B + "/resnet"),))] == 7


def test_without_pods_the_same_senders_merge(tmp_path):
    """The control: phases.pods off, the pods' senders of one uid and name are one job (today's
    behaviour outside Kubernetes, and what the pod test must differ from)."""
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=AGENT)
    for pid in (101, 201):
        clock.t += MS
        assert table.handle(_msg("resnet", clock.t), pid, 0) == "accepted"
    (v,) = table.views(clock.t)[0]
    assert (v.train_job, v.steps, v.processes, v.pod) == ("resnet", 2, 2, "")


def test_pod_resolver_bounds_and_rereads(tmp_path):
    """A cgroup file longer than the bound is read up to it; a pid reused by another pod is seen after
    the cache time; a missing file is no pod."""
    procfs, logs = _procfs(tmp_path, {101: POD_A})
    r = PodResolver(procfs, logs)
    assert r.of(101, 0) == POD_A and r.of(102, 0) == ""
    with open(os.path.join(procfs, "101", "cgroup"), "w") as fh:
        fh.write(f"12:memory:/kubepods/pod{POD_B}/x\n")
    assert r.of(101, 4 * S) == POD_A and r.of(101, 5 * S) == POD_B
    with open(os.path.join(procfs, "101", "cgroup"), "w") as fh:
        fh.write("0::/" + "x" * (70 * 1024) + f"\n12:memory:/kubepods/pod{POD_A}/x\n")
    assert r.of(101, 11 * S) == ""                          # beyond the 64 KiB bound: not read
    assert r.names(POD_A, 0) == ("team-a", "trainer-0") and r.names(POD_B, 0) == ("", POD_B)


def test_ended_pod_run_keeps_its_pod(tmp_path):
    """A pod's run that ended stays exported with its namespace/pod (the same keep rule as any run)."""
    procfs, logs = _procfs(tmp_path, {101: POD_A})
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(pods=True), ctx, own_uid=AGENT, pods=PodResolver(procfs, logs),
                     alive=lambda pid: False)
    clock.t += MS
    assert table.handle(_msg("resnet", clock.t), 101, 0) == "accepted"
    clock.t += RUN_END_SILENCE_NS
    (v,) = table.views(clock.t)[0]
    assert (v.ended, v.namespace, v.pod, v.train_job) == (True, "team-a", "trainer-0", "team-a/trainer-0/resnet")
