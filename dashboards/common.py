"""Shared pieces of the Grafana dashboards: the datasource reference, the template
variables, label selectors, panel builders and the links between dashboards.

Every dashboard is built with grafana-foundation-sdk from these helpers, so the
conventions hold everywhere: the datasource is a template variable (no `__inputs`, so a
provisioned copy works as it is), every panel has a unit, every target a refId, panel
ids are stable (assigned in build order), and every dashboard links to the others with
the variables and time range carried over.

This module must never talk to Grafana or Prometheus: it only builds objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders.common import StackingConfig
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models.common import StackingMode
from grafana_foundation_sdk.models.dashboard import (
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

TAG = "gpu-audit"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

# The All value of every multi-select variable: ".*" also matches a series that lacks
# the label (an identity without a project), which "All" must include.
ALL = ".*"

# Selectors. `simulated=~"|$sim"` keeps real data (no label, or gpu_info's "false") and,
# when the "Simulated data" variable says include, the simulator's series too: usage
# sums exclude simulated data by default (docs/METRICS.md).
SIM = 'simulated=~"|$sim"'
NODE = 'instance=~"$node"'
GPU_SEL = f'{NODE}, gpu=~"$gpu", {SIM}'
OWNER = 'user=~"$user", project=~"$project", job=~"$job"'
PROC_SEL = f"{GPU_SEL}, {OWNER}"

# GPU-hours over the dashboard range from a recording rule sampled at every evaluation:
# sum of the samples / number of evaluations in the range * range in hours. Unlike
# avg_over_time(...) * hours this stays right for an identity present in only part of
# the range (a one-day job in a 30-day view). fleet:gpus:count is evaluated in every
# cycle while any GPU is up, so its sample count is the number of evaluations.
EVALS = "scalar(count_over_time(fleet:gpus:count[$__range]))"
RANGE_HOURS = "($__range_s / 3600)"


def hours_over_range(rule_selector: str, by: str) -> str:
    """Hours (of the rule's unit: GPUs, watts...) accumulated over the dashboard range."""
    # parenthesised: it is used as an operand (busy / held), and / and * bind left
    return (f"(sum by ({by}) (sum_over_time({rule_selector}[$__range]))"
            f" / {EVALS} * {RANGE_HOURS})")


@dataclass(frozen=True)
class Q:
    """One panel target."""

    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


PanelBuilder = timeseries.Panel | stat.Panel | table.Panel


class Board:
    """A dashboard being built: panel ids are assigned in order, so they are stable."""

    def __init__(self, builder: dashboard.Dashboard) -> None:
        self.builder = builder
        self._next_id = 1

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def row(self, title: str) -> None:
        self.builder.with_row(dashboard.Row(title).id(self._take_id()))

    def add(self, *panels: PanelBuilder) -> None:
        for panel in panels:
            self.builder.with_panel(panel.id(self._take_id()))


def _targets(queries: Sequence[Q]) -> list[Builder[Dataquery]]:
    out: list[Builder[Dataquery]] = []
    for i, q in enumerate(queries):
        t = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i)).datasource(DS)
        if q.legend:
            t = t.legend_format(q.legend)
        t = t.instant() if q.instant or q.table else t.range()
        if q.table:
            t = t.format(PromQueryFormat.TABLE)
        out.append(t)
    return out


def ts(title: str, unit: str, *queries: Q, desc: str = "", w: int = 12, h: int = 8,
       stack: bool = False, empty: str = "") -> timeseries.Panel:
    """A time series panel; `empty` is what it says when nothing matches (why a healthy
    node has no data here), for panels that show only trouble."""
    p = (timeseries.Panel().title(title).description(desc).datasource(DS).unit(unit)
         .span(w).height(h).targets(_targets(queries)).fill_opacity(10 if not stack else 40))
    if stack:
        p = p.stacking(StackingConfig().mode(StackingMode.NORMAL))
    if empty:
        p = p.no_value(empty)
    return p


def single(title: str, unit: str, query: Q, *, desc: str = "", w: int = 4, h: int = 4,
           decimals: int | None = None, empty: str = "0") -> stat.Panel:
    """A stat of an instant query; nothing matching reads as `empty` ("0": a count of
    lost GPUs with none lost)."""
    q = Q(query.expr, query.legend, instant=True)
    p = (stat.Panel().title(title).description(desc).datasource(DS).unit(unit).span(w)
         .height(h).targets(_targets([q])).no_value(empty))
    if decimals is not None:
        p = p.decimals(decimals)
    return p


def grid(title: str, unit: str, *queries: Q, desc: str = "", w: int = 24, h: int = 9,
         hide: Sequence[str] = (), units: dict[str, str] | None = None,
         names: dict[str, str] | None = None, empty: str = "") -> table.Panel:
    """A table of instant queries merged on their labels (one row per label set).

    `units` gives a column its own unit (by the column name after renaming); `empty` is
    what it says when nothing matches, for tables that list only trouble."""
    qs = [Q(q.expr, q.legend, instant=True, table=True) for q in queries]
    p = (table.Panel().title(title).description(desc).datasource(DS).unit(unit).span(w)
         .height(h).targets(_targets(qs)))
    if empty:
        p = p.no_value(empty)
    if len(qs) > 1:
        p = p.with_transformation(DataTransformerConfig(id_val="merge", options={}))
    rename = dict(names or {})
    exclude = {"Time": True, **{col: True for col in hide}}
    p = p.with_transformation(DataTransformerConfig(
        id_val="organize", options={"excludeByName": exclude, "renameByName": rename}))
    for col, col_unit in (units or {}).items():
        p = p.override_by_name(col, [DynamicConfigValue(id_val="unit", value=col_unit)])
    return p


# Who owns each GPU (one series per GPU, kept while it is down): joined onto GPU rows
# so a failing GPU's table row names the user, project and job whose work it hit.
OWNER_INFO = f"gpu_owner_info{{{NODE}, {SIM}}}"


def with_owner(expr: str) -> str:
    """`expr` (series with instance and uuid) with the GPU owner's user, project and job
    joined on where it has one, unchanged where it has none."""
    return (f"({expr}) * on (instance, uuid) group_left (user, project, job) {OWNER_INFO}"
            f" or ({expr}) unless on (instance, uuid) {OWNER_INFO}")


def firing_alerts(category: str = "hardware|waste|leak|pipeline") -> Q:
    """gpu-audit's alerts firing now (Prometheus' ALERTS), one row each with the labels
    an operator acts on; alerts without a node (no exporter at all) are kept."""
    return Q(f'max by (alertname, severity, category, instance, gpu, uuid, user, project, '
             f'job, xid, reason) (ALERTS{{alertstate="firing", category=~"{category}", '
             f'instance=~"$node"}})')


def datasource_variable() -> dashboard.DatasourceVariable:
    return (dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
            .regex(""))


def query_variable(name: str, label: str, query: str, *, multi: bool = True
                   ) -> dashboard.QueryVariable:
    v = (dashboard.QueryVariable(name).label(label).datasource(DS).query(query)
         .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
         .current(VariableOption(selected=True, text="All", value="$__all")))
    if multi:
        v = v.multi(True).include_all(True).all_value(ALL)
    return v


def sim_variable() -> dashboard.CustomVariable:
    """Whether simulated series are shown: real data only unless asked for by name."""
    return (dashboard.CustomVariable("sim").label("Simulated data")
            .values("exclude : false,include : true|false")
            .current(VariableOption(selected=True, text="exclude", value="false"))
            .options([VariableOption(selected=True, text="exclude", value="false"),
                      VariableOption(selected=False, text="include", value="true|false")]))


def gpu_variables(b: dashboard.Dashboard, owners_from: str = "gpu_allocation_info"
                  ) -> dashboard.Dashboard:
    """datasource, sim, node, GPU, user, project, job, each narrowed by the ones before."""
    return (b.with_variable(datasource_variable())
            .with_variable(sim_variable())
            .with_variable(query_variable("node", "Node",
                                          f"label_values(gpu_up{{{SIM}}}, instance)"))
            .with_variable(query_variable("gpu", "GPU",
                                          f"label_values(gpu_up{{{NODE}, {SIM}}}, gpu)"))
            .with_variable(query_variable("user", "User",
                                          f"label_values({owners_from}{{{NODE}}}, user)"))
            .with_variable(query_variable(
                "project", "Project",
                f'label_values({owners_from}{{{NODE}, user=~"$user"}}, project)'))
            .with_variable(query_variable(
                "job", "Job",
                f'label_values({owners_from}{{{NODE}, user=~"$user", project=~"$project"}},'
                " job)")))


def new_board(uid: str, title: str, description: str, time_from: str = "now-6h"
              ) -> dashboard.Dashboard:
    return (dashboard.Dashboard(title).uid(uid).description(description)
            .tags([TAG]).time(time_from, "now").refresh("1m").timezone("browser")
            .editable()
            # every other gpu-audit dashboard, variables and time range carried over
            .link(dashboard.DashboardLink("GPU dashboards").type(DashboardLinkType.DASHBOARDS)
                  .tags([TAG]).as_dropdown(True).include_vars(True).keep_time(True)))


def detail_link(title: str, uid: str, params: str) -> dashboard.DashboardLink:
    """A panel data link to another dashboard, for the clicked series, keeping the time
    range and datasource (the URL names the variables it sets)."""
    return (dashboard.DashboardLink(title).type(DashboardLinkType.LINK)
            .url(f"/d/{uid}?${{datasource:queryparam}}&${{sim:queryparam}}&{params}"
                 "&${__url_time_range}"))
