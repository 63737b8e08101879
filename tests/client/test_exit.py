"""Nothing lost on the way out (issue 39): a process that ends with os._exit (a forked child, every worker of
multiprocessing's fork and forkserver contexts) flushes its last steps first, as one that ends with sys.exit
does; spawn children end with sys.exit; a Pool worker sends a task's steps before its result (a Pool left by
`with` is terminated, SIGTERM, as soon as the results are in).  A SIGKILLed child's buffered records cannot be seen by anyone
(docs/zero-code.md): the agent counts what it sent before.  Real unmodified PyTorch jobs under `teye run`;
the oracle is the job's own step count and the exit statuses it saw."""
from __future__ import annotations

import os
import sys

import pytest

from tests.client.helpers import HERE, last_json, plain_run, teye_run

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

SCRIPT = os.path.join(HERE, "torch_exit.py")


def _same_job(agent, mode, steps, job):
    args = [sys.executable, SCRIPT, mode, str(steps)]
    bare = plain_run(args)
    run = teye_run(args, socket_path=agent.path, job=job)
    assert run.returncode == bare.returncode == 0, run.stderr
    assert (run.stdout, run.stderr) == (bare.stdout, bare.stderr)   # output and statuses as without teye
    return last_json(run.stdout), agent.jobs()[job]


@pytest.mark.parametrize("mode,processes", [("fork", 1), ("pool-fork", 2), ("pool-forkserver", 2),
                                            ("pool-spawn", 2), ("pool-fork-with", 2), ("pool-spawn-with", 2)])
def test_children_that_end_without_atexit_send_their_last_steps(agent, mode, processes):
    own, j = _same_job(agent, mode, 30, "exit-" + mode)
    print(own, j.steps, j.samples, j.processes)
    if mode == "fork":
        assert own["statuses"] == [7]        # os._exit's status is the child's, unchanged
    # every step (2 ms each: the last flush_ms of them were lost before), each process its own; -with: the
    # pool is terminated (SIGTERM) once the last result is in: each task's steps are sent before its result
    assert own["steps"] - 1 <= j.steps <= own["steps"], (j.steps, own)
    assert j.samples == 8 * j.steps and j.processes == processes


def test_fork_inside_a_dataloader_worker(agent):
    """Bad input: a DataLoader worker forks a child that ends with os._exit(3); the worker sees status 3 and
    the training steps are the main process's."""
    own, j = _same_job(agent, "dlfork", 10, "exit-dlfork")
    assert own["statuses"] == [3]
    assert (j.steps, j.samples, j.processes) == (10, 80, 1)


def test_a_sigkilled_child_loses_only_its_unsent_tail(agent):
    """Bad input: a forked child killed by SIGKILL after its 30 steps.  Its last records, still in its
    buffer, die with it (no process is left to send them and no later datagram can show the gap); what it
    sent before counts, and the parent's 30 steps all do."""
    own, j = _same_job(agent, "kill", 30, "exit-kill")
    assert own["statuses"] == [-9]
    print(own, j.steps, j.processes)
    # the child's tail is lost unless a flush took it just before the kill: under load its 30 steps outlast
    # flush_ms and the last one can leave the buffer empty (CI, stop 55: all 60 arrived)
    assert 30 <= j.steps <= own["steps"] == 60 and j.samples == 8 * j.steps, (j.steps, j.samples, own)
