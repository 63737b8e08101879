"""An idle agent reads its job table every IDLE_INTERVAL_S, not every second, and a job's first datagram has
it read at once (issue 49: the phases collector's tick a second was the idle agent's largest cost).  A real
PhaseSource on a private socket; the job is teye_client's Reporter."""
from __future__ import annotations

import threading

from agent.phases.source import IDLE_INTERVAL_S
from teye_client import Reporter
from tests.client.helpers import LiveAgent


def _report_one_step(path):
    rep = Reporter(train_job="pace", socket_path=path, flush_ms=0, sum_steps=False)
    with rep.phase("compute"):
        pass
    rep.step(samples=1)
    rep.close()


def test_no_job_paces_the_table_slow_and_the_first_datagram_hurries_it(tmp_path):
    agent = LiveAgent(str(tmp_path))
    hurried = threading.Event()
    try:
        src = agent.src
        assert src.next_interval_s(1.0) == 1.0          # never read yet: the configured pace
        src.collect()
        assert src.next_interval_s(1.0) == 1.0          # no sampler to hurry it: the configured pace
        src.hurry = hurried.set
        assert src.next_interval_s(1.0) == IDLE_INTERVAL_S > 1.0
        assert src.next_interval_s(IDLE_INTERVAL_S * 2) == IDLE_INTERVAL_S * 2   # never faster than configured
        assert not hurried.is_set()
        _report_one_step(agent.path)
        assert hurried.wait(5.0)                        # the job's first datagram asked for a read
        # datagrams since the last read (none of them read into the table yet): the configured pace
        assert src.next_interval_s(1.0) == 1.0
        assert set(agent.jobs()) == {"pace"}
        assert src.next_interval_s(1.0) == 1.0          # a job in the table: the configured pace
    finally:
        agent.close()


def test_a_datagram_between_the_read_and_the_pace_keeps_the_configured_pace(tmp_path):
    agent = LiveAgent(str(tmp_path))
    try:
        src = agent.src
        src.collect()
        src.hurry = lambda: None
        _report_one_step(agent.path)
        for _ in range(200):
            if src.receiver.received:
                break
            threading.Event().wait(0.01)
        assert src.receiver.received
        assert src.next_interval_s(1.0) == 1.0 and src.receiver.wake_once is None
    finally:
        agent.close()
