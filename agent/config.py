"""Configuration: YAML, every key with an embedded default, validated before anything starts.

The schema below is the single place defaults live.  ``load()`` merges a user file
over the defaults, rejects unknown keys and ill-typed values with a ConfigError
naming the dotted key and the expected type, and returns a plain nested dict.
CLI flags are applied on top by ``agent.cli``.
"""
from __future__ import annotations

import copy
import re
import reprlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from .errors import ConfigError
from . import hostseries


@dataclass(frozen=True)
class Field:
    """One configuration key: accepted Python type(s), default, optional extra check, description."""

    type: Tuple[type, ...]
    default: Any
    help: str
    check: Optional[Callable[[Any], Optional[str]]] = None  # returns an error text or None
    nullable: bool = False
    max: float = 1e9  # larger counts or seconds are mistakes, and overflow timers and buffers


def _positive(v):
    return None if v > 0 else "must be > 0"


def _non_negative(v):
    return None if v >= 0 else "must be >= 0"


def _ratio(v):
    return None if 0 <= v <= 1 else "must be between 0 and 1"


def _regex(v):
    try:
        re.compile(v)
    except re.error as e:
        return f"is not a valid regular expression ({e})"
    return None


def _hostport(v):
    try:
        split_hostport(v)
    except ValueError:
        return "expected HOST:PORT such as 0.0.0.0:9835"
    return None


def _level(v):
    return None if v.lower() in ("debug", "info", "warning", "error") else "must be one of debug, info, warning, error"


def split_hostport(text: str) -> Tuple[str, int]:
    """'HOST:PORT' -> (host, port); '[::1]:9835' for IPv6; ':9835' listens on all addresses."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def join_hostport(host: str, port: int) -> str:
    """(host, port) -> 'HOST:PORT', an IPv6 address in brackets ('[::]:9835'), as split_hostport reads it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


FLOAT = (float, int)
INT = (int,)
BOOL = (bool,)
STR = (str,)
LIST = (list,)


def _collector(interval: float, enabled: bool = True, help: str = "") -> Dict[str, Field]:
    return {
        "enabled": Field(BOOL, enabled, f"Run the {help} collector."),
        "interval_seconds": Field(FLOAT, interval, f"Seconds between two reads of the {help} collector.", _positive),
    }


# Collector name -> (default interval in seconds, description).
COLLECTORS = {
    "cpu": (5.0, "CPU time by mode (/proc/stat)"),
    "memory": (5.0, "memory (/proc/meminfo)"),
    "disk": (5.0, "block devices and md arrays (/proc/diskstats, /proc/mdstat, udev's device properties)"),
    "network": (5.0, "network interfaces (/proc/net/dev)"),
    "netstat": (15.0, "protocol counters, socket use, connection tracking and UDP queues (/proc/net/{snmp,snmp6,"
                      "netstat,sockstat,sockstat6,udp,udp6,stat/nf_conntrack}, nf_conntrack)"),
    "netclass": (15.0, "network link state: up, carrier, speed, MTU, carrier changes (/sys/class/net)"),
    "qdisc": (5.0, "root queueing discipline of each interface: bytes, drops, overlimits, a shaper's rate (rtnetlink)"),
    "infiniband": (5.0, "InfiniBand ports (/sys/class/infiniband)"),
    "nfs": (5.0, "NFS client (/proc/self/mountstats, /proc/net/rpc/nfs)"),
    "nfsd": (5.0, "NFS server (/proc/net/rpc/nfsd)"),
    "pressure": (5.0, "pressure stall information (/proc/pressure)"),
    "loadavg": (15.0, "load average, file handles and entropy (/proc/loadavg, /proc/sys/fs/file-nr, "
                    "/proc/sys/kernel/random)"),
    "filesystem": (15.0, "mounted filesystems: size, free, available, inodes, read-only (statvfs of <procfs>/1/mountinfo)"),
    "textfile": (15.0, "metrics sites' scripts write to textfile.directory (*.prom, node_exporter's format)"),
    "hwmon": (15.0, "host sensors: hwmon chips (temperatures, fans, power, voltages) and thermal zones (/sys/class)"),
    "edac": (15.0, "host memory ECC errors (EDAC: /sys/devices/system/edac/mc)"),
    "os": (60.0, "kernel and distribution: uname(2), os-release and SELinux state"),
    "timex": (15.0, "clock synchronisation: NTP sync status, offset and error (adjtimex(2), read-only)"),
    "vmstat": (15.0, "virtual-memory events: OOM kills, page faults, paging and swapping (/proc/vmstat)"),
    "allocation": (5.0, "GPU allocation to Slurm jobs (prolog mapping directory) and Kubernetes pods (kubelet "
                        "pod-resources)"),
    "jobs": (5.0, "per-job CPU, memory, I/O and pressure from the Slurm job and Kubernetes pod cgroups "
                  "(<cgroupfs>)"),
    "systemd": (15.0, "systemd units and their state (systemctl show; off by default, as in node_exporter)"),
    "gpu": (5.0, "NVIDIA GPUs (NVML)"),
    "pmu": (5.0, "host hardware counters (perf events: CPI, FLOPS, memory and PCIe bandwidth)"),
    "phases": (1.0, "training-job phases (phase socket)"),
}

# Off unless configured: systemd, as in node_exporter (one systemctl run a period); only NFS servers run nfsd (deploy/teye.example.yml, install.sh and the DaemonSet agree).
# The hardware collectors (gpu, pmu, infiniband) stay on: where the node lacks the hardware they are *absent*
# (teye_collector_absent=1), which no alert fires on.
OFF_BY_DEFAULT = frozenset({"nfsd", "systemd"})

SCHEMA: Dict[str, Any] = {
    "listen": Field(STR, "0.0.0.0:9835", "HOST:PORT the HTTP server (/metrics, /healthz) listens on.", _hostport),
    "procfs": Field(STR, "/proc", "Root of the proc filesystem (as node_exporter's --path.procfs)."),
    "sysfs": Field(STR, "/sys", "Root of the sys filesystem (as node_exporter's --path.sysfs)."),
    "rootfs": Field(STR, "/", "Where the host's root filesystem is seen, for the filesystem collector's statvfs "
                    "of each mount point (as node_exporter's --path.rootfs; e.g. /host/root in a container)."),
    "udev_data": Field(STR, "/run/udev/data", "udev's database of device properties, for teye_disk_info's model, "
                       "serial, WWN and path (as node_exporter's --path.udev.data; e.g. /host/root/run/udev/data in "
                       "a container). Missing: those labels are empty."),
    "cgroupfs": Field(STR, "/sys/fs/cgroup", "Root of the cgroup tree (v1 controller hierarchies or the v2 "
                      "unified hierarchy), as cAdvisor's and cgroup_exporter's cgroup root."),
    "log_level": Field(STR, "info", "Log level: debug, info, warning or error.", _level),
    "log_format": Field(STR, "text", "Log line format: text, logfmt or json (node_exporter's --log.format). Under "
                        "journald (JOURNAL_STREAM names stderr) no line carries a timestamp of its own.",
                        lambda v: None if v in ("text", "logfmt", "json") else "must be one of text, logfmt, json"),
    "stale_after_seconds": Field(FLOAT, 10.0, "A read still running after this long marks its collector down "
                                 "(a hung NFS mount never hangs a scrape).", _positive),
    "web": {
        "config_file": Field(STR, None, "exporter-toolkit web configuration file (TLS, basic auth, headers), the "
                             "format node_exporter's --web.config.file reads; unset serves plain HTTP.",
                             nullable=True),
        "max_connections": Field(INT, 4096, "Most open HTTP connections, about 7 KiB each (lowered to fit the fd "
                                 "limit); when full, the connection waiting longest for its request is closed.",
                                 _positive),
        "max_requests": Field(INT, 40, "Most concurrent /metrics requests (as node_exporter's "
                              "--web.max-requests); more get 503.", _positive),
        "header_timeout_seconds": Field(FLOAT, 10.0, "TLS handshake and request head must arrive within this.",
                                        _positive),
        "idle_timeout_seconds": Field(FLOAT, 120.0, "An idle keep-alive connection is closed after this.",
                                      _positive),
        "tls_idle_timeout_seconds": Field(FLOAT, 30.0, "With TLS: an idle keep-alive connection is closed after "
                                          "this (a TLS session holds more than a socket; docs/operations.md).",
                                          _positive),
        "tls_max_handshakes": Field(INT, 64, "With TLS: handshakes under way at once; a new connection closes the "
                                    "oldest handshake beyond it (docs/operations.md, What a connection costs).",
                                    _positive),
        "write_timeout_seconds": Field(FLOAT, 30.0, "A client that does not read its response within this is "
                                       "dropped.", _positive),
        "max_header_bytes": Field(INT, 16384, "Largest request head (request line and headers); larger gets 431.",
                                  _positive),
    },
    "trace": {
        "webhook": Field(BOOL, False, "Take a trace of a job when an alert about it arrives: POST /-/trace takes "
                         "Alertmanager's webhook payload, with basic auth only (the web config must have "
                         "basic_auth_users; docs/trace.md, \"The trace webhook\")."),
        "steps": Field(INT, 5, "Steps each process of the job traces, on a webhook's request (1 to 1000).",
                       lambda v: None if 1 <= v <= 1000 else "must be 1 to 1000"),
        "job_interval_seconds": Field(FLOAT, 600.0, "A job is traced on a webhook's request at most once in this.",
                                      _positive),
        "node_interval_seconds": Field(FLOAT, 60.0, "Any job on this node is traced on a webhook's request at most "
                                       "once in this.", _positive),
    },
    "host": {
        "node_exporter": Field(BOOL, False, "node_exporter stays on this node and exports the host: teye's collectors "
                               "it covers are off (network and netclass sampled for the communication cause, not "
                               "exported), and teye's dashboards, report and node_exporter rule files read its "
                               "series (agent/hostseries.py; docs/operations.md, \"node_exporter mode\")."),
    },
    "collectors": {name: _collector(iv, enabled=name not in OFF_BY_DEFAULT, help=desc)
                   for name, (iv, desc) in COLLECTORS.items()},
    "disk": {
        "exclude": Field(STR, r"^(z?ram\d+|loop\d+|fd\d+|(h|s|v|xv)d[a-z]+\d+|nvme\d+n\d+p\d+|mmcblk\d+p\d+)$",
                         "Regex of block device names to skip (partitions, loop, ram/zram and floppy devices by "
                         "default).", _regex),
    },
    "textfile": {
        "directory": Field(STR, None, "Directory of *.prom files in Prometheus' text format that sites' own "
                           "scripts write (node_exporter's --collector.textfile.directory); unset reads none.",
                           nullable=True),
        "follow_symlinks": Field(BOOL, False, "Read a *.prom file that is a symbolic link leading out of the "
                                 "directory (off: such a file is skipped and logged without its content)."),
    },
    "network": {
        "exclude": Field(STR, r"^$", "Regex of interface names to skip (none by default).", _regex),
    },
    "systemd": {
        "unit_include": Field(STR, None, "Regex a unit's whole name must match to be exported (node_exporter's "
                              "--collector.systemd.unit-include); unset: every unit.", _regex, nullable=True),
        "unit_exclude": Field(STR, r".+\.(automount|device|mount|scope|slice)", "Regex of unit names to leave out "
                              "(node_exporter's --collector.systemd.unit-exclude and its default).", _regex),
    },
    "gpu": {
        "busy_threshold": Field(FLOAT, 0.0, "A driver utilization sample at or below this ratio counts as idle.", _ratio),
        "replay": Field(STR, None, "Serve a recorded NVML trace (teye record) instead of live NVML.", nullable=True),
        "idle_gap_buckets": Field(LIST, [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
                                  "Upper bounds (seconds) of the teye_gpu_idle_gap_seconds histogram buckets.",
                                  lambda v: None if v and all(isinstance(b, (int, float)) and not isinstance(b, bool)
                                                              and b > 0 for b in v)
                                  and all(a < b for a, b in zip(v, v[1:]))
                                  else "must be a non-empty, strictly ascending list of positive numbers"),
        "events": Field(BOOL, True, "Count XID errors from NVML's event set in a background thread."),
        "gpm": Field(BOOL, True, "Read GPM metrics (SM activity, tensor/DRAM/pipe activity, NVLink) where supported."),
        "processes": Field(BOOL, True, "Export the processes on each GPU (pid, user, Slurm job, pod uid)."),
        "max_processes": Field(INT, 32, "Most processes exported per GPU (lowest pids first).", _positive),
        "gauge_interval_seconds": Field(FLOAT, 5.0, "Utilization, memory, PCIe, power, energy, temperature, clocks "
                                        "and clock events are read at most this often (0: at every poll); the "
                                        "utilization samples (idle gaps), processes and GPM at every poll.",
                                        _non_negative, max=3600),
        "waiting_interval_seconds": Field(FLOAT, 1.0, "While training jobs' phase intervals wait for the GPU samples "
                                          "that cover them, the GPU collector reads at least this often (else every "
                                          "collectors.gpu.interval_seconds).", _positive, max=3600),
        "reprobe_seconds": Field(FLOAT, 10.0, "A lost GPU, or NVML when it is unavailable, is probed again after "
                                 "this many seconds.", _positive),
    },
    "jobs": {
        "max_jobs": Field(INT, 512, "Most job cgroups (Slurm jobs and pods) read per interval: the newest Slurm "
                          "jobs first; more are counted in teye_jobs_cgroups{state=\"over_limit\"}.", _positive,
                          max=100000),
        "pod_log_dir": Field(STR, "/var/log/pods", "The kubelet's pod log directory (<namespace>_<pod>_<uid>): "
                             "names the pods found in the cgroup tree; unset: pods by uid only.", nullable=True),
    },
    "allocation": {
        "slurm_mapping_dir": Field(STR, "/run/teye/gpu-jobs", "Directory of per-GPU files naming the Slurm job "
                                   "each GPU is allocated to, written by deploy/slurm/teye-gpu-prolog.sh (the format "
                                   "of dcgm-exporter's --hpc-job-mapping-dir); unset: off.", nullable=True),
        "kubelet_socket": Field(STR, "/var/lib/kubelet/pod-resources/kubelet.sock", "The kubelet's pod-resources "
                                "gRPC socket (needs grpcio: pip install 'teye[kubernetes]'); unset: off.",
                                nullable=True),
        "kubelet_refresh_seconds": Field(FLOAT, 10.0, "Seconds between two List calls to the kubelet (from a "
                                         "background thread: a scrape never waits for it).", _positive, max=3600),
        "kubelet_timeout_seconds": Field(FLOAT, 2.0, "A List call that takes longer is abandoned and "
                                         "teye_kubelet_pod_resources_up is 0.", _positive, max=60),
    },
    "pmu": {
        "replay": Field(STR, None, "Serve a recorded PMU trace (teye record --pmu) instead of live perf events.",
                        nullable=True),
        "reprobe_seconds": Field(FLOAT, 60.0, "A counter group that failed (open/read error, CPU offline) is "
                                 "tried again after this many seconds; a PMU-less start is retried as often.",
                                 _positive),
        "memory_peak_bytes_per_second": Field(FLOAT, None, "The node's peak DRAM bandwidth (all sockets, read + "
                                              "write). When set, `teye profile` calls an input-bound job 'host' "
                                              "once memory traffic reaches 80 % of it.", _positive, nullable=True,
                                              max=1e14),
    },
    "phases": {
        "socket": Field(STR, None, "Unix datagram socket path for phase messages (default: /run/teye/phases.sock, "
                        "else $XDG_RUNTIME_DIR or the temp directory).", nullable=True),
        "max_jobs": Field(INT, 64, "Most live training jobs tracked at once.", _positive),
        "job_expiry_seconds": Field(FLOAT, 300.0, "A job silent this long expires and its series disappear.", _positive),
        "max_jobs_per_user": Field(INT, 32, "Most live jobs one uid may hold (so one user cannot fill the table).",
                                   _positive),
        "ended_run_keep_seconds": Field(FLOAT, 30.0, "An ended run's series stay at least this long after it ended "
                                        "(two of Prometheus' default 15 s scrape intervals) before another job "
                                        "may take its place in the table (docs/phases.md).", _non_negative),
        "pods": Field(BOOL, False, "Key jobs by the sender's Kubernetes pod (from /proc/<pid>/cgroup under procfs; "
                      "the agent needs hostPID) as well as uid and name, and name the pod in teye_job_info. "
                      "Datagrams then all take the Python path (docs/phases.md).", None),
        "trusted_uids": Field(LIST, [], "Uids whose job names are exported as sent; other senders' names are "
                              "prefixed with their user name ('alice/NAME'). The agent's own uid is always trusted.",
                              lambda v: None if all(isinstance(u, int) and not isinstance(u, bool) and u >= 0
                                                    for u in v) else "must be a list of uids (integers >= 0)"),
        "max_message_bytes": Field(INT, 65536, "Largest accepted datagram; larger ones count as too_large.", _positive),
        "max_records_per_message": Field(INT, 1024, "Most phase + step records in one datagram.", _positive),
        "max_messages_per_second": Field(INT, 20000, "Receiver budget: beyond this rate per 10 ms slice the receiver "
                                         "handles only each sender's fair share and discards (and charges) the "
                                         "rest of a flooding process's or uid's datagrams (docs/phases.md).", _positive),
        "max_pending_intervals": Field(INT, 4096, "Per job: phase intervals kept waiting for the GPU samples that "
                                       "cover them.", _positive),
        "attribution_max_delay_seconds": Field(FLOAT, 30.0, "A phase interval waits at most this long for GPU "
                                               "samples; then it is attributed with what is there.", _positive),
        "window_seconds": Field(FLOAT, 60.0, "Sliding window of teye_job_input_bound_ratio and of the verdict.",
                                _positive),
        "input_bound_threshold": Field(FLOAT, 0.2, "Verdict 'input' when data_wait holds at least this share of "
                                       "step time.", _ratio),
        "host_threshold": Field(FLOAT, 0.2, "Verdict 'host' when host phases (plus GPU idle inside compute) hold at "
                                "least this share of step time.", _ratio),
        "communication_threshold": Field(FLOAT, 0.2, "Verdict 'communication' when communication holds at least "
                                         "this share of step time.", _ratio),
        "idle_dominant_share": Field(FLOAT, 0.5, "A phase holding at least this share of the job's GPU idle time "
                                     "names the bottleneck too.", _ratio),
        "gpu_idle_min_ratio": Field(FLOAT, 0.1, "GPU idle-time rules apply only when the job's GPUs idle at least "
                                    "this share of the observed time.", _ratio),
        "stall_seconds": Field(FLOAT, 30.0, "Verdict 'idle' when a live job reported no phase or step this long.",
                               _positive),
        # input cause (issue 13): what the sending processes do while they wait for input
        "input_sample_interval_seconds": Field(FLOAT, 0.05, "Period of the /proc samples (CPU time, I/O, pressure) "
                                               "of the processes that send phases, to split data_wait by cause; "
                                               "0 turns the sampling off.", lambda v: None if v >= 0 else "must be >= 0"),
        "input_cpu_busy_ratio": Field(FLOAT, 0.5, "Input cause 'host_cpu' when the job's threads use at least this "
                                      "many CPU seconds per second of data_wait (else 'storage').", _positive),
        "input_cpu_stall_ratio": Field(FLOAT, 0.5, "Input cause 'host_cpu' also when the job's cgroup is stalled on "
                                       "CPU (cpu.pressure 'some') at least this share of its data_wait.", _ratio),
    },
    # teye report (issue 23): where the Prometheus that scraped the agents answers
    "report": {
        "prometheus_url": Field(STR, None, "Prometheus base URL for `teye report` (the flag --prometheus and "
                                "TEYE_PROMETHEUS_URL win).", nullable=True),
        "http_config_file": Field(STR, None, "Prometheus HTTP client config (basic_auth, bearer_token_file, "
                                  "tls_config), the file promtool's --http.config.file reads.", nullable=True),
        "timeout_seconds": Field(FLOAT, 30.0, "Per-query timeout of `teye report`.", _positive),
    },
    "grafana": {
        "url": Field(STR, None, "Grafana base URL: `teye report` prints each job's dashboard link for its nodes "
                     "and time range.", nullable=True),
    },
}


def _type_name(types: Tuple[type, ...]) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list"}
    if types == FLOAT:
        return "number"
    return " or ".join(names.get(t, t.__name__) for t in types)


def defaults(schema: Dict[str, Any] = SCHEMA) -> Dict[str, Any]:
    """The embedded defaults as a nested dict."""
    out = {}
    for key, f in schema.items():
        out[key] = defaults(f) if isinstance(f, dict) else copy.deepcopy(f.default)
    return out


MAX_NUMBER = Field.max  # the default bound of a numeric key; a key whose unit is larger (bytes/s) sets its own


def key_text(key: Any) -> str:
    """A mapping key as an error message shows it: one short line."""
    text = str(key)
    return text[:100] if text.isprintable() else repr(text)[:100]


def short_repr(value: Any) -> str:
    """repr() bounded in length and depth: a YAML alias bomb must not expand in an error message."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (list, dict)):
        r = reprlib.Repr()
        r.maxlevel, r.maxlist, r.maxdict = 2, 6, 4
        return r.repr(value)[:200]
    return repr(value)[:200]


def _validate_value(key: str, f: Field, value: Any) -> Any:
    if value is None and f.nullable:
        return None
    ok = isinstance(value, f.type) and not (isinstance(value, bool) and bool not in f.type)
    if not ok:
        raise ConfigError(f"config key '{key}': expected {_type_name(f.type)}, got {type(value).__name__} "
                          f"{short_repr(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not abs(value) <= f.max:
        raise ConfigError(f"config key '{key}': must be a finite number of at most {f.max:.0e} "
                          f"(got {short_repr(value)})")
    if f.type == FLOAT:
        value = float(value)
    if f.check:
        err = f.check(value)
        if err:
            raise ConfigError(f"config key '{key}': {err} (got {short_repr(value)})")
    return value


def merge(base: Dict[str, Any], override: Any, schema: Dict[str, Any] = SCHEMA, prefix: str = "") -> Dict[str, Any]:
    """Validate ``override`` against ``schema`` and merge it over ``base`` (returns a new dict)."""
    if not isinstance(override, dict):
        where = f"section '{prefix[:-1]}'" if prefix else "the top level"
        raise ConfigError(f"config {where}: expected a mapping of keys, got {type(override).__name__}")
    out = copy.deepcopy(base)
    for key, value in override.items():
        dotted = prefix + key_text(key)
        if key not in schema:
            choices = ", ".join(sorted(schema))
            raise ConfigError(f"config key '{dotted}': unknown key (known here: {choices})")
        f = schema[key]
        if isinstance(f, dict):
            out[key] = merge(out[key], value if value is not None else {}, f, dotted + ".")
        else:
            out[key] = _validate_value(dotted, f, value)
    return out


def _enabled_in(data: Any) -> set:
    """Collectors a (validated) file or flag mapping sets ``enabled: true``."""
    cols = data.get("collectors") if isinstance(data, dict) else None
    return {n for n, c in (cols or {}).items() if isinstance(c, dict) and c.get("enabled") is True}


def load(path: Optional[str] = None, overrides: Optional[Dict[str, Any]] = None,
         explicit: Optional[set] = None) -> Dict[str, Any]:
    """Defaults, then the YAML file at ``path`` (if any), then ``overrides`` (CLI flags, nested dict).

    ``explicit``, when given, receives the collectors the file or the flags turn on explicitly
    (``enabled: true``, ``--collector.X``): for those, absent hardware is a failure, not an absence."""
    cfg = defaults()
    seen = set()
    if path:
        import yaml   # (here: a file is given; the embedded defaults need no YAML parser, 1.7 MiB resident)
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh)
        except OSError as e:
            raise ConfigError(f"config file {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"config file {path}:{where}: invalid YAML: {problem}") from None
        except (ValueError, RecursionError) as e:  # an integer too long to convert, nesting too deep
            raise ConfigError(f"config file {path}: unreadable YAML: {str(e).splitlines()[0][:200]}") from None
        if data is not None:
            cfg = merge(cfg, data)
            seen |= _enabled_in(data)
    if overrides:
        cfg = merge(cfg, overrides)
        seen |= _enabled_in(overrides)
    if cfg["host"]["node_exporter"]:   # node_exporter has the host: its collectors off unless turned on explicitly
        for name in hostseries.COVERED:
            if name not in seen:
                cfg["collectors"][name]["enabled"] = False
    if explicit is not None:
        explicit.update(n for n in seen if cfg["collectors"][n]["enabled"])
    return cfg


def hidden_collectors(cfg: Dict[str, Any]) -> frozenset:
    """Collectors sampled but not exported: in the node_exporter mode, those the communication cause reads."""
    return frozenset(hostseries.SAMPLED_NOT_EXPORTED) if cfg["host"]["node_exporter"] else frozenset()


def get(cfg: Dict[str, Any], dotted: str) -> Any:
    """cfg['a']['b'] for 'a.b'."""
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node
