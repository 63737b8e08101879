"""Where an idle agent's CPU goes: per thread, per collector read and per scrape, trees side by side.

    python benchmarks/idle_profile.py [--seconds 120] [--gpu] [--baseline DIR]

Runs ``teye agent`` at the defaults (as benchmarks/footprint.py's "host", or its "8gpu" with --gpu: the
synthetic 8-GPU replay) from this checkout, and with --baseline from another checkout beside it, each scraped
every 15 s.  After 20 s of start-up, over --seconds:

- per OS thread (the sampler names its threads): CPU from ``/proc/<pid>/task/*/schedstat`` (nanoseconds, not
  clock ticks: one tick over 60 s is 0.017 % of a core, too coarse to tell a change of a few percent) and the
  times it was scheduled in per second (its wake-ups, and the preemptions of a busy machine);
- per collector: the CPU time (``time.thread_time``) of each read through the sampler (``Sampler.read_once``:
  the collector's ``collect()`` and the snapshot it publishes), its count and share of a core;
- per scrape: the CPU time of formatting /metrics (``Exposition.render``), and the interpreter's garbage
  collections.

The agent runs in a wrapper (this file, ``--agent``) that times those calls; nothing else changes.  The
figures are the wrapper's, so they include its own few microseconds a call.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def agent_main(argv) -> int:
    """Inside the agent's process: time reads, renders and collections, then run the agent."""
    tree, out = os.environ["IDLE_PROFILE_TREE"], os.environ["IDLE_PROFILE_OUT"]
    sys.path.insert(0, tree)
    os.chdir(tree)
    import atexit
    import gc
    from agent import sampler as sampler_mod
    from agent.cli import main
    from exporters import render as render_mod

    stats, lock = {}, threading.Lock()

    def acc(key, dt):
        with lock:
            s = stats.setdefault(key, [0, 0.0])
            s[0] += 1
            s[1] += dt

    def timed(key_of, fn):
        def wrapper(self, *a, **kw):
            t = time.thread_time()
            try:
                return fn(self, *a, **kw)
            finally:
                acc(key_of(a), time.thread_time() - t)
        return wrapper
    sampler_mod.Sampler.read_once = timed(lambda a: "read:" + a[0], sampler_mod.Sampler.read_once)
    render_mod.Exposition.render = timed(lambda a: "render", render_mod.Exposition.render)
    started = {}

    def on_gc(phase, info):
        tid = threading.get_native_id()
        if phase == "start":
            started[tid] = time.thread_time()
        elif tid in started:
            acc(f"gc{info['generation']}", time.thread_time() - started.pop(tid))
    gc.callbacks.append(on_gc)

    def reset():   # start-up (imports, first reads) left out
        time.sleep(20)
        with lock:
            stats.clear()
            stats["_t0"] = [0, time.monotonic()]
    threading.Thread(target=reset, daemon=True).start()

    def dump():
        with lock:
            stats["_t1"] = [0, time.monotonic()]
            with open(out, "w") as fh:
                json.dump(stats, fh)
    atexit.register(dump)
    rc = main(argv)
    dump()
    return rc


def _threads(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                comm = fh.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                run_ns, _, slices = map(int, fh.read().split())
        except OSError:
            continue
        out[tid] = (comm, run_ns, slices)
    return out


def main() -> int:
    if sys.argv[1:2] == ["--agent"]:
        return agent_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--gpu", action="store_true", help="the synthetic 8-GPU replay")
    ap.add_argument("--baseline", metavar="DIR")
    ap.add_argument("--top", type=int, default=16, help="collectors listed, costliest first")
    a = ap.parse_args()
    sys.path.insert(0, REPO)
    from tests.procs import free_port, wait_http
    tmp = tempfile.mkdtemp(prefix="teye-idle-profile-")
    conf = os.path.join(tmp, "teye.yml")
    with open(conf, "w") as fh:
        fh.write("log_level: warning\n")
    replay = None
    if a.gpu:
        replay = os.path.join(tmp, "gpu8.json")
        subprocess.run([sys.executable, os.path.join(REPO, "tests", "data", "gpu", "make_synthetic_trace.py"), replay,
                        "--gpus", "8"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    agents = []
    for i, tree in enumerate([REPO] + ([os.path.abspath(a.baseline)] if a.baseline else [])):
        port = free_port()
        argv = [sys.executable, os.path.abspath(__file__), "--agent", "agent", "--config", conf,
                "--listen", f"127.0.0.1:{port}", "--phase-socket", os.path.join(tmp, f"p{i}.sock")]
        if replay:
            argv += ["--gpu-replay", replay]
        out = os.path.join(tmp, f"agent{i}.json")
        env = dict(os.environ, IDLE_PROFILE_TREE=tree, IDLE_PROFILE_OUT=out)
        agents.append((tree, subprocess.Popen(argv, env=env, cwd=tree), f"http://127.0.0.1:{port}/metrics", out))
    try:
        for _, _, url, _ in agents:
            wait_http(url, timeout=90)
        time.sleep(20.5)
        before = [_threads(p.pid) for _, p, _, _ in agents]
        t0 = next_scrape = time.monotonic()
        while time.monotonic() - t0 < a.seconds:
            if time.monotonic() >= next_scrape:
                for _, _, url, _ in agents:
                    with urllib.request.urlopen(url, timeout=10) as r:
                        r.read()
                next_scrape += 15.0
            time.sleep(0.5)
        wall = time.monotonic() - t0
        after = [_threads(p.pid) for _, p, _, _ in agents]
    finally:
        for _, p, _, _ in agents:
            p.terminate()
        for _, p, _, _ in agents:
            p.wait(10)
    for i, (tree, _, _, out) in enumerate(agents):
        by = {}
        for tid, (comm, run_ns, slices) in after[i].items():
            _, run0, slices0 = before[i].get(tid, (comm, 0, 0))
            agg = by.setdefault(comm, [0, 0, 0])
            agg[0] += 1
            agg[1] += run_ns - run0
            agg[2] += slices - slices0
        total = sum(v[1] for v in by.values())
        print(f"\n{tree}: {100 * total / 1e9 / wall:.4f} % of a core over {wall:.0f} s (schedstat)")
        print(f"  {'thread':<18} {'n':>3} {'CPU %':>8} {'scheduled/s':>12}")
        for comm, (n, run_ns, slices) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            print(f"  {comm:<18} {n:>3} {100 * run_ns / 1e9 / wall:>8.4f} {slices / wall:>12.2f}")
        with open(out) as fh:
            st = json.load(fh)
        span = st.pop("_t1")[1] - st.pop("_t0")[1]
        rows = sorted(st.items(), key=lambda kv: -kv[1][1])
        print(f"  {'call':<20} {'n':>5} {'ms each':>8} {'CPU %':>8}")
        for key, (n, s) in rows[:a.top]:
            print(f"  {key:<20} {n:>5} {1000 * s / max(n, 1):>8.3f} {100 * s / span:>8.4f}")
        print(f"  {'(all timed calls)':<20} {'':>5} {'':>8} {100 * sum(s for _, s in st.values()) / span:>8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
