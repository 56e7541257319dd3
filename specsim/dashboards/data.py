"""Figure data: pure functions from a predict report (:class:`~specsim.report.PredictReport`,
read by attribute), a trace and a cost model to plain dictionaries of numbers (JSON-ready),
one per dashboard figure. No plotly here.

Every number comes from :mod:`specsim.predict` (which calls :mod:`specsim.analytical`), from
:mod:`specsim.traces.acceptance` or from the cost model; these functions only select, reshape
and label. The one computation of their own is the regime map's search over (batch, context),
which calls the same formulas as predict (tested to agree with it cell by cell).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from specsim import analytical
from specsim.costs.base import CostModel
from specsim.report import CurvePoint, PredictReport
from specsim.specs import HardwareSpec, ModelSpec
from specsim.traces.acceptance import MIN_SUPPORT, estimate_acceptance
from specsim.traces.format import Trace

COMPONENTS = ("draft", "verify", "selection", "other")


# --------------------------------------------------------------------------------------------
# throughput heatmap over (k, s)
# --------------------------------------------------------------------------------------------


def heatmap_data(report: PredictReport, policy: str) -> dict:
    """Speedup S(k, s) of one policy over k = 1..K (the k all its groups share) and its
    recorded s values, with the joint optimum (k*, s*) and Vegas' 3-step path from predict.

    Grids are ``[i_s][i_k]`` (rows are s values, columns are k), as a heatmap draws them.
    """
    entry = report.policy(policy)
    groups = report.policy_groups(policy)
    k_common = min(len(g.curve) for g in groups)
    ks = list(range(1, k_common + 1))

    def grid(value):
        return [[value(g.at(k)) for k in ks] for g in groups]

    three = entry.three_step
    return {
        "policy": policy, "ks": ks, "ss": [g.s for g in groups],
        "speedup": grid(lambda c: c.speedup),
        "speedup_low": grid(lambda c: c.speedup_ci.low),
        "speedup_high": grid(lambda c: c.speedup_ci.high),
        "expected_tokens": grid(lambda c: c.expected_tokens),
        "iteration_ms": grid(lambda c: c.iteration_ms),
        "extrapolated": grid(lambda c: c.extrapolated),
        "plain_step_ms": groups[0].plain_step_ms,
        "k_star": entry.k_star, "s_star": entry.s_star, "speedup_star": entry.speedup,
        "three_step": None if three is None else {
            "path": [[int(k), s] for k, s in three.path], "k": three.k, "s": three.s,
            "speedup": three.speedup, "gap_to_joint": three.gap_to_joint},
    }


# --------------------------------------------------------------------------------------------
# speedup vs k, per policy at its best s
# --------------------------------------------------------------------------------------------


def inversion_point(curve: Sequence[CurvePoint], plain_step_ms: float) -> dict | None:
    """The efficiency-inversion point of one group's curve: the first k where drafting k + 1
    no longer beats drafting k, i.e. where predict's ``extend_helps`` (the exact test
    ``P_{k+1} > γ'·S_k`` of :func:`specsim.analytical.extend_k_helps`) turns False.

    Returns k with the two sides of the test for display: ``P_{k+1} = E_{k+1} − E_k`` and
    ``γ'·S_k`` with ``γ' = (T_{k+1} − T_k) / T_ar``; None when every extension helps.
    """
    for j, c in enumerate(curve):
        if c.extend_helps is False:
            nxt = curve[j + 1]
            gamma_prime = (nxt.iteration_ms - c.iteration_ms) / plain_step_ms
            return {"k": c.k, "speedup": c.speedup,
                    "survival_next": nxt.expected_tokens - c.expected_tokens,
                    "relative_step_cost": gamma_prime,
                    "threshold": gamma_prime * c.speedup}
    return None


def speedup_curves_data(report: PredictReport) -> dict:
    """Per policy, at its best recorded s (predict's s*): S(k) with its bootstrap CI, k* and
    the inversion point. Policies in the report's order."""
    out = []
    for entry in report.policies:
        g = report.group(entry.policy, entry.s_star)
        curve = g.curve
        out.append({
            "policy": entry.policy, "s": g.s, "ks": [c.k for c in curve],
            "speedup": [c.speedup for c in curve],
            "low": [c.speedup_ci.low for c in curve],
            "high": [c.speedup_ci.high for c in curve],
            "expected_tokens": [c.expected_tokens for c in curve],
            "iteration_ms": [c.iteration_ms for c in curve],
            "extrapolated": [c.extrapolated for c in curve],
            "k_star": g.k_star, "speedup_star": g.speedup_at_k_star,
            "k_star_ci": list(g.k_star_ci),
            "inversion": inversion_point(curve, g.plain_step_ms),
        })
    return {"level": report.confidence_level, "policies": out}


# --------------------------------------------------------------------------------------------
# iteration time breakdown at each policy's optimum
# --------------------------------------------------------------------------------------------


def breakdown_data(report: PredictReport) -> dict:
    """Per policy at its optimum (k*, s*): T(k*, s*) split into draft / verify / selection /
    other (ms, as predict reports them), and what plain decoding needs for the same expected
    tokens, ``E[m+1]·T_ar`` (the ratio of the two is the speedup). Sorted by speedup, best
    first."""
    rows = []
    for entry in report.policies:
        g = report.group(entry.policy, entry.s_star)
        c = g.at(entry.k_star)
        rows.append({
            "policy": entry.policy, "k": c.k, "s": g.s,
            "split_ms": {x: getattr(c.split_ms, x) for x in COMPONENTS},
            "iteration_ms": c.iteration_ms, "expected_tokens": c.expected_tokens,
            "plain_step_ms": g.plain_step_ms,
            "plain_same_tokens_ms": c.expected_tokens * g.plain_step_ms,
            "speedup": c.speedup,
        })
    rows.sort(key=lambda r: -r["speedup"])
    return {"components": list(COMPONENTS), "policies": rows}


# --------------------------------------------------------------------------------------------
# acceptance as the trace shows it
# --------------------------------------------------------------------------------------------


def position_acceptance_data(report: PredictReport, policy: str) -> dict:
    """Per recorded s of one policy: conditional p_i and survival P_i per draft position, with
    how many iterations reached the position (p_i is None where none did)."""
    out = []
    for g in report.policy_groups(policy):
        pos = g.positions
        out.append({"s": g.s, "i": [p.i for p in pos], "p": [p.p for p in pos],
                    "P": [p.P for p in pos], "reached": [p.reached for p in pos],
                    "observed": g.observed_positions})
    return {"policy": policy, "min_support": MIN_SUPPORT, "groups": out}


def _iterations(trace: Trace):
    """(context, k, m, weight) of every recorded iteration that has a context length."""
    ctx, k, m, w = [], [], [], []
    for r in trace.requests:
        ctx.append(r.context)
        k.append(r.k)
        m.append(r.m)
        w.append(np.ones(r.k.size))
    for h in trace.histograms:
        if h.context is None:
            continue
        keep = h.counts > 0
        ms = np.arange(h.k + 1)[keep]
        ctx.append(np.full(ms.size, h.context))
        k.append(np.full(ms.size, h.k))
        m.append(ms)
        w.append(h.counts[keep].astype(float))
    if not ctx:
        return (np.zeros(0),) * 4
    return tuple(np.concatenate(x).astype(float) for x in (ctx, k, m, w))


def context_bin_edges(trace: Trace, bins: int = 8) -> list[float]:
    """Equal-count bins of the context lengths of all recorded iterations (shared by every
    group, so that the curves are comparable). Empty when the trace has no context lengths."""
    ctx, _, _, w = _iterations(trace)
    if ctx.size == 0:
        return []
    order = np.argsort(ctx, kind="stable")
    values = ctx[order]
    cum = np.cumsum(w[order]) / w.sum()
    edges = []
    for q in np.linspace(0, 1, bins + 1)[1:-1]:
        i = min(int(np.searchsorted(cum, q)), values.size - 1)  # last iteration of the lower bin
        edges.append(float(values[i] + values[min(i + 1, values.size - 1)]) / 2)
    return sorted({float(values[0]), *edges, float(values[-1])})


def context_acceptance_data(trace: Trace, bins: int = 8,
                            min_support: int = MIN_SUPPORT) -> dict:
    """Acceptance vs context length: the iterations of each (policy, s) group binned by their
    context length at the start of the iteration; per bin the mean tokens per iteration
    ``E[m+1]``, the pooled ``α = Σm / Σk``, the mean k drafted and the number of iterations.
    Bins with fewer than ``min_support`` iterations are left out (None)."""
    edges = context_bin_edges(trace, bins)
    groups = []
    for (policy, s), sub in trace.groups().items():
        ctx, k, m, w = _iterations(sub)
        row = {"policy": policy, "s": s, "context": [], "tokens": [], "alpha": [], "k": [],
               "iterations": [], "low": [], "high": []}
        if len(edges) >= 2 and ctx.size:
            idx = np.clip(np.searchsorted(edges, ctx, side="right") - 1, 0, len(edges) - 2)
            for b in range(len(edges) - 1):
                sel = idx == b
                n = float(w[sel].sum())
                enough = n >= min_support
                row["low"].append(edges[b])
                row["high"].append(edges[b + 1])
                row["iterations"].append(int(n))
                row["context"].append(float(np.average(ctx[sel], weights=w[sel])) if enough
                                      else None)
                row["tokens"].append(float(np.average(m[sel] + 1, weights=w[sel])) if enough
                                     else None)
                row["alpha"].append(float((w[sel] @ m[sel]) / (w[sel] @ k[sel])) if enough
                                    else None)
                row["k"].append(float(np.average(k[sel], weights=w[sel])) if enough else None)
        groups.append(row)
    return {"edges": edges, "min_support": min_support, "groups": groups}


# --------------------------------------------------------------------------------------------
# regime map over (batch × context length)
# --------------------------------------------------------------------------------------------


def memory_needed_bytes(model: ModelSpec, contexts: Sequence[int], tp: int = 1) -> float:
    """Per-GPU memory the batch needs (see :meth:`ModelSpec.memory_bytes`)."""
    return model.memory_bytes(contexts, tp)


def regime_data(trace: Trace, report: PredictReport, costs: CostModel, model: ModelSpec,
                hardware: HardwareSpec, batches: Sequence[int], contexts: Sequence[int],
                k_max: int | None = None, tp: int = 1, reference_k: int | None = None) -> dict:
    """Speedup over (batch × context length) on one GPU, every sequence at the same context.

    Per cell, every trace group's acceptance estimate (held fixed: the trace's acceptance
    does not move with the context here, only the costs do) is costed as predict costs it
    (``costed_as``) and the best (policy, s, k) kept — exactly predict's ``best`` for
    ``--batch b --context c``. Also per cell: the roofline bound of that cell's verify pass
    ``C_v(k+1)`` at its best k (``verify_bound``) and at ``reference_k`` drafts
    (``reference_bound``; default: each cell's best k), and whether weights + KV fit in the
    GPU's memory. ``boundary`` holds the cell edges where the reference verify bound flips,
    in cell-index coordinates (x = context index, y = batch index). Grids are
    ``[i_batch][i_context]``.
    """
    trace_groups = list(trace.groups().items())
    if [g.key for g in report.groups] != [key for key, _ in trace_groups]:
        raise ValueError("the report was not made from this trace")
    estimates = [estimate_acceptance(sub, k_max=k_max) for _, sub in trace_groups]
    costed = [g.costed_as for g in report.groups]

    shape = (len(batches), len(contexts))
    speed = np.zeros(shape)
    plain_ms = np.zeros(shape)
    iteration_ms = np.zeros(shape)
    need = np.zeros(shape)
    best_policy = [[""] * shape[1] for _ in batches]
    best_s: list[list] = [[None] * shape[1] for _ in batches]
    best_k = np.zeros(shape, dtype=int)
    bound = [[""] * shape[1] for _ in batches]
    reference = [[""] * shape[1] for _ in batches]
    for ib, b in enumerate(batches):
        for ic, c in enumerate(contexts):
            ctx = np.full(int(b), int(c), dtype=np.int64)
            plain = costs.plain_step(ctx)
            best = None
            for (key, _), est, as_ in zip(trace_groups, estimates, costed):
                iters = [costs.iteration(ctx, int(k), as_.s, as_.policy) for k in est.ks]
                t = np.array([it.seconds for it in iters])
                s_k = analytical.speedup(est.expected_tokens, plain.seconds, t)
                k, value = analytical.best_k(s_k, est.ks)
                if best is None or value > best[0]:
                    best = (value, key, k, float(t[k - 1]))
            value, (policy, s), k, t_k = best
            speed[ib, ic] = value
            best_policy[ib][ic], best_s[ib][ic], best_k[ib, ic] = policy, s, k
            plain_ms[ib, ic], iteration_ms[ib, ic] = plain.seconds * 1e3, t_k * 1e3
            bound[ib][ic] = costs.verify(ctx, k + 1).bound
            reference[ib][ic] = (bound[ib][ic] if reference_k is None else
                                 costs.verify(ctx, reference_k + 1).bound)
            need[ib, ic] = memory_needed_bytes(model, ctx, tp)
    fits = need <= hardware.memory_bytes
    return {
        "hardware": hardware.name, "memory_GB": hardware.memory_bytes / 1e9,
        "batches": [int(b) for b in batches], "contexts": [int(c) for c in contexts],
        "speedup": speed.tolist(), "policy": best_policy, "s": best_s, "k": best_k.tolist(),
        "plain_step_ms": plain_ms.tolist(), "iteration_ms": iteration_ms.tolist(),
        "verify_bound": bound, "reference_k": reference_k, "reference_bound": reference,
        "boundary": bound_boundary(reference),
        "memory_needed_GB": (need / 1e9).tolist(), "fits": fits.tolist(),
        "max_context": model.max_context,
    }


def bound_boundary(bound: list[list[str]]) -> list[list[list[float]]]:
    """Cell edges between neighbouring cells whose bound differs, as segments
    ``[[x0, y0], [x1, y1]]``; cell (i_row, i_col) spans x ∈ i_col ± ½, y ∈ i_row ± ½."""
    segments = []
    rows, cols = len(bound), len(bound[0]) if bound else 0
    for i in range(rows):
        for j in range(cols):
            if j + 1 < cols and bound[i][j] != bound[i][j + 1]:
                segments.append([[j + 0.5, i - 0.5], [j + 0.5, i + 0.5]])
            if i + 1 < rows and bound[i][j] != bound[i + 1][j]:
                segments.append([[j - 0.5, i + 0.5], [j + 0.5, i + 0.5]])
    return segments


# --------------------------------------------------------------------------------------------
# headline numbers of one setting
# --------------------------------------------------------------------------------------------


def headline_data(report: PredictReport, model: ModelSpec, hardware: HardwareSpec,
                  tp: int = 1) -> dict:
    """The best (policy, s, k) with its CI, T_ar, and whether the batch fits in memory."""
    best = report.best
    g = report.best_group()
    contexts = g.contexts                # every group is costed on the same batch
    need = memory_needed_bytes(model, contexts, tp)
    d = best.distinguishable_from_runner_up
    return {
        "policy": best.policy, "s": best.s, "k": best.k, "speedup": best.speedup,
        "speedup_ci": list(best.speedup_ci), "level": report.confidence_level,
        "distinguishable": None if d is None else d.to_json(),
        "plain_step_ms": g.plain_step_ms, "batch": len(contexts),
        "context_min": min(contexts), "context_max": max(contexts),
        "context_source": g.context_source,
        "memory_needed_GB": need / 1e9, "memory_GB": hardware.memory_bytes / 1e9,
        "fits": need <= hardware.memory_bytes, "notes": list(report.notes),
    }
