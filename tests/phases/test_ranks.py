"""Ranks of data-parallel jobs (issue 30): the wire fields, the client's detection, the job table's per-rank
sums, the critical rank, and the bad inputs of the issue.  Oracles: the intervals each test sends."""
from __future__ import annotations

import json

import pytest

from agent.phases import ranks
from agent.phases.jobs import MAX_PIDS, JobTable
from agent.phases.protocol import Rejected, decode_python, encode, identity_of
from agent.phases.verdict import Evidence, Thresholds
from teye_client import reporter as rep_mod
from tests.phases.helpers import MS, S, ctx_with_clock, phases_cfg


# -- the client finds its rank -------------------------------------------------------------------
@pytest.mark.parametrize("env,rank,world", [
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}, 3, 4),
    ({"RANK": "3", "WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, 3, 4),  # torchrun inside srun
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8"}, 5, 8),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, 1, 2),
    ({"RANK": " 2 "}, 2, None),                                 # no size: the rank alone
    # TensorFlow's MultiWorkerMirroredStrategy: the chief first, then the workers (issue 37)
    ({"TF_CONFIG": '{"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "task": {"type": "worker", '
                   '"index": 1}}'}, 2, 3),
    ({"TF_CONFIG": '{"cluster": {"worker": ["b:1", "c:1"]}, "task": {"type": "worker", "index": 0}}'}, 0, 2),
])
def test_rank_from_the_launchers_variables(env, rank, world):
    assert rep_mod.rank_from_env(env)[:2] == (rank, world)


@pytest.mark.parametrize("env,why", [
    ({"WORLD_SIZE": "4"}, "WORLD_SIZE is set without RANK"),
    ({"RANK": "three", "WORLD_SIZE": "4"}, "RANK='three' is not an integer"),
    ({"RANK": "1.5"}, "is not an integer"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, "not a rank of the job"),
    ({"RANK": "-1", "WORLD_SIZE": "4"}, "not a rank of the job"),
    ({"RANK": "0", "WORLD_SIZE": "x"}, "WORLD_SIZE='x' is not an integer"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, "one rank, not a data-parallel job"),
    ({}, "no launcher rank variable set"),
    ({"TF_CONFIG": "{not json"}, "TF_CONFIG is not the JSON"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}'},
     "task type 'ps': not a training rank"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}'}, "one task"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}'},
     "not a rank of its cluster"),
])
def test_bad_rank_variables_give_no_rank_and_say_why(env, why):
    rank, world, said = rep_mod.rank_from_env(env)
    assert (rank, world) == (None, None) and why in said


def test_the_reporter_sends_its_rank_once_per_connection(listener, monkeypatch):
    path, sock = listener
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    r = rep_mod.Reporter("ddp", path, flush_ms=0)
    r.step(8, 1000, 2000)
    r.step(8, 2000, 3000)
    first, second = json.loads(sock.recv(65536)), json.loads(sock.recv(65536))
    assert (first["rank"], first["world"]) == (2, 4) and "rank" not in second and "world" not in second
    r.close()  # a new connection (maybe a new agent): says it again
    r.step(8, 3000, 4000)
    assert json.loads(sock.recv(65536))["rank"] == 2
    monkeypatch.setenv("RANK", "x")
    bad = rep_mod.Reporter("ddp", path, flush_ms=0)
    bad.step(8, 1000, 2000)
    assert "rank" not in json.loads(sock.recv(65536)) and "not an integer" in bad.rank_why
    explicit = rep_mod.Reporter("ddp", path, flush_ms=0, rank=1, world_size=2)
    explicit.step(8, 1000, 2000)
    assert (json.loads(sock.recv(65536))["rank"], explicit.rank_why) == (1, "given")


# -- the wire ------------------------------------------------------------------------------------
NOW = 1000 * S


def test_rank_fields_are_checked_and_read():
    ok = encode("j", steps=[(NOW - S, NOW - S // 2, 8)], rank=3, world=4)
    decode_python(ok, NOW)
    assert identity_of(ok)[1:] == (3, 4) and identity_of(encode("j"))[1:] == (None, None)
    bad = {
        b'{"v":1,"job":"j","world":4}': "missing_field",
        b'{"v":1,"job":"j","rank":"3"}': "wrong_type",
        b'{"v":1,"job":"j","rank":1.0}': "wrong_type",
        b'{"v":1,"job":"j","rank":true}': "wrong_type",
        b'{"v":1,"job":"j","rank":-1}': "bad_value",
        b'{"v":1,"job":"j","rank":4,"world":4}': "bad_value",
        b'{"v":1,"job":"j","rank":2000000}': "bad_value",
    }
    for data, reason in bad.items():
        with pytest.raises(Rejected) as e:
            decode_python(data, NOW)
        assert e.value.reason == reason, data


# -- the job table -------------------------------------------------------------------------------
def table(**cfg):
    ctx, clock = ctx_with_clock(NOW)
    return JobTable(phases_cfg(**cfg), ctx, own_uid=0), clock


def send_steps(t, job, pid, rank, n, wait_ms, step_ms=100, t0=NOW - 30 * S, world=4, first=True, end=None):
    """n steps of step_ms, the first wait_ms of each in data_wait; rank sent with the first datagram."""
    for k in range(n):
        s = t0 + k * step_ms * MS
        w = s + wait_ms * MS
        e = s + step_ms * MS
        said = first and k == 0
        assert t.handle(encode(job, [("data_wait", s, w), ("compute", w, e)], [(s, e, 8)],
                               rank=rank if said else None, world=world if said and rank is not None else None),
                        pid, 0, NOW if end is None else end) == "accepted"


def view(t, now=NOW):
    return {j.train_job: j for j in t.views(now)[0]}


def test_the_straggler_is_the_jobs_verdict_and_steps_count_once():
    t, _ = table()
    for r in range(4):
        send_steps(t, "ddp", 100 + r, r, 50, 79 if r == 3 else 2)
    j = view(t)["ddp"]
    assert (j.critical_rank, j.verdict.kind, j.world_size) == (3, "input", 4)
    assert j.input_bound_ratio == pytest.approx(0.79)
    assert j.verdict.evidence.startswith("rank 3 (pid 103) waits 79 % of its step on input; ranks 0–2 wait for it")
    assert (j.steps, j.step_hist.count, j.samples) == (50, 50, 4 * 50 * 8)
    assert [(r.rank, r.steps, round(r.input_bound_ratio, 2)) for r in j.ranks] == \
        [(0, 50, 0.02), (1, 50, 0.02), (2, 50, 0.02), (3, 50, 0.79)]
    assert dict(j.ranks[3].phase_seconds)["data_wait"] == pytest.approx(50 * 0.079)


def test_a_job_without_ranks_is_judged_as_before():
    t, _ = table()
    for r in range(4):
        send_steps(t, "plain", 100 + r, None, 50, 79 if r == 3 else 2)
    j = view(t)["plain"]
    assert (j.critical_rank, j.ranks, j.steps) == (None, (), 200)
    assert j.input_bound_ratio == pytest.approx((79 + 3 * 2) / 400)


def test_a_rank_that_dies_mid_run_expires_and_the_others_go_on():
    t, clock = table(job_expiry_seconds=60)
    for r in range(3):
        send_steps(t, "ddp", 100 + r, r, 20, 50 if r == 2 else 2)
    assert view(t)["ddp"].critical_rank == 2
    # rank 2 dies; ranks 0 and 1 go on for 70 s (restarted without it)
    later = NOW + 70 * S
    for r in range(2):
        send_steps(t, "ddp", 100 + r, r, 20, 2, t0=later - 5 * S, first=False, end=later)
    j = view(t, later)["ddp"]
    # the two left wait alike: nobody is named (issue 39)
    assert [r.rank for r in j.ranks] == [0, 1] and j.critical_rank is None and j.verdict.kind == "compute"
    assert 102 not in t.rank_pids


def test_a_rank_that_never_steps_sets_nobodys_pace():
    t, _ = table()
    for r in range(2):
        send_steps(t, "ddp", 100 + r, r, 20, 2)
    # a parameter server: rank 2 waits a lot, reports phases, never a step
    assert t.handle(encode("ddp", [("data_wait", NOW - 10 * S, NOW - S)], rank=2, world=3), 102, 0, NOW) == "accepted"
    j = view(t)["ddp"]
    assert j.critical_rank is None and j.verdict.kind == "compute" and len(j.ranks) == 3


def test_ranks_with_different_job_names_and_two_jobs_on_a_node_stay_apart():
    t, _ = table()
    send_steps(t, "a", 100, 0, 20, 60, world=2)
    send_steps(t, "a", 101, 1, 20, 2, world=2)
    send_steps(t, "b", 200, 0, 20, 2, world=2)
    send_steps(t, "b", 201, 1, 20, 2, world=2)
    send_steps(t, "c", 300, 1, 20, 2, world=2)   # a rank of "a" launched under another name: its own job
    jobs = view(t)
    assert (jobs["a"].critical_rank, jobs["a"].verdict.kind, jobs["a"].steps) == (0, "input", 20)
    assert (jobs["b"].verdict.kind, jobs["b"].steps) == ("compute", 20)
    assert [r.rank for r in jobs["c"].ranks] == [1] and jobs["c"].critical_rank == 1
    assert "the only rank of the job on this node" in jobs["c"].verdict.evidence


def test_a_restarted_rank_replaces_the_old_process():
    t, _ = table()
    send_steps(t, "ddp", 100, 0, 10, 2, world=2)
    send_steps(t, "ddp", 101, 1, 10, 2, world=2)
    send_steps(t, "ddp", 102, 1, 10, 50, world=2, t0=NOW - 10 * S)
    j = view(t)["ddp"]
    assert [(r.rank, r.pid) for r in j.ranks] == [(0, 100), (1, 102)] and 101 not in t.rank_pids


def test_more_ranks_than_the_process_limit_are_bounded():
    t, _ = table()
    for r in range(MAX_PIDS + 6):
        send_steps(t, "big", 1000 + r, r, 2, 2, world=MAX_PIDS + 6)
    j = view(t)["big"]
    assert len(j.ranks) == MAX_PIDS and j.processes == MAX_PIDS and j.steps == 2 and j.samples == 8 * 2 * 70
    assert "(6 more ranks on this node beyond the limit of 64 per job are not judged)" in j.verdict.evidence
    assert len(t.rank_pids) == MAX_PIDS + 6


def test_ranked_datagrams_take_the_python_path_after_the_first(monkeypatch):
    """After the rank, a process's datagrams carry none: handle_batch must still give them to the Python
    path, or the rank's sums would miss them."""
    t, _ = table()
    batch = []
    for k in range(10):
        s = NOW - 20 * S + k * 100 * MS
        batch.append((encode("ddp", [("data_wait", s, s + 40 * MS)], [(s, s + 100 * MS, 8)],
                             rank=1 if k == 0 else None, world=2 if k == 0 else None), 101, 0))
    t.handle_batch(batch)
    (r,) = view(t)["ddp"].ranks
    assert (r.steps, round(r.input_bound_ratio, 3)) == (10, 0.4)


# -- the rules (pure) ----------------------------------------------------------------------------
def ev(wait=0.0, host=0.0, comm=0.0, step=10.0, silent=0.0):
    phases = {"data_wait": wait, "host": host, "communication": comm, "compute": step - wait - host - comm}
    return Evidence(window_s=60, phase_seconds={k: v for k, v in phases.items() if v}, step_seconds=step,
                    steps=100, silent_s=silent)


def R(rank, e):
    return ranks.RankEvidence(rank, 100 + rank, (str(rank),), e)


def test_communication_names_the_rank_the_others_wait_for():
    c = ranks.judge([R(0, ev(comm=6)), R(1, ev(comm=0.3)), R(2, ev(comm=5.4))])
    assert (c.rank.rank, c.waiting, c.verdict.kind) == (1, (0, 2), "compute")
    assert c.verdict.evidence.startswith("rank 1 (pid 101, GPU 1) computes 97 ms per step and spends the least of "
                                         "its step in communication (3 %); ranks 0, 2 wait for it in their "
                                         "collectives, 57 ms per step")


def test_ranks_that_exchange_alike_name_nobody_by_communication():
    """Issue 37: every rank of a balanced DDP job spends a few points in the exchange; the least of them is
    noise, not the rank the others wait for (the spread must reach communication_threshold)."""
    c = ranks.judge([R(0, ev(comm=0.6, wait=0.1)), R(1, ev(comm=0.5, wait=0.2)), R(2, ev(comm=0.7))])
    assert c.verdict.evidence.startswith("no rank waits on its own input or host work (0–2 % of its step) and their "
                                         "communication shares differ by less than 20 points: the 3 ranks on this "
                                         "node are even, none holds the others back; ")
    assert not c.named and "rank 1" not in c.verdict.evidence   # no rank picked from waits under 1 %
    assert ranks.choose([R(0, ev(comm=2.4)), R(1, ev(comm=0.5))])[1] == ranks.NONE_WAITS  # 19 points apart
    assert ranks.choose([R(0, ev(comm=2.5)), R(1, ev(comm=0.5))])[1] == ranks.COMMUNICATION  # 20 points
    assert ranks.choose([R(0, ev(comm=9))])[1] == ranks.NONE_WAITS  # one rank: nobody to wait for


def test_host_wait_and_stalled_ranks():
    c = ranks.judge([R(0, ev(host=4)), R(1, ev(wait=1)), R(2, ev(wait=9, silent=60))])
    assert (c.rank.rank, c.verdict.kind, c.waiting) == (0, "host", (1,))  # rank 2 stalled: not a candidate
    assert ranks.judge([R(0, ev(step=0.0))]) is None
    assert ranks.ranges([0, 1, 2, 5, 7, 8]) == "0–2, 5, 7, 8"
    assert ranks.choose([R(0, ev(wait=1)), R(1, ev(wait=1))], Thresholds())[0].rank == 0  # ties: the lowest


def test_without_launcher_variables_the_rank_comes_from_torch_distributed_once_initialised(listener, monkeypatch):
    """A process group made by the script itself (init_process_group with explicit rank and world size): the
    reporter finds it at its next flush, never importing torch itself."""
    import sys
    import types
    path, sock = listener
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    dist = types.ModuleType("torch.distributed")
    state = {"init": False}
    dist.is_available = lambda: True
    dist.is_initialized = lambda: state["init"]
    dist.get_rank = lambda: 6
    dist.get_world_size = lambda: 8
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    r = rep_mod.Reporter("ddp", path, flush_ms=0)
    r.step(8, 1000, 2000)
    assert "rank" not in json.loads(sock.recv(65536))   # not initialised yet: no rank
    state["init"] = True
    r.step(8, 2000, 3000)
    first = json.loads(sock.recv(65536))
    r.step(8, 3000, 4000)
    assert (first["rank"], first["world"], r.rank_why) == (6, 8, "torch.distributed.get_rank()")
    assert "rank" not in json.loads(sock.recv(65536))   # once
    dist.get_rank = lambda: (_ for _ in ()).throw(RuntimeError("torn down"))
    other = rep_mod.Reporter("ddp", path, flush_ms=0)
    other.step(8, 1000, 2000)
    assert "rank" not in json.loads(sock.recv(65536)) and other.rank is None  # an error: no rank, never raised


def test_the_critical_ranks_slowed_gpu_is_named():
    """Its GPU (from NVML's process list) and what slows it (the GPU source's notes) are in the evidence."""
    t, _ = table()
    t.ctx.gpu_pids = {100 + r: frozenset({str(r)}) for r in range(4)}
    t.ctx.gpu_notes = {"1": "clocks held down by hw_thermal, SM clock 1005 MHz"}
    t._known_gpus = frozenset({"0", "1", "2", "3"})
    for r in range(4):
        send_steps(t, "ddp", 100 + r, r, 20, 60 if r == 1 else 2)
    j = view(t)["ddp"]
    assert j.verdict.evidence.startswith("rank 1 (pid 101, GPU 1) waits 60 % of its step on input; ranks 0, 2, 3 "
                                         "wait for it; its GPU 1: clocks held down by hw_thermal, SM clock 1005 MHz")


def test_tensorflow_ranks_have_no_scaling_efficiency_and_the_exchange_not_observed():
    """Issue 37: a TensorFlow job with ranks (TF_CONFIG) cannot show its exchange: its verdict says so and its
    scaling efficiency is absent; the same job from PyTorch's DataLoader has both."""
    for src, kind, eff in (("tf.data", "not_observed", None), ("torch", "compute", 1.0)):
        t, _ = table()
        for pid, rank in ((101, 0), (102, 1)):
            for k in range(10):
                s = NOW - 20 * S + k * 100 * MS
                msg = json.loads(encode("dp", [("data_wait", s, s + 5 * MS), ("compute", s + 5 * MS, s + 100 * MS)],
                                        [(s, s + 100 * MS, 8)], rank=rank if k == 0 else None,
                                        world=2 if k == 0 else None))
                if k == 0:
                    msg["src"] = src
                assert t.handle(json.dumps(msg).encode(), pid, 0, NOW) == "accepted"
        j = view(t)["dp"]
        assert (j.source, j.verdict.kind, j.scaling_efficiency) == (src, kind, eff)
        assert ("communication not observed" in j.verdict.evidence) == (kind == "not_observed")


# -- issue 39: a critical rank only where one holds the others back --------------------------------
def test_ranks_that_all_wait_alike_name_nobody_and_one_that_waits_more_is_named():
    """Every rank input-bound alike: the job is input-bound, but no rank holds the others back (rule 2 needs
    RANK_SPREAD, 10 points, over the least own wait); at 10 points it is named; a single rank is its own."""
    even = [R(0, ev(wait=8.0)), R(1, ev(wait=8.3)), R(2, ev(wait=7.5))]
    c = ranks.judge(even)
    assert (c.named, c.verdict.kind) == (False, "input")
    assert c.verdict.evidence.startswith("every rank waits on its own input or host work alike (75–83 % of its "
                                         "step) and their communication shares differ by less than 20 points")
    assert ranks.choose([R(0, ev(wait=8.0)), R(1, ev(wait=7.01))])[1] == ranks.NONE_WAITS   # 9.9 points
    assert ranks.choose([R(0, ev(wait=8.0)), R(1, ev(wait=7.0))])[1:] == (ranks.OWN_WAIT,)  # 10 points
    c = ranks.judge([R(0, ev(wait=8.0)), R(1, ev(wait=2.0))])
    assert (c.named, c.rank.rank, c.verdict.kind) == (True, 0, "input")
    c = ranks.judge([R(3, ev(wait=0.1))])
    assert c.named and c.rank.rank == 3     # the only rank on this node: its verdict is the job's


def test_even_ranks_export_no_critical_rank():
    t, _ = table()
    for r in range(4):
        send_steps(t, "ddp", 100 + r, r, 50, 3 if r == 1 else 2)   # waits that differ by a millisecond
    j = view(t)["ddp"]
    assert (j.critical_rank, j.verdict.kind) == (None, "compute")
    assert "the 4 ranks on this node are even" in j.verdict.evidence   # (no critical_rank: no gauge, source.py)


def test_a_rank_slow_only_for_its_first_100_steps():
    """Issue 39's bad input: rank 2 waits 60 ms of each 100 ms step on its input for its first 100 steps,
    then as little as the others.  While those steps are in the window it is the critical rank; once the
    window (60 s) holds only the even steps, nobody is named and the verdict is the even ranks'; the
    counters keep the whole run (rank 2's 6 s of early waits)."""
    t, _ = table()
    t0 = NOW - 200 * S
    for r in range(4):
        send_steps(t, "ddp", 100 + r, r, 100, 60 if r == 2 else 2, t0=t0, end=t0 + 10 * S)
    early = view(t, t0 + 10 * S)["ddp"]
    assert (early.critical_rank, early.verdict.kind) == (2, "input")
    assert early.verdict.evidence.startswith("rank 2 (pid 102, GPU") or early.verdict.evidence.startswith(
        "rank 2 (pid 102) waits 60 % of its step on input")
    for r in range(4):   # the next 1,000 steps, 100 s, all even
        send_steps(t, "ddp", 100 + r, r, 1000, 2, t0=t0 + 10 * S, first=False, end=t0 + 110 * S)
    late = view(t, t0 + 110 * S)["ddp"]
    assert (late.critical_rank, late.verdict.kind) == (None, "compute")
    assert late.input_bound_ratio == pytest.approx(0.02)
    r2 = next(r for r in late.ranks if r.rank == 2)
    assert dict(r2.phase_seconds)["data_wait"] == pytest.approx(100 * 0.06 + 1000 * 0.002)
    assert (late.steps, r2.steps) == (1100, 1100)
