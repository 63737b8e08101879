"""What a job is configured with, sent by the zero-code hook, and the advice built on it (issue 45).

Unmodified scripts under `teye run` beside a live agent (tests/client/torch_config.py,
tests/client/torch_config_ddp.py).  Oracles: what each script set, printed by the script itself (never
read back from teye); its final loss and exit status, run again without teye; the phrases the advice
must and must not hold, written in tests/phases/test_advice.py (never imported from the code under test)."""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests import reference
from tests.client.helpers import HERE, LiveAgent, base_env, last_json, teye_run
from tests.phases.test_advice import EXCHANGE_SUGGESTIONS, LOADER_SUGGESTIONS

pytestmark = [pytest.mark.measures("the compute-slow rank named from its step time (the scripts' perf_counter)"),
              pytest.mark.e2e,
              pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"),
                                 reason="the torch extra (./dev.sh test installs it)")]
SCRIPT = os.path.join(HERE, "torch_config.py")
DDP_SCRIPT = os.path.join(HERE, "torch_config_ddp.py")
ENV = base_env(OMP_NUM_THREADS="1")
# the jobs without teye, whose losses the runs under teye must keep (tests/reference.py)
BARE = {mode: reference.Bare(f"config-{mode}", [sys.executable, SCRIPT, mode, str(steps)], {"OMP_NUM_THREADS": "1"},
                                     timeout=240)
        for mode, steps in (("tuned", 60), ("subclass", 20), ("fork", 12))}
BARE.update((hook, reference.Bare(
    f"config-ddp-{hook}", [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           reference.PORT, DDP_SCRIPT, str(steps), str(slow_ms), hook], {"OMP_NUM_THREADS": "1"}))
    for hook, slow_ms, steps in (("fp16", 40, 30), ("own", 0, 10)))

# the phrases the advice must never hold (tests/phases/test_advice.py: issue 45's report)


def run_script(sockdir, mode):
    agent = LiveAgent(sockdir)
    try:
        r = teye_run(BARE[mode].command(), socket_path=agent.path, job=f"cfg-{mode}", env=ENV, timeout=240)
        jobs = agent.jobs()
        reading = agent.src.collect(force=True)
    finally:
        agent.close()
    bare = BARE[mode].result()
    assert (r.returncode, bare.returncode) == (0, 0), (r.stderr[-2000:], bare.stderr[-2000:])
    own, plain = last_json(r.stdout), last_json(bare.stdout)
    assert own["loss"] == plain["loss"]   # bit for bit: the same float, printed by both runs
    return jobs[f"cfg-{mode}"], own, reading


def series(reading, name):
    """The (labels...) of one family's points in the agent's reading, as the exporter gets them."""
    return [p for p in reading.points() if p.spec.name == name]


def test_the_tuned_loop_exports_its_settings_and_is_never_told_to_set_them(sockdir):
    j, own, reading = run_script(sockdir, "tuned")
    assert dict(j.config) == own["set"]
    cfg = {p.labels[1]: p.labels[2] for p in series(reading, "teye_job_config_info") if p.labels[0] == j.train_job}
    assert cfg == own["set"]
    # the loop waits for its workers (its own clock), which spin the CPU: input-bound, cause host_cpu
    assert own["wait_s"] / own["step_s"] > 0.2
    assert (j.verdict.kind, j.verdict.cause) == ("input", "host_cpu"), j.verdict.evidence
    text = j.verdict.recommendation
    assert not [p for p in LOADER_SUGGESTIONS if p in text], text
    assert text.startswith("The job already has DataLoader(num_workers=2, pin_memory=True, persistent_workers=True, "
                           "prefetch_factor=2, batch_size=4).")
    cpus = os.cpu_count()
    if cpus <= 3:   # two workers and the training process fill the node: the host is the limit
        assert "the host is the limit, and more workers will not help" in text
        assert "Move the decoding offline" in text and "to the GPU" in text
        assert "Raise DataLoader num_workers" not in text
    else:
        assert "Raise DataLoader num_workers while the node has free cores" in text
    tips = [p for p in series(reading, "teye_job_advice_tip") if p.labels[0] == j.train_job]
    assert [p.labels[1] for p in sorted(tips, key=lambda p: p.value)] == list(j.verdict.tips)
    assert [p.value for p in sorted(tips, key=lambda p: p.value)] == list(range(1, len(tips) + 1))


def test_a_loader_subclass_with_an_object_and_huge_strings_sends_only_what_checks(sockdir):
    j, own, reading = run_script(sockdir, "subclass")
    assert dict(j.config) == own["set"]   # no prefetch_factor (a 1 MB string), no batch_size (an object)
    values = [p.labels for p in series(reading, "teye_job_config_info")]
    assert values and max(len(v) for labels in values for v in labels) <= 32
    # the client left them out: the agent had nothing to refuse
    counts = {p.labels[0]: p.value for p in series(reading, "teye_phase_config_messages_total")}
    assert counts["accepted"] >= 1 and counts["wrong_type"] == counts["too_large"] == counts["bad_value"] == 0


def test_a_forked_child_sends_its_own_loader_and_the_job_keeps_the_parents(sockdir):
    agent = LiveAgent(sockdir)
    try:
        r = teye_run(BARE["fork"].command(), socket_path=agent.path, job="cfg-fork", env=ENV, timeout=240)
        jobs = agent.jobs()
        table = agent.src.table
        with table._lock:
            job = next(jb for jb in (*table._jobs.values(), *table._ended.values()) if jb.label == "cfg-fork")
            by_pid = {pid: dict(cfg) for pid, (_, cfg) in job.configs.by_pid.items()}
    finally:
        agent.close()
    bare = BARE["fork"].result()
    assert (r.returncode, bare.returncode) == (0, 0)
    own, plain = last_json(r.stdout), last_json(bare.stdout)
    assert (own["loss"], own["child"]["loss"], own["child_status"]) == (plain["loss"], plain["child"]["loss"], 0)
    assert by_pid == {own["pid"]: own["set"], own["child"]["pid"]: own["child_set"]}
    # the job's: its lowest pid's (the parent's), not a mixture
    assert dict(jobs["cfg-fork"].config) == own["set"]


def run_ddp(sockdir, hook):
    agent = LiveAgent(sockdir)
    try:
        r = teye_run(BARE[hook].command(), socket_path=agent.path, env=ENV, timeout=300)
        jobs = agent.jobs()
        reading = agent.src.collect(force=True)
    finally:
        agent.close()
    bare = BARE[hook].result()
    assert (r.returncode, bare.returncode) == (0, 0), (r.stdout, r.stderr[-3000:], bare.stderr[-3000:])
    own = {o["rank"]: o for o in map(json.loads, r.stdout.splitlines())}
    plain = {o["rank"]: o for o in map(json.loads, bare.stdout.splitlines())}
    assert {k: o["loss"] for k, o in own.items()} == {k: o["loss"] for k, o in plain.items()}
    return jobs["torch_config_ddp"], own, reading


def test_ddp_settings_and_the_compute_slow_rank_gets_advice_about_itself(sockdir):
    j, own, reading = run_ddp(sockdir, "fp16")
    assert own[0]["set"] == own[1]["set"]
    assert dict(j.config) == dict(own[0]["set"], **{"ddp.comm_hook": "fp16_compress_hook"})
    # rank 1 sleeps in its compute (its own clock: 40 ms a step): it is the one the other waits for
    assert own[1]["slept_s"] >= 30 * 0.04 and own[0]["slept_s"] == 0
    assert j.critical_rank == 1, j.verdict.evidence
    text = j.verdict.recommendation
    assert not [p for p in EXCHANGE_SUGGESTIONS if p in text], text
    assert text.startswith("Rank 1 is the one: it computes ")
    for phrase in ("its node:", "its data shard:", "its GPU's clocks:",
                   "the exchange is not what to change"):
        assert phrase in text, text
    assert j.verdict.tips == ("rank.slow", "rank.node", "rank.shard", "rank.clocks")


def test_a_comm_hook_of_the_jobs_own_is_custom_and_its_name_is_never_sent(sockdir):
    j, own, reading = run_ddp(sockdir, "own")
    assert dict(j.config)["ddp.comm_hook"] == "custom"
    assert not [p for p in reading.points() if any("my_secret_hook" in str(v) for v in p.labels)]
