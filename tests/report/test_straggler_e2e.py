"""Issue 30 across nodes: a real 4-rank DDP job (gloo, CPU) as two simulated nodes, two torchrun node
ranks each under `teye run` beside its own agent, and a real Prometheus scraping both agents with the
shipped recording and alert rules.  Rank 3, on the second node, reads slowly.

Oracle: each rank's own wall-clock timing, printed by the script (tests/client/torch_ddp_ranks.py)."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.client.helpers import HERE, base_env
from tests.phases.helpers import shared_tmpdir
from tests.procs import REPO, Agent, Prometheus, free_port, prometheus_binary

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"),
                                 reason="the torch extra (./dev.sh test installs it)")]
RULES = sorted(glob.glob(os.path.join(REPO, "deploy", "prometheus", "rules", "*.yml")))
OFF = ("gpu", "disk", "network", "infiniband", "nfs", "nfsd", "pressure", "pmu")
STEPS = 150


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    if not prometheus_binary():
        pytest.skip("prometheus not installed (./dev.sh test installs it)")
    tmp = tmp_path_factory.mktemp("straggler")
    d = shared_tmpdir()
    conf = tmp / "teye.yaml"
    conf.write_text("collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in OFF))
    agents, prom = [], None
    try:
        for name in ("a", "b"):
            sock = os.path.join(d, f"{name}.sock")
            ag = Agent(["--config", str(conf), "--phase-socket", sock], log_path=str(tmp / f"agent-{name}.log"))
            ag.sock = sock
            agents.append(ag)
        prom = Prometheus(str(tmp), [f"127.0.0.1:{a.port}" for a in agents], rule_files=RULES)
        prom.wait_for("count(up == 1) == 2", timeout=30)
        port = free_port()
        procs = [subprocess.Popen(
            [sys.executable, "-m", "agent", "run", "--socket", ag.sock, "--", sys.executable, "-m",
             "torch.distributed.run", "--nnodes", "2", "--node_rank", str(i), "--nproc_per_node", "2",
             "--master_addr", "127.0.0.1", "--master_port", str(port),
             os.path.join(HERE, "torch_ddp_ranks.py"), str(STEPS), "3", "20", "ddp"],
            env=base_env(OMP_NUM_THREADS="1"), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i, ag in enumerate(agents)]
        own = {}
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-3000:]
            own.update({o["rank"]: o for o in map(json.loads, out.splitlines())})
        # the rules see the whole run once both agents have been scraped after its last flush
        time.sleep(4)
        yield {"prom": prom, "own": own, "nodes": [f"127.0.0.1:{a.port}" for a in agents]}
    finally:
        if prom:
            prom.stop()
        for a in agents:
            a.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_the_report_and_the_rules_name_the_straggler_its_node_and_share(two_nodes):
    own, node_b = two_nodes["own"], two_nodes["nodes"][1]
    assert sorted(own) == [0, 1, 2, 3]
    truth = own[3]["wait_s"] / own[3]["step_s"]
    assert truth > 0.4 and all(own[r]["wait_s"] / own[r]["step_s"] < 0.15 for r in (0, 1, 2))

    p = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", two_nodes["prom"].url,
                        "--train-job", "torch_ddp_ranks", "--format", "json"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    doc = json.loads(p.stdout)
    (job,) = doc["jobs"]
    st = job["straggler"]
    assert (st["rank"], st["node"], st["ranks"], st["verdict"]) == (3, node_b, 4, "input")
    assert st["input_bound_ratio"] == pytest.approx(truth, abs=0.05)
    assert st["cause"] in ("storage", "host_cpu", "unknown")
    assert job["input_bound_ratio"] == st["input_bound_ratio"] and job["verdict"] == "input"
    assert job["steps"] == STEPS  # global steps: each node counts them once, the job made STEPS
    assert doc["queries"] <= 12   # the rank series come in the job query: the number of queries stays fixed

    for fmt, line in (("text", "Straggler: rank 3 on "), ("markdown", "Straggler: rank 3 on ")):
        out = subprocess.run([sys.executable, "-m", "agent", "report", "--prometheus", two_nodes["prom"].url,
                              "--train-job", "torch_ddp_ranks", "--format", fmt],
                             capture_output=True, text=True, timeout=60, cwd=REPO).stdout
        assert f"{line}{node_b} waits" in out and "the job's other 3 ranks wait for it" in out, out

    res = two_nodes["prom"].query('teye:job_critical_rank:input_bound_ratio5m{train_job="torch_ddp_ranks"}')
    assert [(r["metric"]["rank"], r["metric"]["instance"]) for r in res] == [("3", node_b)]
    # The rule is a rate(): it starts from the counters of the run's first scrape, about a second into a
    # run of about five (CI read 0.761 against the whole run's 0.687), while the report reads the run's
    # final counters whole; hence the wider bound here.
    assert float(res[0]["value"][1]) == pytest.approx(truth, abs=0.1)
    print(f"\nrank 3's own wait share {truth:.3f}; report {st['input_bound_ratio']:.3f} (cause {st['cause']}); "
          f"recording rule {float(res[0]['value'][1]):.3f}; other ranks' own shares "
          f"{[round(own[r]['wait_s'] / own[r]['step_s'], 3) for r in (0, 1, 2)]}")
    count = two_nodes["prom"].query('teye:job_ranks:count5m{train_job="torch_ddp_ranks"}')
    assert float(count[0]["value"][1]) == 4
