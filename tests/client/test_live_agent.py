"""The zero-code tests' in-process agent (tests/client/helpers.py LiveAgent): ``jobs()`` returns once every
datagram the ended clients sent is handled, not merely read (stop 65: it waits 0.1 s of quiet after that,
where it waited 0.5 s of quiet before)."""
from __future__ import annotations

import subprocess
import sys
import time

from tests.client.helpers import QUIET_S, LiveAgent, base_env

SENDER = """
import sys
from workloads.phases import Reporter
rep = Reporter(train_job="handled", socket_path=sys.argv[1], flush_ms=60000)
for i in range(int(sys.argv[2])):
    with rep.phase("data_wait"):
        pass
    rep.step(samples=1)
rep.close()   # (all of it sent now, as the last messages)
"""


def test_jobs_waits_for_the_datagrams_read_to_be_handled(sockdir):
    """The receiver's thread is slowed to 3 x QUIET_S per round it handles and the job sends its 40 steps at
    its close: they are all in the view (the sender's own count), though the socket was quiet for longer than
    QUIET_S while the round that read them was being handled."""
    agent = LiveAgent(sockdir)
    try:
        rx = agent.src.receiver
        take = rx._take

        def slow_take(batch):
            time.sleep(3 * QUIET_S)
            take(batch)

        rx._take = slow_take
        run = subprocess.run([sys.executable, "-c", SENDER, agent.path, "40"], env=base_env(),
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        jobs = agent.jobs()
        assert "handled" in jobs and jobs["handled"].steps == 40, {k: j.steps for k, j in jobs.items()}
    finally:
        agent.close()
