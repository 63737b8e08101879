"""`teye trace --train-job`'s request path (issue 46), each part on its own: the request as the job reads it,
the job's side driven step by step with a fake profiler (the narrowest boundary: what torch.profiler would
do), and the CLI against no job, a second request and a directory that is not the job's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from agent.trace import request
from teye_client import _trace
from tests.procs import REPO


def _req(**over):
    # (expires in 2096: the table is made when the module is collected, maybe minutes before a case runs)
    r = {"id": "r1", "steps": 3, "output": "/tmp/x", "start_after": 0, "expires": 4e9, "ranks": None}
    r.update(over)
    return json.dumps(r).encode()


@pytest.mark.parametrize("raw, why", [
    (b"\xff", "not JSON"), (b"[1]", "not a JSON object"), (b"x" * 5000, "over 4096 bytes"),
    (_req(id="../x"), "its id is not"), (_req(id=""), "its id is not"),
    (_req(steps=0), "steps must be"), (_req(steps=True), "steps must be"), (_req(steps=1001), "steps must be"),
    (_req(output="rel/dir"), "output must be an absolute path"), (_req(output=5), "output must be"),
    (_req(start_after="soon"), "must be numbers"), (_req(expires=float("nan")), "must be numbers"),
    (_req(expires=1.0), "it expired"), (_req(ranks=[0, "1"]), "ranks must be a list of integers"),
])
def test_a_bad_request_is_refused_with_its_reason(raw, why):
    got = _trace.parse_request(raw, time.time())
    assert isinstance(got, str) and why in got, got


def test_a_good_request_reads_back():
    got = _trace.parse_request(_req(ranks=[1]), time.time())
    assert got["id"] == "r1" and got["steps"] == 3 and got["ranks"] == [1]


class FakeProfile:
    """What the Tracer asks of torch.profiler: one warm-up step, then ``steps`` recorded, then export."""
    made: list = []

    def __init__(self, steps, fail_at=None):
        self.steps, self.n, self.fail_at, self.stopped = steps, 0, fail_at, False
        FakeProfile.made.append(self)

    def step(self):
        self.n += 1
        if self.n == self.fail_at:
            raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")
        return self.n == self.steps + 1

    def export(self, path, bound):
        with open(path, "w") as f:
            f.write('{"traceEvents": []}')

    def stop(self):
        self.stopped = True


def make_dirs(top):
    """A job's request directory (``top/teye-x/trace``, both levels 0700, as the job's own) and an output
    directory (``top/out``, 0700): (request dir, output dir)."""
    req = top / "teye-x" / "trace"
    req.mkdir(parents=True)
    os.chmod(top / "teye-x", 0o700)
    os.chmod(req, 0o700)
    out = top / "out"
    out.mkdir(mode=0o700)
    return str(req), str(out)


@pytest.fixture
def dirs(tmp_path):
    FakeProfile.made.clear()
    return make_dirs(tmp_path)


def _status(d, pid=None):
    names = [n for n in os.listdir(d) if n.endswith(".status.json")]
    assert len(names) == 1, names
    with open(os.path.join(d, names[0])) as f:
        return json.load(f)


def _ask(d, out, **over):
    r = dict(id="r1", steps=3, output=out, start_after=time.time(), expires=time.time() + 60, ranks=None)
    r.update(over)
    _trace._write_private(os.path.join(d, "job.json"), json.dumps(r).encode())


def test_the_job_takes_a_request_once_starts_after_it_and_records_the_steps_asked(dirs, monkeypatch):
    d, out = dirs
    monkeypatch.setattr(_trace, "CHECK_EVERY_NS", 0)
    t = _trace.Tracer("job", 1, FakeProfile, directory=d)
    clock = iter(range(10**9, 10**12, 10**8))       # (a step every 100 ms: 10 steps a second)
    for _ in range(4):
        t.tick(next(clock))                          # no request: nothing
    assert os.listdir(d) == []
    now = [time.time()]
    monkeypatch.setattr(_trace, "_wall", lambda: now[0])
    _ask(d, out, start_after=now[0] + 1.0)
    t.tick(next(clock))                              # step 5 ends: the request is seen and taken
    assert _status(d)["state"] == "accepted"
    now[0] += 0.999
    t.tick(next(clock))                              # before start_after: not yet
    assert _status(d)["state"] == "accepted" and not FakeProfile.made
    now[0] += 0.001
    t.tick(next(clock))                              # step 7 ends at start_after: a first step is proposed
    st = _status(d)                                  # half a second of its steps later (5: 2 since step 5 in 0.2 s)
    assert st["state"] == "starting" and st["start_step"] == 7 + 2 + 5 and not FakeProfile.made
    for _ in range(4):
        t.tick(next(clock))                          # steps 8-11: not yet
    assert not FakeProfile.made
    t.tick(next(clock))                              # step 12 ends: the profiler starts
    st = _status(d)
    assert st["state"] == "tracing" and st["first_step"] == 14   # step 13 warms up; 14, 15, 16 are recorded
    for _ in range(3):
        t.tick(next(clock))
    assert _status(d)["state"] == "tracing"
    t.tick(next(clock))                              # step 16 ends: the three recorded steps are complete
    assert _status(d)["state"] == "tracing"
    t.tick(next(clock))                              # step 17 ends: they are written (outside the traced steps)
    st = _status(d)
    assert st["state"] == "done" and st["rank"] == 1 and FakeProfile.made[-1].stopped
    assert st["trace"] == os.path.join(out, f"job.r1.{t.node}.rank1.pt.trace.json")
    assert os.stat(st["trace"]).st_mode & 0o777 == 0o600
    n = len(FakeProfile.made)
    for _ in range(10):
        t.tick(next(clock))                          # the same request is not taken twice
    assert len(FakeProfile.made) == n


def _ranks(d, n=2):
    ts = [_trace.Tracer("job", r, FakeProfile, directory=d) for r in range(n)]
    for r, t in enumerate(ts):
        t.pid = 1000 + r                             # (each rank its own process: its own status file)
    return ts


def test_ranks_that_end_a_step_on_either_side_of_start_after_trace_the_same_steps(dirs, monkeypatch):
    """Two ranks in lockstep end step 7 a moment apart, start_after between them: the early one would start a
    step before the other (CI stop 55); each proposes a first step and takes the larger of the two."""
    d, out = dirs
    monkeypatch.setattr(_trace, "CHECK_EVERY_NS", 0)
    now = [time.time()]
    monkeypatch.setattr(_trace, "_wall", lambda: now[0])
    a, b = _ranks(d)
    _ask(d, out, start_after=now[0] + 1.0)
    ns = 10**9
    for _ in range(6):                               # steps 1-6, 20 ms each, before start_after
        ns += 2 * 10**7
        for t in (a, b):
            t.tick(ns)
    now[0] += 1.0
    a.tick(ns + 2 * 10**7)                           # a ends step 7 at start_after ...
    now[0] -= 0.002
    b.tick(ns + 2 * 10**7)                           # ... b ended it 2 ms before (its wall clock read earlier)
    now[0] += 0.002
    ns += 2 * 10**7
    assert a.start_step is not None and b.start_step is None
    for _ in range(60):
        ns += 2 * 10**7
        for t in (a, b):
            t.tick(ns)
    firsts = [t.first_step for t in (a, b)]
    assert firsts[0] == firsts[1] == b.proposed and b.proposed == a.proposed + 1, (firsts, a.proposed, b.proposed)
    done = [_status_of(d, t) for t in (a, b)]
    assert [(s["state"], s["first_step"]) for s in done] == [("done", firsts[0])] * 2


def test_a_peer_out_of_lockstep_or_a_bad_status_is_not_waited_for(dirs, monkeypatch):
    d, out = dirs
    monkeypatch.setattr(_trace, "CHECK_EVERY_NS", 0)
    (a,) = _ranks(d, 1)
    _ask(d, out)
    for name, body in (("job.r1.n.pid7.status.json", json.dumps({"id": "r1", "start_step": 10**6})),  # far ahead
                       ("job.r1.n.pid8.status.json", "{not json"),
                       ("job.r1.n.pid9.status.json", json.dumps({"id": "r1", "start_step": 9, "x": "y" * 9000})),
                       ("job.r0.n.pid6.status.json", json.dumps({"id": "r0", "start_step": 12}))):   # another request
        with open(os.path.join(d, name), "w") as f:
            f.write(body)
    for k in range(30):
        a.tick(10**9 + k * 10**8)
    assert a.first_step == a.proposed and a.req is None and _status_of(d, a)["state"] == "done"


def _status_of(d, t):
    with open(os.path.join(d, f"job.r1.{t.node}.pid{t.pid}.status.json")) as f:
        return json.load(f)


def test_a_request_for_other_ranks_or_in_a_directory_others_may_write_is_not_taken(dirs, monkeypatch):
    d, out = dirs
    monkeypatch.setattr(_trace, "CHECK_EVERY_NS", 0)
    t = _trace.Tracer("job", 1, FakeProfile, directory=d)
    _ask(d, out, ranks=[0])
    t.tick()
    assert t.req is None and not [n for n in os.listdir(d) if n.endswith("status.json")]
    os.chmod(d, 0o777)                               # another user could have written this one
    _ask(d, out, id="r2")
    t.tick()
    assert t.req is None
    os.chmod(d, 0o700)
    _ask(d, out, id="r3")
    t.tick()
    assert t.req is not None and t.req["id"] == "r3"


def test_a_profiler_that_raises_fails_the_trace_and_the_job_goes_on(dirs, monkeypatch):
    d, out = dirs
    monkeypatch.setattr(_trace, "CHECK_EVERY_NS", 0)
    monkeypatch.setattr(_trace, "START_MARGIN_S", 0)   # (the least margin: 3 steps, whatever their rate)
    t = _trace.Tracer("job", 0, lambda steps: FakeProfile(steps, fail_at=2), directory=d)
    _ask(d, out)
    for _ in range(10):
        t.tick()                                     # (never raises into the loop)
    st = _status(d)
    assert st["state"] == "failed" and "CUPTI_ERROR_NOT_INITIALIZED" in st["reason"]
    assert FakeProfile.made[-1].stopped and t.req is None and os.listdir(out) == []


@pytest.mark.parametrize("ticks, state, why", [
    (2, "failed", "the process ended after step 2, before its first traced step (at step 7)"),
    (6, "failed", "the process ended after step 6, during its trace (from step 7): the steps recorded are not kept"),
    (9, "done", None),                               # every step recorded: written at the exit
])
def test_a_process_that_ends_with_its_request_running_gives_its_last_word(dirs, monkeypatch, ticks, state, why):
    """The job's last step came before its traced ones, or during them: at its exit the status says so (or the
    trace, all recorded, is written), so that the CLI ends then and not at its timeout."""
    d, out = dirs
    monkeypatch.setattr(_trace, "CHECK_EVERY_NS", 0)
    monkeypatch.setattr(_trace, "START_MARGIN_S", 0)   # (3 steps: proposed at step 2 for step 2 + 2 + 3)
    t = _trace.Tracer("job", 0, FakeProfile, directory=d)
    _ask(d, out)
    for _ in range(ticks):
        t.tick()
    assert _status(d)["state"] == ("starting" if ticks == 2 else "tracing")
    _trace.close_all()                               # (what atexit, or the hook before os._exit, calls)
    st = _status(d)
    assert st["state"] == state and st.get("reason") == why, st
    assert t.req is None and all(p.stopped for p in FakeProfile.made)
    assert os.listdir(out) == ([] if why else [os.path.basename(st["trace"])])


def test_a_forked_copy_of_a_tracer_says_nothing_for_its_parent(dirs, monkeypatch):
    d, out = dirs
    monkeypatch.setattr(_trace, "CHECK_EVERY_NS", 0)
    monkeypatch.setattr(_trace, "START_MARGIN_S", 0)
    t = _trace.Tracer("job", 0, FakeProfile, directory=d)
    _ask(d, out)
    for _ in range(2):
        t.tick()
    t.pid = os.getpid() + 1                          # (made in the parent: the status file is the parent's)
    _trace.close_all()
    assert _status(d)["state"] == "starting" and t.req is not None


ENDS_EARLY = """
import os, sys, time
from teye_client import _trace

class Profile:                                   # (never made: the process ends before its first traced step)
    SUFFIX = ".pt.trace.json"

t = _trace.Tracer("ends_early", None, Profile)
until = time.monotonic() + 60
while t.start_step is None and time.monotonic() < until:
    t.tick()
    time.sleep(0.01)
print(t.step_n, t.start_step, flush=True)
if sys.argv[1] == "os._exit":
    os._exit(0)                                  # (as a multiprocessing child ends: no atexit)
"""


@pytest.mark.parametrize("how", ["return", "os._exit"])
def test_the_cli_ends_when_the_process_that_took_the_request_ends_before_its_trace(tmp_path, how):
    """A real process (the request module's Tracer, under teye's zero-code hook: `teye run`) takes the request
    and ends before its first traced step, by returning (atexit) or by os._exit (the hook's flush): the CLI
    says why at once; before, it waited for its timeout (here 100 s, past the 40 s the test gives it)."""
    script = tmp_path / "ends_early.py"
    script.write_text(ENDS_EARLY)
    out = tmp_path / "o"
    out.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": REPO, "TEYE_TRACE_REQUESTS": str(tmp_path / "req")}
    job = subprocess.Popen([sys.executable, "-m", "agent", "run", "--", sys.executable, str(script), how],
                           cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        r = _cli("--train-job", "ends_early", "--output", str(out), "--timeout", "100", "--json",
                 env={"TEYE_TRACE_REQUESTS": str(tmp_path / "req")}, timeout=40)
        jout, jerr = job.communicate(timeout=30)
    finally:
        job.kill()
    assert job.returncode == 0, jerr[-2000:]
    ended, start = map(int, jout.split())           # (the job's own word: its last step, the first to trace)
    [p] = json.loads(r.stdout)["processes"]
    assert r.returncode == 1 and p["state"] == "failed", r.stdout + r.stderr
    assert p["reason"] == f"the process ended after step {ended}, before its first traced step (at step {start})"


def test_an_output_directory_that_is_not_the_jobs_own_fails_at_once(dirs, monkeypatch):
    d, out = dirs
    monkeypatch.setattr(_trace, "CHECK_EVERY_NS", 0)
    os.chmod(out, 0o755)                             # others could read the job's code in its trace
    t = _trace.Tracer("job", 0, FakeProfile, directory=d)
    _ask(d, out)
    t.tick()
    st = _status(d)
    assert st["state"] == "failed" and "open to group or others (mode 0755)" in st["reason"]


def test_the_watch_costs_one_stat_per_interval(dirs, monkeypatch):
    """The training thread looks for a request at most every CHECK_EVERY_NS, whatever its step rate."""
    d, out = dirs
    t = _trace.Tracer("job", 0, FakeProfile, directory=d)
    looks = []
    monkeypatch.setattr(t, "_look", lambda path, now_ns: looks.append(path))
    for ns in range(0, 10**9, 10**6):                # 1,000 steps of 1 ms
        t.tick(ns + 1)
    assert len(looks) == 4                           # at 0, 0.25, 0.5 and 0.75 s


def _cli(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "agent", "trace", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO, **(env or {})})


@pytest.mark.not_measuring("its clock tells a bounded wait (about 1 s) from the full timeout (12 s), with 10 s to spare")
def test_the_cli_says_when_no_process_took_the_request_and_leaves_nothing_behind(tmp_path):
    d = tmp_path / "req"
    t0 = time.monotonic()
    # (a timeout just past the bound below: a CLI that waits it out fails in 12 s, not 20)
    r = _cli("--train-job", "nobody_runs_this", "--output", str(tmp_path / "o"), "--timeout", "12",
             env={_trace.ENV_DIR: str(d)})
    assert r.returncode == 1 and "no process of nobody_runs_this on this node took the request" in r.stderr
    assert time.monotonic() - t0 < request.DEFAULT_START_IN_S + 9    # not the full timeout
    assert os.listdir(d) == [] and os.stat(tmp_path / "o").st_mode & 0o777 == 0o700


def test_a_second_request_while_one_is_pending_is_refused(tmp_path):
    d = tmp_path / "req"
    out = tmp_path / "o"
    out.mkdir(mode=0o700)
    req = request.write_request("job", os.geteuid(), 2, str(out), None, 1.0, 30.0, directory=str(d))
    r = _cli("--train-job", "job", "--output", str(out), env={_trace.ENV_DIR: str(d)})
    assert r.returncode == 1 and f"a trace of job is already requested (id {req['id']})" in r.stderr


@pytest.mark.parametrize("mode, why", [(0o755, "open to group or others (mode 0755)")])
def test_an_output_directory_others_can_open_is_refused_by_the_cli(tmp_path, mode, why):
    out = tmp_path / "o"
    out.mkdir()
    os.chmod(out, mode)
    r = _cli("--train-job", "job", "--output", str(out), env={_trace.ENV_DIR: str(tmp_path / "req")})
    assert r.returncode == 1 and why in r.stderr and not (tmp_path / "req" / "job.json").exists()


def test_bad_arguments_are_usage_errors(tmp_path):
    env = {_trace.ENV_DIR: str(tmp_path / "req")}
    assert _cli("--train-job", "j", "--steps", "0", env=env).returncode == 2
    r = _cli("--train-job", "j", "--max-bytes", "0", env=env)
    assert r.returncode == 2 and "--max-bytes must be 1 to" in r.stderr
    assert _cli(env=env).returncode == 2
    r = _cli("--train-job", "alice/job", env=env)
    assert r.returncode == 1 and "as root with --uid" in r.stderr


@pytest.mark.not_measuring("its clock tells a bounded wait from the full timeout (120 s), with 5-10 times to spare")
def test_a_rank_that_never_reaches_a_step_boundary_is_named_after_a_bounded_wait(tmp_path):
    """The job took the request but never ends another step (stuck in its data loader): the wait ends at
    the timeout with that rank's last word, and the CLI says so (exit 1)."""
    d = tmp_path / "req"
    out = tmp_path / "o"
    out.mkdir(mode=0o700)
    req = request.write_request("job", os.geteuid(), 2, str(out), None, 0.2, 1.0, directory=str(d))
    _trace._write_private(os.path.join(str(d), f"job.{req['id']}.n.pid7.status.json"),
                          json.dumps({"pid": 7, "rank": 0, "state": "accepted", "steps": 2}).encode())
    t0 = time.monotonic()
    got = request.wait(req, "job", 1.0)
    assert 0.9 < time.monotonic() - t0 < 5 and got[7]["state"] == "accepted"


def test_the_agents_request_is_taken_from_its_directory_and_traced_into_the_jobs_default(tmp_path, monkeypatch):
    """The agent's trace webhook writes into <socket dir>/trace/<uid>, a directory of its own that the job
    trusts as it trusts the socket's; the request names no output: the job writes into its own default
    (/tmp/teye-<uid>/traces, beside its request directory), made 0700 by the job."""
    monkeypatch.setattr(_trace, "CHECK_EVERY_NS", 0)
    monkeypatch.setattr(_trace, "START_MARGIN_S", 0)   # (the least margin: 3 steps, whatever their rate)
    FakeProfile.made.clear()
    own = tmp_path / "teye-x" / "trace"                # the job's own request directory: absent so far
    (tmp_path / "teye-x").mkdir(mode=0o700)
    agent = tmp_path / "run" / "trace" / str(os.geteuid())
    agent.mkdir(parents=True)
    for p in (tmp_path / "run", tmp_path / "run" / "trace", agent):
        os.chmod(p, 0o755)
    t = _trace.Tracer("job", None, FakeProfile, directory=str(own), agent_dir=str(agent))
    req = dict(id="a1", steps=2, output=None, start_after=time.time(), expires=time.time() + 60, ranks=None)
    _trace._write_private(str(agent / "job.json"), json.dumps(req).encode())
    for _ in range(10):
        t.tick()
    out = tmp_path / "teye-x" / "traces"
    assert os.stat(out).st_mode & 0o777 == 0o700
    assert [n for n in os.listdir(out) if n.startswith("job.a1.")]   # written where the job's user alone reads
    assert t.req is None and os.listdir(agent) == ["job.json"]        # nothing of the job's in the agent's
    os.chmod(agent, 0o777)                                            # one others may write: not trusted
    req["id"] = "a2"
    _trace._write_private(str(agent / "job.json"), json.dumps(req).encode())
    t.tick()
    assert t.req is None


def test_a_trace_over_the_requests_byte_bound_is_removed_and_its_status_says_why(dirs, monkeypatch):
    """Issue 46: a bound on what a request leaves on the job's disk.  The fake profiler's export is 19 bytes
    (its own file, measured here): with max_bytes 18 the trace is removed and the status names both; with 19
    it is kept."""
    d, out = dirs
    monkeypatch.setattr(_trace, "CHECK_EVERY_NS", 0)
    monkeypatch.setattr(_trace, "START_MARGIN_S", 0)   # (the least margin: 3 steps, whatever their rate)
    probe = os.path.join(out, "probe.json")
    FakeProfile(1).export(probe, None)
    size = os.stat(probe).st_size
    os.unlink(probe)
    for bound, kept in ((size - 1, False), (size, True)):
        for n in os.listdir(d):
            os.unlink(os.path.join(d, n))
        t = _trace.Tracer("job", 0, FakeProfile, directory=d)
        _ask(d, out, id=f"b{bound}", steps=1, max_bytes=bound)
        for _ in range(9):
            t.tick()
        st = _status(d)
        if kept:
            assert st["state"] == "done" and os.stat(st["trace"]).st_size == size, st
        else:
            assert st["state"] == "failed" and st["reason"].startswith(
                f"the trace is {size} bytes, over the request's bound of {bound} "), st
            assert os.listdir(out) == [] and t.req is None


@pytest.mark.parametrize("bound", [0, -1, True, 1.5, "big", (1 << 40) + 1])
def test_a_bad_byte_bound_is_refused(bound):
    got = _trace.parse_request(_req(max_bytes=bound), time.time())
    assert isinstance(got, str) and "max_bytes must be an integer from 1 to" in got, got


def test_the_byte_bound_defaults_to_what_summarize_reads():
    from agent.trace import defaults
    assert _trace.parse_request(_req(), time.time())["max_bytes"] == _trace.DEFAULT_MAX_BYTES \
        == defaults.MAX_TRACE_BYTES


@pytest.mark.parametrize("env", [None, "/somewhere/requests"])
def test_the_hooks_request_paths_are_the_request_modules(monkeypatch, env):
    """The zero-code hook looks for requests itself before it imports this module: at the same paths."""
    from teye_client._common import trace_request_paths
    if env is None:
        monkeypatch.delenv(_trace.ENV_DIR, raising=False)
    else:
        monkeypatch.setenv(_trace.ENV_DIR, env)
    sock = "/run/teye/phases.sock"
    assert trace_request_paths("job-1", sock) == [os.path.join(_trace.request_dir(), "job-1.json"),
                                                  os.path.join(_trace.agent_request_dir(sock), "job-1.json")]
    assert trace_request_paths("job-1", None) == [os.path.join(_trace.request_dir(), "job-1.json")]


HOOK = r"""
import json, os, sys, time
from teye_client import _common
class Rep:
    train_job, socket_path, rank = "job", None, 0
    def note_trace(self, *a):
        pass
_common.session.reporter = Rep()
made = []
class Prof:
    def __init__(self, steps):
        made.append(steps)
    def step(self):
        return False                                 # (records on: the trace never ends in this test)
    def stop(self):
        pass
hook = _common.TraceHook(lambda _trace, steps: Prof(steps))
for _ in range(40):                                  # 40 steps of 10 ms, no request: nothing imported
    hook.tick()
    time.sleep(0.01)
before = "teye_client._trace" in sys.modules
d = os.environ["TEYE_TRACE_REQUESTS"]
now = time.time()
with open(os.path.join(d, "job.json"), "w") as f:
    json.dump(dict(id="r1", steps=2, output=sys.argv[1], start_after=now, expires=now + 60, ranks=None), f)
written = time.monotonic_ns()
starts, imported_at, made_at, n = [], None, None, 0
while n < 3000 and (made_at is None or n < made_at + 5):   # until 5 steps after the profile is made (<= 30 s)
    starts.append(time.monotonic_ns())                     # (read before the hook reads the same clock)
    hook.tick()
    if imported_at is None and "teye_client._trace" in sys.modules:
        imported_at = n                              # the iteration that looked and found the request
    n += 1
    if made_at is None and made:
        made_at = n
    time.sleep(0.01)
look = imported_at is not None and all(t - written < _common.TRACE_LOOK_NS for t in starts[:imported_at])
print(json.dumps({"before": before, "after": "teye_client._trace" in sys.modules, "steps": hook.step_n,
                  "ticks": 40 + n, "made": made, "within_one_look": look,
                  "taken": hook.tracer is not None and "r1" in hook.tracer.done_ids}))
"""


def test_the_hook_imports_the_request_module_only_once_a_request_exists(dirs):
    """A training process that is never traced never imports teye_client._trace (its first import cost 1.5 ms of
    a small TensorFlow loop's first step); one that is asked imports it within one look and counts its steps on.
    The script runs until the profile is made (the first traced step is proposed half a second of steps after
    the request is taken): a loaded machine makes its steps slower, never this test shorter than it needs."""
    import subprocess
    import sys
    from tests.procs import REPO
    d, out = dirs
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEYE_")}
    env.update(PYTHONPATH=REPO, TEYE_TRACE_REQUESTS=d)
    r = subprocess.run([sys.executable, "-c", HOOK, out], env=env, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["before"] is False and got["after"] is True and got["taken"] is True, got
    # imported at the first iteration that began a look's interval or more after the request was written
    # (the script's own clock, read before each tick): every iteration before it began within the interval
    assert got["within_one_look"] is True, got
    assert got["steps"] == got["ticks"] and got["made"] == [2], got     # every iteration counted; made once
