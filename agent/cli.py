"""The `teye` command: agent, doctor, record, profile, run, dashboards, report, trace, catalog."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

from . import __version__
from . import config as config_mod
from .errors import ConfigError
from .logutil import setup_logging

log = logging.getLogger("teye")




def _common_source_flags(p: argparse.ArgumentParser) -> None:
    """Flags every command that reads the node takes; node_exporter's spellings (--path.procfs, --log.level)
    beside teye's own, the same destination."""
    p.add_argument("--config", metavar="FILE", help="YAML config file (every key has a default)")
    p.add_argument("--procfs", "--path.procfs", dest="procfs", metavar="PATH", help="root of /proc (default /proc)")
    p.add_argument("--sysfs", "--path.sysfs", dest="sysfs", metavar="PATH", help="root of /sys (default /sys)")
    p.add_argument("--udev-data", "--path.udev.data", dest="udev_data", metavar="PATH",
                   help="udev's device database (default /run/udev/data)")
    p.add_argument("--rootfs", "--path.rootfs", dest="rootfs", metavar="PATH",
                   help="where the host's / is mounted, for the filesystem and os collectors (default /; "
                        "/host/root in the image)")
    p.add_argument("--cgroupfs", metavar="PATH", help="root of the cgroup tree (default /sys/fs/cgroup; "
                                                       "/host/sys/fs/cgroup in the image)")
    p.add_argument("--log-level", "--log.level", dest="log_level", choices=["debug", "info", "warning", "error"],
                   help="log level (default info)")


def _collector_flags(p: argparse.ArgumentParser) -> None:
    """node_exporter's --collector.X / --no-collector.X for every teye collector: on explicitly (absent hardware
    is then a failure that alerts) or off, over the configuration file."""
    for name in config_mod.COLLECTORS:
        p.add_argument(f"--collector.{name}", dest=f"collector_{name}", action=argparse.BooleanOptionalAction,
                       default=None, help=f"turn the {name} collector on (required: absent hardware alerts) or, "
                       f"with --no-collector.{name}, off")


def _overrides(args: argparse.Namespace) -> dict:
    """CLI flags as a nested config dict (only flags that were given)."""
    o: dict = {}
    for flag, key in (("listen", "listen"), ("procfs", "procfs"), ("sysfs", "sysfs"), ("rootfs", "rootfs"),
                      ("cgroupfs", "cgroupfs"), ("udev_data", "udev_data"), ("log_level", "log_level")):
        v = getattr(args, flag, None)
        if v is not None:
            o[key] = v
    if getattr(args, "gpu_replay", None):
        o.setdefault("gpu", {})["replay"] = args.gpu_replay
    if getattr(args, "pmu_replay", None):
        o.setdefault("pmu", {})["replay"] = args.pmu_replay
    if getattr(args, "phase_socket", None):
        o.setdefault("phases", {})["socket"] = args.phase_socket
    if getattr(args, "web_config_file", None):
        o.setdefault("web", {})["config_file"] = args.web_config_file
    if getattr(args, "web_max_requests", None) is not None:
        o.setdefault("web", {})["max_requests"] = args.web_max_requests
    if getattr(args, "log_format", None):
        o["log_format"] = args.log_format
    for name in config_mod.COLLECTORS:
        on = getattr(args, f"collector_{name}", None)
        if on is not None:
            o.setdefault("collectors", {})[name] = {"enabled": on}
    return o


def load_config(args: argparse.Namespace, explicit: Optional[set] = None) -> dict:
    return config_mod.load(getattr(args, "config", None), _overrides(args), explicit)


def cmd_agent(args: argparse.Namespace) -> int:
    from .daemon import run
    explicit: set = set()
    cfg = load_config(args, explicit)
    setup_logging(cfg["log_level"], cfg["log_format"])
    return run(cfg, required=explicit)


def cmd_record(args: argparse.Namespace) -> int:
    """teye record [--pmu]: what the NVML backend (or the PMU source) reads, as a JSON-lines trace."""
    import os
    from .errors import SourceUnavailable
    cfg = load_config(args)
    if args.duration <= 0 or args.interval <= 0:
        print("teye record: --duration and --interval must be > 0", file=sys.stderr)
        return 2
    try:
        if args.pmu:
            from .pmu.record import record
            polls = record(args.output, args.duration, args.interval, cfg["sysfs"], cfg["procfs"])
        else:
            from .gpu.nvml import load_pynvml
            from .gpu.record import record as record_gpu
            polls = record_gpu(load_pynvml(), args.output, args.duration, args.interval, cfg)
    except SourceUnavailable as e:
        if os.path.exists(args.output):
            os.unlink(args.output)
        print(f"teye record: nothing to record: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"teye record: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"teye record: {polls} polls written to {args.output}")
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    from .catalog import render
    sys.stdout.write(render())
    return 0


WORKLOAD_TOOLS = ("train", "sweep", "launch")


def cmd_workloads(args) -> int:
    """`teye workloads TOOL ARGS...`: workloads.TOOL's own main (what `python -m workloads.TOOL` is in a checkout,
    which an install cannot offer: its packages are private to teye)."""
    import importlib
    try:
        mod = importlib.import_module(f"workloads.{args.tool}")
    except ImportError as e:
        print(f"teye workloads {args.tool}: {e} (the reference workloads need TensorFlow: "
              "pip install 'teye[workloads]', or 'teye[workloads-cpu]')", file=sys.stderr)
        return 2
    return mod.main(list(args.tool_args))


def _lazy(module: str, func: str = "main"):
    def call(args):
        import importlib
        return getattr(importlib.import_module(module), func)(args)
    return call


def _with_config(module: str, func: str = "main"):
    """Like _lazy, but the command gets the loaded configuration too: ``main(args, cfg)``.

    Configuration is the CLI's business, so the modules below it never import agent.cli.
    """
    def call(args):
        import importlib
        explicit: set = set()
        cfg = load_config(args, explicit)
        args.explicit_collectors = explicit
        return getattr(importlib.import_module(module), func)(args, cfg)
    return call


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="teye", description="Per-node monitoring agent for GPU training clusters.")
    p.add_argument("--version", action="version", version=f"teye {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    a = sub.add_parser("agent", help="run the monitoring agent (serves /metrics)")
    a.add_argument("--listen", "--web.listen-address", dest="listen", metavar="HOST:PORT",
                   help="address to serve on (default 0.0.0.0:9835; [::]:9835 for every IPv6 address)")
    _common_source_flags(a)
    a.add_argument("--log.format", dest="log_format", choices=["text", "logfmt", "json"],
                   help="log line format (default text; under journald no timestamp of its own)")
    _collector_flags(a)
    a.add_argument("--gpu-replay", metavar="FILE", help="serve a recorded NVML trace instead of live NVML")
    a.add_argument("--pmu-replay", metavar="FILE", help="serve a recorded PMU trace (teye record --pmu) instead "
                   "of live perf events")
    a.add_argument("--phase-socket", metavar="PATH", help="Unix datagram socket for training-phase messages")
    a.add_argument("--web.config.file", dest="web_config_file", metavar="FILE",
                   help="exporter-toolkit web config (TLS, basic auth), as node_exporter's flag")
    a.add_argument("--web.max-requests", dest="web_max_requests", type=int, metavar="N",
                   help="most concurrent /metrics requests (default 40)")
    a.set_defaults(func=cmd_agent)

    d = sub.add_parser("doctor", help="print what this node supports and why not")
    _common_source_flags(d)
    _collector_flags(d)
    d.set_defaults(func=_with_config("agent.doctor"))

    r = sub.add_parser("record", help="record what the GPU backend (or, with --pmu, the PMU source) reads, "
                       "as JSON lines")
    r.add_argument("--output", required=True, metavar="FILE", help="trace file to write (JSON lines)")
    r.add_argument("--pmu", action="store_true", help="record raw hardware-counter reads instead of NVML")
    r.add_argument("--duration", type=float, default=60.0, metavar="SECONDS",
                   help="how long to record (default 60)")
    r.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                   help="time between two reads (default 1)")
    _common_source_flags(r)
    r.set_defaults(func=cmd_record)

    pr = sub.add_parser("profile", help="run a command and explain its GPU idle time")
    pr.add_argument("--output", metavar="DIR", default="teye-profile",
                    help="where summary.json and the timeline PNG go (default ./teye-profile)")
    _common_source_flags(pr)
    pr.add_argument("--gpu-replay", metavar="FILE", help=argparse.SUPPRESS)
    pr.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...", help="the command to profile")
    pr.set_defaults(func=_with_config("agent.profile"))

    ru = sub.add_parser("run", help="run a command with zero-code phases (PyTorch, TensorFlow): "
                        "its Python processes report to the node's agent unchanged")
    ru.add_argument("--job", metavar="NAME", help="training job name (default: from Slurm, a Kubernetes pod, "
                    "or the script's name); a script's own Reporter(train_job=...) keeps its name, with a warning")
    ru.add_argument("--socket", metavar="PATH", help="the agent's phase socket (default: TEYE_PHASE_SOCKET or "
                    "the agent's default locations); a warning where no agent holds it")
    ru.add_argument("--print-env", nargs="?", const="shell", choices=("shell", "taskprolog"), metavar="FORM",
                    help="print the export lines that turn it on instead of running a command: shell-quoted for "
                    "eval (the default), or 'taskprolog': literal values, as a Slurm TaskProlog prints them")
    ru.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...",
                    help="the command to run (its exit status is teye's)")
    ru.set_defaults(func=_lazy("agent.run"))

    db = sub.add_parser("dashboards", help="Grafana dashboards")
    dsub = db.add_subparsers(dest="dash_command", metavar="ACTION")
    dsub.required = True
    push = dsub.add_parser("push", help="upload the dashboards through the Grafana HTTP API")
    push.add_argument("--url", required=True, help="Grafana's base URL (https://grafana.example)")
    tok = push.add_mutually_exclusive_group()
    tok.add_argument("--token-file", metavar="FILE", help="file holding the service-account token (Editor "
                     "role); without it and --token, the GRAFANA_TOKEN environment variable")
    tok.add_argument("--token", help="the token itself (visible in `ps` and shell history: prefer "
                     "--token-file or GRAFANA_TOKEN)")
    push.add_argument("--folder", default="teye", help="Grafana folder, created when missing (default teye)")
    push.set_defaults(func=_lazy("dashboards.push"))

    wl = sub.add_parser("workloads", help="the reference TensorFlow workloads (the workloads extra): train, sweep, "
                        "launch; the arguments after the tool are its own (teye workloads train --help)",
                        add_help=True)
    wl.add_argument("tool", choices=WORKLOAD_TOOLS, help="train: one model; sweep: batch sizes and pipelines; "
                    "launch: a multi-worker run (docs/workloads.md)")
    wl.add_argument("tool_args", nargs=argparse.REMAINDER, metavar="ARGS...", help="the tool's own arguments")
    wl.set_defaults(func=cmd_workloads)

    from .report.main import add_parser as _add_report   # teye report (issue 23)
    _add_report(sub)
    from .trace.main import add_parser as _add_trace     # teye trace (issue 46)
    _add_trace(sub)

    c = sub.add_parser("catalog", help="print the metric catalog (docs/metrics.md)")
    c.set_defaults(func=cmd_catalog)
    _own_usage(p)
    return p


def _own_usage(parser: argparse.ArgumentParser) -> None:
    """Each (sub)command remembers its parser, so that a flag it does not know is answered with its own usage
    (argparse leaves unknown flags to the top-level parser, which prints teye's usage instead)."""
    parser.set_defaults(_parser=parser)
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                _own_usage(sub)


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"teye: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
