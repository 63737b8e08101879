"""The cause of input waits (storage, host_cpu, unknown) from fixture /proc trees driven by a
ground-truth timeline, and each bad input of issue 13 (pid gone, other pid namespace, io unreadable)."""
from __future__ import annotations

import os

import pytest

from agent.phases import cause
from agent.phases.jobs import JobTable
from agent.phases.procstat import InputProbe, ProcReader, ProcSample
from agent.phases.protocol import encode
from agent.phases.source import PhasesReading
from agent.phases.verdict import INPUT_CAUSE_RECOMMENDATIONS, InputWait, input_cause
from tests.phases.helpers import MS, S, ctx_with_clock, phases_cfg

PID, UID = 4242, 1000
TCK = 100            # USER_HZ: /proc/<pid>/stat counts CPU time in 10 ms ticks


class FakeProc:
    """A /proc + /sys tree for one process whose counters follow rates per phase (ground truth)."""

    def __init__(self, root, uid=UID, cgroup="/user.slice/job.scope", io=True, psi=True, node_psi=False,
                 switches=False):
        """``psi``: the job's cgroup has pressure files (cgroup v2); ``node_psi``: the I/O stall is written to
        the node's /proc/pressure/io instead (cgroup v1: no pressure per cgroup)."""
        self.proc = os.path.join(root, "proc")
        self.sys = os.path.join(root, "sys")
        self.dir = os.path.join(self.proc, str(PID))
        os.makedirs(self.dir)
        os.makedirs(os.path.join(self.proc, "pressure"))
        self.cg = os.path.join(self.sys, "fs", "cgroup", cgroup.lstrip("/"))
        os.makedirs(self.cg)
        self._write("status", f"Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        self._write("cgroup", f"0::{cgroup}\n")
        self.io, self.psi, self.node_psi, self.switches = io, psi, node_psi, switches
        self.uid = uid
        self.woken = self.preempted = 0.0
        if not io:   # a kernel without task I/O accounting / a file that vanished: no io file at all
            os.symlink("/nonexistent/io", os.path.join(self.dir, "io"))
        self.cpu = self.read = self.io_stall = self.cpu_stall = self.delay = 0.0
        self.flush()

    def _write(self, name, text, base=None):
        with open(os.path.join(base or self.dir, name), "w") as fh:
            fh.write(text)

    def advance(self, seconds, cpu_rate, read_rate=0.0, io_stall=0.0, cpu_stall=0.0, run_delay=0.0, woken=0.0,
                preempted=0.0):
        """Rates per second; ``woken``/``preempted``: the main thread's voluntary / involuntary switches."""
        self.woken += seconds * woken
        self.preempted += seconds * preempted
        self.delay += seconds * run_delay
        self.cpu += seconds * cpu_rate
        self.read += seconds * read_rate
        self.io_stall += seconds * io_stall
        self.cpu_stall += seconds * cpu_stall

    def flush(self):
        if not os.path.isdir(self.dir):
            return
        ticks = int(self.cpu * TCK)
        fields = ["S", "1"] + ["0"] * 9 + [str(ticks // 2), str(ticks - ticks // 2)] + ["0"] * 6 + ["777"] + ["0"] * 20
        self._write("stat", f"{PID} (python3 (train)) " + " ".join(fields) + "\n")
        self._write("schedstat", f"{int(self.cpu * 1e9)} {int(self.delay * 1e9)} 42\n")
        if self.switches:
            u = self.uid
            self._write("status", f"Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t{u}\t{u}\t{u}\t{u}\n"
                                  f"Cpus_allowed_list:\t0-1\nvoluntary_ctxt_switches:\t{int(self.woken)}\n"
                                  f"nonvoluntary_ctxt_switches:\t{int(self.preempted)}\n")
        if self.io:
            self._write("io", f"rchar: {int(self.read)}\nwchar: 0\nsyscr: 1\nsyscw: 0\n"
                              f"read_bytes: {int(self.read)}\nwrite_bytes: 0\ncancelled_write_bytes: 0\n")
        if self.node_psi:
            us = int(self.io_stall * 1e6)
            self._write("io", f"some avg10=0.00 avg60=0.00 avg300=0.00 total={us}\n"
                              f"full avg10=0.00 avg60=0.00 avg300=0.00 total={us}\n",
                        os.path.join(self.proc, "pressure"))
        if self.psi:
            us = int(self.io_stall * 1e6)
            self._write("io.pressure", f"some avg10=0.00 avg60=0.00 avg300=0.00 total={us}\n"
                                       f"full avg10=0.00 avg60=0.00 avg300=0.00 total={us}\n", self.cg)
            self._write("cpu.pressure", f"some avg10=0.00 avg60=0.00 avg300=0.00 total={int(self.cpu_stall * 1e6)}\n",
                        self.cg)


def run_job(fake: FakeProc, wait_rates, compute_rates, steps=20, wait_ms=430, compute_ms=120, pid=PID, uid=UID,
            before_samples=None):
    """A training loop (data_wait, compute per step) sampled every 50 ms by the probe; returns the JobView.

    Rates are (cpu cores, read B/s, io stall share, cpu stall share[, run delay share]) per phase: the truth."""
    ctx, clock = ctx_with_clock(1000 * S)
    probe = InputProbe(ProcReader(fake.proc, fake.sys, clk_tck=TCK), 0.05, clock)
    table = JobTable(phases_cfg(), ctx, own_uid=uid, probe=probe)
    t = clock.t
    dt = 10 * MS
    first = True
    for _ in range(steps):
        phases = []
        for name, ms, rates in (("data_wait", wait_ms, wait_rates), ("compute", compute_ms, compute_rates)):
            a = t
            for _k in range(ms // 10):       # the truth advances in 10 ms ticks; the probe samples every 50 ms
                fake.advance(dt / S, *rates)
                t += dt
                if (t - 1000 * S) % (50 * MS) == 0:
                    fake.flush()
                    probe.sample_once(t)
            phases.append((name, a, t))
        if first and before_samples:
            before_samples()
        table.handle(encode("cnn", phases, [(phases[0][1], t, 64)]), pid, uid, now_ns=t)
        first = False
    clock.t = t + 60 * MS
    fake.flush()
    probe.sample_once(clock.t)
    table.attribute(clock.t, force=True)
    (view,), _, _, _ = table.views(clock.t)
    return view


def test_storage_waits_little_cpu_while_reading(tmp_path):
    fake = FakeProc(str(tmp_path))
    view = run_job(fake, wait_rates=(0.02, 5e6, 0.8, 0.0), compute_rates=(1.0, 0.0, 0.0, 0.0))
    v = view.verdict
    assert v.kind == "input" and v.cause == "storage"
    assert view.input_bound_ratio == pytest.approx(430 / 550)
    w = view.evidence.input_wait
    # sampling starts when the first data_wait arrives (with step 1): waits 1 and 2 began before it
    assert w.wait_s == pytest.approx(18 * 0.43)
    assert w.cpu_ratio == pytest.approx(0.02, abs=0.03)            # 10 ms ticks, 50 ms samples
    assert w.read_bytes / w.wait_s == pytest.approx(5e6, rel=0.05)
    assert w.io_stall_s / w.wait_s == pytest.approx(0.8, abs=0.03)
    assert "cause storage" in v.evidence and "I/O pressure 78 %" in v.evidence
    assert v.recommendation == INPUT_CAUSE_RECOMMENDATIONS["storage"]
    assert "prefetch" in v.recommendation and "local" in v.recommendation and "shard" in v.recommendation
    points = {(p.spec.name, p.labels): p.value for p in PhasesReading((view,), (), (), 0).points()}
    assert points[("teye_job_input_cause", ("cnn", "storage"))] == 1
    assert points[("teye_job_input_cause", ("cnn", "host_cpu"))] == 0
    assert points[("teye_job_input_cause", ("cnn", "unknown"))] == 0
    assert points[("teye_job_input_wait_cpu_ratio", ("cnn",))] == pytest.approx(0.02, abs=0.03)


def test_host_cpu_threads_busy_while_waiting(tmp_path):
    fake = FakeProc(str(tmp_path))
    # two threads decoding during the wait; interval boundaries fall between samples (430/120 ms)
    view = run_job(fake, wait_rates=(1.6, 0.0, 0.0, 0.0), compute_rates=(0.3, 0.0, 0.0, 0.0))
    v = view.verdict
    assert v.kind == "input" and v.cause == "host_cpu"
    assert view.input_wait_cpu_ratio == pytest.approx(1.6, abs=0.1)
    assert "threads are busy while it waits" in v.evidence
    assert "num_parallel_calls" in v.recommendation and "vectorize" in v.recommendation and "cache" in v.recommendation


def test_host_cpu_when_starved_of_cpu(tmp_path):
    fake = FakeProc(str(tmp_path))
    view = run_job(fake, wait_rates=(0.1, 0.0, 0.0, 0.9), compute_rates=(1.0, 0.0, 0.0, 0.0))
    assert view.verdict.cause == "host_cpu" and "wait for a CPU" in view.verdict.evidence


def test_host_cpu_when_the_decoding_thread_waits_on_the_run_queue(tmp_path):
    """A decoder in the training thread on a saturated host: 0.3 core used, runnable the rest of the wait."""
    fake = FakeProc(str(tmp_path), psi=False)
    view = run_job(fake, wait_rates=(0.3, 0.0, 0.0, 0.0, 0.65), compute_rates=(1.0, 0.0, 0.0, 0.0, 0.0))
    assert view.verdict.cause == "host_cpu", view.verdict.evidence
    assert "starved of CPU" in view.verdict.evidence and "main thread waiting for a CPU 6" in view.verdict.evidence
    assert view.evidence.input_wait.run_delay_s / view.evidence.input_wait.wait_s == pytest.approx(0.65, abs=0.03)


def test_a_waiter_woken_into_a_loaded_run_queue_is_not_starved(tmp_path):
    """Issue 39: a pipeline that sleeps (the training thread blocks on its queue, 200 wake-ups a second) on a
    host loaded by other processes: its main thread queues for a CPU after each wake-up (60 % of the wait),
    which is the neighbours' load, not the job's demand; only the share after preemptions (5 of 205
    switches) counts.  The cause stays unknown, as without the neighbours."""
    fake = FakeProc(str(tmp_path), psi=False, switches=True)
    view = run_job(fake, wait_rates=(0.1, 0.0, 0.0, 0.0, 0.6, 200, 5), compute_rates=(1.0, 0.0, 0.0, 0.0, 0.0, 1, 50))
    assert view.verdict.cause == "unknown", view.verdict.evidence
    w = view.evidence.input_wait
    assert w.run_delay_s / w.wait_s == pytest.approx(0.6 * 5 / 205, abs=0.01)
    assert "main thread waiting for a CPU" in view.verdict.evidence and w.run_delay_s / w.wait_s < 0.03


def test_a_decoder_preempted_by_the_neighbours_is_starved(tmp_path):
    """The same load on a decoder in the training thread: preempted 200 times a second while it works,
    woken twice: its run-queue wait is CPU it wanted (host_cpu), as before."""
    fake = FakeProc(str(tmp_path), psi=False, switches=True)
    view = run_job(fake, wait_rates=(0.3, 0.0, 0.0, 0.0, 0.65, 2, 200), compute_rates=(1.0, 0.0, 0.0, 0.0, 0.0, 1, 50))
    assert view.verdict.cause == "host_cpu" and "starved of CPU" in view.verdict.evidence, view.verdict.evidence
    w = view.evidence.input_wait
    assert w.run_delay_s / w.wait_s == pytest.approx(0.65 * 200 / 202, abs=0.02)


def test_starved_delay_by_hand():
    assert cause.starved_delay(0.6, 95, 5) == pytest.approx(0.03)
    assert cause.starved_delay(0.6, 0, 0) == 0.6          # no switch in the interval: all of it
    assert cause.starved_delay(0.6, None, 3) == 0.6       # counts unknown: as before
    assert cause.starved_delay(None, 1, 1) is None


def test_compute_bound_job_has_no_cause(tmp_path):
    fake = FakeProc(str(tmp_path))
    view = run_job(fake, wait_rates=(0.0, 0.0, 0.0, 0.0), compute_rates=(1.0, 0.0, 0.0, 0.0), wait_ms=20,
                   compute_ms=500)
    points = {(p.spec.name, p.labels): p.value for p in PhasesReading((view,), (), (), 0).points()}
    assert view.verdict.kind == "compute" and view.verdict.cause is None
    assert not any(name == "teye_job_input_cause" for name, _ in points)


class FakeProcWithWorker(FakeProc):
    """The sender and one DataLoader-style worker (its child, in task/<pid>/children): the rates go to the
    worker, the sender itself only waits (0.02 core) and reads nothing."""

    WORKER = 4343

    def __init__(self, root, **kw):
        super().__init__(root, **kw)
        self.wdir = os.path.join(self.proc, str(self.WORKER))
        os.makedirs(self.wdir)
        os.makedirs(os.path.join(self.dir, "task", str(PID)))
        os.makedirs(os.path.join(self.wdir, "task", str(self.WORKER)))
        self._write(os.path.join("task", str(PID), "children"), f"{self.WORKER} \n")
        self._write(os.path.join("task", str(self.WORKER), "children"), "", self.wdir)
        self.own = 0.0
        self.flush()

    def advance(self, seconds, cpu_rate, read_rate=0.0, io_stall=0.0, cpu_stall=0.0, run_delay=0.0):
        self.own = getattr(self, "own", 0.0) + seconds * 0.02
        super().advance(seconds, cpu_rate, read_rate, io_stall, cpu_stall, run_delay)

    def flush(self):
        if not hasattr(self, "wdir"):
            return super().flush()
        worker, self.cpu, self.read = (self.cpu, self.read), self.own, 0.0
        super().flush()                       # the sender: its own 0.02 core, no reads
        self.cpu, self.read = worker
        ticks = int(self.cpu * TCK)           # the worker: utime, stime (and cutime, cstime 0)
        fields = ["S", str(PID)] + ["0"] * 9 + [str(ticks), "0", "0", "0"] + ["0"] * 4 + ["888"] + ["0"] * 20
        self._write("stat", f"{self.WORKER} (pt_data_worker) " + " ".join(fields) + "\n", self.wdir)
        self._write("io", f"rchar: {int(self.read)}\nwchar: 0\nsyscr: 1\nsyscw: 0\nread_bytes: {int(self.read)}\n"
                          f"write_bytes: 0\ncancelled_write_bytes: 0\n", self.wdir)


def test_host_cpu_when_a_dataloader_worker_is_busy_while_the_sender_waits(tmp_path):
    """The sender sleeps in next() while its worker process decodes (one core, no I/O): host_cpu, from the
    worker's CPU; the sender's own 0.02 core alone would say nothing of the kind."""
    fake = FakeProcWithWorker(str(tmp_path))
    view = run_job(fake, wait_rates=(1.0, 0.0, 0.0, 0.0), compute_rates=(0.0, 0.0, 0.0, 0.0))
    assert view.verdict.kind == "input" and view.verdict.cause == "host_cpu", view.verdict.evidence
    assert view.input_wait_cpu_ratio == pytest.approx(1.02, abs=0.1)   # the worker's core + the sender's 0.02


def test_worker_reads_count_as_the_senders(tmp_path):
    """A worker reading 5 MB/s from a slow file system with little CPU: storage, the reads are the worker's."""
    fake = FakeProcWithWorker(str(tmp_path))
    view = run_job(fake, wait_rates=(0.05, 5e6, 0.0, 0.0), compute_rates=(0.0, 0.0, 0.0, 0.0))
    assert view.verdict.cause == "storage", view.verdict.evidence
    w = view.evidence.input_wait
    assert w.read_bytes / w.wait_s == pytest.approx(5e6, rel=0.05)


def test_a_wait_with_idle_cpus_and_no_io_is_unknown_not_storage(tmp_path):
    """A sleep in __getitem__ (or a lock, a remote service): little CPU, no reads, no I/O pressure. Nothing
    says storage, so the cause is unknown with that reason (it was called storage)."""
    fake = FakeProc(str(tmp_path))
    view = run_job(fake, wait_rates=(0.01, 0.0, 0.0, 0.0), compute_rates=(1.0, 0.0, 0.0, 0.0))
    _unknown(view, "idle CPUs and no storage I/O")
    assert "read 0.0 MB/s" in view.verdict.evidence and "I/O pressure 0 %" in view.verdict.evidence


def test_io_pressure_without_reads_is_storage(tmp_path):
    """Reads the task counters cannot see (an NFS client's page cache misses are paid in I/O stall): storage."""
    fake = FakeProc(str(tmp_path))
    view = run_job(fake, wait_rates=(0.01, 0.0, 0.6, 0.0), compute_rates=(1.0, 0.0, 0.0, 0.0))
    w = view.evidence.input_wait
    assert view.verdict.cause == "storage", view.verdict.evidence
    assert w.read_bytes == 0 and w.io_stall_s / w.wait_s == pytest.approx(0.6, abs=0.03)


def test_the_nodes_io_pressure_is_no_evidence_where_the_jobs_own_reads_are_seen(tmp_path):
    """cgroup v1: no pressure per cgroup, only the node's.  A job that sleeps while another process's I/O
    stalls the node (a checkpoint next door) reads nothing itself: its waits are not storage.  Where its own
    reads cannot be seen, the node's pressure is the evidence left, and it counts."""
    seen = FakeProc(str(tmp_path / "seen"), psi=False, node_psi=True)
    view = run_job(seen, wait_rates=(0.01, 0.0, 0.6, 0.0), compute_rates=(1.0, 0.0, 0.6, 0.0))
    _unknown(view, "idle CPUs and no storage I/O")
    assert view.evidence.input_wait.read_bytes == 0 and view.evidence.input_wait.io_stall_s is None
    blind = FakeProc(str(tmp_path / "blind"), psi=False, node_psi=True, io=False)
    view = run_job(blind, wait_rates=(0.01, 0.0, 0.6, 0.0), compute_rates=(1.0, 0.0, 0.0, 0.0))
    w = view.evidence.input_wait
    assert view.verdict.cause == "storage", view.verdict.evidence
    assert w.read_bytes is None and w.io_stall_s / w.wait_s == pytest.approx(0.6, abs=0.03)


def test_descendants_are_bounded_and_found_recursively(tmp_path):
    proc = tmp_path / "proc"
    for pid, kids in ((1, "2 3"), (2, "4"), (3, ""), (4, "")):
        (proc / str(pid) / "task" / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "task" / str(pid) / "children").write_text(kids + " \n")
    (proc / "1" / "task" / "9").mkdir()                       # a second thread of pid 1 with its own child
    (proc / "1" / "task" / "9" / "children").write_text("5\n")
    r = ProcReader(str(proc), str(tmp_path / "sys"), clk_tck=TCK)
    assert sorted(r.descendants(1)) == [2, 3, 4, 5]
    assert len(r.descendants(1, limit=2)) == 2
    assert r.descendants(77) == []                            # gone, or a kernel without the children file


# -- bad input: the cause is unknown with the reason, the rest of the verdict stands ----------------
def _unknown(view, reason):
    v = view.verdict
    assert v.kind == "input" and v.cause == "unknown", v.evidence
    assert reason in v.evidence, v.evidence
    assert view.input_bound_ratio == pytest.approx(430 / 550)     # the rest of the verdict stands
    assert "data_wait 78 % of step time" in v.evidence


def test_pid_vanished(tmp_path):
    fake = FakeProc(str(tmp_path))
    view = run_job(fake, (0.02, 0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0), steps=5,
                   before_samples=lambda: os.rename(fake.dir, fake.dir + ".gone"))
    _unknown(view, f"pid {PID} exited")


def test_pid_reused_by_another_process(tmp_path):
    fake = FakeProc(str(tmp_path))

    def reuse():  # same pid, later start time: the sender exited and another process got its pid
        orig = fake.flush

        def flush():
            orig()
            with open(os.path.join(fake.dir, "stat")) as fh:
                text = fh.read()
            with open(os.path.join(fake.dir, "stat"), "w") as fh:
                fh.write(text.replace(" 777 ", " 999 "))
        fake.flush = flush
    ctx, clock = ctx_with_clock(1000 * S)
    probe = InputProbe(ProcReader(fake.proc, fake.sys, clk_tck=TCK), 0.05, clock)
    probe.track(PID, UID, clock.t)
    probe.sample_once(clock.t)
    reuse()
    fake.flush()
    probe.sample_once(clock.t + 50 * MS)
    samples, problem, gone = probe.samples(PID)
    assert len(samples) == 1 and gone and "now belongs to a newer process" in problem


def test_sender_in_another_pid_namespace(tmp_path):
    fake = FakeProc(str(tmp_path), uid=0)     # /proc/4242 here is root's process, the sender is uid 1000
    view = run_job(fake, (0.02, 0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0), steps=5)
    _unknown(view, "belongs to uid 0, the sender is uid 1000: the sender lives in another pid namespace")


def test_sender_outside_our_pid_namespace_pid_zero(tmp_path):
    fake = FakeProc(str(tmp_path))
    view = run_job(fake, (0.02, 0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0), steps=5, pid=0)
    _unknown(view, "outside the agent's pid namespace")


def test_io_unreadable_low_cpu_is_unknown_but_busy_cpu_is_still_host_cpu(tmp_path):
    fake = FakeProc(str(tmp_path / "a"), io=False, psi=False)
    view = run_job(fake, (0.02, 0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0), steps=5)
    _unknown(view, "the reads cannot be seen: no ")
    assert view.evidence.input_wait.io_stall_s is None and view.evidence.input_wait.read_bytes is None
    fake = FakeProc(str(tmp_path / "b"), io=False, psi=False)
    view = run_job(fake, (1.5, 0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0), steps=5)
    assert view.verdict.cause == "host_cpu"     # busy threads need no I/O figures


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to setuid() the child to nobody")
def test_real_proc_io_of_another_user_is_permission_denied():
    """The real kernel: nobody cannot read root's /proc/<pid>/io (ptrace access check)."""
    parent = os.getpid()
    r, w = os.pipe()
    child = os.fork()
    if child == 0:   # the child drops to nobody and reads its root-owned parent (modules already imported)
        try:
            os.setgid(65534)
            os.setuid(65534)
            reader = ProcReader("/proc")
            rb, why = reader.read_bytes(parent)
            cpu = reader.sample(parent, 1, None)[0].cpu_s
            os.write(w, f"{rb}|{why}|{cpu > 0}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        out = fh.read()
    os.waitpid(child, 0)
    rb, why, cpu_ok = out.split("|")
    assert rb == "None" and why.startswith(f"cannot read /proc/{parent}/io: permission denied")
    assert cpu_ok == "True"     # /proc/<pid>/stat stays readable: CPU is still measured


def test_no_probe_samples_at_all():
    assert input_cause(None)[0] == "unknown"
    assert input_cause(InputWait(problem="pid 7 exited"))[1] == "cause unknown: pid 7 exited"


# -- interpolation (pure) ---------------------------------------------------------------------------
def test_wait_usage_interpolates_between_samples():
    smp = [ProcSample(0, 0.0, 0, 0.0, None), ProcSample(100, 1.0, 1000, 0.5, None),
           ProcSample(200, 1.0, 3000, 0.5, None)]
    u = cause.wait_usage(smp, 50, 150)
    assert u.cpu_s == pytest.approx(0.5) and u.read_bytes == 1500 and u.io_stall_s == pytest.approx(0.25)
    assert u.cpu_stall_s is None
    assert cause.wait_usage(smp, 150, 250) is None and cause.wait_usage(smp, -1, 50) is None
    assert cause.wait_usage(smp, 100, 200).cpu_s == 0.0
    assert cause.wait_usage(smp, 50, 150, [0, 100, 200]) == u   # the times the caller took once per pid


def test_probe_thread_sleeps_until_a_sender_is_tracked(tmp_path):
    """No job reports data_wait: the probe's thread takes no sample at all (it used to wake 20 times a
    second for nothing); the first tracked sender starts the sampling, close() ends a sleeping thread."""
    import threading
    import time
    calls = []
    probe = InputProbe(ProcReader("/proc", "/sys"), 0.01)
    real = probe.sample_once
    probe.sample_once = lambda now_ns=None: (calls.append(1), real(now_ns))
    probe.start()
    try:
        time.sleep(0.3)
        assert calls == []                     # 30 intervals went by with nobody to sample
        probe.track(os.getpid(), os.getuid(), time.monotonic_ns())
        deadline = time.monotonic() + 5
        while probe.samples_taken < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert probe.samples_taken >= 3        # this process, sampled from real /proc
        smp, problem, gone = probe.samples(os.getpid())
        assert not gone and smp and smp[-1].cpu_s > 0
    finally:
        probe.close()
    assert not [t for t in threading.enumerate() if t.name == "teye-input-probe"]
