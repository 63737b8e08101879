"""The wire protocol: each kind of malformed datagram is rejected with its own reason; fuzzing never crashes."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.phases.jobs import JobTable
from agent.phases.protocol import RESULTS, Limits, Message, Rejected, decode, encode
from tests.phases.helpers import S, ctx_with_clock, phases_cfg

NOW = 1000 * S
T = NOW - S  # a plausible CLOCK_MONOTONIC time one second ago


def _msg(**over):
    obj = {"v": 1, "job": "resnet50-bs64", "phases": [["data_wait", T, T + 1000], ["compute", T + 1000, T + 5000]],
           "steps": [[T, T + 5000, 64]]}
    obj.update(over)
    return json.dumps(obj).encode()


def test_valid_message_decodes_and_unknown_phases_become_other():
    m = decode(_msg(phases=[["data_wait", T, T + 10], ["my_custom_phase", T + 10, T + 20]], cvd="1, 3",
                    dropped=7, extra_key_from_v1_1="ignored"), NOW)
    assert m == Message("resnet50-bs64", (("data_wait", T, T + 10), ("other", T + 10, T + 20)),
                        ((T, T + 5000, 64),), ("1", "3"), 7)
    assert decode(encode("j", [("compute", T, T)]), NOW).phases == (("compute", T, T),)  # zero length is fine


BAD = [
    ("not_json", b"hello"),
    ("not_json", b"\xff\xfe\x00garbage"),
    ("not_json", b"[" * 60_000),                         # nesting deeper than the parser's recursion limit
    ("not_json", b'{"v": 1, "job": "j", "phases": [["compute", NaN, 1]]}'),
    ("not_json", b'{"v": 1, "job": "j", "dropped": ' + b"9" * 5000 + b"}"),  # 5000-digit integer
    ("not_json", b""),
    ("not_object", b"[1, 2, 3]"),
    ("not_object", b'"a string"'),
    ("missing_field", b'{"job": "j"}'),
    ("missing_field", b'{"v": 1}'),
    ("wrong_type", b'{"v": "1", "job": "j"}'),
    ("wrong_type", b'{"v": true, "job": "j"}'),
    ("unknown_version", b'{"v": 3, "job": "j"}'),
    ("unknown_version", b'{"v": 0, "job": "j"}'),
    ("wrong_type", _msg(job=17)),
    ("bad_name", _msg(job="")),
    ("bad_name", _msg(job="x" * 129)),
    ("bad_name", _msg(job="alice/resnet")),              # '/' is reserved for the agent's USER/NAME labels
    ("bad_name", _msg(job="job with spaces")),
    ("wrong_type", _msg(phases={"data_wait": [T, T + 1]})),
    ("wrong_type", _msg(phases=[["data_wait", T]])),
    ("wrong_type", _msg(phases=[[1, T, T + 1]])),
    ("wrong_type", _msg(phases=[["data_wait", float(T), T + 1]])),
    ("wrong_type", _msg(phases=[["data_wait", "1", "2"]])),
    ("wrong_type", _msg(steps=[[T, T + 1]])),
    ("wrong_type", _msg(steps=[[T, T + 1, 1.5]])),
    ("wrong_type", _msg(steps="many")),
    ("wrong_type", _msg(cvd=[0, 1])),
    ("wrong_type", _msg(dropped="3")),
    ("bad_interval", _msg(phases=[["compute", -5, T]])),               # negative
    ("bad_interval", _msg(phases=[["compute", T + 10, T]])),           # reversed
    ("bad_interval", _msg(steps=[[T - 2 * 86_400 * S, T, 1]])),        # a step of two days
    ("bad_interval", _msg(phases=[["compute", T, 2**64]])),            # beyond a 64-bit clock
    ("bad_clock", _msg(phases=[["compute", NOW + 60 * S, NOW + 61 * S]])),           # in the future
    ("bad_clock", _msg(phases=[["compute", 1_700_000_000 * S, 1_700_000_000 * S + 1]])),  # time.time_ns()
    ("bad_clock", _msg(phases=[["compute", NOW - 900 * S, NOW - 899 * S]])),         # older than the expiry
    ("bad_value", _msg(steps=[[T, T + 1, -64]])),
    ("bad_value", _msg(dropped=-1)),
    ("too_large", _msg(phases=[["compute", T, T + 1]] * 1100)),
    ("too_large", _msg(cvd="0," * 400)),
    ("too_large", b" " * 70_000 + b"{}"),
    # issue 46: a trace on request, as its client reports it
    ("wrong_type", _msg(trace=[1, 5, 5])),
    ("wrong_type", _msg(trace=[1, 5, 5, 7])),
    ("wrong_type", _msg(trace=[True, 5, 5, "x"])),
    ("bad_value", _msg(trace=[3, 5, 5, "x"])),
    ("bad_value", _msg(trace=[1, -1, 5, "x"])),
    ("bad_value", _msg(trace=[1, 5, 0, "x"])),
    ("bad_value", _msg(trace=[1, 5, 1001, "x"])),
    ("bad_value", _msg(trace=[2, 5, 5, "../x"])),
]


@pytest.mark.parametrize("reason,data", BAD, ids=[f"{r}-{i}" for i, (r, _) in enumerate(BAD)])
def test_each_malformed_kind_has_its_reason(reason, data):
    with pytest.raises(Rejected) as e:
        decode(data, NOW, Limits(max_bytes=65536, max_records=1024, max_age_ns=300 * S))
    assert e.value.reason == reason
    assert e.value.detail  # says what was wrong


def test_table_counts_each_rejection_by_reason_and_keeps_running():
    ctx, clock = ctx_with_clock(NOW)
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    want = {r: 0 for r in RESULTS}
    for reason, data in BAD:
        assert table.handle(data, 100, 0) == reason
        want[reason] += 1
    assert table.handle(_msg(), 100, 0) == "accepted"
    want["accepted"] += 1
    assert table.handle(_msg(), None, None) == "no_credentials"
    want["no_credentials"] += 1
    _, results, _, _ = table.views(clock())
    assert dict(results) == want
    assert set(dict(results)) == set(RESULTS)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30)

# Messages that are close to valid: right keys, arbitrary values.
near_valid = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 1, 2, "1", None]),
     "job": st.one_of(st.text(max_size=140), st.sampled_from(["ok-job", "j"]), json_values)},
    optional={"phases": st.lists(st.one_of(
        st.tuples(st.sampled_from(["data_wait", "compute", "zzz"]), st.integers(-10, 2 * NOW),
                  st.integers(-10, 2 * NOW)).map(list), json_values), max_size=6),
        "steps": st.lists(st.one_of(st.tuples(st.integers(-10, 2 * NOW), st.integers(-10, 2 * NOW),
                                              st.integers(-5, 10**10)).map(list), json_values), max_size=4),
        "cvd": st.one_of(st.text(max_size=20), json_values),
        "dropped": st.one_of(st.integers(-5, 2**65), json_values)})


def _check_counted(table, data, counts):
    r = table.handle(data, 100, 1000)
    assert r in RESULTS
    counts[r] = counts.get(r, 0) + 1
    _, results, _, _ = table.views(NOW)
    nonzero = {k: v for k, v in results if v}
    assert nonzero == counts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_fuzz_arbitrary_bytes(data):
    ctx, _ = ctx_with_clock(NOW)
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    _check_counted(table, data, {})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(json_values, near_valid), min_size=1, max_size=4))
def test_fuzz_json_messages(objs):
    ctx, _ = ctx_with_clock(NOW)
    table = JobTable(phases_cfg(max_jobs=3), ctx, own_uid=0)
    counts = {}
    for obj in objs:
        _check_counted(table, json.dumps(obj).encode(), counts)
    # whatever was accepted is visible and consistent
    views, _, _, _ = table.views(NOW)
    for v in views:
        assert all(s >= 0 for _, s in v.phase_seconds) and v.steps >= 0 and v.samples >= 0
        assert v.input_bound_ratio is None or 0 <= v.input_bound_ratio <= 1


def test_a_trace_report_is_the_jobs_latest_and_counted_per_process():
    """Issue 46: each process reports a trace it finished once; the job's latest is the id reported last,
    with the processes that wrote and failed it, and totals over the run."""
    ctx, clock = ctx_with_clock(NOW)
    table = JobTable(phases_cfg(), ctx, own_uid=0)
    assert table.handle(_msg(trace=[1, 36, 5, "t1"]), 100, 0) == "accepted"
    assert table.handle(_msg(trace=[2, 36, 5, "t1"]), 101, 0) == "accepted"
    (view,), *_ = table.views(clock())
    t = view.trace
    assert (t.id, t.steps, t.first_step, t.done, t.failed) == ("t1", 5, 36, 1, 1)
    assert table.handle(_msg(trace=[1, 90, 3, "t2"]), 100, 0) == "accepted"
    (view,), *_ = table.views(clock())
    t = view.trace
    assert (t.id, t.steps, t.first_step, t.done, t.failed, t.totals) == ("t2", 3, 90, 1, 0,
                                                                         (("done", 2), ("failed", 1)))
    assert table.handle(_msg(), 100, 0) == "accepted"      # a datagram without one changes nothing
    (view,), *_ = table.views(clock())
    assert view.trace == t
