"""Cluster overview: which nodes and GPUs work, which idle and who holds them, jobs by verdict, fleet GPU-hours."""
from __future__ import annotations

from .common import (NODE, NODE_GPU, bargauge, cluster_variable, dashboard, datasource_variable, gpu_variable, heatmap,
                     job_link, node_link, node_variable, row, stat, table, target, timeseries, train_job_variable,
                     with_column_links, with_series_links)

UID = "teye-cluster"
TITLE = "teye / Cluster overview"

# Busy share of each GPU over 5 minutes, recorded (teye-recording.yml): a fleet of
# 1,000 nodes has 8,000 GPUs, too many to compute two rates per GPU at every step of
# a panel (benchmarks/fleet.py).  GPUs that do not answer are absent, not idle.
GPU_BUSY = f"teye:gpu_utilization:ratio5m{{{NODE_GPU}}}"
LOW = "< on () group_left () teye:threshold:gpu_low_utilization_ratio"
# GPUs holding a process, from the per-node record.
ALLOCATED = f"(sum(teye:node_gpus_allocated:count{{{NODE}}}) or vector(0))"
JOBS = 'instance=~"$node", train_job=~"$train_job"'


def build():
    d = (dashboard(UID, TITLE, "Fleet view of teye nodes: GPU utilization per node, idle or "
                   "under-used GPUs and the jobs holding them, training jobs by verdict, GPU-hours used "
                   "against allocated.")
         .with_variable(datasource_variable())
         .with_variable(cluster_variable())
         .with_variable(node_variable())
         .with_variable(gpu_variable())
         .with_variable(train_job_variable(multi=True)))

    d = d.with_row(row("Now"))
    d = d.with_panel(stat(
        "Agents reporting", "teye agents Prometheus scrapes successfully (teye_build_info is present).",
        "short", [target(f"count(teye_build_info{{{NODE}}})", instant=True)]))
    d = d.with_panel(stat(
        "GPUs", "GPUs the agents see through NVML (teye_gpu_info).",
        "short", [target(f"count(teye_gpu_info{{{NODE}}})", instant=True)]))
    d = d.with_panel(stat(
        "GPUs allocated", "GPUs with at least one compute process on them (teye_gpu_process_info).",
        "short", [target(ALLOCATED, instant=True)]))
    d = d.with_panel(stat(
        "Allocated GPUs below the low threshold",
        "Allocated GPUs whose 5-minute busy share is under teye:threshold:gpu_low_utilization_ratio "
        "(deploy/prometheus/rules/teye-thresholds.yml).",
        "short", [target("count(teye:gpu_allocated_utilization:ratio5m{" + NODE + "} " + LOW + ") or vector(0)",
                         instant=True)],
        thresholds=[(None, "green"), (1, "orange")]))
    d = d.with_panel(stat(
        "Mean GPU utilization", "Mean busy share of the selected GPUs over the last 5 minutes "
        "(teye:gpu_utilization:ratio5m).",
        "percentunit", [target(f"avg(teye:gpu_utilization:ratio5m{{{NODE_GPU}}})", instant=True)],
        thresholds=[(None, "red"), (0.15, "orange"), (0.25, "yellow"), (0.6, "green")]))
    d = d.with_panel(stat(
        "Firing teye alerts", "teye alerts firing now (Prometheus ALERTS series of the teye rules).",
        "short", [target('count(ALERTS{alertstate="firing", alertname=~"Teye.*"}) or vector(0)', instant=True)],
        thresholds=[(None, "green"), (1, "red")]))

    d = d.with_row(row("GPU utilization"))
    d = d.with_panel(with_series_links(heatmap(
        "GPU utilization per node",
        "One row per node, colored by the mean busy share of its selected GPUs over 5 minutes "
        "(teye:gpu_utilization:ratio5m): exact busy time integrated from every NVML utilization sample by the "
        "agent, so sub-second idle gaps count. GPUs that do not answer (lost, node down) are absent. One row "
        "per node, not per GPU, so that a fleet of 1,000 nodes stays one query of 1,000 series; the table "
        "below names the idle GPUs, and the node dashboard shows each GPU.",
        "percentunit", [target(f"avg by (instance) ({GPU_BUSY})", "{{instance}}")],
        y_unit="none", cell_unit="percentunit", w=24, h=10, scheme="RdYlGn", min=0, max=1),
        node_link("${__field.labels.instance}")))
    d = d.with_panel(with_column_links(table(
        "Idle or low GPUs and their training jobs",
        "GPUs whose 5-minute busy share is under the low threshold now, with the training job that reports "
        "phases from them (empty when no job reports phases).",
        "percentunit",
        [target("(teye:gpu_utilization:ratio5m{" + NODE_GPU + "} " + LOW + ")"
                " * on (job, instance, gpu) group_right () teye:gpu_train_job:info"
                " or on (job, instance, gpu)"
                " (teye:gpu_utilization:ratio5m{" + NODE_GPU + "} " + LOW + ")",
                instant=True, fmt="table")],
        rename={"Value": "busy (5m)", "instance": "node"}, sort_by="busy (5m)"),
        {"node": node_link(), "train_job": job_link()}))
    d = d.with_panel(with_column_links(table(
        "Allocated GPUs below the low threshold",
        "GPUs holding a compute process (NVML) whose 5-minute busy share is under the low threshold, with the "
        "user, Slurm job or Kubernetes pod holding them: candidates for the GPU utilization alerts.",
        "percentunit",
        [target("teye:gpu_allocated_utilization:ratio5m{" + NODE_GPU + "} " + LOW, instant=True, fmt="table")],
        rename={"Value": "busy (5m)", "instance": "node"}, sort_by="busy (5m)"),
        {"node": node_link(), "train_job": job_link()}))

    d = d.with_row(row("Training jobs"))
    d = d.with_panel(bargauge(
        "Training jobs by verdict",
        "How many training jobs each verdict holds now (teye_job_bottleneck): input = waiting for data, "
        "host = kernel launch / Python overhead, communication = gradient exchange, compute = fine, idle = "
        "GPU idle outside reported phases, not_observed = steps only and no GPU samples (no verdict).",
        "short", [target(f"count by (kind) (teye_job_bottleneck{{{JOBS}}} == 1)", "{{kind}}", instant=True)]))
    d = d.with_panel(with_column_links(table(
        "Training jobs",
        "Every training job reporting phases: its verdict, input-bound ratio (share of step time in data_wait) "
        "and the mean busy share of its GPUs.",
        "percentunit",
        [target(f"teye_job_bottleneck{{{JOBS}}} == 1", instant=True, fmt="table"),
         target(f"teye_job_input_bound_ratio{{{JOBS}}}", instant=True, fmt="table"),
         target(f"teye:job_gpu_utilization:ratio5m{{{JOBS}}}", instant=True, fmt="table")],
        w=16, hide=("Time", "__name__", "job", "Value #A"),
        rename={"kind": "verdict", "Value #B": "input-bound", "Value #C": "GPU busy (5m)", "instance": "node"},
        sort_by="input-bound"),
        {"node": node_link(), "train_job": job_link()}))

    d = d.with_row(row("Fleet"))
    d = d.with_panel(timeseries(
        "GPUs busy, allocated and present",
        "GPU-equivalents busy (sum of busy shares), GPUs holding a compute process, and GPUs present. The gap "
        "between allocated and busy is allocated GPU time that does no work.",
        "short",
        [target(f"sum({GPU_BUSY})", "busy (GPU-equivalents)"),
         target(ALLOCATED, "allocated"),
         target(f"count(teye_gpu_info{{{NODE}}})", "present")],
        w=12, min=0))
    d = d.with_panel(stat(
        "GPU-hours used", "Busy GPU-hours over the dashboard's time range (increase of teye_gpu_busy_seconds_total).",
        "suffix: GPU-h", [target(f"sum(increase(teye_gpu_busy_seconds_total{{{NODE}}}[$__range])) / 3600",
                                 instant=True)], decimals=1))
    d = d.with_panel(stat(
        "GPU-hours allocated", "GPU-hours with a compute process on the GPU over the dashboard's time range "
        "(mean number of allocated GPUs times the range).",
        "suffix: GPU-h", [target(f"avg_over_time({ALLOCATED}[$__range:]) * $__range_s / 3600",
                                 instant=True)], decimals=1))
    d = d.with_panel(stat(
        "Allocated GPU time used", "Busy GPU-hours divided by allocated GPU-hours over the time range: the share "
        "of the GPU time handed to jobs that did work.",
        "percentunit",
        [target(f"sum(increase(teye_gpu_busy_seconds_total{{{NODE}}}[$__range])) / 3600"
                f" / (avg_over_time({ALLOCATED}[$__range:]) * $__range_s / 3600)",
                instant=True)],
        thresholds=[(None, "red"), (0.15, "orange"), (0.25, "yellow"), (0.6, "green")]))
    return d
