"""Plotly figure builders: one function per dashboard figure, from the dictionaries of
:mod:`specsim.dashboards.data` to a :class:`plotly.graph_objects.Figure`.

Builders only draw: titles, axis labels with units, hover text with the numbers, markers.
They compute nothing a reader would need to check (that lives in ``data``).
"""
from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

HEIGHT = 460
MAX_ERROR_BARS = 16
FONT = "Inter, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"

POLICY_COLORS = {"vegas": "#1f6fb4", "sparsespec": "#e07b10", "quest": "#2a9d3a",
                 "streamingllm": "#c9302c", "last-token": "#8159b8", "full": "#6f6f6f"}
EXTRA_COLORS = ["#17a2b8", "#b5651d", "#e377c2", "#7f7f00", "#1b1b6f"]
COMPONENT_COLORS = {"draft": "#4c78a8", "verify": "#f2a03d", "selection": "#59a14f",
                    "other": "#b9b0ab"}
COMPONENT_LABELS = {"draft": "draft: k·C_d", "verify": "verify: C_v(k+1)",
                    "selection": "selection: C_sel", "other": "other overhead"}
# diverging around 1×: red where speculation is slower than plain decoding, blue where faster
SPEEDUP_SCALE = [[0.0, "#b2182b"], [0.25, "#ef8a62"], [0.42, "#fddbc7"], [0.5, "#f7f7f7"],
                 [0.58, "#d1e5f0"], [0.75, "#67a9cf"], [1.0, "#2166ac"]]
NO_FIT_GREY = "#cfcfcf"


def template() -> go.layout.Template:
    """The dashboard's look, shared by every figure."""
    axis = dict(showgrid=True, gridcolor="#ececec", zeroline=False, linecolor="#9a9a9a",
                ticks="outside", tickcolor="#9a9a9a", ticklen=4, title=dict(standoff=8),
                automargin=True)
    return go.layout.Template(layout=dict(
        font=dict(family=FONT, size=12, color="#222"),
        paper_bgcolor="white", plot_bgcolor="white",
        title=dict(x=0.0, xanchor="left", xref="paper", font=dict(size=15),
                   subtitle=dict(font=dict(size=12, color="#666"))),
        xaxis=axis, yaxis=axis,
        legend=dict(orientation="h", x=0.0, xanchor="left", y=-0.2, yanchor="top",
                    font=dict(size=11), bgcolor="rgba(255,255,255,0)"),
        hoverlabel=dict(bgcolor="white", font=dict(family=FONT, size=12), align="left"),
        margin=dict(l=70, r=24, t=78, b=40),
        height=HEIGHT,
        colorway=list(POLICY_COLORS.values()) + EXTRA_COLORS,
    ))


TEMPLATE = template()


def policy_color(policy: str, known: list[str] | None = None) -> str:
    if policy in POLICY_COLORS:
        return POLICY_COLORS[policy]
    others = sorted(p for p in (known or [policy]) if p not in POLICY_COLORS)
    i = others.index(policy) if policy in others else 0
    return EXTRA_COLORS[i % len(EXTRA_COLORS)]


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def s_label(s) -> str:
    return "none" if s is None else f"{s:g}"


def tokens_label(n: float) -> str:
    """16384 → '16K', 1536 → '1.5K', 131072 → '128K'."""
    if n >= 1024 and n % 1024 == 0:
        return f"{int(n) // 1024}K"
    if n >= 1024:
        return f"{n / 1024:.1f}K"
    return f"{int(n)}"


def s_colors(n: int) -> list[str]:
    """Dark-to-light sequential colours for n sparsity values (small s dark)."""
    if n == 1:
        return ["#1f6fb4"]
    return sample_colorscale("Viridis", [0.85 * i / (n - 1) for i in range(n)])


def _title(text: str, subtitle: str = "") -> dict:
    return dict(text=text, subtitle=dict(text=subtitle))


def empty_figure(title: str, message: str) -> go.Figure:
    fig = go.Figure(layout=dict(template=TEMPLATE, title=_title(title)))
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=13, color="#777"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


# --------------------------------------------------------------------------------------------
# (k, s) heatmap
# --------------------------------------------------------------------------------------------


def speedup_colours(values) -> dict:
    """Heatmap colour settings fitted to the speedups shown: the bar runs from the smallest to
    the largest value (always including 1×), white at 1×, red below and blue above, each side
    spread over its own range."""
    flat = [float(v) for row in values for v in (row if isinstance(row, (list, tuple)) else [row])
            if v is not None and math.isfinite(float(v))]
    lo, hi = min(flat + [1.0]), max(flat + [1.0])
    if hi - lo < 1e-9:
        lo, hi = lo - 0.05, hi + 0.05
    middle = (1.0 - lo) / (hi - lo)
    stops = []
    for position, colour in SPEEDUP_SCALE:
        at = position * 2 * middle if position <= 0.5 else \
            middle + (position - 0.5) * 2 * (1 - middle)
        if stops and at <= stops[-1][0] + 1e-12:    # a side of zero width
            if position <= 0.5:                      # below 1×: white (the last) stays
                stops[-1] = [stops[-1][0], colour]
            continue                                 # above 1×: white (the first) stays
        stops.append([at, colour])
    stops[0][0], stops[-1][0] = 0.0, 1.0
    return dict(zmin=lo, zmax=hi, colorscale=stops)


def heatmap_figure(d: dict, subtitle: str = "") -> go.Figure:
    """Rows are s values (y = row index, labelled), columns k. The 3-step path runs through
    the upper-left corners of its cells so that it never covers a cell's number."""
    labels = [f"s = {s_label(s)}" for s in d["ss"]]
    rows = list(range(len(labels)))
    row_of = {s: i for i, s in enumerate(d["ss"])}
    custom = [[[lo, hi, e, t, "extrapolated k" if x else "", label]
               for lo, hi, e, t, x in zip(*cells)]
              for label, cells in zip(labels, zip(d["speedup_low"], d["speedup_high"],
                                                  d["expected_tokens"], d["iteration_ms"],
                                                  d["extrapolated"]))]
    fig = go.Figure(layout=dict(template=TEMPLATE))
    fig.add_trace(go.Heatmap(
        x=d["ks"], y=rows, z=d["speedup"], customdata=custom, **speedup_colours(d["speedup"]),
        texttemplate="%{z:.2f}", textfont=dict(size=11),
        xgap=1, ygap=1, name="speedup",
        colorbar=dict(title=dict(text="speedup (×)", side="right"), thickness=12, len=0.9),
        hovertemplate=("k = %{x}, %{customdata[5]}<br>speedup <b>%{z:.3f}×</b> "
                       "[%{customdata[0]:.3f}, %{customdata[1]:.3f}]<br>"
                       "E[m+1] = %{customdata[2]:.2f} tokens per iteration<br>"
                       "T(k, s) = %{customdata[3]:.2f} ms per iteration"
                       "<extra>%{customdata[4]}</extra>")))
    three = d.get("three_step")
    if three:
        # consecutive steps that land on the same cell share one marker ("2, 3")
        points: list[list] = []
        for n, (k, s) in enumerate(three["path"], start=1):
            if points and points[-1][0] == k and points[-1][1] == s:
                points[-1][2] += ", " + str(n)
            else:
                points.append([k, s, str(n)])
        what = {"1": "step 1: at the largest k, the smallest s whose accepted tokens plateau",
                "2": "step 2: the best k at that s", "3": "step 3: the best s at that k"}
        dx, dy = -0.3, 0.3  # upper-left corner of the cell
        # each step number sits on the side of its marker that no path segment leaves from
        sides = []
        for i, p in enumerate(points):
            neighbours = [q[0] for q in points[max(i - 1, 0):i + 2] if q is not p]
            sides.append("middle left" if any(x > p[0] for x in neighbours) else "middle right")
        fig.add_trace(go.Scatter(
            x=[p[0] + dx for p in points], y=[row_of[p[1]] + dy for p in points],
            text=[f"<b>{p[2]}</b>" for p in points], mode="lines+markers+text",
            textposition=sides, textfont=dict(size=13, color="#111", shadow="0 0 3px white"),
            line=dict(color="#111", width=1.6, dash="dot"),
            marker=dict(size=8, symbol="circle", color="#111", line=dict(color="white", width=1)),
            name=f"Vegas 3-step path → k = {three['k']}, s = {s_label(three['s'])} "
                 f"({three['speedup']:.3f}×, {three['gap_to_joint'] * 100:.1f}% below k*, s*)",
            customdata=[[" / ".join(what[x.strip()] for x in p[2].split(",")), p[0],
                         s_label(p[1])] for p in points],
            hovertemplate=("%{customdata[0]}<br>k = %{customdata[1]}, s = %{customdata[2]}"
                           "<extra>3-step</extra>")))
    fig.add_trace(go.Scatter(
        x=[d["k_star"]], y=[row_of[d["s_star"]]], mode="markers",
        marker=dict(symbol="star", size=20, color="#ffd21f", line=dict(color="#111", width=1.5)),
        name=f"joint optimum k* = {d['k_star']}, s* = {s_label(d['s_star'])} "
             f"({d['speedup_star']:.3f}×)",
        hovertemplate=(f"joint optimum (k*, s*)<br>k = {d['k_star']}, "
                       f"s = {s_label(d['s_star'])}<br>speedup {d['speedup_star']:.3f}×"
                       "<extra></extra>")))
    fig.update_layout(
        title=_title(f"Speedup by draft length k and sparsity s — {d['policy']}", subtitle),
        xaxis=dict(title=dict(text="draft length k (tokens drafted per iteration)"), dtick=1,
                   showgrid=False, range=[min(d["ks"]) - 0.5, max(d["ks"]) + 0.5]),
        yaxis=dict(title=dict(text="sparsity s (selected KV / context)"), showgrid=False,
                   tickvals=rows, ticktext=labels, range=[-0.5, len(rows) - 0.5]),
        legend=dict(y=-0.2))
    return fig


# --------------------------------------------------------------------------------------------
# speedup vs k
# --------------------------------------------------------------------------------------------


def speedup_curves_figure(d: dict, subtitle: str = "") -> go.Figure:
    level = int(round(d["level"] * 100))
    known = [p["policy"] for p in d["policies"]]
    fig = go.Figure(layout=dict(template=TEMPLATE))
    for p in d["policies"]:
        color = policy_color(p["policy"], known)
        ks = p["ks"]
        fig.add_trace(go.Scatter(
            x=ks + ks[::-1], y=p["high"] + p["low"][::-1], fill="toself", mode="lines",
            fillcolor=_rgba(color, 0.13), line=dict(width=0), hoverinfo="skip",
            legendgroup=p["policy"], showlegend=False, name=f"{p['policy']} {level}% CI"))
    for p in d["policies"]:
        color = policy_color(p["policy"], known)
        custom = [[lo, hi, e, t, "extrapolated beyond the trace" if x else ""]
                  for lo, hi, e, t, x in zip(p["low"], p["high"], p["expected_tokens"],
                                             p["iteration_ms"], p["extrapolated"])]
        fig.add_trace(go.Scatter(
            x=p["ks"], y=p["speedup"], customdata=custom, mode="lines+markers",
            line=dict(color=color, width=2), legendgroup=p["policy"],
            marker=dict(size=6, color=color,
                        symbol=["circle-open" if x else "circle" for x in p["extrapolated"]]),
            name=f"{p['policy']} s={s_label(p['s'])}: k*={p['k_star']}, "
                 f"{p['speedup_star']:.2f}×",
            hovertemplate=(f"<b>{p['policy']}</b>, s = {s_label(p['s'])}, k = %{{x}}<br>"
                           f"speedup <b>%{{y:.3f}}×</b> [%{{customdata[0]:.3f}}, "
                           f"%{{customdata[1]:.3f}}] ({level}% CI)<br>"
                           "E[m+1] = %{customdata[2]:.2f} tokens, T = %{customdata[3]:.2f} ms"
                           "<extra>%{customdata[4]}</extra>")))
    inv = [p for p in d["policies"] if p["inversion"]]
    if inv:
        fig.add_trace(go.Scatter(
            x=[p["inversion"]["k"] for p in inv], y=[p["inversion"]["speedup"] for p in inv],
            mode="markers", name="inversion: k + 1 no longer helps",
            marker=dict(symbol="diamond-open", size=15, color="#111", line=dict(width=2)),
            customdata=[[p["policy"], p["inversion"]["k"] + 1,
                         p["inversion"]["survival_next"], p["inversion"]["threshold"],
                         p["inversion"]["relative_step_cost"]] for p in inv],
            hovertemplate=("<b>%{customdata[0]}</b>: efficiency inversion at k = %{x}<br>"
                           "drafting %{customdata[1]} tokens adds P = %{customdata[2]:.3f} "
                           "expected tokens,<br>less than γ′·S_k = %{customdata[4]:.3f} × "
                           "%{y:.3f} = %{customdata[3]:.3f}<extra></extra>")))
    all_k = [k for p in d["policies"] for k in p["ks"]]
    fig.add_trace(go.Scatter(
        x=[min(all_k) - 0.3, max(all_k) + 0.3], y=[1.0, 1.0], mode="lines",
        line=dict(color="#777", width=1.2, dash="dash"), name="plain decoding (1×)",
        hoverinfo="skip"))
    fig.update_layout(
        title=_title(f"Speedup vs draft length k, each policy at its best s, with "
                     f"{level}% confidence bands", subtitle),
        xaxis=dict(title=dict(text="draft length k (tokens drafted per iteration)"), dtick=1),
        yaxis=dict(title=dict(text="speedup over plain decoding (×)")),
        hovermode="closest", legend=dict(y=-0.18))
    return fig


# --------------------------------------------------------------------------------------------
# iteration time breakdown
# --------------------------------------------------------------------------------------------


def breakdown_figure(d: dict, subtitle: str = "") -> go.Figure:
    rows = d["policies"]
    x = [f"{r['policy']}<br>k = {r['k']}, s = {s_label(r['s'])}" for r in rows]
    fig = go.Figure(layout=dict(template=TEMPLATE))
    for comp in d["components"]:
        ms = [r["split_ms"][comp] for r in rows]
        share = [m / r["iteration_ms"] * 100 for m, r in zip(ms, rows)]
        fig.add_trace(go.Bar(
            x=x, y=ms, name=COMPONENT_LABELS[comp], marker=dict(color=COMPONENT_COLORS[comp]),
            customdata=[[s, r["iteration_ms"]] for s, r in zip(share, rows)],
            hovertemplate=(f"%{{x}}<br>{comp}: <b>%{{y:.2f}} ms</b> "
                           "(%{customdata[0]:.0f}% of T = %{customdata[1]:.2f} ms)"
                           "<extra></extra>")))
    fig.add_trace(go.Scatter(
        x=x, y=[r["plain_same_tokens_ms"] for r in rows], mode="markers",
        name="plain decoding, same tokens: E[m+1]·T_ar",
        marker=dict(symbol="line-ew-open", size=46, color="#111", line=dict(width=3)),
        customdata=[[r["expected_tokens"], r["plain_step_ms"], r["speedup"]] for r in rows],
        hovertemplate=("%{x}<br>plain decoding needs %{customdata[0]:.2f} × "
                       "%{customdata[1]:.2f} ms = <b>%{y:.2f} ms</b><br>for the tokens one "
                       "iteration emits: speedup %{customdata[2]:.3f}×<extra></extra>")))
    top = max(max(r["iteration_ms"], r["plain_same_tokens_ms"]) for r in rows)
    for xi, r in zip(x, rows):
        fig.add_annotation(x=xi, y=max(r["iteration_ms"], r["plain_same_tokens_ms"]),
                           text=f"<b>{r['speedup']:.2f}×</b>", showarrow=False, yshift=12,
                           font=dict(size=12))
    fig.update_layout(
        title=_title("Where the time goes: one iteration at each policy's optimum (k*, s*)",
                     subtitle),
        barmode="stack", bargap=0.45,
        xaxis=dict(title=dict(text="policy at its optimum (k*, s*)"), showgrid=False,
                   tickangle=0),
        yaxis=dict(title=dict(text="time per iteration (ms)"), range=[0, top * 1.15]),
        legend=dict(traceorder="normal", y=-0.27),
        hovermode="closest")
    return fig


# --------------------------------------------------------------------------------------------
# acceptance
# --------------------------------------------------------------------------------------------


def position_acceptance_figure(d: dict, subtitle: str = "") -> go.Figure:
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        "conditional p<sub>i</sub> = P(draft i accepted | drafts 1..i−1 accepted)",
        "survival P<sub>i</sub> = p<sub>1</sub>·…·p<sub>i</sub>"))
    fig.update_layout(template=TEMPLATE)
    colors = s_colors(len(d["groups"]))
    for g, color in zip(d["groups"], colors):
        name = f"s = {s_label(g['s'])}"
        thin = [r < d["min_support"] for r in g["reached"]]
        fig.add_trace(go.Scatter(
            x=g["i"], y=g["p"], customdata=g["reached"], mode="lines+markers", name=name,
            legendgroup=name, line=dict(color=color, width=2),
            marker=dict(size=6, color=color,
                        symbol=["circle-open" if t else "circle" for t in thin]),
            hovertemplate=(f"{name}, position i = %{{x}}<br>p_i = <b>%{{y:.3f}}</b><br>"
                           "%{customdata:,} iterations reached i<extra></extra>")),
            row=1, col=1)
        fig.add_trace(go.Scatter(
            x=g["i"], y=g["P"], mode="lines+markers", name=name, legendgroup=name,
            showlegend=False, line=dict(color=color, width=2), marker=dict(size=6, color=color),
            hovertemplate=(f"{name}, position i = %{{x}}<br>P_i = <b>%{{y:.3f}}</b>: "
                           "chance drafts 1..i all pass<extra></extra>")),
            row=1, col=2)
    for ann in fig.layout.annotations:
        ann.font = dict(size=11, color="#444")
    fig.update_xaxes(title=dict(text="draft position i"), dtick=1)
    fig.update_yaxes(range=[0, 1.03], title=dict(text="p<sub>i</sub> (probability)"),
                     row=1, col=1)
    fig.update_yaxes(range=[0, 1.03], title=dict(text="P<sub>i</sub> (probability)"),
                     row=1, col=2)
    fig.update_layout(
        title=_title(f"Per-position acceptance in the trace — {d['policy']}", subtitle),
        margin=dict(t=100), legend=dict(y=-0.2))
    return fig


def context_acceptance_figure(d: dict, policy: str, subtitle: str = "") -> go.Figure:
    title = f"Acceptance vs context length in the trace — {policy}"
    groups = sorted((g for g in d["groups"] if g["policy"] == policy),
                    key=lambda g: -1 if g["s"] is None else g["s"])
    if not groups or not any(t is not None for g in groups for t in g["tokens"]):
        return empty_figure(title, "the trace records no context lengths for this policy")
    fig = go.Figure(layout=dict(template=TEMPLATE))
    for g, color in zip(groups, s_colors(len(groups))):
        name = f"s = {s_label(g['s'])}"
        custom = [[lo, hi, a, k, n] for lo, hi, a, k, n in
                  zip(g["low"], g["high"], g["alpha"], g["k"], g["iterations"])]
        fig.add_trace(go.Scatter(
            x=g["context"], y=g["tokens"], customdata=custom, mode="lines+markers", name=name,
            line=dict(color=color, width=2), marker=dict(size=7, color=color),
            connectgaps=False,
            hovertemplate=(f"{name}<br>context %{{customdata[0]:,.0f}}–%{{customdata[1]:,.0f}} "
                           "tokens (mean %{x:,.0f})<br>E[m+1] = <b>%{y:.2f}</b> tokens per "
                           "iteration<br>α = Σm/Σk = %{customdata[2]:.3f}, mean k = "
                           "%{customdata[3]:.1f}<br>%{customdata[4]:,} iterations"
                           "<extra></extra>")))
    fig.update_layout(
        title=_title(title, subtitle),
        xaxis=dict(title=dict(text="context length at the start of the iteration (tokens)"),
                   tickformat=",d"),
        yaxis=dict(title=dict(text="mean tokens per iteration, E[m+1]"), rangemode="tozero"),
        legend=dict(y=-0.2))
    return fig


# --------------------------------------------------------------------------------------------
# regime map
# --------------------------------------------------------------------------------------------


def regime_figure(d: dict, subtitle: str = "") -> go.Figure:
    batches, contexts = d["batches"], d["contexts"]
    xs, ys = list(range(len(contexts))), list(range(len(batches)))
    fits = d["fits"]
    speed = [[v if f else None for v, f in zip(row, frow)] for row, frow in zip(d["speedup"], fits)]
    beyond = d.get("max_context")
    custom = []
    for ib, b in enumerate(batches):
        row = []
        for ic, c in enumerate(contexts):
            note = f"beyond the model's {beyond:,}-token window" if beyond and c > beyond else ""
            row.append([b, tokens_label(c), d["policy"][ib][ic], s_label(d["s"][ib][ic]),
                        d["k"][ib][ic], d["verify_bound"][ib][ic], d["memory_needed_GB"][ib][ic],
                        d["plain_step_ms"][ib][ic], d["iteration_ms"][ib][ic], note,
                        d["speedup"][ib][ic]])
        custom.append(row)
    fig = go.Figure(layout=dict(template=TEMPLATE))
    fig.add_trace(go.Heatmap(
        x=xs, y=ys, z=speed, customdata=custom, **speedup_colours(speed),
        texttemplate="%{z:.2f}", textfont=dict(size=10), xgap=1, ygap=1, name="speedup",
        colorbar=dict(title=dict(text="speedup (×)", side="right"), thickness=12, len=0.9),
        hovertemplate=("batch %{customdata[0]} × %{customdata[1]} context<br>"
                       "best: <b>%{customdata[2]}</b>, s = %{customdata[3]}, k = "
                       "%{customdata[4]} → <b>%{z:.3f}×</b><br>"
                       "T = %{customdata[8]:.2f} ms per iteration, T_ar = %{customdata[7]:.2f} "
                       "ms per step<br>verify pass (k + 1 tokens) %{customdata[5]}-bound; "
                       "weights + KV "
                       f"%{{customdata[6]:.0f}} of {d['memory_GB']:.0f} GB<br>"
                       "%{customdata[9]}<extra></extra>")))
    grey = [[None if f else 1 for f in frow] for frow in fits]
    if any(v for row in grey for v in row):
        fig.add_trace(go.Heatmap(
            x=xs, y=ys, z=grey, customdata=custom, showscale=False, xgap=1, ygap=1,
            colorscale=[[0, NO_FIT_GREY], [1, NO_FIT_GREY]], name="does not fit",
            hovertemplate=("batch %{customdata[0]} × %{customdata[1]} context<br>"
                           "<b>does not fit</b>: weights + KV need %{customdata[6]:.0f} GB, the "
                           f"GPU has {d['memory_GB']:.0f} GB<br>(would be %{{customdata[10]:.2f}}"
                           "× with %{customdata[2]}, k = %{customdata[4]})<extra></extra>")))
        fig.add_trace(go.Scatter(
            x=[None], y=[None], mode="markers", name=f"does not fit in {d['memory_GB']:.0f} GB "
                                                   "(weights + KV cache)",
            marker=dict(symbol="square", size=13, color=NO_FIT_GREY)))
    k_ref = d.get("reference_k")
    which = f"k = {k_ref} drafts" if k_ref else "each cell's best k"
    lx, ly = [], []
    for (x0, y0), (x1, y1) in d["boundary"]:
        lx += [x0, x1, None]
        ly += [y0, y1, None]
    if lx:
        name = (f"verify pass ({which} + 1) turns compute-bound<br>"
                "towards large batch and short context")
    else:
        only = {b for row in d["reference_bound"] for b in row}
        name = f"verify pass ({which} + 1) {'/'.join(sorted(only))}-bound in every cell"
    fig.add_trace(go.Scatter(
        x=lx or [None], y=ly or [None], mode="lines", line=dict(color="#111", width=3),
        hoverinfo="skip", name=name))
    fig.update_layout(
        title=_title("Regime map: best speedup by batch size and context length", subtitle),
        xaxis=dict(title=dict(text="context length per sequence (tokens)"), tickvals=xs,
                   ticktext=[tokens_label(c) for c in contexts], showgrid=False,
                   range=[-0.5, len(xs) - 0.5]),
        yaxis=dict(title=dict(text="batch size (sequences)"), tickvals=ys,
                   ticktext=[str(b) for b in batches], showgrid=False,
                   range=[-0.5, len(ys) - 0.5]),
        legend=dict(y=-0.2),
        meta=dict(regime=dict(batches=batches, contexts=contexts)))
    return fig


# --------------------------------------------------------------------------------------------
# measured vs predicted
# --------------------------------------------------------------------------------------------


def validation_figure(d: dict) -> go.Figure:
    pts = d["points"]
    groups = sorted({p["group"] for p in pts})
    lo = min(min(p["measured_ms"], p["predicted_ms"]) for p in pts)
    hi = max(max(p["measured_ms"], p["predicted_ms"]) for p in pts)
    log = hi / lo > 20
    fig = go.Figure(layout=dict(template=TEMPLATE))
    span = [lo / 1.15, hi * 1.15] if log else [0.0, hi * 1.1]
    for factor, dash, name in ((1.0, "solid", "predicted = measured"),
                               (1.1, "dot", "±10%"), (0.9, "dot", None)):
        fig.add_trace(go.Scatter(
            x=span, y=[v * factor for v in span], mode="lines", hoverinfo="skip",
            line=dict(color="#888" if factor != 1.0 else "#444", width=1, dash=dash),
            name=name or "", showlegend=name is not None, legendgroup=f"ref{factor != 1.0}"))
    for n, group in enumerate(groups):
        sel = [p for p in pts if p["group"] == group]
        fig.add_trace(go.Scatter(
            x=[p["measured_ms"] for p in sel], y=[p["predicted_ms"] for p in sel],
            mode="markers", name=group or "points",
            marker=dict(size=9, color=(list(POLICY_COLORS.values()) + EXTRA_COLORS)[n % 11],
                        line=dict(color="white", width=1)),
            customdata=[[p["label"], p["relative_error"] * 100] for p in sel],
            hovertemplate=("<b>%{customdata[0]}</b><br>measured %{x:.3f} ms, predicted "
                           "%{y:.3f} ms<br>error %{customdata[1]:+.1f}%<extra></extra>")))
    sub = (f"mean |error| {d['mean_abs_relative_error'] * 100:.1f}%, largest "
           f"{d['max_abs_relative_error'] * 100:.1f}%, over {len(pts)} points")
    priced = d.get("priced_by") or []
    if priced:
        sub += "; predicted by " + "; ".join(priced)
    axis = dict(type="log", range=[math.log10(span[0]), math.log10(span[1])], dtick="D2") \
        if log else dict(type="linear", range=[0, span[1]])
    fig.update_layout(
        title=_title("Measured vs predicted time", sub),
        xaxis=dict(title=dict(text="measured (ms)"), **axis),
        yaxis=dict(title=dict(text="predicted (ms)"), **axis),
        legend=dict(y=-0.2), hovermode="closest")
    return fig


def validation_errors_figure(d: dict) -> go.Figure:
    """Relative error per point as horizontal bars (±10% marked): every point, or the
    :data:`MAX_ERROR_BARS` largest |errors| when there are more."""
    worst = sorted(d["points"], key=lambda p: -abs(p["relative_error"]))[:MAX_ERROR_BARS]
    pts = sorted(worst, key=lambda p: p["relative_error"])
    shown = ("" if len(pts) == len(d["points"]) else
             f"the {len(pts)} largest of {len(d['points'])} errors; ")
    groups = sorted({p["group"] for p in pts})
    palette = list(POLICY_COLORS.values()) + EXTRA_COLORS
    fig = go.Figure(layout=dict(template=TEMPLATE))
    fig.add_trace(go.Bar(
        y=[p["label"] for p in pts], x=[p["relative_error"] * 100 for p in pts],
        orientation="h", name="error",
        marker=dict(color=[palette[groups.index(p["group"]) % len(palette)] for p in pts]),
        customdata=[[p["measured_ms"], p["predicted_ms"], p["group"] or "-"] for p in pts],
        hovertemplate=("<b>%{y}</b> (%{customdata[2]})<br>error <b>%{x:+.1f}%</b>: predicted "
                       "%{customdata[1]:.3f} ms, measured %{customdata[0]:.3f} ms"
                       "<extra></extra>")))
    for x in (-10, 10):
        fig.add_vline(x=x, line=dict(color="#888", width=1, dash="dot"))
    fig.add_vline(x=0, line=dict(color="#444", width=1))
    widest = max(12.0, max(abs(p["relative_error"]) * 100 for p in pts) * 1.15)
    fig.update_layout(
        title=_title("Prediction error per measurement",
                     f"{shown}predicted / measured − 1; dotted lines at ±10%"),
        xaxis=dict(title=dict(text="error (%)"), range=[-widest, widest], zeroline=False),
        yaxis=dict(title=dict(text="measurement"), automargin=True),
        showlegend=False, bargap=0.35,
        height=max(HEIGHT, 140 + 24 * len(pts)))
    return fig
