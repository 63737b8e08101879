"""A job's own CPU time from its processes (agent.phases.jobcpu; issue 47: the job's CPU outside Slurm).

The oracle is the fixture tree: every figure is the ticks written into /proc/<pid>/stat, over USER_HZ."""
import dataclasses
import os
import shutil

from agent.phases.jobcpu import CpuWatch
from agent.phases.jobs import JobTable
from agent.phases.procstat import ProcReader
from tests.phases.helpers import S, ctx_with_clock, phases_cfg
from agent.phases.source import PhasesReading
from agent.sampler import Sampler
from exporters.prometheus import make_registry
from prometheus_client import generate_latest
from tests.conftest import parse_exposition
from tests.phases.test_jobs import _Src, _get
from tests.phases.test_parts import _msg

TCK = os.sysconf("SC_CLK_TCK")


class Tree:
    """A /proc of processes: pid -> (own ticks, reaped ticks, start, children, allowed CPUs)."""

    def __init__(self, root):
        self.root = str(root)

    def proc(self, pid, own, reaped=0, start=1000, kids=(), cpus="0-1", state="S"):
        d = os.path.join(self.root, str(pid))
        os.makedirs(os.path.join(d, "task", str(pid)), exist_ok=True)
        fields = [state, "1", str(pid), str(pid), "0", "-1", "0", "0", "0", "0", "0", str(own // 2),
                  str(own - own // 2), str(reaped // 2), str(reaped - reaped // 2), "20", "0", "3", "0", str(start),
                  "1000", "100"]
        with open(os.path.join(d, "stat"), "w") as f:
            f.write(f"{pid} (python3 (a job)) " + " ".join(fields) + "\n")
        with open(os.path.join(d, "task", str(pid), "children"), "w") as f:
            f.write(" ".join(map(str, kids)) + (" " if kids else ""))
        with open(os.path.join(d, "status"), "w") as f:
            f.write(f"Name:\tpython3\nCpus_allowed:\tf\nCpus_allowed_list:\t{cpus}\nvoluntary_ctxt_switches:\t1\n")

    def gone(self, pid):
        shutil.rmtree(os.path.join(self.root, str(pid)))


def _exposition(reading):
    sampler = Sampler({"phases": (_Src(reading), 1.0)})
    sampler.read_once("phases")
    return parse_exposition(generate_latest(make_registry(lambda: sampler.snapshot)).decode())


def _views(table, clock, ranks=((0, 500), (1, 501))):
    t = clock.t - 10 * S
    for rank, pid in ranks:
        table.handle(_msg(t, rank=rank)[0], pid, 0)
    return table.views(clock.t)[0]


def test_a_jobs_cpu_is_its_ranks_their_reaped_children_and_live_descendants(tmp_path):
    tr = Tree(tmp_path)
    tr.proc(500, own=400, reaped=50, kids=[600], cpus="0-3")
    tr.proc(600, own=200, reaped=0, kids=[601])          # a DataLoader worker and a decoder it started
    tr.proc(601, own=100)
    tr.proc(501, own=300, cpus="2-5")
    tr.proc(700, own=9999)                                # another job's process: never counted
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    views = _views(table, clock)
    w = CpuWatch(ProcReader(tr.root))
    (c,) = w.observe(views, clock.t)
    assert c.train_job == "j" and c.seconds == (400 + 50 + 200 + 100 + 300) / TCK
    assert c.cpus == 6                                    # {0..3} | {2..5}

    # one second later the worker has ended and is reaped: its seconds (and its child's, and 50 more ticks) are in
    # the rank's cutime, read in the same pass; it is no longer readable: counted once
    clock.t += S
    tr.gone(600)
    tr.gone(601)
    tr.proc(500, own=450, reaped=50 + 350, kids=[], cpus="0-3")
    (c,) = w.observe(views, clock.t)
    assert c.seconds == (450 + 400 + 300) / TCK
    # a new worker, found at the next lookup of its descendants (every 5 s), counts from its own start
    tr.proc(500, own=460, reaped=400, kids=[602], cpus="0-3")
    tr.proc(602, own=70, start=3000)
    clock.t += S
    assert w.observe(views, clock.t)[0].seconds == (460 + 400 + 300) / TCK      # not looked up yet
    clock.t += 5 * S
    assert w.observe(views, clock.t)[0].seconds == (460 + 400 + 70 + 300) / TCK
    # it ends unreaped-then-reaped and its pid goes to a stranger before the next lookup: the stranger is not the
    # job's (its start time differs); the worker's 80 ticks are in the rank's cutime
    tr.proc(602, own=5000, start=4000)
    tr.proc(500, own=460, reaped=480, kids=[602], cpus="0-3")
    clock.t += S
    (c,) = w.observe(views, clock.t)
    assert c.seconds == (460 + 480 + 300) / TCK
    tr.gone(602)
    tr.proc(500, own=450, reaped=400, kids=[], cpus="0-3")    # (a reading that falls: the figure holds)
    assert w.observe(views, clock.t + S)[0].seconds == (460 + 480 + 300) / TCK
    tr.proc(500, own=460, reaped=480, kids=[], cpus="0-3")

    # rank 1 exits: its last figure stays in the job's sum; its pid is reused by a new process: counted beside it
    tr.gone(501)
    clock.t += S
    (c,) = w.observe(views, clock.t)
    assert c.seconds == (460 + 480 + 300) / TCK
    tr.proc(501, own=30, start=5000, cpus="2-5")
    clock.t += S
    (c,) = w.observe(views, clock.t)
    assert c.seconds == (460 + 480 + 300 + 30) / TCK

    # exported as counters of the job
    m = _exposition(PhasesReading(views, (), (), 0, "", cpu=(c,)))
    assert _get(m, "teye_job_cpu_seconds_total", train_job="j") == (460 + 480 + 300 + 30) / TCK
    assert _get(m, "teye_job_cpus", train_job="j") == 6


def test_a_figure_never_falls_and_an_ended_job_keeps_its_last(tmp_path):
    tr = Tree(tmp_path)
    tr.proc(500, own=400, kids=[600])
    tr.proc(600, own=200)
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    views = _views(table, clock, ranks=((0, 500),))
    w = CpuWatch(ProcReader(tr.root))
    assert w.observe(views, clock.t)[0].seconds == 600 / TCK
    # the worker exits unreaped and unseen (a double fork): its seconds are nowhere now, the figure holds
    tr.gone(600)
    tr.proc(500, own=410, kids=[])
    clock.t += 6 * S
    assert w.observe(views, clock.t)[0].seconds == 610 / TCK
    # the job ended: no reading, the last figure (the process's files would say otherwise)
    tr.proc(500, own=9000)
    ended = tuple(dataclasses.replace(v, ended=True) for v in views)
    assert w.observe(ended, clock.t + S)[0].seconds == 610 / TCK
    # a job gone from the table is forgotten
    assert w.observe((), clock.t + 2 * S) == () and not w.jobs and not w.last


def test_a_rank_started_by_another_rank_counts_once(tmp_path):
    tr = Tree(tmp_path)
    tr.proc(500, own=400, kids=[501])
    tr.proc(501, own=300, kids=[601])
    tr.proc(601, own=100)
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    (c,) = CpuWatch(ProcReader(tr.root)).observe(_views(table, clock), clock.t)
    assert c.seconds == (400 + 300 + 100) / TCK


def test_unreadable_processes_give_no_figure_and_nothing_raises(tmp_path):
    tr = Tree(tmp_path)
    os.makedirs(os.path.join(tr.root, "500"))
    with open(os.path.join(tr.root, "500", "stat"), "w") as f:
        f.write("500 (python3) S 1 2\n")                  # cut short
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    (c,) = CpuWatch(ProcReader(tr.root)).observe(_views(table, clock), clock.t)   # 501 has no directory at all
    assert c.seconds is None and c.cpus is None          # never read: no figure (not 0 s)
