"""Shared building blocks for the teye dashboards (grafana-foundation-sdk builders).

Every panel is made through one of the small factories below, so every panel gets a
title, a description, a unit, the ``${datasource}`` data source and one query per
``target(...)``.  ``render(builder)`` turns a dashboard builder into the JSON text
that is committed under ``dashboards/json/`` (stable: sorted keys, panel ids and
query refIds numbered in order).

Template variables (the same names on every dashboard):

* ``datasource``: the Prometheus data source;
* ``node``: the Prometheus ``instance`` label of teye agents (``teye_build_info``);
* ``gpu``: the NVML index (``teye_gpu_info``);
* ``train_job``: the training job name reported over the phase socket.
"""
from __future__ import annotations

import json
import re
from typing import Dict, Iterable, List, Optional, Sequence

from grafana_foundation_sdk.builders import bargauge as bargauge_b
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import heatmap as heatmap_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import table as table_b
from grafana_foundation_sdk.builders import text as text_b
from grafana_foundation_sdk.builders import timeseries as ts_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import heatmap as heatmap_m
from grafana_foundation_sdk.models import prometheus as prom_m
from grafana_foundation_sdk.models import text as text_m

DS = dash_m.DataSourceRef(type_val="prometheus", uid="${datasource}")
GRAFANA_DS = dash_m.DataSourceRef(type_val="grafana", uid="-- Grafana --")

# Label selectors every query uses (Grafana substitutes the variables).
NODE = 'instance=~"$node"'
NODE_GPU = 'instance=~"$node", gpu=~"$gpu"'
JOB = 'train_job="$train_job", instance=~"$node"'

TAGS = ["teye"]

# Every selector of every query also matches the cluster variable (kubernetes-mixin's convention): the shipped
# Prometheus configurations set a ``cluster`` label (external_labels, seen where several Prometheus meet: the
# central tier, federation).  On one Prometheus the series carry none, the variable finds no value and "All"
# (``.*``) matches the absent label, so nothing changes there.
CLUSTER = 'cluster=~"$cluster"'
_SELECTOR_OPEN = re.compile(r"\{(?!\{)")

UIDS = {"cluster": "teye-cluster", "node": "teye-node", "job": "teye-job"}
# what every link carries: the time range and the data source and cluster chosen
_KEEP = "${__url_time_range}&${datasource:queryparam}&${cluster:queryparam}"


# ----------------------------------------------------------------- variables

def datasource_variable() -> dash_b.DatasourceVariable:
    return (dash_b.DatasourceVariable("datasource").label("Data source").type("prometheus")
            .description("Prometheus that scrapes the teye agents."))


def _query_variable(name: str, label: str, query: str, description: str, *, multi: bool,
                    include_all: bool, all_value: Optional[str] = ".*") -> dash_b.QueryVariable:
    """``all_value=None``: "All" means every value the query found (Grafana sends them as one regex)."""
    v = (dash_b.QueryVariable(name).label(label).query(query).datasource(DS).description(description)
         .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dash_m.VariableSort.ALPHABETICAL_ASC)
         .multi(multi).include_all(include_all))
    if include_all and all_value is not None:
        v = v.all_value(all_value)
    return v


def cluster_variable() -> dash_b.QueryVariable:
    return _query_variable("cluster", "Cluster", "label_values(teye_build_info, cluster)",
                           "The cluster label the Prometheus configurations set (external_labels); All where the "
                           "series carry none (one Prometheus).", multi=True, include_all=True).current(
        dash_m.VariableOption(selected=True, text="All", value="$__all"))


def node_variable(*, multi: bool = True) -> dash_b.QueryVariable:
    return _query_variable("node", "Node", f"label_values(teye_build_info{{{CLUSTER}}}, instance)",
                           "Nodes running the teye agent (the Prometheus instance label).",
                           multi=multi, include_all=multi)


def gpu_variable() -> dash_b.QueryVariable:
    return _query_variable("gpu", "GPU", 'label_values(teye_gpu_info{instance=~"$node"}, gpu)',
                           "GPUs of the selected nodes (NVML index; MIG instances as GPU/instance).",
                           multi=True, include_all=True)


def train_job_variable(*, multi: bool = False) -> dash_b.QueryVariable:
    return _query_variable("train_job", "Training job",
                           'label_values(teye_job_steps_total{instance=~"$node"}, train_job)',
                           "Training jobs that report phases to the agents of the selected nodes.",
                           multi=multi, include_all=multi)


def job_train_job_variable() -> dash_b.QueryVariable:
    """The training job first, on the job dashboard: the nodes follow from it."""
    return _query_variable("train_job", "Training job", f"label_values(teye_job_steps_total{{{CLUSTER}}}, train_job)",
                           "Training jobs that report phases to a teye agent.", multi=False, include_all=False)


def job_node_variable() -> dash_b.QueryVariable:
    """Nodes the selected job runs on; All = those nodes, not every node of the fleet, so that the
    job's panels read the job's nodes only (a fleet of 1,000 nodes: benchmarks/fleet.py)."""
    return _query_variable("node", "Node", 'label_values(teye_job_steps_total{train_job="$train_job"}, instance)',
                           "Nodes the training job reports phases from (All: every one of them).",
                           multi=True, include_all=True, all_value=None)


# ------------------------------------------------------------------- queries

def target(expr: str, legend: str = "", *, instant: bool = False, fmt: Optional[str] = None,
           interval: Optional[str] = None) -> prom_b.Dataquery:
    """One PromQL query (refIds are numbered by ``render``)."""
    q = prom_b.Dataquery().expr(with_cluster(" ".join(expr.split()))).datasource(DS)
    q = q.instant() if instant else q.range()
    if legend:
        q = q.legend_format(legend)
    if fmt:
        q = q.format(prom_m.PromQueryFormat(fmt))
    if interval:
        q = q.interval(interval)
    return q


def with_cluster(expr: str) -> str:
    """``expr`` with the cluster variable's matcher in each of its selectors."""
    return _SELECTOR_OPEN.sub("{" + CLUSTER + ", ", expr).replace(", }", "}")


# ---------------------------------------------------------------------- links

def dashboard_links(here: str) -> List[dash_b.DashboardLink]:
    """The top-bar links: the cluster overview (from the node and job views), and every teye dashboard, the
    variables and time range kept (back and forth between cluster, node and job)."""
    out = []
    if here != "cluster":
        out.append(dash_b.DashboardLink("Cluster").type(dash_m.DashboardLinkType.LINK).icon("dashboard")
                   .url(f"/d/{UIDS['cluster']}/?{_KEEP}").tooltip("The fleet: every node and training job")
                   .keep_time(False).include_vars(False))
    out.append(dash_b.DashboardLink("teye").type(dash_m.DashboardLinkType.DASHBOARDS).tags(TAGS)
               .as_dropdown(True).include_vars(True).keep_time(True))
    return out


def node_link(value: str = "${__value.raw}") -> dict:
    """A data link to the node dashboard for the node ``value`` names (a cell, or a series' instance label)."""
    return {"title": f"Node {value}", "url": f"/d/{UIDS['node']}/?var-node={value}&{_KEEP}"}


def job_link(value: str = "${__value.raw}") -> dict:
    """A data link to the job dashboard for the training job ``value`` names."""
    return {"title": f"Training job {value}", "url": f"/d/{UIDS['job']}/?var-train_job={value}&{_KEEP}"}


def with_column_links(p, links: Dict[str, dict]):
    """A table whose cells in the named columns (names as displayed) link to the node or job view."""
    for column, link in links.items():
        p = p.override_by_name(column, [dash_m.DynamicConfigValue(id_val="links", value=[link])])
    return p


def with_series_links(p, *links: dict):
    """A panel whose series link to the node or job view they belong to (from the series' labels)."""
    return p.data_links([dash_b.DashboardLink(x["title"]).url(x["url"]) for x in links])


# -------------------------------------------------------------------- panels

def _common(p, title: str, description: str, unit: str, targets: Sequence[prom_b.Dataquery], w: int, h: int):
    p = p.title(title).description(" ".join(description.split())).unit(unit).datasource(DS).span(w).height(h)
    for t in targets:
        p = p.with_target(t)
    return p


def timeseries(title: str, description: str, unit: str, targets: Sequence[prom_b.Dataquery], *,
               w: int = 12, h: int = 8, stack: bool = False, percent_stack: bool = False,
               min: Optional[float] = None, max: Optional[float] = None, fill: float = 10,
               bars: bool = False) -> ts_b.Panel:
    p = _common(ts_b.Panel(), title, description, unit, targets, w, h)
    p = p.fill_opacity(80 if (stack or percent_stack) else fill).line_width(1)
    if stack or percent_stack:
        mode = common_m.StackingMode.PERCENT if percent_stack else common_m.StackingMode.NORMAL
        p = p.stacking(common_b.StackingConfig().mode(mode).group("A"))
    if bars:
        p = p.draw_style(common_m.GraphDrawStyle.BARS)
    if min is not None:
        p = p.min(min)
    if max is not None:
        p = p.max(max)
    p = p.legend(common_b.VizLegendOptions().show_legend(True)
                 .display_mode(common_m.LegendDisplayMode.TABLE if not (stack or percent_stack)
                               else common_m.LegendDisplayMode.LIST)
                 .placement(common_m.LegendPlacement.BOTTOM)
                 .calcs(["mean", "max"] if not (stack or percent_stack) else []))
    p = p.tooltip(common_b.VizTooltipOptions().mode(common_m.TooltipDisplayMode.MULTI)
                  .sort(common_m.SortOrder.DESCENDING))
    return p


def stat(title: str, description: str, unit: str, targets: Sequence[prom_b.Dataquery], *,
         w: int = 4, h: int = 4, text_mode: str = "auto", thresholds: Optional[List[tuple]] = None,
         mappings: Optional[Dict[str, tuple]] = None, decimals: Optional[int] = None) -> stat_b.Panel:
    p = _common(stat_b.Panel(), title, description, unit, targets, w, h)
    p = (p.text_mode(common_m.BigValueTextMode(text_mode)).graph_mode(common_m.BigValueGraphMode.NONE)
         .color_mode(common_m.BigValueColorMode.BACKGROUND if thresholds or mappings
                     else common_m.BigValueColorMode.VALUE)
         .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    if thresholds:
        p = p.thresholds(_thresholds(thresholds))
    if mappings:
        p = p.mappings([dash_m.ValueMap(options={
            k: dash_m.ValueMappingResult(text=text, color=color, index=i)
            for i, (k, (text, color)) in enumerate(mappings.items())})])
    if decimals is not None:
        p = p.decimals(decimals)
    return p


def _thresholds(steps: List[tuple]) -> dash_b.ThresholdsConfig:
    """[(None, 'green'), (0.2, 'red')] -> absolute thresholds (None = base)."""
    return dash_b.ThresholdsConfig().mode(dash_m.ThresholdsMode.ABSOLUTE).steps(
        [dash_m.Threshold(value=v, color=c) for v, c in steps])


def heatmap(title: str, description: str, unit: str, targets: Sequence[prom_b.Dataquery], *,
            y_unit: str, cell_unit: str, w: int = 12, h: int = 8, scheme: str = "Oranges",
            min: Optional[float] = None, max: Optional[float] = None) -> heatmap_b.Panel:
    """A heatmap of pre-bucketed data (Prometheus histogram buckets or one row per series)."""
    p = _common(heatmap_b.Panel(), title, description, unit, targets, w, h)
    color = (heatmap_b.HeatmapColorOptions().mode(heatmap_m.HeatmapColorMode.SCHEME).scheme(scheme)
             .scale(heatmap_m.HeatmapColorScale.EXPONENTIAL).exponent(0.5).steps(64).fill("dark-orange")
             .reverse(False))
    if min is not None:
        color = color.min(min)
    if max is not None:
        color = color.max(max)
    p = (p.calculate(False).color(color).cell_values(heatmap_b.CellValues().unit(cell_unit))
         .y_axis(heatmap_b.YAxisConfig().unit(y_unit).axis_placement(common_m.AxisPlacement.LEFT))
         .show_legend().show_tooltip().show_value(common_m.VisibilityMode.NEVER).cell_gap(1)
         .filter_values(heatmap_b.FilterValueRange().le(1e-9))
         .rows_frame(heatmap_b.RowsHeatmapOptions().layout(common_m.HeatmapCellLayout.AUTO)))
    return p


def table(title: str, description: str, unit: str, targets: Sequence[prom_b.Dataquery], *,
          w: int = 12, h: int = 8, hide: Iterable[str] = ("Time", "__name__", "job"),
          rename: Optional[Dict[str, str]] = None, sort_by: Optional[str] = None) -> table_b.Panel:
    """A table of instant queries (format table), merged, with housekeeping columns hidden."""
    p = _common(table_b.Panel(), title, description, unit, targets, w, h)
    if len(targets) > 1:
        p = p.with_transformation(dash_m.DataTransformerConfig(id_val="merge", options={}))
    p = p.with_transformation(dash_m.DataTransformerConfig(id_val="organize", options={
        "excludeByName": {name: True for name in hide},
        "renameByName": dict(rename or {}),
    }))
    if sort_by:
        p = p.sort_by([common_b.TableSortByFieldState().display_name(sort_by).desc(True)])
    return p


def bargauge(title: str, description: str, unit: str, targets: Sequence[prom_b.Dataquery], *,
             w: int = 8, h: int = 6, max: Optional[float] = None) -> bargauge_b.Panel:
    p = _common(bargauge_b.Panel(), title, description, unit, targets, w, h)
    p = (p.display_mode(common_m.BarGaugeDisplayMode.GRADIENT).orientation(common_m.VizOrientation.HORIZONTAL)
         .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False)).min(0))
    if max is not None:
        p = p.max(max)
    return p


def text(title: str, description: str, content: str, *, w: int = 24, h: int = 8) -> text_b.Panel:
    """A Markdown panel (no query; its unit is "none" so every panel declares one)."""
    return (text_b.Panel().title(title).description(" ".join(description.split())).unit("none")
            .span(w).height(h).mode(text_m.TextMode.MARKDOWN).content(content))


def row(title: str) -> dash_b.Row:
    return dash_b.Row(title)


# ---------------------------------------------------------------- dashboards

def dashboard(uid: str, title: str, description: str) -> dash_b.Dashboard:
    return (dash_b.Dashboard(title).uid(uid).description(description).tags(TAGS).editable()
            .tooltip(dash_m.DashboardCursorSync.CROSSHAIR).refresh("30s").time("now-1h", "now")
            .timezone("browser")
            .annotation(dash_b.AnnotationQuery().name("Annotations & Alerts").datasource(GRAFANA_DS)
                        .enable(True).hide(True).icon_color("rgba(0, 211, 255, 1)").type("dashboard"))
            .links(dashboard_links(uid[len("teye-"):])))


def to_dict(builder: dash_b.Dashboard) -> dict:
    """Build and number: panel ids 1..N in order, query refIds A, B, ... per panel."""
    d = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    next_id = 1
    for panel in iter_panels(d):
        panel["id"] = next_id
        next_id += 1
        for i, t in enumerate(panel.get("targets") or []):
            t["refId"] = chr(ord("A") + i)
    return d


def iter_panels(d: dict):
    """Every panel of a dashboard dict, rows and the panels inside collapsed rows included."""
    for p in d.get("panels") or []:
        yield p
        for inner in p.get("panels") or []:
            yield inner


def render(builder: dash_b.Dashboard) -> str:
    return json.dumps(to_dict(builder), indent=2, sort_keys=True) + "\n"
