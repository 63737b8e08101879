"""teye's trace summary beside Holistic Trace Analysis' on the same traces (issue 46's "the summary against HTA's").

    python benchmarks/hta_compare.py [--steps N] [--seeds K]

Run it with a Python that has HTA (``pip install HolisticTraceAnalysis "pandas<3"`` in a virtual environment of
its own: it brings pandas and plotly, which teye never needs; HTA 0.5 fails on pandas 3); teye's summary (agent/trace/summary.py, standard library only)
is imported from this tree.

The traces are GPU traces in the Kineto format that ``torch.profiler`` writes, made here (this machine has no
GPU): per step, on the host, a ``ProfilerStep#N`` span and the kernel launches (``cudaLaunchKernel``, each with
the correlation id of its kernel); on the device, compute kernels on one stream, host-to-device and
device-to-host copies on another, and NCCL all-reduce kernels on a third that overlap the compute partly,
with idle gaps between, their lengths drawn from a seeded generator, on whole microseconds.  Three readings
of each trace, over the steps HTA keeps (it leaves out the last profiler step):

- the truth, counted microsecond by microsecond from the intervals the generator placed (no interval
  arithmetic shared with either tool);
- HTA 0.5's ``get_temporal_breakdown`` (idle, compute, non-compute time, over the span from the first kernel's
  start to the last kernel's end) and ``get_comm_comp_overlap`` (the share of NCCL kernel time that a compute
  kernel overlaps);
- teye's ``summarize`` (its device partition of each step's window: compute, memory, exposed and overlapped
  communication, idle), summed over the same steps.

What each tool calls idle differs: HTA's is inside the kernels' span, teye's inside the steps' windows; so both
are compared as busy time (the span less idle), which is the same microseconds in both.  HTA's non-compute is
teye's memory plus exposed communication.  teye's overlapped communication is NCCL time that any other device
work overlaps (compute or copies); HTA's overlap counts compute only: the copies here never overlap the NCCL
kernels, so both must agree.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from agent.trace import summary as S  # noqa: E402

HOST_PID, HOST_TID, DEV_PID = 4242, 4242, 0
COMPUTE_STREAM, COPY_STREAM, NCCL_STREAM = 7, 8, 20


def make_trace(steps: int, seed: int):
    """(the Kineto-format trace, the device intervals per step: {step: [(kind, start, end)]})."""
    rng = random.Random(seed)
    ev = [{"ph": "M", "name": "process_name", "pid": HOST_PID, "tid": 0, "args": {"name": "python"}},
          {"ph": "M", "name": "process_name", "pid": DEV_PID, "tid": 0, "args": {"name": "GPU 0"}}]
    placed = {}
    t = 1_000_000
    corr = 0
    for n in range(1, steps + 1):
        dev = []
        cur = t + rng.randint(200, 1500)                 # the device waits for the step's first launch
        copy_end = cur + rng.randint(300, 900)           # an input copy first
        dev.append(("memory", cur, copy_end, "Memcpy HtoD (Pageable -> Device)", COPY_STREAM))
        cur = copy_end + rng.randint(0, 300)
        for k in range(rng.randint(4, 8)):               # forward and backward kernels, with gaps
            d = rng.randint(600, 2500)
            dev.append(("compute", cur, cur + d, f"sm90_gemm_{k % 3}", COMPUTE_STREAM))
            cur += d + rng.randint(0, 400)
        last_compute = cur
        # the gradient all-reduce starts under the last third of the compute and runs past it
        a = dev[-3][1] + rng.randint(0, 500)
        b = last_compute + rng.randint(800, 3000)
        dev.append(("nccl", a, b, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", NCCL_STREAM))
        c0 = b + rng.randint(100, 600)                   # the optimizer's kernels, then a copy out
        c1 = c0 + rng.randint(400, 1200)
        dev.append(("compute", c0, c1, "multi_tensor_apply_kernel", COMPUTE_STREAM))
        m0 = c1 + rng.randint(0, 300)
        dev.append(("memory", m0, m0 + rng.randint(100, 400), "Memcpy DtoH (Device -> Pinned)", COPY_STREAM))
        step_len = max(e for _, _, e, _, _ in dev) - t + rng.randint(300, 3000)   # the host's step ends after
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": HOST_PID,
                   "tid": HOST_TID, "ts": t, "dur": step_len, "args": {}})
        for kind, s, e, name, stream in dev:
            corr += 1
            launch = max(t + 1, s - rng.randint(5, 60))
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel" if kind != "memory"
                       else "cudaMemcpyAsync", "pid": HOST_PID, "tid": HOST_TID, "ts": launch, "dur": 4,
                       "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel" if kind != "memory" else "gpu_memcpy", "name": name,
                       "pid": DEV_PID, "tid": stream, "ts": s, "dur": e - s,
                       "args": {"device": 0, "stream": stream, "correlation": corr}})
        placed[n] = [(kind, s, e) for kind, s, e, _, _ in dev]
        t += step_len
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "synthetic"}],
           "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": ev,
           "traceName": f"synthetic-{seed}"}
    return doc, placed


def truth(placed, kept):
    """Counted microsecond by microsecond: busy, compute, non-compute (busy less compute), NCCL time overlapped
    by compute, NCCL time."""
    out = dict.fromkeys(("busy", "compute", "non_compute", "nccl_overlapped_by_compute", "nccl"), 0)
    for n in kept:
        lo = min(s for _, s, _ in placed[n])
        hi = max(e for _, _, e in placed[n])
        for us in range(lo, hi):
            kinds = {k for k, s, e in placed[n] if s <= us < e}
            if kinds:
                out["busy"] += 1
                out["compute" if "compute" in kinds else "non_compute"] += 1
            if "nccl" in kinds:
                out["nccl"] += 1
                out["nccl_overlapped_by_compute"] += "compute" in kinds
    return out


def teye(doc, kept):
    res = S.summarize(doc)
    by = {r["step"]: r for r in res["steps"]}
    out = dict.fromkeys(("busy", "compute", "non_compute", "nccl_overlapped", "nccl"), 0.0)
    for n in kept:
        r = by[n]
        d = r["device_duration_s"] * 1e6
        dev = {k: v * d for k, v in r["device"].items()}
        out["busy"] += d - dev["idle"]
        out["window"] = out.get("window", 0.0) + d
        out["compute"] += dev["compute"]
        out["non_compute"] += dev["memory"] + dev["communication_exposed"]
        out["nccl_overlapped"] += dev["communication_overlapped"]
        out["nccl"] += dev["communication_overlapped"] + dev["communication_exposed"]
    return out


def hta(doc):
    from hta.trace_analysis import TraceAnalysis
    d = tempfile.mkdtemp(prefix="teye-hta.")
    with open(os.path.join(d, "rank0.json"), "w") as f:
        json.dump(doc, f)
    a = TraceAnalysis(trace_dir=d)
    tb = a.get_temporal_breakdown(visualize=False).iloc[0]
    ov = a.get_comm_comp_overlap(visualize=False).iloc[0]
    df = a.t.get_trace(0)
    kept = sorted(int(i) for i in df["iteration"].unique() if i >= 0)
    return {"busy": float(tb["kernel_time(us)"] - tb["idle_time(us)"]), "compute": float(tb["compute_time(us)"]),
            "idle_share": float(tb["idle_time(us)"] / tb["kernel_time(us)"]),
            "non_compute": float(tb["non_compute_time(us)"]),
            "overlap_ratio": float(ov["comp_comm_overlap_pctg"]) / 100}, kept   # (HTA rounds it to 0.01 %)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    import logging
    import warnings
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore", FutureWarning)   # (HTA 0.5 on pandas 2.x)
    rows = []
    print(f"{'seed':>4} {'steps':>5} | {'figure':<22} {'truth us':>10} {'HTA us':>10} {'teye us':>10} "
          f"{'HTA-truth':>9} {'teye-truth':>10}")
    for seed in range(args.seeds):
        doc, placed = make_trace(args.steps, seed)
        h, kept = hta(doc)
        tr, te = truth(placed, kept), teye(doc, kept)
        figs = [("busy (kernel span - idle)", tr["busy"], h["busy"], te["busy"]),
                ("compute", tr["compute"], h["compute"], te["compute"]),
                ("non-compute", tr["non_compute"], h["non_compute"], te["non_compute"])]
        for name, a, b, c in figs:
            print(f"{seed:>4} {len(kept):>5} | {name:<22} {a:>10.0f} {b:>10.0f} {c:>10.0f} {b - a:>9.0f} {c - a:>10.0f}")
        t_ratio = tr["nccl_overlapped_by_compute"] / tr["nccl"]
        te_ratio = te["nccl_overlapped"] / te["nccl"]
        print(f"{seed:>4} {len(kept):>5} | {'NCCL overlapped share':<22} {t_ratio:>10.4f} {h['overlap_ratio']:>10.4f} "
              f"{te_ratio:>10.4f} {h['overlap_ratio'] - t_ratio:>9.4f} {te_ratio - t_ratio:>10.4f}")
        print(f"{seed:>4} {len(kept):>5} | idle share, by each tool's definition: HTA {h['idle_share']:.4f} of the "
              f"kernels' span, teye {1 - te['busy'] / te['window']:.4f} of the steps' windows")
        rows.append([abs(b - a) for _, a, b, _ in figs] + [abs(c - a) for _, a, _, c in figs]
                    + [abs(h["overlap_ratio"] - t_ratio), abs(te_ratio - t_ratio)])
    worst = [max(r[i] for r in rows) for i in range(8)]
    print(f"largest |HTA - truth|: busy {worst[0]:.0f} us, compute {worst[1]:.0f} us, non-compute {worst[2]:.0f} us, "
          f"overlap share {worst[6]:.4f}")
    print(f"largest |teye - truth|: busy {worst[3]:.0f} us, compute {worst[4]:.0f} us, non-compute {worst[5]:.0f} us, "
          f"overlap share {worst[7]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
