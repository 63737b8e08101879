"""`teye trace summarize` (issue 46): the HTA-style summary of PyTorch profiler traces.

Oracles: a real torch.profiler trace of a tiny CPU job whose own perf_counter times next() and each step
(tests/trace/torch_traced_job.py); hand-made traces and the synthetic GPU trace
(tests/data/trace/gpu_synthetic.json) whose shares, gaps and self times are computed by hand below.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from agent.trace import summary as S
from tests.procs import REPO

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_FIXTURE = os.path.join(REPO, "tests", "data", "trace", "gpu_synthetic.json")
P, T1, T2 = 77, 77, 78           # pid, main thread, a second thread (DDP's reducer, a comm thread)


def X(name, ts, dur, cat="cpu_op", tid=T1, pid=P):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def step(n, ts, dur):
    return X(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")


def write(tmp_path, events, name="t.json", **top):
    p = tmp_path / name
    p.write_text(json.dumps(dict(top, traceEvents=events)))
    return str(p)


def teye(*args):
    return subprocess.run([sys.executable, "-m", "agent", "trace", "summarize", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------------------------ (1) a real trace

torch_missing = False
try:
    import torch  # noqa: F401
except ImportError:
    torch_missing = True


@pytest.mark.measures("the data-wait share against the job's own perf_counter")
@pytest.mark.e2e
@pytest.mark.skipif(torch_missing, reason="the torch extra (./dev.sh test installs it)")
def test_a_real_torch_profiler_trace_against_the_jobs_own_clock(tmp_path):
    """A DataLoader sleeping 20 ms a batch and a step of known work, traced for 5 steps after 2: the summary
    holds exactly those steps, and its data-wait share is the script's own perf_counter split within 5 points."""
    trace = str(tmp_path / "rank0.pt.trace.json")
    run = subprocess.run([sys.executable, os.path.join(HERE, "torch_traced_job.py"), trace, "0.02"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    own = json.loads(run.stdout.strip().splitlines()[-1])
    s = S.summarize(S.load(trace), trace)
    assert [r["step"] for r in s["steps"]] == own["traced_steps"] == [2, 3, 4, 5, 6]
    truth = own["wait_s"] / own["total_s"]
    assert s["overall"]["host"]["data_wait"] == pytest.approx(truth, abs=0.05), (s["overall"]["host"], truth)
    # ProfilerStep#N opens and closes inside prof.step(): between the script's spans inside and around the calls
    assert own["total_s"] - 1e-3 <= s["overall"]["step_time_s"]["total"] <= own["outer_s"] + 1e-3, own
    assert s["device_traced"] is False and s["overall"]["device"] is None
    # the shares of a step partition it
    for r in s["steps"]:
        h = r["host"]
        assert h["data_wait"] + h["compute"] + h["communication_exposed"] + h["gap"] == pytest.approx(1.0)
    assert s["top_ops"][0]["name"].startswith("enumerate(DataLoader)#")   # the sleep is __next__'s own time
    # the command prints the same figures, and JSON with stable keys
    out = teye(trace, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert sorted(doc) == ["errors", "format", "ranks", "traces", "version"]
    assert doc["traces"][0]["overall"]["host"] == pytest.approx(s["overall"]["host"])
    text = teye(trace)
    assert text.returncode == 0 and "5 steps traced" in text.stdout
    assert f"data wait {100 * s['overall']['host']['data_wait']:5.1f} %" in text.stdout


# ------------------------------------------------------------------------------- (2) hand-made answers

def comm_trace(tmp_path):
    """One step of 1000 us.  Main thread: data [0,100], aten::mm [100,400] (aten::copy_ [150,200] in it),
    c10d::allreduce_ [400,600] with gloo:all_reduce and an aten::copy_ inside it (communication, not
    compute), aten::add [700,750].  Second thread: nccl:all_reduce [300,500] (its own aten::view inside)."""
    ev = [step(5, 1000, 1000),
          X("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1000, 100, cat="user_annotation"),
          X("aten::mm", 1100, 300), X("aten::copy_", 1150, 50),
          X("c10d::allreduce_", 1400, 200), X("gloo:all_reduce", 1410, 180, cat="user_annotation"),
          X("aten::copy_", 1420, 20),
          X("aten::add", 1700, 50),
          X("nccl:all_reduce", 1300, 200, tid=T2, cat="user_annotation"), X("aten::view", 1310, 10, tid=T2),
          X("aten::outside", 5000, 10)]                                   # after the step: in no figure
    return write(tmp_path, ev)


def test_exposed_and_overlapped_communication_on_the_host(tmp_path):
    s = S.summarize(S.load(comm_trace(tmp_path)))
    (r,) = s["steps"]
    assert r["step"] == 5 and r["duration_s"] == pytest.approx(0.001)
    # data 100; compute: mm [100,400] and add [700,750] = 350; communication [300,600]: [300,400] runs beside
    # mm (overlapped 100), [400,600] alone (exposed 200); gap 1000-100-350-200 = 350
    assert r["host"] == pytest.approx({"data_wait": 0.1, "compute": 0.35, "communication_exposed": 0.2,
                                       "communication_overlapped": 0.1, "gap": 0.35})
    assert s["overall"]["host"] == pytest.approx(r["host"])


def test_top_ops_by_self_time(tmp_path):
    s = S.summarize(S.load(comm_trace(tmp_path)))
    got = {o["name"]: (o["calls"], round(o["self_s"] * 1e6, 6)) for o in s["top_ops"]}
    assert got == {"aten::mm": (1, 250.0), "gloo:all_reduce": (1, 160.0), "nccl:all_reduce": (1, 190.0),
                   "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__": (1, 100.0),
                   "aten::copy_": (2, 70.0), "aten::add": (1, 50.0), "c10d::allreduce_": (1, 20.0),
                   "aten::view": (1, 10.0)}
    assert [o["name"] for o in s["top_ops"][:2]] == ["aten::mm", "nccl:all_reduce"]
    assert [o["name"] for o in S.summarize(S.load(comm_trace(tmp_path)), top=1)["top_ops"]] == ["aten::mm"]


def test_device_idle_gaps_and_communication_of_the_synthetic_gpu_trace():
    """Step 10: gemm [1,4] and [4,6] ms touch (no gap), memcpy [6.5,7], NCCL [5,9]: compute 5, memory 0.5,
    NCCL beside work 1.5 (overlapped) and alone 2.5 (exposed), idle 2 (before 1 ms, after 1 ms).  Step 11:
    kernels [0,2] and [5,6]: a 3 ms gap, idle 7."""
    s = S.summarize(S.load(GPU_FIXTURE), GPU_FIXTURE)
    assert s["device_traced"] is True and (s["rank"], s["host_name"]) == (3, "gpu-node-1")
    a, b = s["steps"]
    assert a["device"] == pytest.approx({"compute": 0.5, "memory": 0.05, "communication_exposed": 0.25,
                                         "communication_overlapped": 0.15, "idle": 0.2})
    assert b["device"] == pytest.approx({"compute": 0.3, "memory": 0.0, "communication_exposed": 0.0,
                                         "communication_overlapped": 0.0, "idle": 0.7})
    assert s["overall"]["device"]["idle"] == pytest.approx(0.45)
    assert a["host"]["compute"] == pytest.approx(0.2) and b["host"]["gap"] == pytest.approx(0.9)
    assert [(k["name"], k["calls"], round(k["time_s"] * 1e3, 6)) for k in s["top_kernels"]] == [
        ("sm90_gemm_a", 2, 5.0), ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1, 4.0), ("sm90_gemm_b", 1, 2.0),
        ("elementwise_kernel", 1, 1.0), ("Memcpy DtoH (Device -> Pinned)", 1, 0.5)]


def test_the_device_step_is_the_gpu_annotation_where_the_trace_has_one(tmp_path):
    """Kineto writes ProfilerStep#N on the GPU timeline too (gpu_user_annotation): the device's step is that
    span, not the host's.  Step 10's device span [1,9] ms holds no idle time at all."""
    doc = json.load(open(GPU_FIXTURE))
    doc["traceEvents"].append(X("ProfilerStep#10", 101000, 8000, cat="gpu_user_annotation", pid=0, tid=7))
    s = S.summarize(doc)
    assert s["steps"][0]["device"]["idle"] == 0.0 and s["steps"][0]["device_duration_s"] == pytest.approx(0.008)
    assert s["steps"][1]["device"]["idle"] == pytest.approx(0.7)


def test_the_step_time_spread_between_ranks(tmp_path):
    r0 = write(tmp_path, [step(1, 0, 100_000), step(2, 100_000, 110_000)], "r0.json",
               distributedInfo={"rank": 0, "world_size": 2})
    r1 = write(tmp_path, [step(1, 0, 120_000), step(2, 120_000, 140_000)], "r1.json",
               distributedInfo={"rank": 1, "world_size": 2})
    res = S.summarize_files([r0, r1])
    sp = res["ranks"]
    assert (sp["slowest_rank"], sp["fastest_rank"], sp["count"], sp["common_steps"]) == (1, 0, 2, 2)
    assert sp["spread_s"] == pytest.approx(0.025) and sp["spread_ratio"] == pytest.approx(25 / 105)   # 130 - 105 ms
    assert sp["worst_step"] == {"step": 2, "spread_s": pytest.approx(0.030)}
    assert S.summarize_files([r0])["ranks"] is None
    out = teye(r0, r1)
    assert out.returncode == 0 and "spread 25.0 ms" in out.stdout and "slowest rank 1" in out.stdout


def test_a_gzipped_trace_reads_like_the_plain_one(tmp_path):
    plain = comm_trace(tmp_path)
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(open(plain, "rb").read()))
    assert S.summarize(S.load(str(gz)))["steps"] == S.summarize(S.load(plain))["steps"]


# ------------------------------------------------------------------------------------ (3) bad input

def reason(path, **kw):
    with pytest.raises(S.TraceError) as e:
        S.summarize(S.load(path, **kw), path)
    assert "\n" not in str(e.value) and str(e.value).startswith(path)
    return e.value.reason


def test_truncated_json(tmp_path):
    p = tmp_path / "cut.json"
    p.write_bytes(open(GPU_FIXTURE, "rb").read()[:700])
    assert reason(str(p)).startswith("truncated JSON")
    # wherever the file is cut, it is called truncated (not "not JSON")
    raw = open(GPU_FIXTURE, "rb").read()
    for n in range(1, len(raw.rstrip()) - 1):
        with pytest.raises(S.TraceError) as e:
            S.parse("x", raw[:n])
        assert e.value.reason.startswith("truncated JSON ("), (n, e.value.reason)
    g = tmp_path / "cut.json.gz"
    g.write_bytes(gzip.compress(open(GPU_FIXTURE, "rb").read())[:300])
    assert reason(str(g)) == "truncated gzip"


def test_a_file_over_the_size_bound(tmp_path):
    size = os.path.getsize(GPU_FIXTURE)
    assert reason(GPU_FIXTURE, max_bytes=size - 1) == f"larger than the bound of {size - 1} bytes (--max-bytes)"
    assert S.summarize(S.load(GPU_FIXTURE, max_bytes=size))["overall"]["steps"] == 2     # the bound itself is fine
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * 10_000 + b"]}"))
    assert reason(str(bomb), max_bytes=5000) == "decompresses to more than the bound of 5000 bytes (--max-bytes)"


def test_a_trace_without_profiler_steps(tmp_path):
    p = write(tmp_path, [X("aten::mm", 0, 10)])
    assert reason(p).startswith("no steps found: no ProfilerStep#N span")


def test_json_that_is_not_a_trace(tmp_path):
    p = tmp_path / "report.json"
    p.write_text(json.dumps({"format": "teye-report", "jobs": []}))
    assert reason(str(p)).startswith("not a Chrome trace: no traceEvents list")
    x = tmp_path / "host.xplane.pb"
    x.write_bytes(b"\x0a\x05plane")
    assert reason(str(x)).startswith("a TensorFlow profiler trace (XSpace protobuf): the summary reads Chrome")
    q = tmp_path / "text.json"
    q.write_text("step 1 loss 0.5\n")
    assert reason(str(q)).startswith("not JSON")


def test_the_command_reports_each_bad_file_on_one_line_and_summarizes_the_rest(tmp_path):
    good = comm_trace(tmp_path)
    bad = write(tmp_path, [X("aten::mm", 0, 10)], "nosteps.json")
    out = teye(good, bad, str(tmp_path / "missing.json"), "--json")
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert [t["file"] for t in doc["traces"]] == [good]
    assert [e["file"] for e in doc["errors"]] == [bad, str(tmp_path / "missing.json")]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"teye trace summarize: {bad}: no steps found")
    assert "cannot read: No such file or directory" in lines[1]
