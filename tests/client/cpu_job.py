"""A job whose CPU time the test knows (issue 47: the job's own CPU outside Slurm): its own clock is the oracle.

    python cpu_job.py SOCKET

Reports its steps with a Reporter (job "cpu_job").  The main process burns about 0.6 s of CPU over 6 steps
(each after a 0.5 s wait: the run spans several 1 s scrapes)
while a child it then joins burns 0.5 s (reaped: in the parent's cutime) and a second child burns 0.4 s, says
its own CPU time over a pipe and stays alive, as a DataLoader worker does; a seventh step comes after all of
it.  Then it prints one JSON line, its clock: ``own_s``
(os.times() user + system, the main process), ``reaped_s`` (children_user + children_system), ``live_s`` (what
the live child said), and waits for its stdin to close before it ends.
"""
import json
import multiprocessing as mp
import os
import sys
import time

from teye_client import Reporter


def burn(seconds):
    t = time.process_time()
    x = 0
    while time.process_time() - t < seconds:
        x += 1
    return x


def reaped():
    burn(0.5)


def live(conn, stop):
    burn(0.4)
    t = os.times()
    conn.send(t.user + t.system)
    stop.wait()


if __name__ == "__main__":
    rep = Reporter("cpu_job", sys.argv[1], flush_ms=20)
    ctx = mp.get_context("fork")
    a, b = ctx.Pipe()
    stop = ctx.Event()
    p = ctx.Process(target=reaped)
    q = ctx.Process(target=live, args=(b, stop))
    p.start()
    q.start()
    for i in range(6):          # the children burn while the job steps, as DataLoader workers do
        with rep.phase("data_wait"):
            time.sleep(0.5)     # (the run spans several of a 1 s scrape: the report's span is not "short")
        with rep.phase("compute"):
            burn(0.1)
        rep.step(samples=1)
    p.join()
    live_s = a.recv()
    with rep.phase("compute"):  # a last step after all of it: the job's span holds its every CPU second
        burn(0.01)
    rep.step(samples=1)
    rep.flush()
    t = os.times()
    print(json.dumps({"own_s": t.user + t.system, "reaped_s": t.children_user + t.children_system,
                      "live_s": live_s}), flush=True)
    sys.stdin.read()
    stop.set()
    q.join()
