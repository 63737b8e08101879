"""Training job: the verdict and its evidence, GPU busy/idle next to the job's phases on one time axis."""
from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.models import dashboard as dash_m

from agent.phases.advice import catalog
from agent.phases.verdict import KINDS, RECOMMENDATIONS, base_catalog

from .common import (DS, GRAFANA_DS, JOB, cluster_variable, dashboard, datasource_variable, gpu_variable, heatmap,
                     job_node_variable, job_train_job_variable, node_link, row, stat, table, target, text,
                     timeseries, with_series_links)

UID = "teye-job"
TITLE = "teye / Training job"

RATE = "[$__rate_interval]"
# each per-node series links to that node's dashboard
NODE_SERIES = node_link("${__field.labels.instance}")
JOB_GPU = 'train_job="$train_job", instance=~"$node", gpu=~"$gpu"'
# The GPUs the job uses: those the agent credits with the job's idle time.
JOB_GPUS = f"group by (instance, gpu) (teye_job_gpu_idle_seconds_total{{{JOB_GPU}}})"
INPUT_BOUND_THRESHOLD = "teye:threshold:job_input_bound_ratio"
# samples per second of training step (agent/phases/definitions.py, the report's figure): per node, samples
# over the steps' wall time, times the processes reporting; {w} the range
_SAMPLES_PER_STEP_SECOND = (f"sum by (instance) (rate(teye_job_samples_total{{{{{JOB}}}}}{{w}}))"
                            f" / (sum by (instance) (rate(teye_job_step_seconds_sum{{{{{JOB}}}}}{{w}})) > 0)"
                            f" * max by (instance) (teye_job_processes{{{{{JOB}}}}})")

_VERDICT_COLORS = {"input": "red", "host": "orange", "communication": "purple", "compute": "green",
                   "idle": "blue", "not_observed": "text"}


def _recommendations() -> str:
    lines = ["What each verdict means and what to do about it (the agent's rules are in "
             "`agent/phases/verdict.py`; `teye profile` and `teye report` give the same advice in the job's own "
             "framework, PyTorch or TensorFlow, when zero-code instrumentation names it).", ""]
    for kind in KINDS:
        lines.append(f"* **{kind}**: {RECOMMENDATIONS[kind]}")
    return "\n".join(lines) + "\n"


def _advice_table():
    """What to do for this job now: the agent's advice (teye_job_advice_tip, which starts from what the job is
    configured with and never recommends what it already has), each tip mapped to its sentence from the same
    catalog the agent draws from (agent.phases.advice), in the advice's order."""
    p = table("What to do", "The agent's advice for the job's current verdict, tip by tip in its order: it starts "
              "from what the job is configured with (the table beside it) and never recommends what the job "
              "already has; a rank that computes longer than the others gets advice about that rank. `teye "
              "report` and `teye profile` give the same advice with the figures.",
              "none", [target(f"max by (tip) (teye_job_advice_tip{{{JOB}}})", instant=True, fmt="table")],
              w=16, h=9, hide=("Time",), rename={"Value": "#", "tip": "What to do"})
    p = p.mappings([dash_m.ValueMap(options={i: dash_m.ValueMappingResult(text=t, index=k)
                                             for k, (i, t) in enumerate(catalog(base_catalog()))})])
    return p.sort_by([common_b.TableSortByFieldState().display_name("#").desc(False)])


def _annotations(d):
    steps = f"teye_job_steps_total{{{JOB}}}"
    d = d.annotation(dash_b.AnnotationQuery().name("Job start").datasource(DS).enable(True).icon_color("green")
                     .expr(f"({steps} > 0) unless ({steps} offset 1m)"))
    d = d.annotation(dash_b.AnnotationQuery().name("Job stopped stepping").datasource(DS).enable(True)
                     .icon_color("red")
                     .expr(f"(changes({steps}[1m]) == 0) and (changes({steps}[2m]) > 0)"))
    # Epoch boundaries, job start/end pushed by workloads through the Grafana API
    # (dashboards.push.annotate: tags "teye" and the train_job name).
    d = d.annotation(dash_b.AnnotationQuery().name("Job events (epochs)").datasource(GRAFANA_DS).enable(True)
                     .icon_color("yellow").type("tags")
                     .target(dash_b.AnnotationTarget().type("tags").tags(["teye", "$train_job"])
                             .match_any(False).limit(500)))
    return d


def build():
    d = (dashboard(UID, TITLE, "One training job: its verdict (input, host, communication, compute, idle, not_observed) with "
                   "the evidence, and on one time axis the step time by phase next to GPU busy/idle time, the "
                   "idle split by the phase it fell in, and the idle-gap lengths.")
         .with_variable(datasource_variable())
         .with_variable(cluster_variable())
         .with_variable(job_train_job_variable())
         .with_variable(job_node_variable())
         .with_variable(gpu_variable()))
    d = _annotations(d)

    d = d.with_row(row("Verdict and evidence"))
    verdict = stat(
        "Verdict", "The agent's current verdict for the job (teye_job_bottleneck): input = waiting for data, "
        "host = kernel launch / Python overhead, communication = gradient exchange, compute = the GPU does "
        "the work, idle = GPU idle outside the reported phases, not_observed = steps only (input wait not "
        "observed) and no GPU samples: no verdict can be given.",
        "none", [target(f"teye_job_bottleneck{{{JOB}}} == 1", "{{kind}}", instant=True)],
        w=4, h=5, text_mode="name")
    for kind, color in _VERDICT_COLORS.items():
        verdict = verdict.override_by_name(kind, [dash_m.DynamicConfigValue(
            id_val="color", value={"mode": "fixed", "fixedColor": color})])
    d = d.with_panel(verdict)
    d = d.with_panel(stat(
        "Input-bound ratio", "Share of step time in data_wait over the agent's sliding window "
        "(teye_job_input_bound_ratio). Red from the input-bound threshold (20 %). No data for a job that "
        "reports steps only: its input wait is not observed.",
        "percentunit", [target(f"max(teye_job_input_bound_ratio{{{JOB}}})", instant=True)],
        w=4, h=5, thresholds=[(None, "green"), (0.2, "red")]))
    d = d.with_panel(stat(
        "GPU idle ratio", "Share of the job's GPU time (during its steps) that the GPUs were idle, over the "
        "agent's sliding window (teye_job_gpu_idle_ratio).",
        "percentunit", [target(f"max(teye_job_gpu_idle_ratio{{{JOB}}})", instant=True)],
        w=4, h=5, thresholds=[(None, "green"), (0.25, "orange"), (0.5, "red")]))
    d = d.with_panel(stat(
        "GPU idle time in data_wait", "Share of the job's GPU idle time that overlaps its data_wait phase over "
        "5 minutes: most idle time in data_wait means the input pipeline starves the GPU.",
        "percentunit",
        [target(f'sum(rate(teye_job_gpu_idle_seconds_total{{{JOB}, phase="data_wait"}}[5m]))'
                f" / sum(rate(teye_job_gpu_idle_seconds_total{{{JOB}}}[5m]))", instant=True)],
        w=4, h=5, thresholds=[(None, "green"), (0.5, "red")]))
    d = d.with_panel(stat(
        "Mean step time", "Mean wall time of a training step over 5 minutes (teye_job_step_seconds).",
        "s", [target(f"sum(rate(teye_job_step_seconds_sum{{{JOB}}}[5m]))"
                     f" / sum(rate(teye_job_step_seconds_count{{{JOB}}}[5m]))", instant=True)],
        w=4, h=5))
    d = d.with_panel(stat(
        "Samples per second", "Training samples per second of training step over 5 minutes, all processes of "
        "the job (evaluation and compile, between steps, are in no figure of training: the report's samples/s).",
        "suffix: samples/s", [target(f"sum({_SAMPLES_PER_STEP_SECOND.format(w='[5m]')})", instant=True)],
        w=4, h=5, decimals=1))
    d = d.with_panel(_advice_table())
    d = d.with_panel(table(
        "What the job is configured with", "The settings teye's zero-code hook saw in the job "
        "(teye_job_config_info): its training DataLoader, DistributedDataParallel, autocast and torch.compile; "
        "empty for a job that reports through its own Reporter or runs TensorFlow.",
        "none", [target(f"max by (key, value) (teye_job_config_info{{{JOB}}})", instant=True, fmt="table")],
        w=8, h=9, hide=("Time", "Value"), rename={"key": "setting"}))
    d = d.with_panel(text(
        "What each verdict means", "Recommendation for each verdict, from the agent's verdict rules, whatever "
        "the job already does (What to do, above, starts from that).",
        _recommendations(), w=24, h=9))

    d = d.with_row(row("Timeline: phases and GPU busy/idle"))
    d = d.with_panel(timeseries(
        "Step time by phase", "Seconds per training step spent in each phase (data_wait, compute, host, "
        "communication, checkpoint, other), stacked: the stack's height is the step time. Not eval or compile "
        "(evaluation and tracing a step function, between steps: beside training in teye report).",
        "s",
        [target(f"sum by (phase) (rate(teye_job_phase_seconds_total{{{JOB}, phase!~\"compile|eval\"}}{RATE}))"
                f" / on () group_left () sum(rate(teye_job_steps_total{{{JOB}}}{RATE}))", "{{phase}}")],
        w=24, h=8, stack=True, min=0))
    d = d.with_panel(timeseries(
        "GPU busy vs idle, idle split by phase", "Mean over the job's GPUs: the busy share, and the idle share "
        "split by the phase of the job it overlapped (GPU idle during data_wait is time lost to the input "
        "pipeline). Same time axis as the phases above.",
        "percentunit",
        [target(f"avg(({_gpu_rate('teye_gpu_busy_seconds_total')} / {_gpu_rate('teye_gpu_sampled_seconds_total')})"
                f" and on (instance, gpu) {JOB_GPUS})", "busy"),
         target(f"sum by (phase) (rate(teye_job_gpu_idle_seconds_total{{{JOB_GPU}}}{RATE}))"
                f" / on () group_left () count({JOB_GPUS})", "idle in {{phase}}")],
        w=24, h=8, stack=True, min=0, max=1))
    d = d.with_panel(heatmap(
        "Idle-gap length", "How many idle gaps of each length the job's GPUs had per interval "
        "(teye_gpu_idle_gap_seconds histogram: consecutive driver samples below the busy threshold). A band at "
        "the step period's input time is the gap before every step.",
        "s",
        [target(f"sum by (le) (increase(teye_gpu_idle_gap_seconds_bucket{{instance=~\"$node\", gpu=~\"$gpu\"}}"
                f"{RATE}) and on (instance, gpu) {JOB_GPUS})", "{{le}}", fmt="heatmap")],
        y_unit="s", cell_unit="short", w=24, h=8))

    d = d.with_row(row("Given against used: the Slurm jobs' cgroups on these nodes"))
    node = 'instance=~"$node"'
    d = d.with_panel(timeseries(
        "CPU used vs allocated", "Cores each Slurm job on the job's nodes uses (rate of its cgroup's CPU seconds, "
        "user + system: teye_slurm_job_cpu_seconds_total) against the cores it may use (its cpuset or CPU quota: "
        "teye_slurm_job_cpus). A job far below its allocation asked for too many cores.",
        "short",
        [target(f"sum by (instance, slurm_job) (rate(teye_slurm_job_cpu_seconds_total{{{node}}}{RATE}))",
                "{{slurm_job}} used"),
         target(f"max by (instance, slurm_job) (teye_slurm_job_cpus{{{node}}})", "{{slurm_job}} allocated")],
        min=0))
    d = d.with_panel(timeseries(
        "Memory used vs limit", "Memory charged to each Slurm job's cgroup (teye_slurm_job_memory_used_bytes, "
        "page cache included), its page cache (teye_slurm_job_memory_cache_bytes) and its limit "
        "(teye_slurm_job_memory_limit_bytes): the job is killed when used reaches the limit and no cache is left "
        "to drop.",
        "bytes",
        [target(f"max by (instance, slurm_job) (teye_slurm_job_memory_used_bytes{{{node}}})", "{{slurm_job}} used"),
         target(f"max by (instance, slurm_job) (teye_slurm_job_memory_cache_bytes{{{node}}})",
                "{{slurm_job}} page cache"),
         target(f"max by (instance, slurm_job) (teye_slurm_job_memory_limit_bytes{{{node}}})",
                "{{slurm_job}} limit")],
        min=0))
    d = d.with_panel(timeseries(
        "Allocated GPUs: busy share", "Busy share over 5 minutes of every GPU a scheduler allocated on these nodes "
        "(the Slurm prolog's mapping, the kubelet's pod-resources: teye:gpu_scheduler_allocation_utilization:"
        "ratio5m), whether or not a process holds it: a GPU flat at 0 was allocated and never used.",
        "percentunit",
        [target(f"teye:gpu_scheduler_allocation_utilization:ratio5m{{{node}}}",
                "{{slurm_job}}{{pod}} GPU {{gpu}}")],
        min=0, max=1))
    d = d.with_row(row("Ranks (data-parallel jobs)"))
    d = d.with_panel(stat(
        "Critical rank", "The rank that holds the job back over all its nodes: the largest share of its step "
        "spent waiting on its own input and host work over 5 minutes (teye:job_critical_rank:own_wait_ratio5m, "
        "docs/phases.md); empty for a job whose processes do not say their rank.",
        "percentunit", [target('teye:job_critical_rank:own_wait_ratio5m{train_job="$train_job"}',
                               "rank {{rank}} on {{instance}}", instant=True)],
        w=6, h=8, thresholds=[(None, "green"), (0.2, "red")]))
    ranks = table(
        "Ranks × phases", "Each rank's share of its step time in each phase over 5 minutes "
        "(teye_job_rank_phase_seconds_total / teye_job_rank_step_seconds_total), over all nodes: a straggler "
        "waits on its own input, or (a compute straggler) spends the least of its step in communication; the "
        "ranks waiting for it show communication (DDP's exposed gradient exchange, collectives called from "
        "Python) or, where teye cannot see the exchange, compute.",
        "percentunit",
        [target(f"sum by (rank, phase) (rate(teye_job_rank_phase_seconds_total{{{JOB}}}[5m]))"
                f" / on (rank) group_left () sum by (rank) (rate(teye_job_rank_step_seconds_total{{{JOB}}}[5m]))",
                instant=True, fmt="table")],
        w=18, h=8)
    d = d.with_panel(ranks.with_transformation(dash_m.DataTransformerConfig(
        id_val="groupingToMatrix", options={"columnField": "phase", "rowField": "rank", "valueField": "Value"})))
    d = d.with_panel(timeseries(
        "Scaling efficiency", "The share of the job's ranks' step time outside the gradient exchange over all its "
        "nodes, 1 - communication seconds / step seconds summed over its ranks over 5 minutes "
        "(teye:job_scaling_efficiency:ratio5m), and the line under which TeyeJobCommunicationBound fires "
        "(1 - teye:threshold:job_communication_ratio): the job loses the rest to the exchange. Empty for a job "
        "whose processes do not say their rank.",
        "percentunit",
        [target('teye:job_scaling_efficiency:ratio5m{train_job="$train_job"}', "all nodes"),
         target("1 - teye:threshold:job_communication_ratio", "threshold")],
        min=0, max=1))
    d = d.with_panel(timeseries(
        "Communication share by rank", "Each rank's share of its step time in communication over 5 minutes "
        "(teye:job_rank_communication:ratio5m). Where no rank waits on its own input, the rank far below the "
        "others computes longest and they wait for it in the gradient exchange (TeyeJobComputeStraggler, "
        "teye:job_compute_straggler:communication_ratio5m).",
        "percentunit",
        [target('teye:job_rank_communication:ratio5m{train_job="$train_job"}', "rank {{rank}} on {{instance}}")],
        min=0, max=1))

    d = d.with_row(row("Throughput"))
    d = d.with_panel(with_series_links(timeseries(
        "Samples per second", "Training samples per second of training step reported by the job, per node "
        "(as the report's: evaluation between steps is not in it).",
        "suffix: samples/s",
        [target(f"sum by (instance) ({_SAMPLES_PER_STEP_SECOND.format(w=RATE)})", "{{instance}}")], min=0),
        NODE_SERIES))
    d = d.with_panel(with_series_links(timeseries(
        "Input-bound ratio", "Share of step time in data_wait: the agent's sliding window, the 5-minute "
        "recording rule, and the alert threshold.",
        "percentunit",
        [target(f"teye_job_input_bound_ratio{{{JOB}}}", "{{instance}} agent window"),
         target(f"teye:job_input_bound:ratio5m{{{JOB}}}", "{{instance}} 5 min"),
         target(INPUT_BOUND_THRESHOLD, "threshold")],
        min=0, max=1), NODE_SERIES))
    d = d.with_panel(heatmap(
        "Step time distribution", "How many steps of each duration per interval (teye_job_step_seconds "
        "histogram): a second band means some steps wait for something.",
        "s",
        [target(f"sum by (le) (increase(teye_job_step_seconds_bucket{{{JOB}}}{RATE}))", "{{le}}", fmt="heatmap")],
        y_unit="s", cell_unit="short"))
    d = d.with_panel(with_series_links(timeseries(
        "Job GPU utilization", "Mean busy share of the job's GPUs over 5 minutes, per node "
        "(teye:job_gpu_utilization:ratio5m).",
        "percentunit",
        [target(f"teye:job_gpu_utilization:ratio5m{{{JOB}}}", "{{instance}}")], min=0, max=1), NODE_SERIES))

    d = d.with_row(row("Inside the step and memory"))
    d = d.with_panel(timeseries(
        "Parts of the step's compute", "The job's compute split into forward, backward, optimizer, the "
        "host-to-device copy and other (the rest: zero_grad, the loss, a scheduler, Python), each part's share of "
        "the compute over the rate interval (teye_job_step_part_seconds_total / teye_job_phase_seconds_total"
        "{phase=\"compute\"}), stacked to 1; the exposed gradient exchange is communication, not backward. "
        "Zero-code PyTorch jobs only (docs/phases.md \"Inside the step\").",
        "percentunit",
        [target(f"sum by (part) (rate(teye_job_step_part_seconds_total{{{JOB}}}{RATE}))"
                f" / ignoring (part) group_left () sum (rate(teye_job_phase_seconds_total{{{JOB}, phase=\"compute\"}}"
                f"{RATE}))", "{{part}}")],
        stack=True, min=0, max=1))
    d = d.with_panel(with_series_links(timeseries(
        "Memory per rank against its GPU", "Each rank's memory (teye_job_rank_memory_bytes: host resident, CUDA "
        "allocated, reserved, and the step's peak) beside the memory of the GPU it uses "
        "(teye:job_rank_gpu_memory_total:bytes): reserved near the total is close to an out-of-memory error. A "
        "job without ranks: its processes' memory on each node (teye_job_memory_bytes).",
        "bytes",
        [target(f"teye_job_rank_memory_bytes{{{JOB}}}", "rank {{rank}} {{kind}} on {{instance}}"),
         target(f"teye:job_rank_gpu_memory_total:bytes{{{JOB}}}", "rank {{rank}}'s GPU total on {{instance}}"),
         target(f"teye_job_memory_bytes{{{JOB}}} unless on (instance, train_job) "
                f"teye_job_rank_memory_bytes{{{JOB}}}", "{{kind}} on {{instance}}")],
        min=0), NODE_SERIES))
    d = d.with_panel(with_series_links(timeseries(
        "Memory growth over 30 minutes (creep)", "How much the job's memory of each kind grew over the last 30 "
        "minutes on each node (teye:job_memory_growth:bytes30m), and the threshold above which "
        "TeyeJobMemoryCreep fires when the growth is also steady (each third of the window rising, never falling "
        "back; docs/phases.md \"Memory and creep\"): warm-up and a cache that fills once show here for 30 minutes, "
        "then fall back to 0; a leak stays above the line.",
        "bytes",
        [target(f"teye:job_memory_growth:bytes30m{{{JOB}}}", "{{kind}} on {{instance}}"),
         target("teye:threshold:job_memory_creep_bytes", "threshold")]), NODE_SERIES))
    return d


def _gpu_rate(metric: str) -> str:
    return f'rate({metric}{{instance=~"$node", gpu=~"$gpu"}}{RATE})'
