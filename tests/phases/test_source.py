"""Where a job's phases come from: the optional "src" (once per connection), teye_job_info{source}, the evidence."""
from __future__ import annotations

import json

import pytest

from agent.phases import protocol
from agent.phases.jobs import JobTable
from agent.phases.protocol import Rejected, decode_python, encode
from tests.phases.helpers import MS, S, ctx_with_clock, phases_cfg
from tests.phases.test_jobs import _exposition, _get, _step


def _with_src(data: bytes, src) -> bytes:
    obj = json.loads(data)
    obj["src"] = src
    return json.dumps(obj, separators=(",", ":")).encode()


def test_src_is_validated_and_optional():
    now = 1000 * S
    plain = encode("j", [("compute", now - MS, now)])
    assert decode_python(_with_src(plain, "torch"), now) == decode_python(plain, now)
    with pytest.raises(Rejected) as e:
        decode_python(_with_src(plain, 3), now)
    assert e.value.reason == "wrong_type"
    with pytest.raises(Rejected) as e:
        decode_python(_with_src(plain, "x" * 33), now)
    assert e.value.reason == "too_large"
    assert protocol.source_of(_with_src(plain, "tf.data")) == "tf.data"
    assert protocol.source_of(_with_src(plain, "made-up")) == "other"   # a bounded label
    assert protocol.source_of(plain) is None


def test_source_label_and_evidence():
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    t = clock.t - 10 * S
    for i in range(10):
        phases, steps, t = _step(t, 60, 40)
        data = encode("pt", phases, steps)
        if i == 0:
            data = _with_src(data, "torch")  # the first datagram of the connection only
        assert table.handle_batch([(data, 321, 0)]) is None
        phases, steps, t2 = _step(t - 100 * MS, 10, 90)
        table.handle_batch([(encode("plain", phases, steps), 322, 0)])
    m = _exposition(table, clock.t)
    assert _get(m, "teye_job_info", train_job="pt", user="root", uid="0", pid="321", source="torch",
                namespace="", pod="") == 1
    assert _get(m, "teye_job_info", train_job="plain", user="root", uid="0", pid="322", source="client",
                namespace="", pod="") == 1
    views = {j.train_job: j for j in table.views(clock.t)[0]}
    assert views["pt"].verdict.kind == "input" and views["pt"].steps == 10
    assert "phases from zero-code: torch DataLoader" in views["pt"].verdict.evidence
    assert "phases from client" in views["plain"].verdict.evidence


def test_steps_only_sources_never_claim_an_input_share():
    from agent.phases.verdict import Evidence, decide
    ev = Evidence(window_s=60, phase_seconds={}, step_seconds=10.0, steps=10, source="tf-steps")
    v = decide(ev)
    assert v.kind == "not_observed" and "input wait not observed" in v.evidence and "data_wait" not in v.evidence


def test_a_steps_only_job_exports_no_phase_counters_no_samples_and_no_guess():
    """A steps-only job (tf-steps: a Python generator, Model.fit where it cannot be observed) sends steps and no
    phases: its phase counters and sample count are absent, not 0; its verdict is not_observed without GPU
    samples, and a job that reports phases keeps its four usual phase counters from 0."""
    ctx, clock = ctx_with_clock()
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    t = clock.t - 10 * S
    for i in range(10):
        data = encode("gen", [], [(t, t + 80 * MS, 0)])
        if i == 0:
            data = _with_src(data, "tf-steps")
        assert table.handle_batch([(data, 400, 0)]) is None
        t += 80 * MS
    table.handle_batch([(encode("phased", [("compute", t - 50 * MS, t)], [(t - 50 * MS, t, 8)]), 401, 0)])
    m = _exposition(table, clock.t)
    names = {(n, dict(l).get("train_job")) for n, l in m}
    assert ("teye_job_steps_total", "gen") in names and _get(m, "teye_job_steps_total", train_job="gen") == 10
    for absent in ("teye_job_phase_seconds_total", "teye_job_samples_total", "teye_job_input_bound_ratio"):
        assert (absent, "gen") not in names, absent
    assert _get(m, "teye_job_phase_seconds_total", train_job="phased", phase="data_wait") == 0
    assert _get(m, "teye_job_samples_total", train_job="phased") == 8
    assert _get(m, "teye_job_bottleneck", train_job="gen", kind="not_observed") == 1
    assert _get(m, "teye_job_bottleneck", train_job="gen", kind="compute") == 0
