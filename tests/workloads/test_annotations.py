"""Grafana annotations from workloads.train (--grafana-url/--grafana-token), against the fake Grafana
of tests/deploy: start, epoch and end annotations tagged ["teye", <train_job>, kind]."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pytest

from tests.deploy.fake_grafana import FakeGrafana
from tests.procs import free_port
from workloads import annotations as wann

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKEN = "t"


def by_kind(g: FakeGrafana):
    return [(a["tags"][2], a) for a in g.annotations]


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


# -- the helper alone (no TensorFlow) ------------------------------------------------------------
def test_helper_posts_start_epoch_end_region_with_the_job_tags():
    with FakeGrafana(token=TOKEN) as g:
        from dashboards.push import annotate
        notes = wann.JobAnnotations(g.url, TOKEN, "job-a", post=annotate)
        notes.epoch(1, 2)                      # before start: ignored
        notes.end("ignored")                   # before start: ignored
        t0 = int(time.time() * 1000)
        notes.start("go")
        notes.epoch(1, 1, "loss 1.0")
        notes.end("done")
        notes.end("twice")                     # once only
        t1 = int(time.time() * 1000)
    kinds = [k for k, _ in by_kind(g)]
    assert kinds == ["start", "epoch", "end"]
    start, epoch, end = g.annotations
    for a, kind in zip(g.annotations, kinds):
        assert a["tags"] == ["teye", "job-a", kind]
    assert start["text"] == "go" and epoch["text"] == "epoch 1 of 1 done: loss 1.0" and end["text"] == "done"
    assert t0 <= start["time"] <= epoch["time"] <= end["timeEnd"] <= t1
    assert end["time"] == start["time"]
    assert start["timeEnd"] is None
    assert {r["auth"] for r in g.requests} == {f"Bearer {TOKEN}"}


@pytest.mark.measures("a timed assertion: the caller's time beside a slow Grafana")
def test_a_slow_grafana_does_not_stall_the_caller():
    calls = []

    def slow_post(*args):
        time.sleep(0.5)
        calls.append(args[4])

    notes = wann.JobAnnotations("http://grafana:3000", TOKEN, "j", post=slow_post)
    t = time.monotonic()
    notes.start("s")
    notes.epoch(1, 3)
    notes.epoch(2, 3)
    queued_s = time.monotonic() - t
    notes.end("e")                             # waits for the queue (bounded by CLOSE_WAIT_S)
    assert queued_s < 0.4  # one blocking post alone would take 0.5 s
    assert calls == ["start", "epoch", "epoch", "end"]


def args_for(url, job="j"):
    return argparse.Namespace(grafana_url=url, grafana_token=TOKEN, train_job=job)


def test_only_the_chief_annotates_and_no_url_means_off():
    logs = []
    assert wann.JobAnnotations.from_args(args_for("http://g:3000"), 0, logs.append).enabled
    assert not wann.JobAnnotations.from_args(args_for("http://g:3000"), 1, logs.append).enabled
    assert not wann.JobAnnotations.from_args(args_for(None), 0, logs.append).enabled
    assert logs == []


def test_without_grafana_client_annotations_still_post(monkeypatch):
    """teye.grafana speaks Grafana's HTTP API with the standard library: grafana-client is not needed."""
    monkeypatch.setitem(sys.modules, "grafana_client", None)     # as if not installed
    logs = []
    with FakeGrafana(token=TOKEN) as g:
        notes = wann.JobAnnotations.from_args(args_for(g.url), 0, logs.append)
        assert notes.enabled and logs == []
        notes.start("s")
        notes.end("e")
    assert [k for k, _ in by_kind(g)] == ["start", "end"]


def test_flags_default_from_the_environment(monkeypatch):
    from workloads import train
    monkeypatch.setenv("TEYE_GRAFANA_URL", "http://env-grafana:3000")
    monkeypatch.setenv("TEYE_GRAFANA_TOKEN", "env-token")
    a = train.parse_args([])
    assert (a.grafana_url, a.grafana_token) == ("http://env-grafana:3000", "env-token")
    a = train.parse_args(["--grafana-url", "http://x:1", "--grafana-token", "y"])
    assert (a.grafana_url, a.grafana_token) == ("http://x:1", "y")
    monkeypatch.delenv("TEYE_GRAFANA_URL")
    assert train.parse_args([]).grafana_url is None


# -- real training runs ---------------------------------------------------------------------------
TINY = ["--model", "simple_cnn", "--batch-size", "8", "--synthetic-samples", "64", "--no-progress",
        "--pipeline", "naive"]


@pytest.mark.tf
def test_cli_steps_run_posts_exactly_start_and_end(tmp_path):
    pytest.importorskip("tensorflow")
    res = tmp_path / "r.json"
    with FakeGrafana(token=TOKEN) as g:
        t0 = int(time.time() * 1000)
        p = subprocess.run([sys.executable, "-m", "workloads.train", *TINY, "--steps", "3", "--train-job", "ann-1",
                            "--grafana-url", g.url, "--grafana-token", TOKEN, "--results", str(res)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        t1 = int(time.time() * 1000)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(res.read_text())["steps"] == 3
    assert [k for k, _ in by_kind(g)] == ["start", "end"]
    start, end = g.annotations
    assert start["tags"] == ["teye", "ann-1", "start"] and end["tags"] == ["teye", "ann-1", "end"]
    assert t0 <= start["time"] == end["time"] < end["timeEnd"] <= t1
    assert end["text"] == p.stdout.strip()                          # the summary line
    assert "ann-1 started" in start["text"] and "3 steps" in start["text"]


@pytest.mark.tf
def test_epochs_run_posts_one_epoch_annotation_per_epoch(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow")
    from workloads import train
    with FakeGrafana(token=TOKEN) as g:
        monkeypatch.setenv("TEYE_GRAFANA_URL", g.url)                # the environment defaults
        monkeypatch.setenv("TEYE_GRAFANA_TOKEN", TOKEN)
        rc = train.main([*TINY, "--epochs", "2", "--train-job", "ann-2", "--results", str(tmp_path / "r.json")])
    assert rc == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["steps"] == 16                                          # 64 samples / 8 per step x 2 epochs
    assert [k for k, _ in by_kind(g)] == ["start", "epoch", "epoch", "end"]
    start, e1, e2, end = g.annotations
    assert all(a["tags"][:2] == ["teye", "ann-2"] for a in g.annotations)
    assert e1["text"].startswith("epoch 1 of 2 done: step 8, loss ")
    assert e2["text"].startswith("epoch 2 of 2 done: step 16, loss ")
    assert start["time"] <= e1["time"] <= e2["time"] <= end["timeEnd"] and end["time"] == start["time"]


@pytest.mark.tf
def test_a_failed_run_ends_the_region_with_the_reason(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow")
    from workloads import train
    monkeypatch.setattr(train.Trainer, "step", lambda self, batch: float("nan"))
    with FakeGrafana(token=TOKEN) as g:
        rc = train.main([*TINY, "--steps", "3", "--train-job", "ann-3", "--grafana-url", g.url,
                         "--grafana-token", TOKEN, "--results", str(tmp_path / "r.json")])
    assert rc == train.EXIT_FAILED and not (tmp_path / "r.json").exists()
    assert [k for k, _ in by_kind(g)] == ["start", "end"]
    assert g.annotations[1]["text"] == "ann-3 failed: loss became nan at step 1"
    assert g.annotations[1]["time"] == g.annotations[0]["time"] <= g.annotations[1]["timeEnd"]


@pytest.mark.measures("a timed assertion: training's time beside an unreachable Grafana")
@pytest.mark.tf
def test_unreachable_grafana_still_trains_to_completion(tmp_path, capsys):
    pytest.importorskip("tensorflow")
    from workloads import train
    res = tmp_path / "r.json"
    t = time.monotonic()
    rc = train.main([*TINY, "--steps", "3", "--grafana-url", closed_port_url(), "--grafana-token", TOKEN,
                     "--results", str(res)])
    assert rc == 0
    assert json.loads(res.read_text())["steps"] == 3
    assert len(capsys.readouterr().out.strip().splitlines()) == 1
    assert time.monotonic() - t < 30
