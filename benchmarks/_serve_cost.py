"""The receive thread's CPU per datagram, in one process: benchmarks/phases.py runs this for each tree.

    python benchmarks/_serve_cost.py TREE [ROUNDS [STEPS]]

Imports the agent from TREE (standard library only here, so that any checkout can be measured),
queues bursts of 16 typical datagrams (2 phases + 1 step, 8 jobs) on a socketpair with
SO_PASSCRED, and times only the receiving side with the thread's CPU clock: the compiled loop
(``JobTable.compiled_receive()``, ``_fast.serve``) where the tree has it, else what the receiver
does without it (``recvmsg`` per datagram, then ``JobTable.handle_batch``).  The table has an
input probe (not started), as the agent's has.  Without the wake-ups and the cold caches of a
live agent this is a lower bound of benchmarks/phases.py's agent CPU per message, and much less
noisy.  With STEPS > 1 each datagram carries STEPS steps, as teye_client's batching reporter sends them
(benchmarks/zero_code.py), and the figure is per step.  Prints the median of ROUNDS rounds of 3,200
datagrams, in microseconds per datagram (per step with STEPS > 1), and on
stderr which receive path ran (``path: python``, or ``path: compiled (N datagrams handled in C, M passed
to Python)``).
"""
import copy
import json
import os
import socket
import statistics
import struct
import sys
import time

BURST = 16


def typical_datagram(i: int, t_ns: int) -> bytes:
    """The benchmarks' per-step datagram: job bench<i % 8>, a 1 ms data_wait and a 2 ms compute
    ending at t_ns, and their 3 ms step (also what benchmarks/phases.py sends)."""
    return json.dumps({"v": 1, "job": f"bench{i % 8}", "phases": [["data_wait", t_ns - 3_000_000, t_ns - 2_000_000],
                                                                 ["compute", t_ns - 2_000_000, t_ns]],
                       "steps": [[t_ns - 3_000_000, t_ns, 32]]}, separators=(",", ":")).encode()


def batched_datagram(i: int, t_ns: int, steps: int) -> bytes:
    """A datagram of teye_client's batching reporter: job bench<i % 8>, ``steps`` 10 ms steps ending at
    t_ns, each a 1 ms compute, a 3 ms data_wait and a 6 ms compute (64 samples)."""
    ph, st = [], []
    for k in range(steps):
        e = t_ns - (steps - 1 - k) * 10_000_000
        s = e - 10_000_000
        ph += [["compute", s, s + 1_000_000], ["data_wait", s + 1_000_000, s + 4_000_000], ["compute", s + 4_000_000, e]]
        st.append([s, e, 64])
    return json.dumps({"v": 1, "job": f"bench{i % 8}", "phases": ph, "steps": st}, separators=(",", ":")).encode()


def main() -> int:
    tree = os.path.abspath(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    if steps == 1:
        make = typical_datagram
    else:
        def make(i, t_ns):
            return batched_datagram(i, t_ns, steps)
    sys.path.insert(0, tree)
    from agent.config import defaults
    from agent.context import AgentContext
    from agent.phases.jobs import JobTable
    from agent.phases.procstat import InputProbe, ProcReader

    cfg = copy.deepcopy(defaults()["phases"])
    cfg["max_messages_per_second"] = 50000
    probe = InputProbe(ProcReader("/proc", "/sys"), 0.05, time.monotonic_ns)
    table = JobTable(cfg, AgentContext(clock=time.monotonic_ns), probe=probe)
    serve = table.compiled_receive() if hasattr(table, "compiled_receive") else None
    bufsize = cfg["max_message_bytes"] + 1
    tx, rx = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    rx.setblocking(False)
    cred_size = struct.calcsize("3i")
    counts = [0, 0]
    in_c = [0, 0]   # datagrams the compiled loop handled itself, and those it passed back to Python

    def receive_python():
        batch = []
        for _ in range(BURST):
            data, anc, _flags, _addr = rx.recvmsg(bufsize, socket.CMSG_SPACE(cred_size))
            pid = uid = None
            for lvl, typ, cdata in anc:
                if lvl == socket.SOL_SOCKET and typ == socket.SCM_CREDENTIALS and len(cdata) >= cred_size:
                    pid, uid, _gid = struct.unpack("3i", cdata[:cred_size])
            batch.append((data, pid, uid))
        table.handle_batch(batch)
        return BURST

    def receive_compiled():
        handled, rest, error = serve(rx.fileno(), bufsize, BURST, counts)
        if error is not None:
            raise error
        table.handle_batch(rest)
        in_c[0] += handled
        in_c[1] += len(rest)
        return handled + len(rest)

    receive = receive_python if serve is None else receive_compiled
    out = []
    for _ in range(rounds):
        cpu = 0.0
        n = 0
        for _ in range(200):
            t = time.monotonic_ns()
            for i in range(BURST):
                tx.send(make(i, t))
            c0 = time.thread_time()
            n += receive()
            cpu += time.thread_time() - c0
        out.append(cpu / (n * steps) * 1e6)
    accepted = table.results["accepted"]
    if accepted != rounds * 200 * BURST:
        print(f"only {accepted} of {rounds * 200 * BURST} datagrams accepted", file=sys.stderr)
        return 1
    # which receive path ran, for tests/phases/test_bench_serve_cost.py (stdout stays the one figure)
    if receive is receive_python:
        print("path: python", file=sys.stderr)
    else:
        print(f"path: compiled ({in_c[0]} datagrams handled in C, {in_c[1]} passed to Python)", file=sys.stderr)
    print(f"{statistics.median(out):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
