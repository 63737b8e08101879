"""A fresh agent on this machine under a real Prometheus with the shipped configuration and rules: no alert.

    python benchmarks/fresh_agent_alerts.py [--minutes 15] [--node-exporter] [--image TAG]

What an admin does on day one: ``teye agent`` with the built-in defaults (what ``./dev.sh agent`` runs) and
Prometheus started from the shipped ``deploy/prometheus/prometheus.yml`` as written (15 s scrapes and rule
evaluations, every shipped rule file, each rule's ``for:`` as shipped), only its listen address, its
``targets/*.yml`` and its self-scrape moved to free ports.  ``--node-exporter`` runs the node_exporter mode
instead (``deploy/prometheus/prometheus-node-exporter.yml``: teye with ``host.node_exporter: true`` beside
Debian's prometheus-node-exporter).  Every 30 s the script asks Prometheus for ``ALERTS`` (pending and firing);
at the end it asks for every ``ALERTS`` series over the whole run (a range query, so an alert that came and
went between two polls is seen too) and prints each alert that was ever pending or firing.  Exit status 1 if
any was.  This is wall time, not CPU: leave it running in the background.  ``--image TAG``: the agent is the
image (tests/dist/test_image.py builds ``localhost/teye-test:0.1.0``) run under podman with the DaemonSet's
mounts and arguments (the host's / at /host/root, --path.rootfs, --cgroupfs), as
tests/dist/test_image_host_view.py runs it, instead of an agent on the host.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.procs import REPO, Agent, Prometheus, free_port, wait_http  # noqa: E402

PROM_DIR = os.path.join(REPO, "deploy", "prometheus")


def shipped_config(tmp: str, agent: str, prom_port: int, config_name: str, node_exporter: str = "") -> str:
    """The shipped Prometheus config with only its addresses moved: targets file, self-scrape, no Alertmanager."""
    with open(os.path.join(PROM_DIR, config_name), encoding="utf-8") as fh:
        cfg = yaml.safe_load(fh)
    for d in ("rules", "rules-node-exporter"):
        shutil.copytree(os.path.join(PROM_DIR, d), os.path.join(tmp, d), dirs_exist_ok=True)
    for d in ("targets", "targets-node-exporter"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    with open(os.path.join(tmp, "targets", "teye-nodes.yml"), "w") as fh:
        yaml.safe_dump([{"targets": [agent]}], fh)
    if node_exporter:
        with open(os.path.join(tmp, "targets-node-exporter", "nodes.yml"), "w") as fh:
            yaml.safe_dump([{"targets": [node_exporter]}], fh)
    cfg.pop("alerting", None)   # no Alertmanager here; ALERTS is what Prometheus itself evaluates
    for sc in cfg["scrape_configs"]:
        if sc["job_name"] == "prometheus":
            sc["static_configs"] = [{"targets": [f"127.0.0.1:{prom_port}"]}]
        for fsd in sc.get("file_sd_configs", []):
            fsd["files"] = [os.path.join(tmp, f) for f in fsd["files"]]
    cfg["rule_files"] = [os.path.join(tmp, r) for r in cfg["rule_files"]]
    return yaml.safe_dump(cfg, sort_keys=False)


class Container:
    """The image with the DaemonSet's mounts and arguments (tests/dist/test_image_host_view.py), on a free port;
    ``port``, ``proc.poll()`` and ``stop()`` as tests.procs.Agent has them."""

    def __init__(self, image: str, tmp: str):
        import pathlib
        from tests.dist.test_image import UID, podman, run_args
        from tests.dist.test_image_host_view import _daemonset_run
        self.podman = podman
        self.port = free_port()
        flags, command, argv = _daemonset_run(pathlib.Path(tmp), self.port)
        self.name = f"teye-fresh-alerts-{self.port}"
        podman("run", "-d", "--name", self.name, "--network", "host", "--pid", "host", "--user", f"{UID}:{UID}",
               *run_args(), *flags, "--entrypoint", command[0], image, *argv)
        self.proc = self
        self.returncode = None
        wait_http(f"http://127.0.0.1:{self.port}/metrics")

    def poll(self):
        running = self.podman("inspect", self.name, "--format", "{{.State.Running}}", check=False).stdout.strip()
        if running != "true":
            self.returncode = 1
        return self.returncode

    def stop(self):
        logs = self.podman("logs", self.name, check=False)
        print("container log (tail):", (logs.stdout + logs.stderr)[-1500:], flush=True)
        self.podman("rm", "-f", "-t", "2", self.name, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--node-exporter", action="store_true",
                    help="teye in node_exporter mode beside Debian's prometheus-node-exporter")
    ap.add_argument("--image", metavar="TAG", help="the agent is this image under podman, with the DaemonSet's "
                    "mounts and arguments")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="teye-fresh-alerts-")
    ne_proc = None
    agent_args = []
    config_name = "prometheus.yml"
    ne_addr = ""
    if args.node_exporter:
        with open(os.path.join(tmp, "teye.yml"), "w") as fh:
            fh.write("host:\n  node_exporter: true\n")
        agent_args = ["--config", os.path.join(tmp, "teye.yml")]
        config_name = "prometheus-node-exporter.yml"
        ne_port = free_port()
        ne_addr = f"127.0.0.1:{ne_port}"
        ne_proc = subprocess.Popen([shutil.which("prometheus-node-exporter") or "prometheus-node-exporter",
                                    f"--web.listen-address={ne_addr}"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"http://{ne_addr}/metrics", proc=ne_proc)
    agent = Container(args.image, tmp) if args.image else Agent(agent_args, log_path=os.path.join(tmp, "agent.log"))
    prom = None
    try:
        prom = Prometheus(tmp, config=shipped_config(tmp, f"127.0.0.1:{agent.port}", 9090, config_name, ne_addr))
        prom_port = prom.port
        # its self-scrape on the port it got, as the shipped localhost:9090 would be (SIGHUP reloads)
        with open(os.path.join(tmp, "prometheus.yml"), "w") as fh:
            fh.write(shipped_config(tmp, f"127.0.0.1:{agent.port}", prom_port, config_name, ne_addr))
        prom.proc.send_signal(signal.SIGHUP)
        start = time.time()
        print(f"fresh agent :{agent.port}, Prometheus :{prom_port} ({config_name}, shipped rules), "
              f"{args.minutes:g} min; work dir {tmp}", flush=True)
        seen = {}
        end = time.monotonic() + args.minutes * 60
        while time.monotonic() < end:
            time.sleep(min(30, max(0.0, end - time.monotonic())))
            now = prom.query("ALERTS")
            for s in now:
                m = s["metric"]
                key = (m.get("alertname"), m.get("alertstate"), m.get("collector", ""), m.get("instance", ""))
                seen.setdefault(key, time.time() - start)
            up = prom.query('up')
            print(f"{(time.time() - start) / 60:5.1f} min: {len(now)} ALERTS series; up: "
                  + ", ".join(f"{s['metric']['job']}={s['value'][1]}" for s in up), flush=True)
            if agent.proc.poll() is not None:
                print(f"agent exited with {agent.proc.returncode}", flush=True)
                return 1
        # every ALERTS series over the whole run, at the evaluation interval
        rng = prom.api("query_range", query="ALERTS", start=start, end=time.time(), step="15s")["result"]
        for s in rng:
            m = s["metric"]
            key = (m.get("alertname"), m.get("alertstate"), m.get("collector", ""), m.get("instance", ""))
            seen.setdefault(key, float(s["values"][0][0]) - start)
        rules = prom.api("rules")["groups"]
        n_alerts = sum(1 for g in rules for r in g["rules"] if r["type"] == "alerting")
        n_rec = sum(1 for g in rules for r in g["rules"] if r["type"] == "recording")
        bad = [(g["name"], r["name"], r.get("lastError")) for g in rules for r in g["rules"]
               if r.get("health") != "ok"]
        minutes = (time.time() - start) / 60
        print(f"\n{minutes:.1f} min under {config_name}: {n_alerts} alert rules and {n_rec} recording rules "
              f"loaded, {len(bad)} unhealthy")
        for b in bad:
            print("  unhealthy rule:", b)
        if not seen:
            print("no alert was pending or firing at any evaluation")
        for (name, state, coll, inst), t in sorted(seen.items()):
            print(f"  {state:8s} {name} collector={coll!r} instance={inst!r} first seen at {t / 60:.1f} min")
        return 1 if seen or bad else 0
    finally:
        if prom:
            prom.stop()
        agent.stop()
        if ne_proc:
            ne_proc.terminate()
            ne_proc.wait(10)


if __name__ == "__main__":
    sys.exit(main())
