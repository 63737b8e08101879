"""Ground truth on a real GPU: a known busy/idle pattern against what teye and nvidia-smi read.

    python benchmarks/gpu_truth.py [--pattern 100:0,200:300,50:50,20:180] [--segment-seconds 10] [--out DIR]

Needs an NVIDIA GPU and PyTorch built with CUDA (PyTorch is not a teye dependency; this script
is the one place that uses it).  In one run:

1. A real ``teye agent`` (live NVML, default settings, its own phase socket), ``teye record``
   (the same NVML reads written as a trace: DIR/trace.jsonl) and
   ``nvidia-smi --query-gpu=utilization.gpu -lms 100`` all watch GPU 0.
2. This process drives the GPU in segments of --segment-seconds, one training job per segment
   (``duty-<busy>-<idle>``): each step sleeps ``idle`` ms inside a ``data_wait`` phase (the GPU
   has nothing to do), then keeps fp16 matrix products queued for ``busy`` ms inside a
   ``compute`` phase and waits for them.  The truth is taken on the host around each burst:
   from the first launch to the end of ``torch.cuda.synchronize()``: an upper bound on the
   GPU's busy time (by launch and synchronize latency: measured 3-10 % of a 20-100 ms burst).  Segments are separated by
   3 s of idle, during which /metrics is read.
3. Per segment, side by side: the truth's busy seconds, teye's (``teye_gpu_busy_seconds_total``
   between the readings around the segment), nvidia-smi's (mean ``utilization.gpu`` x
   duration); idle stretches in the truth against ``teye_gpu_idle_gap_seconds``; the job's
   ``teye_job_input_bound_ratio`` against the truth's data_wait share of step time, its
   ``teye_job_gpu_idle_ratio`` against the truth's idle share, and its verdict.
4. DIR/truth.json holds the segments and bursts in unix microseconds; with DIR/trace.jsonl
   it is the oracle of tests/gpu/test_real_trace.py (copy both to tests/data/gpu/).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.conftest import parse_exposition  # noqa: E402
from tests.procs import REPO, Agent  # noqa: E402
from workloads.phases import Reporter  # noqa: E402

PAUSE_S = 3.0
NOTE = ("truth: host-side bursts (first launch to the end of torch.cuda.synchronize), unix us; "
        "observed: what the live teye agent and nvidia-smi read in the same run (benchmarks/gpu_truth.py)")


def _value(metrics, name, **labels):
    for (n, lab), v in metrics.items():
        if n == name and all(dict(lab).get(k) == want for k, want in labels.items()):
            return v
    return None


def _gap_counts(metrics, gpu="0"):
    """teye_gpu_idle_gap_seconds: {le: cumulative count} of one GPU."""
    out = {}
    for (n, lab), v in metrics.items():
        d = dict(lab)
        if n == "teye_gpu_idle_gap_seconds_bucket" and d.get("gpu") == gpu:
            out[d["le"]] = v
    return out


def _burst(torch, a, b, busy_s):
    """Queue matrix products for busy_s of host time, then wait for them: (start_us, end_us)."""
    t0 = time.time_ns()
    end = time.monotonic() + busy_s
    n = 0
    while True:
        torch.matmul(a, b)
        n += 1
        if n % 8 == 0:
            if time.monotonic() >= end:
                break
            torch.cuda.synchronize()  # keep the queue short, so the burst ends close to `end`
    torch.cuda.synchronize()
    return t0 // 1000, time.time_ns() // 1000


def _segment(torch, a, b, sock, busy_ms, idle_ms, seconds):
    job = f"duty-{busy_ms}-{idle_ms}"
    bursts, waits, steps = [], 0, 0
    rep = Reporter(job, socket_path=sock)
    start = time.time_ns() // 1000
    end_mono = time.monotonic() + seconds
    step_ns = 0
    while time.monotonic() < end_mono:
        s0 = time.monotonic_ns()
        with rep.phase("data_wait"):
            w0 = time.monotonic_ns()
            if idle_ms:
                time.sleep(idle_ms / 1000)
            waits += time.monotonic_ns() - w0
        with rep.phase("compute"):
            bursts.append(_burst(torch, a, b, busy_ms / 1000))
        rep.step(samples=64)
        step_ns += time.monotonic_ns() - s0
        steps += 1
    rep.close()
    stop = time.time_ns() // 1000
    busy = sum(e - s for s, e in bursts) / 1e6
    return dict(job=job, busy_ms=busy_ms, idle_ms=idle_ms, start_us=start, end_us=stop, steps=steps,
                truth_busy_s=busy, truth_wait_share=waits / step_ns, bursts=bursts)


def _smi_busy(rows, start_us, end_us):
    vals = [u for t, u in rows if start_us <= t <= end_us]
    return (statistics.mean(vals) / 100 * (end_us - start_us) / 1e6, len(vals)) if vals else (None, 0)


def _read_smi(path):
    rows = []
    with open(path) as fh:
        for line in fh:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 2 or not parts[1].isdigit():
                continue
            # "2026/11/23 10:00:00.123": local time as nvidia-smi prints it
            t = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            frac = float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            rows.append((int((t + frac) * 1e6), int(parts[1])))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pattern", default="100:0,200:300,50:50,20:180",
                    help="segments as busy_ms:idle_ms, comma-separated")
    ap.add_argument("--segment-seconds", type=float, default=10.0)
    ap.add_argument("--out", default=None, help="where trace.jsonl, truth.json and the logs go (default: a temp dir)")
    args = ap.parse_args(argv)
    import torch  # noqa: PLC0415 - optional, only this script needs it
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU visible to PyTorch")
    pattern = [tuple(int(x) for x in p.split(":")) for p in args.pattern.split(",")]
    out = args.out or tempfile.mkdtemp(prefix="teye-gpu-truth-")
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="teye-gt-")
    sock = os.path.join(tmp, "phases.sock")
    total = PAUSE_S + len(pattern) * (args.segment_seconds + PAUSE_S) + 8
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with contextlib.ExitStack() as stack:
        segments, readings, final, smi_rows = _run(stack, args, pattern, out, sock, total, env, torch)
    _report(args, torch, segments, readings, final, smi_rows, out)


def _start(stack, argv, log_path, env=None):
    """A subprocess writing to log_path, terminated (then waited for) when the stack closes."""
    log = stack.enter_context(open(log_path, "w"))
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop():
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    stack.callback(stop)
    return proc


def _run(stack, args, pattern, out, sock, total, env, torch):
    """Start the observers, drive the GPU, read /metrics around each segment."""
    agent = Agent(["--phase-socket", sock, "--log-level", "info"], env, os.path.join(out, "agent.log"))
    stack.callback(agent.stop)
    recorder = _start(stack, [sys.executable, "-m", "agent", "record", "--output", os.path.join(out, "trace.jsonl"),
                              "--duration", str(total), "--interval", "1"], os.path.join(out, "record.log"), env)
    smi_path = os.path.join(out, "nvidia-smi.csv")
    smi = _start(stack, ["nvidia-smi", "-i", "0", "--query-gpu=timestamp,utilization.gpu,power.draw",
                         "--format=csv,noheader,nounits", "-lms", "100"], smi_path)
    dev = torch.device("cuda:0")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
    for _ in range(20):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    time.sleep(PAUSE_S)
    readings = [parse_exposition(agent.metrics())]
    segments = []
    for busy_ms, idle_ms in pattern:
        seg = _segment(torch, a, b, sock, busy_ms, idle_ms, args.segment_seconds)
        time.sleep(PAUSE_S)
        readings.append(parse_exposition(agent.metrics()))
        segments.append(seg)
    time.sleep(2)
    final_text = agent.metrics()
    final = parse_exposition(final_text)
    with open(os.path.join(out, "metrics-final.txt"), "w") as fh:
        fh.write(final_text)
    smi.terminate()
    recorder.wait(timeout=total + 60)
    smi.wait(timeout=30)
    return segments, readings, final, _read_smi(smi_path)


def _report(args, torch, segments, readings, final, smi_rows, out):
    print(f"GPU: {torch.cuda.get_device_name(0)}; segments of {args.segment_seconds:g} s, {PAUSE_S:g} s idle between")
    print(f"{'segment':>14} {'steps':>5} {'truth busy s':>12} {'teye busy s':>11} {'ratio':>6} "
          f"{'smi busy s':>10} {'ratio':>6} {'wait share':>10} {'teye input':>10} {'gpu idle':>8} {'verdict':>9}")
    for k, seg in enumerate(segments):
        m0, m1 = readings[k], readings[k + 1]
        b0, b1 = _value(m0, "teye_gpu_busy_seconds_total", gpu="0"), _value(m1, "teye_gpu_busy_seconds_total", gpu="0")
        busy = b1 - b0 if b0 is not None and b1 is not None else None
        smi_busy, n_smi = _smi_busy(smi_rows, seg["start_us"], seg["end_us"])
        # the job as read 3 s after its last step (at the final reading it has stalled: verdict idle)
        inp = _value(m1, "teye_job_input_bound_ratio", train_job=seg["job"])
        idle = _value(m1, "teye_job_gpu_idle_ratio", train_job=seg["job"])
        verdict = [dict(lab)["kind"] for (n, lab), v in m1.items()
                   if n == "teye_job_bottleneck" and dict(lab).get("train_job") == seg["job"] and v == 1]
        g0, g1 = _gap_counts(m0), _gap_counts(m1)
        seg["teye"] = dict(busy_s=busy, input_bound_ratio=inp, gpu_idle_ratio=idle, verdict=verdict,
                           idle_gaps={le: g1[le] - g0.get(le, 0) for le in g1})
        seg["nvidia_smi"] = dict(busy_s=smi_busy, samples=n_smi)
        fmt = (lambda v, w=6: f"{v:>{w}.3f}" if isinstance(v, float) else f"{'-':>{w}}")
        print(f"{seg['job']:>14} {seg['steps']:>5} {seg['truth_busy_s']:>12.3f} {fmt(busy, 11)} "
              f"{fmt(busy / seg['truth_busy_s'] if busy is not None else None)} {fmt(smi_busy, 10)} "
              f"{fmt(smi_busy / seg['truth_busy_s'] if smi_busy is not None else None)} "
              f"{seg['truth_wait_share']:>10.3f} {fmt(inp, 10)} {fmt(idle, 8)} {','.join(verdict) or '-':>9}")
        print(f"{'':>14} idle stretches in the truth: {seg['steps']} of {seg['idle_ms']} ms; teye's idle-gap "
              f"histogram (cumulative, this segment): {seg['teye']['idle_gaps']}")
    pids = [dict(lab) for (n, lab), v in final.items() if n == "teye_gpu_process_info"]
    print(f"teye_gpu_process_info while the GPU was held: {pids or 'none'} (this process: pid {os.getpid()})")
    observed = dict(teye_agent_busy_s=[seg.pop("teye")["busy_s"] for seg in segments],
                    nvidia_smi_busy_s=[seg.pop("nvidia_smi")["busy_s"] for seg in segments])
    with open(os.path.join(out, "truth.json"), "w") as fh:
        json.dump(dict(gpu=torch.cuda.get_device_name(0), pause_s=PAUSE_S, pid=os.getpid(), segments=segments,
                       observed=observed, note=NOTE), fh, separators=(",", ":"))
    print(f"files in {out}")


if __name__ == "__main__":
    main()
