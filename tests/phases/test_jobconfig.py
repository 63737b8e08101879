"""The configuration a job sends (issue 45): the ``cfg`` of a phase message checked, refused with a counted
reason, kept per process, bounded in series; and the client's side, which leaves out what does not check.
Oracles: the values each test sends or hands the client, and the exposition prometheus_client parses."""
from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from agent.phases import jobconfig
from agent.phases.jobconfig import KEYS, Refused, check
from agent.phases.protocol import encode
from agent.phases.source import PhasesReading
from exporters.prometheus import families
from teye_client import _config
from tests.phases.helpers import S, ctx_with_clock, phases_cfg

NOW = 1000 * S


def table():
    from agent.phases.jobs import JobTable
    ctx, _ = ctx_with_clock(NOW)
    return JobTable(phases_cfg(), ctx, own_uid=0)


def with_cfg(job, cfg, k=0, rank=None):
    """A datagram of one step with ``cfg`` (any JSON value) beside it."""
    obj = json.loads(encode(job, [("data_wait", NOW - 2 * S + k, NOW - S + k)], [(NOW - 2 * S + k, NOW - S + k, 8)],
                            rank=rank, world=None if rank is None else 2))
    obj["cfg"] = cfg
    return json.dumps(obj).encode()


@pytest.mark.parametrize("cfg,reason", [
    ([1, 2], "wrong_type"),
    ("loader.num_workers=2", "wrong_type"),
    ({"loader.num_workers": {"nested": "object"}}, "wrong_type"),
    ({"loader.num_workers": "2"}, "wrong_type"),
    ({"loader.num_workers": True}, "wrong_type"),            # a bool is not an integer here
    ({"loader.num_workers": 2.0}, "wrong_type"),
    ({"loader.pin_memory": 1}, "wrong_type"),
    ({"loader.num_workers": -1}, "bad_value"),
    ({"loader.num_workers": 4097}, "bad_value"),             # the first invalid value (4096 is the last valid)
    ({"ddp.bucket_cap_bytes": 1 << 44 | 1}, "bad_value"),
    ({"ddp.comm_hook": "my_secret_hook"}, "bad_value"),      # a name of the job's: never exported
    ({"autocast.dtype": "x" * 2**20}, "bad_value"),          # a huge string
    ({"loader.batch_size": "y" * 2**20}, "wrong_type"),
    ({f"k{i}": 1 for i in range(65)}, "too_large"),
    ({"k" * 65: 1}, "too_large"),
])
def test_a_bad_configuration_is_refused_whole_with_its_reason(cfg, reason):
    with pytest.raises(Refused) as e:
        check(cfg)
    assert e.value.reason == reason
    assert len(str(e.value)) < 300   # the refusal quotes at most 40 characters of a value


def test_the_last_valid_values_and_unknown_keys():
    cfg = {"loader.num_workers": 4096, "loader.prefetch_factor": 1, "ddp.bucket_cap_bytes": 1 << 44,
           "ddp.comm_hook": "custom", "autocast.dtype": "bfloat16", "torch.compile": False, "a.newer.key": [1]}
    assert check(cfg) == (("loader.num_workers", "4096"), ("loader.prefetch_factor", "1"),
                          ("ddp.bucket_cap_bytes", str(1 << 44)), ("ddp.comm_hook", "custom"),
                          ("autocast.dtype", "bfloat16"), ("torch.compile", "false"))
    assert check({f"k{i}": 1 for i in range(64)}) == ()


def test_a_refused_configuration_is_counted_and_the_datagrams_step_is_taken():
    t = table()
    assert t.handle(with_cfg("j", {"autocast.dtype": "x" * 5000}), 100, 0, NOW) == "accepted"
    assert t.handle(with_cfg("j", {"loader.num_workers": {"a": 1}}, k=1), 100, 0, NOW) == "accepted"
    views = {v.train_job: v for v in t.views(NOW)[0]}
    assert views["j"].steps == 2 and views["j"].config == ()
    assert t.config_results == {"accepted": 0, "wrong_type": 1, "too_large": 0, "bad_value": 1}
    assert t.handle(with_cfg("j", {"loader.num_workers": 3}, k=2), 100, 0, NOW) == "accepted"
    assert {v.train_job: v for v in t.views(NOW)[0]}["j"].config == (("loader.num_workers", "3"),)
    assert t.config_results["accepted"] == 1


def test_a_thousand_different_configurations_make_one_series_per_key():
    """Values that change with every datagram replace the process's configuration: one series per (job, key),
    and the exposition parses back to exactly the last values sent."""
    t = table()
    for k in range(1000):
        cfg = {"loader.batch_size": k + 1, "loader.num_workers": k % 7, "ddp.comm_hook": jobconfig.COMM_HOOKS[k % 11],
               "autocast.dtype": jobconfig.DTYPES[k % 7], "loader.pin_memory": k % 2 == 0}
        assert t.handle(with_cfg("j", cfg, k=k, rank=k % 2), 100 + k % 2, 0, NOW) == "accepted"
    views, results, attributed, pending = t.views(NOW)
    reading = PhasesReading(views, results, attributed, pending, "", config_results=tuple(t.config_results.items()))
    reg = CollectorRegistry()
    reg.register(type("C", (), {"collect": lambda self: families(reading.points())})())
    text = generate_latest(reg).decode()
    got = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "teye_job_config_info":
            for s in fam.samples:
                assert s.value == 1 and s.labels["train_job"] == "j"
                got.setdefault(s.labels["key"], []).append(s.labels["value"])
    # the lowest rank's (rank 0: the last k with k % 2 == 0, 998), one value per key
    assert got == {"loader.batch_size": ["999"], "loader.num_workers": [str(998 % 7)], "loader.pin_memory": ["true"],
                   "ddp.comm_hook": [jobconfig.COMM_HOOKS[998 % 11]], "autocast.dtype": [jobconfig.DTYPES[998 % 7]]}


def test_the_client_and_the_agent_share_the_keys_and_the_names():
    assert _config.KEYS == tuple(KEYS)
    assert _config.COMM_HOOKS == jobconfig.COMM_HOOKS and _config.DTYPES == jobconfig.DTYPES
    assert _config.MAX_INT == jobconfig.MAX_INT


class _Raises:
    def __get__(self, obj, owner):
        raise RuntimeError("a property of the job's")


class OddLoader:
    """A loader of a subclass's shape: an object, a huge string, a bool-as-int and a raising property."""
    num_workers = True              # a bool where an integer belongs
    pin_memory = _Raises()
    persistent_workers = "yes"
    prefetch_factor = "p" * 2**20
    batch_size = object()
    extra = object()


class FakeIter:
    pass


def test_the_client_leaves_out_what_does_not_check_and_sends_what_does(monkeypatch):
    for name in ("_static", "_loader", "_keyed"):
        monkeypatch.setattr(_config, name, {})
    monkeypatch.setattr(_config, "_state", {"dirty": False, "version": 0, "frag": None, "key": None})
    trained = []
    monkeypatch.setattr(_config.session, "train_keys", trained)
    it = FakeIter()
    _config.loader_made(it, OddLoader())
    assert it._teye_cfg == {}
    good = type("Loader", (), {"num_workers": 4096, "pin_memory": True, "persistent_workers": False,
                               "prefetch_factor": 1 << 16, "batch_size": 1 << 31})()
    it2 = FakeIter()
    _config.loader_made(it2, good)
    _config.keyed(7, it2)
    _config.note("ddp.comm_hook", _config._hook_name(lambda s, b: None))   # the job's own: custom
    v, frag = _config.payload()
    sent = json.loads("{" + frag[1:] + "}")["cfg"]
    assert check(sent) == (("loader.num_workers", "4096"), ("loader.pin_memory", "true"),
                           ("loader.persistent_workers", "false"), ("loader.prefetch_factor", str(1 << 16)),
                           ("loader.batch_size", str(1 << 31)), ("ddp.comm_hook", "custom"))
    assert len(frag) < 512 and _config.payload() == (v, frag)   # unchanged: the same version
    it3 = FakeIter()
    _config.loader_made(it3, type("L", (), {"num_workers": 4097, "pin_memory": 1})())
    _config.keyed(8, it3)
    trained.append(8)   # a step followed its batches: it is the training loader now
    assert _config.payload()[1] == ',"cfg":{"ddp.comm_hook":"custom"}'   # the first invalid values: left out
