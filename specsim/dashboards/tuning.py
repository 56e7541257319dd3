"""`specsim tune --dashboard`: the throughput–latency trade-off of the simulated settings.

One figure per latency metric (a control picks it): every setting the sweep simulated as a
point (throughput against the metric; colour the policy, size the largest batch), the Pareto
front through the settings no other beats on both, the SLO's bound on that metric where one is
given, and the pick ringed.
"""
from __future__ import annotations

import plotly.graph_objects as go

from specsim.dashboards.figures import TEMPLATE, _title, empty_figure, policy_color
from specsim.dashboards.page import Control, Page, Section, Slot
from specsim.simulator.objectives import (LATENCY_METRICS, format_seconds, pareto_front,
                                          setting_label)

#: The metrics the page offers, first the default.
METRICS = ("tpot-p99", "tpot-p50", "ttft-p99", "ttft-p50", "latency-p99")


def tradeoff_figure(settings: list[dict], metric: str, pick: dict | None = None,
                    bound_s: float | None = None) -> go.Figure:
    """Throughput (tokens/s) against ``metric`` (ms) for every setting, the front, the bound."""
    field = LATENCY_METRICS[metric]
    usable = [r for r in settings if r.get(field) is not None]
    if not usable:
        return empty_figure(f"Throughput against {metric}", f"no setting has a {metric}")
    fig = go.Figure(layout=dict(template=TEMPLATE))
    batches = sorted({r["max_batch"] for r in usable})
    size = {b: 8 + 10 * i / max(1, len(batches) - 1) for i, b in enumerate(batches)}
    policies = sorted({r["policy"] for r in usable})
    for policy in policies:
        sel = [r for r in usable if r["policy"] == policy]
        fig.add_trace(go.Scatter(
            x=[r[field] * 1e3 for r in sel], y=[r["throughput"] for r in sel],
            mode="markers", name=policy,
            marker=dict(size=[size[r["max_batch"]] for r in sel],
                        color="#777" if policy == "plain" else policy_color(policy, policies),
                        line=dict(color="white", width=1), opacity=0.85),
            customdata=[[setting_label(r)] for r in sel],
            hovertemplate=("<b>%{customdata[0]}</b><br>" + metric + " %{x:.2f} ms<br>"
                           "%{y:.0f} tokens/s<extra></extra>")))
    front = pareto_front(usable, field)
    fig.add_trace(go.Scatter(
        x=[r[field] * 1e3 for r in front], y=[r["throughput"] for r in front],
        mode="lines", name="no other setting beats these on both", hoverinfo="skip",
        line=dict(color="#444", width=1.5, dash="dot", shape="hv")))
    if bound_s is not None:
        fig.add_vline(x=bound_s * 1e3, line=dict(color="#c0392b", width=1.5, dash="dash"),
                      annotation_text=f"SLO {metric} ≤ {format_seconds(bound_s)}",
                      annotation_position="top")
    if pick is not None and pick.get(field) is not None:
        fig.add_trace(go.Scatter(
            x=[pick[field] * 1e3], y=[pick["throughput"]], mode="markers", name="the pick",
            marker=dict(size=22, color="rgba(0,0,0,0)", line=dict(color="#111", width=2)),
            hovertemplate=f"<b>the pick: {setting_label(pick)}</b><extra></extra>"))
    sub = f"{len(usable)} simulated settings; {len(front)} on the front"
    fig.update_layout(title=_title(f"Throughput against {metric}", sub),
                      xaxis=dict(title=dict(text=f"{metric} (ms)")),
                      yaxis=dict(title=dict(text="throughput (tokens/s)")),
                      legend=dict(y=-0.2, orientation="h"), hovermode="closest")
    return fig


def tune_page(settings: list[dict], picked: dict, slos, facts: list[tuple[str, str]],
              notes: list[str] = ()) -> Page:
    """The page: one control (the latency metric), one wide figure per metric."""
    bounds = {s.metric: s.limit_s for s in slos}
    pick = picked.get("best")
    variants = {m: tradeoff_figure(settings, m, pick, bounds.get(m)) for m in METRICS}
    first = picked.get("tradeoff_metric")
    default = first if first in METRICS else METRICS[0]
    control = Control("metric", "latency", [(m, m) for m in METRICS], default,
                      "the latency percentile on the horizontal axis")
    caption = ("Every simulated setting (plain decoding and each policy, s, k at each largest "
               "batch): higher and further left is better. The dotted steps join the "
               "settings no other beats on both; the ring is the pick.")
    return Page(title="specsim tune: throughput against latency", facts=facts,
                controls=[control],
                sections=[Section("The trade-off", [Slot("tradeoff", ("metric",), variants,
                                                          caption, wide=True)])],
                notes=list(notes))
