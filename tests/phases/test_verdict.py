"""The verdict rules on constructed evidence, one case per kind, plus the thresholds from config."""
from __future__ import annotations

import pytest

from agent.phases.verdict import KINDS, RECOMMENDATIONS, Evidence, Thresholds, decide, recommendation
from tests.phases.helpers import phases_cfg

TH = Thresholds()


def ev(phases, step_seconds=0.0, steps=0, gpu_idle=None, observed=0.0, step_idle=None, silent=0.0, **more):
    return Evidence(window_s=60.0, phase_seconds=phases, step_seconds=step_seconds, steps=steps,
                    gpu_idle_seconds=gpu_idle or {}, gpu_observed_seconds=observed,
                    gpu_step_idle_seconds=step_idle, silent_s=silent, **more)


def test_input_by_step_time_share():
    v = decide(ev({"data_wait": 6.0, "compute": 3.0}, step_seconds=10.0, steps=100))
    assert v.kind == "input"
    assert "data_wait 60 % of step time (threshold 20 %)" in v.evidence and "100 steps" in v.evidence
    assert "prefetch" in v.recommendation and "num_parallel_calls" in v.recommendation


def test_input_by_where_gpu_idle_falls_even_below_the_time_threshold():
    # data_wait only 15 % of step time, but 80 % of the GPU idle time (GPU idle 30 %) falls in it
    v = decide(ev({"data_wait": 1.5, "compute": 8.5}, step_seconds=10.0, steps=50,
                  gpu_idle={"data_wait": 2.4, "compute": 0.6}, observed=10.0, step_idle=3.0))
    assert v.kind == "input"
    assert "80 % of GPU idle time falls in data_wait" in v.evidence
    assert "GPU idle 30 % of observed time" in v.evidence


def test_host_by_host_phase():
    v = decide(ev({"data_wait": 0.5, "host": 3.0, "compute": 6.5}, step_seconds=10.0, steps=10))
    assert v.kind == "host" and "gpu_private" in v.recommendation


def test_host_by_gpu_idle_inside_compute():
    # the job is all "compute" yet the GPU idles 40 % of the time, during compute: launch-bound
    v = decide(ev({"data_wait": 0.2, "compute": 9.8}, step_seconds=10.0, steps=10,
                  gpu_idle={"data_wait": 0.2, "compute": 3.8}, observed=10.0, step_idle=4.0))
    assert v.kind == "host"
    # ... but a compute-bound job with a few normal gaps between kernels stays compute
    v = decide(ev({"data_wait": 0.2, "compute": 9.8}, step_seconds=10.0, steps=10,
                  gpu_idle={"data_wait": 0.25, "compute": 1.0}, observed=10.0, step_idle=1.25))
    assert v.kind == "compute"


def test_communication():
    v = decide(ev({"data_wait": 0.3, "compute": 5.0, "communication": 4.5}, step_seconds=10.0, steps=10))
    assert v.kind == "communication"
    assert "gradient" in v.recommendation.lower() and "InfiniBand" in v.recommendation


def test_compute():
    v = decide(ev({"data_wait": 0.5, "compute": 9.3, "host": 0.2}, step_seconds=10.0, steps=10,
                  gpu_idle={"data_wait": 0.3}, observed=10.0, step_idle=0.4))
    assert v.kind == "compute"
    assert "compute 93 % of step time" in v.evidence and "mixed precision" in v.recommendation


def test_idle_when_silent_or_idle_outside_phases():
    v = decide(ev({"compute": 5.0}, step_seconds=5.0, steps=5, silent=45.0))
    assert v.kind == "idle" and "no phase or step reported for 45 s" in v.evidence
    assert decide(ev({})).kind == "idle"
    # GPU idle 70 % of the time, but only a little of it overlaps the reported phases
    v = decide(ev({"data_wait": 0.5, "compute": 4.0}, step_seconds=10.0, steps=10,
                  gpu_idle={"data_wait": 0.5, "compute": 0.5}, observed=10.0, step_idle=7.0))
    assert v.kind == "idle" and "outside the reported phases" in v.evidence


def test_largest_lost_share_wins():
    v = decide(ev({"data_wait": 2.5, "communication": 4.0, "compute": 3.5}, step_seconds=10.0, steps=10))
    assert v.kind == "communication" and dict(v.scores) == pytest.approx({"input": 0.25, "communication": 0.4})


def test_without_steps_the_phase_sum_is_the_step_time():
    v = decide(ev({"data_wait": 1.0, "compute": 3.0}))
    assert v.kind == "input" and "data_wait 25 %" in v.evidence


def test_thresholds_come_from_config():
    th = Thresholds.from_config(phases_cfg(input_bound_threshold=0.5))
    e = ev({"data_wait": 3.0, "compute": 7.0}, step_seconds=10.0, steps=10)
    assert decide(e, TH).kind == "input" and decide(e, th).kind == "compute"


def test_every_kind_has_a_recommendation():
    assert set(RECOMMENDATIONS) == set(KINDS)


def test_input_cause_and_extra_host_evidence():
    from agent.phases.verdict import INPUT_CAUSE_RECOMMENDATIONS, InputWait
    base = dict(window_s=60.0, phase_seconds={"data_wait": 6.0, "compute": 4.0}, step_seconds=10.0, steps=10,
                extra=(("host", "memory bandwidth 92 % of peak"), ("gpu", "not cited")))
    busy = decide(Evidence(**base, input_wait=InputWait(wait_s=6.0, cpu_s=6.6, read_bytes=0)))
    assert (busy.kind, busy.cause) == ("input", "host_cpu")
    assert "1.10 CPU s per s of data_wait over 6.0 s" in busy.evidence
    assert "memory bandwidth 92 % of peak" in busy.evidence and "not cited" not in busy.evidence
    assert busy.recommendation == INPUT_CAUSE_RECOMMENDATIONS["host_cpu"]
    slow = decide(Evidence(**base, input_wait=InputWait(wait_s=6.0, cpu_s=0.3, read_bytes=60_000_000,
                                                        io_stall_s=4.5)))
    assert slow.cause == "storage" and "read 10.0 MB/s" in slow.evidence and "I/O pressure 75 %" in slow.evidence
    assert "memory bandwidth" not in slow.evidence      # host notes only where the host is the limit
    none = decide(Evidence(**base))
    assert none.cause == "unknown" and none.recommendation == RECOMMENDATIONS["input"]
    host = decide(Evidence(window_s=60.0, phase_seconds={"host": 5.0, "compute": 5.0}, step_seconds=10.0, steps=10,
                           extra=(("host", "memory bandwidth 92 % of peak"),)))
    assert host.kind == "host" and host.cause is None and "memory bandwidth 92 %" in host.evidence


def _steps_only(step_idle=None, observed=0.0, source="tf-steps"):
    return Evidence(window_s=60.0, phase_seconds={}, step_seconds=10.0, steps=100, gpu_observed_seconds=observed,
                    gpu_step_idle_seconds=step_idle, source=source)


@pytest.mark.parametrize("source", ["tf-steps", "torch-steps"])
def test_input_wait_not_observed_is_never_a_guess(source):
    """Steps only: no GPU samples -> not_observed; GPUs busy -> compute (the GPU is the limit); GPUs idle at
    least gpu_idle_min_ratio of the steps -> idle (they wait for what the phases do not show)."""
    v = decide(_steps_only(source=source))
    assert v.kind == "not_observed" and v.recommendation == recommendation("not_observed", source=source)
    assert "input wait not observed" in v.evidence and "no GPU samples" in v.evidence
    busy = decide(_steps_only(step_idle=0.5, observed=10.0, source=source))   # idle 5 %
    assert busy.kind == "compute" and "busy 95 %" in busy.evidence and "input wait not observed" in busy.evidence
    waits = decide(_steps_only(step_idle=1.0, observed=10.0, source=source))  # idle 10 %: the threshold
    assert waits.kind == "idle" and "idle 10 %" in waits.evidence and "not observed" in waits.recommendation
    assert decide(_steps_only(step_idle=8.6, observed=10.0, source=source)).kind == "idle"
    # the same steps from a source that observes input waits are judged by the phase rules
    assert decide(_steps_only(step_idle=0.5, observed=10.0, source="client")).kind == "compute"


# Item 4 of issue 29: advice in the job's own framework.  What each family's text must name, and what it must
# never name (another framework's API).
TORCH_WORDS = ("DataLoader", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
TF_WORDS = ("tf.data", "num_parallel_calls", "AUTOTUNE", "TFRecord", "TF_GPU_THREAD_MODE", "jit_compile", "keras")
TORCH_ONLY = ("DataLoader", "torch.", "num_workers", "pin_memory")


def _input_ev(source, cpu):
    from agent.phases.verdict import InputWait
    return ev({"data_wait": 6.0, "compute": 4.0}, step_seconds=10.0, steps=10, source=source,
              input_wait=InputWait(wait_s=6.0, cpu_s=cpu * 6.0, read_bytes=int(6e6 * 6) if cpu < 0.5 else 0,
                                   io_stall_s=0.0))


@pytest.mark.parametrize("source", ["torch", "torch-steps", "tf.data", "tf-steps", "keras", "client", "other"])
def test_recommendations_speak_the_jobs_own_framework(source):
    from agent.phases.verdict import CAUSES, framework_of
    fam = framework_of(source)
    assert fam == {"torch": "torch", "torch-steps": "torch", "tf.data": "tensorflow", "tf-steps": "tensorflow",
                   "keras": "tensorflow"}.get(source, "neutral")
    texts = {("input", c): recommendation("input", c, source) for c in CAUSES}
    texts.update({(k, None): recommendation(k, source=source) for k in ("host", "compute", "communication",
                                                                          "not_observed", "steps_only_idle")})
    for key, text in texts.items():
        assert text, key
        low = text.lower()
        if fam == "torch":
            assert not any(w.lower() in low for w in TF_WORDS), (key, text)
        elif fam == "tensorflow":
            assert not any(w.lower() in low for w in TORCH_ONLY), (key, text)
    inp = texts[("input", "unknown")]
    if fam == "torch":
        assert all(w in inp for w in TORCH_WORDS), inp
        assert "decode" in inp and "shards" in inp                         # faster decode, storage layout
        assert all(w in texts[("input", "storage")] for w in ("num_workers", "prefetch_factor", "shards", "NVMe"))
        assert "num_workers" in texts[("input", "host_cpu")] and "decode" in texts[("input", "host_cpu")]
        assert "torch.compile" in texts[("host", None)] and "torch.autocast" in texts[("compute", None)]
        assert "bucket_cap_mb" in texts[("communication", None)]
        assert "DataLoader" in texts[("not_observed", None)] and "DataLoader" in texts[("steps_only_idle", None)]
    elif fam == "tensorflow":
        assert "prefetch(tf.data.AUTOTUNE)" in inp and "num_parallel_calls" in inp and "cache()" in inp
        assert "interleave" in texts[("input", "storage")] and "TFRecord" in texts[("input", "storage")]
        assert "num_parallel_calls" in texts[("input", "host_cpu")]
        assert "TF_GPU_THREAD_MODE" in texts[("host", None)] and "jit_compile" in texts[("compute", None)]
        assert "tf.data" in texts[("not_observed", None)] and "tf.data" in texts[("steps_only_idle", None)]
    else:   # a client that did not say: neutral advice naming both, no single framework's recipe
        assert texts[("input", "unknown")] == RECOMMENDATIONS["input"]
        for text in (inp, texts[("input", "host_cpu")], texts[("host", None)], texts[("compute", None)]):
            assert "tf.data" in text or "TensorFlow" in text or "XLA" in text, text
            assert "DataLoader" in text or "PyTorch" in text or "torch.compile" in text, text
        assert "persistent_workers" not in inp and "TFRecord" not in inp


@pytest.mark.parametrize("source, says, never", [
    ("torch", "DataLoader", "tf.data"), ("tf.data", "tf.data", "DataLoader"), ("keras", "tf.data", "DataLoader"),
])
def test_decide_gives_the_sources_advice(source, says, never):
    """decide() itself picks the text of the job's source, for each input cause and for compute."""
    for cpu, cause in ((1.5, "host_cpu"), (0.05, "storage")):
        v = decide(_input_ev(source, cpu))
        assert v.kind == "input" and v.cause == cause, v.evidence
        assert says in v.recommendation and never not in v.recommendation, v.recommendation
        assert v.recommendation == recommendation("input", cause, source)
    c = decide(ev({"data_wait": 0.5, "compute": 9.5}, step_seconds=10.0, steps=10, source=source))
    assert c.kind == "compute" and c.recommendation == recommendation("compute", source=source)
    assert never not in c.recommendation


def test_compile_is_in_no_share_wherever_the_client_put_it():
    """compile (docs/phases.md) leaves the step time: inside a 1 s step with 0.4 s of it, 0.3 s of data_wait is
    half of the 0.6 s left; without steps, the phases but compile.  A client whose data_wait overlaps its
    compile (bad input: 0.9 s of data_wait and 0.5 s of compile in a 1 s step) gets a share of at most 1, no
    error."""
    ev = Evidence(window_s=60, phase_seconds={"data_wait": 0.3, "compute": 0.3, "compile": 0.4}, step_seconds=1.0)
    assert ev.step_time == pytest.approx(0.6) and ev.share("data_wait") == pytest.approx(0.5)
    ev = Evidence(window_s=60, phase_seconds={"data_wait": 0.3, "compute": 0.3, "compile": 4.0})
    assert ev.step_time == pytest.approx(0.6) and ev.share("data_wait") == pytest.approx(0.5)
    ev = Evidence(window_s=60, phase_seconds={"data_wait": 0.9, "compile": 0.5}, step_seconds=1.0)
    assert ev.step_time == pytest.approx(0.9) and ev.share("data_wait") == pytest.approx(1.0)
    assert decide(ev, Thresholds()).kind == "input"


def test_a_steps_only_job_whose_exchange_crosses_the_threshold_is_communication():
    """Issue 47: a data-parallel job whose input teye cannot see (steps only: tensors in memory, a get_batch
    loop) still has its exposed exchange timed; where that alone crosses the threshold it is communication,
    never not_observed; under it, the job stays not observed (no guess at its input)."""
    ev = Evidence(window_s=60, phase_seconds={"communication": 0.5}, step_seconds=1.0, steps=10,
                  source="torch-steps")
    v = decide(ev)
    assert v.kind == "communication" and "its input wait is not observed" in v.evidence, v
    ev = Evidence(window_s=60, phase_seconds={"communication": 0.1}, step_seconds=1.0, steps=10,
                  source="torch-steps")
    assert decide(ev).kind == "not_observed"
