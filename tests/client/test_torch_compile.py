"""torch.compile under zero-code phases: an unmodified, input-bound PyTorch script (tests/client/torch_compile_job.py)
under `teye run` with a live agent.  The oracle is the script's own clock: its steps, its input waits and its
compilations (timed with the same public callbacks PyTorch offers any job), not anything teye sends."""
from __future__ import annotations

import sys

import pytest

from tests import reference
from tests.client.helpers import HERE, base_env, last_json, teye_run

torch = pytest.importorskip("torch", reason="the torch extra (./dev.sh test installs it)")

SCRIPT = f"{HERE}/torch_compile_job.py"
STEPS = 60
# the job without teye, whose compilations the run under teye must not add to (tests/reference.py)
BARE_COMPILE = reference.Bare("torch-compile", [sys.executable, SCRIPT, "compile", str(STEPS)])


def _run(agent, mode, **env):
    job = "ptc-" + mode
    run = teye_run([sys.executable, SCRIPT, mode, str(STEPS)], socket_path=agent.path, job=job, timeout=300,
                   env=base_env(**env))
    assert run.returncode == 0, run.stderr
    own = last_json(run.stdout)
    j = agent.jobs()[job]
    assert (j.steps, j.samples, j.source, j.client_dropped) == (own["steps"], own["samples"], "torch", 0)
    return own, j, dict(j.phase_seconds), run.stderr


@pytest.mark.measures("compile seconds and the input share against the script's own perf_counter")
def test_compilations_are_compile_and_in_no_share(agent):
    """The first step's compile (forward traced, then the backward compiled at its first run) and the
    recompile for the epoch's short last batch (dynamic=False) are ``compile``, carved out of those steps'
    compute: teye's compile seconds are the script's, and the input share is the script's wait over its
    step time less its compilations."""
    own, j, phases, _ = _run(agent, "compile")
    assert own["compiles"] >= 3, own           # forward, lazy backward, the recompile
    # and no compilation of teye's making: the forward's hooks stay as they were once a compilation began (a
    # compiled graph guards on the global hook tables: narrowing them recompiled it, 6 compilations against 4)
    bare = BARE_COMPILE.result()
    assert bare.returncode == 0 and own["compiles"] == last_json(bare.stdout)["compiles"], (own, bare.stdout[-300:])
    assert phases["compile"] == pytest.approx(own["compile_s"], abs=0.005 * own["compiles"]), (phases, own)
    truth = own["wait_s"] / (own["step_s"] - own["compile_s"])
    assert truth > 0.5, own                    # input-bound, and the compile would have diluted that
    assert own["wait_s"] / own["step_s"] < truth - 0.1, own
    assert j.input_bound_ratio == pytest.approx(truth, abs=0.03), (j.input_bound_ratio, truth, own)
    assert phases["data_wait"] == pytest.approx(own["wait_s"], rel=0.05, abs=0.005)
    assert sum(phases.values()) == pytest.approx(own["step_s"], rel=0.05)   # the phases tile the steps


@pytest.mark.measures("compile seconds and the input share against the script's own perf_counter")
def test_a_job_without_torch_compile_has_no_compile_phase(agent):
    own, j, phases, _ = _run(agent, "eager")
    assert "compile" not in phases, phases
    truth = own["wait_s"] / own["step_s"]
    assert j.input_bound_ratio == pytest.approx(truth, abs=0.03), (j.input_bound_ratio, truth)


@pytest.mark.measures("compile seconds and the input share against the script's own perf_counter")
def test_a_compile_that_fails_is_compile_and_the_eager_steps_after_it_are_not(agent):
    """The backend raises at the first step; the job catches it and goes on eager.  PyTorch ends the
    compilation in a ``finally``: its time is ``compile`` and nothing of it runs on into later steps."""
    own, j, phases, err = _run(agent, "fail", TEYE_DEBUG="1")
    assert "instrumented torch.compile compilations (torch._dynamo.callback)" in err
    assert own["compiles"] == 1, own
    assert phases["compile"] == pytest.approx(own["compile_s"], abs=0.005), (phases, own)
    assert own["compile_s"] >= 0.05
    truth = own["wait_s"] / (own["step_s"] - own["compile_s"])
    assert j.input_bound_ratio == pytest.approx(truth, abs=0.03), (j.input_bound_ratio, truth, own)
