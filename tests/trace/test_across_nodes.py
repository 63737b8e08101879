"""`teye trace` across nodes (issue 46): the ranks of a job on two nodes, each node with its own request directory
(its own /tmp), agree on the first traced step through the job's own store (teye_client._trace.StoreExchange
over torch.distributed's HashStore here, the store class torchrun's TCPStore shares its interface with), where
each node's statuses alone cannot: the second node's request arrived 0.3 s after the first's.  Oracle: the step
numbers each Tracer ticked, counted here."""
from __future__ import annotations

import json
import os
import time

import pytest

from teye_client import _trace
from tests.trace.test_request import FakeProfile, make_dirs

pytestmark = pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"),
                                reason="the torch extra (./dev.sh test installs it)")
STEP_NS = 2 * 10**7     # 20 ms steps: 50 a second, so a margin of 25 steps (START_MARGIN_S 0.5)


def _node(tmp_path, name):
    (tmp_path / name).mkdir(parents=True)
    return make_dirs(tmp_path / name)


def _ask(d, out, start_after, rid="multi-1"):
    r = dict(id=rid, steps=3, output=out, start_after=start_after, expires=time.time() + 60, ranks=None)
    _trace._write_private(os.path.join(d, "job.json"), json.dumps(r).encode())


class BrokenStore:
    def compare_set(self, *a):
        raise RuntimeError("Connection reset by peer")

    check = get = compare_set


def _two_nodes(tmp_path, monkeypatch, store):
    monkeypatch.setattr(_trace, "CHECK_EVERY_NS", 0)
    now = [time.time()]
    monkeypatch.setattr(_trace, "_wall", lambda: now[0])
    nodes = [_node(tmp_path, n) for n in ("node-a", "node-b")]
    ex = (lambda: _trace.StoreExchange(store, "job")) if store is not None else None
    ts = [_trace.Tracer("job", r, FakeProfile, directory=nodes[r][0], exchange=ex) for r in range(2)]
    for r, t in enumerate(ts):
        t.pid = 1000 + r
    # (half a step off the ticks: which tick first reaches start_after never hangs on a float's last bit)
    _ask(*nodes[0], start_after=now[0] + 1.01)
    _ask(*nodes[1], start_after=now[0] + 1.31)       # the loop over the nodes reached node b later
    ns = 10**9
    for _ in range(200):                             # 4 s of lockstep steps
        ns += STEP_NS
        now[0] += STEP_NS / 1e9
        for t in ts:
            t.tick(ns)
    return ts, nodes


def _status(d, t):
    [name] = [n for n in os.listdir(d) if n.endswith(f".pid{t.pid}.status.json")]
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def test_ranks_on_two_nodes_take_the_largest_proposal_through_the_jobs_store(tmp_path, monkeypatch):
    import torch.distributed as dist
    store = dist.PrefixStore("default_pg", dist.HashStore())   # (torchrun's default group: a prefixed store)
    (a, b), nodes = _two_nodes(tmp_path, monkeypatch, store)
    # each node proposed from its own request's start, 15 steps apart (within a margin of 25): both trace from
    # the later proposal, which the store holds
    assert b.proposed - a.proposed == 15 and a.margin == b.margin == 25
    assert a.first_step == b.first_step == b.proposed
    assert int(store.get("teye/trace/job/multi-1")) == b.proposed
    assert [(_status(d, t)["state"], _status(d, t)["first_step"]) for (d, _), t in zip(nodes, (a, b))] == \
        [("done", b.proposed)] * 2


def test_without_the_store_each_node_starts_on_its_own_and_a_store_that_fails_is_not_fatal(tmp_path, monkeypatch):
    (a, b), nodes = _two_nodes(tmp_path / "none", monkeypatch, None)
    assert b.first_step - a.first_step == 15       # the reason for the store: each node's statuses are its own
    (a, b), nodes = _two_nodes(tmp_path / "broken", monkeypatch, BrokenStore())
    assert b.first_step - a.first_step == 15 and a.exchange is None and b.exchange is None
    assert [_status(d, t)["state"] for (d, _), t in zip(nodes, (a, b))] == ["done", "done"]


def test_concurrent_offers_keep_the_largest():
    import torch.distributed as dist
    store = dist.HashStore()
    x, y = _trace.StoreExchange(store, "job"), _trace.StoreExchange(store, "job")
    assert x.peek("r") == 0
    assert x.offer("r", 40) == 40 and y.offer("r", 37) == 40 and y.offer("r", 45) == 45 and x.peek("r") == 45
    assert _trace.StoreExchange(store, "other").peek("r") == 0     # (a key per job and request)
