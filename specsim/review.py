"""`specsim review`: the four open questions about Vegas' evidence, answered with specsim's own
measurements for a trace set and a cost model.

1. **Is Collect-2-Query a good proxy?** From a proxy-check file (``scripts/review_proxy.py``:
   the engine drafting with Vegas' two collected rows and with all k+1 verify rows,
   ``vegas`` / ``vegas-all``, measuring at every verify and layer the top-K overlap of the two
   rankings): overlap by layer, by key distance, by context length, and the accepted drafts
   per iteration of both rules with a CI (bootstrap over prompts, paired). The review's
   falsifier: overlap well below 60–75 % *and* > 10 % fewer accepted tokens per iteration.
2. **Symmetric tuning.** Every policy at its own optimum on the same (k, s) grid
   (``specsim.predict``; with ``simulate`` also the simulator's grid sweep).
3. **No tuning on the test set.** (k*, s*) picked on a tuning part of the prompts, reported on
   the held-out part, with the optimism of tuning on the held-out part itself.
4. **Error bars.** CIs on every optimum, and for every pair of policies the paired-bootstrap
   difference of their best speedups and whether they are distinguishable.

The result is a plain dictionary (JSON-ready); ``specsim.cli.review_cmd`` prints it. Nothing
here imports torch: the proxy file is produced by the engine, read here.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from specsim import analytical
from specsim import predict as P
from specsim.errors import SpecsimError
from specsim.report import GroupResult, PredictReport
from specsim.traces.format import Trace

PROXY_VERSION = 1
#: The review's falsifier: overlap below this (the low end of "60–75 %") ...
OVERLAP_THRESHOLD = 0.60
#: ... together with a relative deficit in accepted drafts per iteration above this.
DEFICIT_THRESHOLD = 0.10
#: Context-length bins of the proxy check (cache length at the selection), lower edges.
CONTEXT_BINS = (2048, 3072, 4096, 5120, 6144)
RULES = ("vegas", "vegas-all")      # Collect-2-Query, all k+1 rows


# --------------------------------------------------------------------------------------------
# (1) the proxy check: per-run summaries (written by scripts/review_proxy.py) and the answer
# --------------------------------------------------------------------------------------------


def band_labels(bands, recent: int) -> list[str]:
    """Key-distance bands d = L − n as text: '33–128', '129–512', …, '>2048'."""
    lows = [recent + 1, *[b + 1 for b in bands]]
    return [f"{lo}–{hi}" for lo, hi in zip(lows, bands)] + [f">{bands[-1]}"]


def context_labels(bins=CONTEXT_BINS) -> list[str]:
    edges = list(bins)
    return ([f"<{edges[0]}"] + [f"{lo}–{hi - 1}" for lo, hi in zip(edges, edges[1:])]
            + [f"≥{edges[-1]}"])


def proxy_run_summary(records, sequence: int, num_layers: int, bins=CONTEXT_BINS) -> dict:
    """Sums over one sequence's proxy-check entries (``specsim.engine.selection.ProxyRecords``),
    leaving out the trivial ones (K covers every ranked position): per layer the summed
    overlap, per distance band the shared / Collect-2-Query / all-rows picks, per context bin
    the summed overlap (over layers and entries) and its count."""
    rows = [i for i, b in enumerate(records.sequence) if b == sequence]
    keep = [i for i in rows if records.budget[i] < records.eligible[i]]
    bands = len(records.bands) + 1
    overlap = np.array([records.overlap[i] for i in keep], float).reshape(-1, num_layers)
    which = np.searchsorted(np.asarray(bins), [records.context[i] for i in keep],
                            side="right")
    context_sum = np.bincount(which, overlap.sum(1), minlength=len(bins) + 1)
    context_count = np.bincount(which, minlength=len(bins) + 1) * num_layers

    def band_sum(name):
        picks = [getattr(records, name)[i].sum(0) for i in keep]
        return (np.sum(picks, 0) if picks else np.zeros(bands)).astype(int).tolist()

    return {"entries": len(rows), "trivial": len(rows) - len(keep), "count": len(keep),
            "layer_overlap_sum": overlap.sum(0).tolist(),
            "band_shared": band_sum("shared"), "band_pair": band_sum("pair_picks"),
            "band_all": band_sum("all_picks"),
            "context_overlap_sum": context_sum.tolist(),
            "context_count": context_count.astype(int).tolist()}


def read_proxy(path: str | os.PathLike) -> dict:
    """A proxy-check file, validated (errors name the file and the field)."""
    path = str(path)
    if not os.path.isfile(path):
        raise SpecsimError(f"{path}: no such proxy-check file (make one with "
                           f"scripts/review_proxy.py)")
    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecsimError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("specsim_proxy") != PROXY_VERSION:
        raise SpecsimError(f"{path}: not a specsim proxy-check file (specsim_proxy: "
                           f"expected {PROXY_VERSION})")
    for name in ("model", "runs", "num_layers", "distance_bands", "recent", "context_bins"):
        if name not in data:
            raise SpecsimError(f"{path}: {name}: expected a value, got none (missing)")
    if not isinstance(data["runs"], list) or not data["runs"]:
        raise SpecsimError(f"{path}: runs: expected a non-empty list")
    needed = ("rule", "k", "s", "prompt", "iterations", "accepted", "proxy")
    for i, run in enumerate(data["runs"]):
        missing = [n for n in needed if n not in run]
        if missing:
            raise SpecsimError(f"{path}: runs[{i}].{missing[0]}: expected a value, got "
                                   f"none (missing)")
        if run["rule"] not in RULES:
            raise SpecsimError(f"{path}: runs[{i}].rule is '{run['rule']}', expected one of "
                               f"{', '.join(RULES)}")
    data["path"] = path
    return data


def _paired_runs(proxy: dict) -> tuple[list, list[str]]:
    """(configs, prompts): configs are the (k, s) where both rules ran a prompt; each is
    (k, s, {prompt: {rule: run}}) with only prompts that both rules ran."""
    table: dict = {}
    for run in proxy["runs"]:
        table.setdefault((int(run["k"]), float(run["s"])), {}).setdefault(
            run["prompt"], {})[run["rule"]] = run
    configs = []
    for (k, s), by_prompt in sorted(table.items()):
        both = {p: r for p, r in by_prompt.items() if set(r) == set(RULES)}
        if both:
            configs.append((k, s, both))
    prompts = sorted({p for _, _, both in configs for p in both})
    return configs, prompts


def _ratio_ci(numerator: np.ndarray, denominator: np.ndarray, weights: np.ndarray,
              level: float) -> list[float]:
    """Percentile CI of Σ_p w_p·num_p / Σ_p w_p·den_p over bootstrap weights [n_boot, P]."""
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = (weights @ numerator) / (weights @ denominator)
    ci = analytical.percentile_interval(boot, level)
    return [ci.low, ci.high]


def _acceptance(configs, prompts, weights, level) -> dict:
    """Accepted drafts per iteration E[m] and tokens per iteration E[m + 1] of both rules over
    ``configs`` (ratios of sums over prompts), and the relative deficit of Collect-2-Query
    ``1 − E[m]_C2Q / E[m]_all`` with its paired-bootstrap CI over prompts."""
    index = {p: i for i, p in enumerate(prompts)}
    sums = {rule: np.zeros((3, len(prompts))) for rule in RULES}   # accepted, iterations, tokens
    for _, _, both in configs:
        for prompt, runs in both.items():
            for rule in RULES:
                run = runs[rule]
                sums[rule][:, index[prompt]] += (run["accepted"], run["iterations"],
                                                 run["accepted"] + run["iterations"])
    c2q, full = sums["vegas"], sums["vegas-all"]
    e = {rule: float(sums[rule][0].sum() / max(sums[rule][1].sum(), 1)) for rule in RULES}
    t = {rule: float(sums[rule][2].sum() / max(sums[rule][1].sum(), 1)) for rule in RULES}
    with np.errstate(invalid="ignore", divide="ignore"):
        boot_m = 1.0 - ((weights @ c2q[0]) / (weights @ c2q[1])) / (
            (weights @ full[0]) / (weights @ full[1]))
        boot_t = 1.0 - ((weights @ c2q[2]) / (weights @ c2q[1])) / (
            (weights @ full[2]) / (weights @ full[1]))
    deficit = 1.0 - e["vegas"] / e["vegas-all"] if e["vegas-all"] > 0 else float("nan")
    tokens_deficit = 1.0 - t["vegas"] / t["vegas-all"]
    m_ci, t_ci = (analytical.percentile_interval(b, level) for b in (boot_m, boot_t))
    return {"accepted_c2q": e["vegas"], "accepted_all": e["vegas-all"],
            "tokens_c2q": t["vegas"], "tokens_all": t["vegas-all"],
            "deficit": deficit, "deficit_ci": [m_ci.low, m_ci.high],
            "tokens_deficit": tokens_deficit, "tokens_deficit_ci": [t_ci.low, t_ci.high],
            "prompts": int(sum(1 for i in range(len(prompts)) if full[1, i] > 0))}


def proxy_answer(proxy: dict, n_boot: int = 1000, seed: int = 0, level: float = 0.95,
                 overlap_threshold: float = OVERLAP_THRESHOLD,
                 deficit_threshold: float = DEFICIT_THRESHOLD) -> dict:
    """Answer (1) from a proxy-check file (``read_proxy``)."""
    configs, prompts = _paired_runs(proxy)
    if not configs:
        raise SpecsimError(f"{proxy.get('path', 'proxy file')}: no (k, s) where both vegas and "
                           f"vegas-all ran the same prompt")
    layers, recent = int(proxy["num_layers"]), int(proxy["recent"])
    bands = list(proxy["distance_bands"])
    rng = np.random.default_rng(seed)
    weights = analytical.bootstrap_weights(np.ones(len(prompts)), n_boot, rng)
    index = {p: i for i, p in enumerate(prompts)}

    def pooled(runs_of):
        """Overlap sums over the given (prompt, run) pairs, per prompt for the CI."""
        layer_sum, count = np.zeros(layers), 0
        per_prompt = np.zeros((2, len(prompts)))   # overlap sum, entries × layers
        band = {name: np.zeros(len(bands) + 1) for name in ("band_shared", "band_pair",
                                                            "band_all")}
        ctx_sum = np.zeros(len(proxy["context_bins"]) + 1)
        ctx_count = np.zeros_like(ctx_sum)
        for prompt, run in runs_of:
            summary = run["proxy"]
            layer_sum += summary["layer_overlap_sum"]
            count += summary["count"]
            per_prompt[:, index[prompt]] += (sum(summary["layer_overlap_sum"]),
                                             summary["count"] * layers)
            for name in band:
                band[name] += summary[name]
            ctx_sum += summary["context_overlap_sum"]
            ctx_count += summary["context_count"]
        mean = float(per_prompt[0].sum() / max(per_prompt[1].sum(), 1)) if count else None
        ci = _ratio_ci(per_prompt[0], per_prompt[1], weights, level) if count else None
        return {"mean": mean, "ci": ci, "entries": count, "layer_sum": layer_sum,
                "band": band, "ctx_sum": ctx_sum, "ctx_count": ctx_count}

    every = [(p, runs[rule]) for _, _, both in configs for p, runs in both.items()
             for rule in RULES]
    total = pooled(every)
    by_rule = {rule: pooled([(p, runs[rule]) for _, _, both in configs
                             for p, runs in both.items()]) for rule in RULES}
    if not total["entries"]:
        raise SpecsimError(f"{proxy.get('path', 'proxy file')}: every verify had K ≥ the ranked "
                           f"positions (contexts too short for the budget): nothing to compare")
    by_layer = [{"layer": i,
                 "overlap": float(total["layer_sum"][i] / total["entries"]),
                 "overlap_c2q_runs": _mean_or_none(by_rule["vegas"]["layer_sum"][i],
                                                   by_rule["vegas"]["entries"]),
                 "overlap_all_rows_runs": _mean_or_none(by_rule["vegas-all"]["layer_sum"][i],
                                                        by_rule["vegas-all"]["entries"])}
                for i in range(layers)]
    b = total["band"]
    by_distance = [{"distance": label,
                    "recall": _mean_or_none(b["band_shared"][j], b["band_all"][j]),
                    "share_of_c2q_picks": _mean_or_none(b["band_pair"][j], b["band_pair"].sum()),
                    "share_of_all_rows_picks": _mean_or_none(b["band_all"][j],
                                                             b["band_all"].sum()),
                    "all_rows_picks": int(b["band_all"][j])}
                   for j, label in enumerate(band_labels(bands, recent))]
    by_context = [{"context": label, "overlap": _mean_or_none(total["ctx_sum"][j],
                                                              total["ctx_count"][j]),
                   "layer_entries": int(total["ctx_count"][j])}
                  for j, label in enumerate(context_labels(proxy["context_bins"]))
                  if total["ctx_count"][j]]
    by_config = []
    for k, s, both in configs:
        over = pooled([(p, runs[rule]) for p, runs in both.items() for rule in RULES])
        row = {"k": k, "s": s, "prompts": len(both), "overlap": over["mean"],
               "overlap_ci": over["ci"]}
        row.update(_acceptance([(k, s, both)], prompts, weights, level))
        by_config.append(row)
    by_row_gap = []   # Collect-2-Query's rows 1 and q − 1 = k lie k − 1 rows apart
    for k in sorted({c[0] for c in configs}):
        over = pooled([(p, runs[rule]) for kk, _, both in configs if kk == k
                       for p, runs in both.items() for rule in RULES])
        by_row_gap.append({"k": k, "row_gap": k - 1, "overlap": over["mean"],
                           "overlap_ci": over["ci"],
                           **_acceptance([c for c in configs if c[0] == k], prompts, weights,
                                         level)})
    accepted = _acceptance(configs, prompts, weights, level)
    overlap = total["mean"]
    low_overlap = overlap < overlap_threshold
    big_deficit = accepted["deficit"] > deficit_threshold
    falsified = bool(low_overlap and big_deficit and accepted["deficit_ci"][0] > 0)
    if falsified:
        verdict = "falsified: low overlap and a significant deficit in accepted drafts"
    elif low_overlap:
        verdict = ("not falsified: the overlap is low, but Collect-2-Query's drafts are accepted "
                   f"{'about as often' if not big_deficit else 'less often, not significantly'}"
                   f" as with all rows")
    elif big_deficit:
        verdict = "not falsified by the overlap, but all rows give notably more accepted drafts"
    else:
        verdict = "not falsified: high overlap and no large deficit in accepted drafts"
    configs_falsified = [(r["k"], r["s"]) for r in by_config
                         if r["overlap"] is not None and r["overlap"] < overlap_threshold
                         and r["deficit"] > deficit_threshold and r["deficit_ci"][0] > 0]
    return {
        "source": proxy.get("path"), "model": proxy["model"],
        "setup": {key: proxy.get(key) for key in ("weights", "dtype", "device", "threads",
                                                  "sampling", "max_new_tokens", "command")},
        "prompts": prompts, "ks": sorted({c[0] for c in configs}),
        "ss": sorted({c[1] for c in configs}), "recent_excluded": recent,
        "budget_rule": "K = max(ceil(s·L), 256) positions outside the recent window",
        "overlap": {"mean": overlap, "ci": total["ci"], "checks": total["entries"],
                    "layers": layers,
                    "during_c2q_runs": by_rule["vegas"]["mean"],
                    "during_all_rows_runs": by_rule["vegas-all"]["mean"]},
        "by_layer": by_layer, "by_distance": by_distance, "by_context": by_context,
        "by_row_gap": by_row_gap, "by_config": by_config, "accepted": accepted,
        "falsifier": {"overlap_below": overlap_threshold, "deficit_above": deficit_threshold,
                      "overlap": overlap, "deficit": accepted["deficit"],
                      "deficit_ci": accepted["deficit_ci"], "falsified": falsified,
                      "configs_falsified": configs_falsified, "verdict": verdict},
    }


def _mean_or_none(total, count):
    return float(total / count) if count else None


# --------------------------------------------------------------------------------------------
# (2)–(4) from a trace: predict's per-policy optima, held-out tuning, paired comparisons
# --------------------------------------------------------------------------------------------


def infer_prompt_ids(trace: Trace) -> str | None:
    """Give requests without ``prompt_id`` one taken from the engine's request ids
    ``PROMPT|POLICY|kK|sS`` (``specsim trace``), so that bootstraps pair by prompt and holdout
    splits keep a prompt on one side under every policy. Returns a note when it did."""
    requests = trace.requests
    if not requests or all(r.prompt_id is not None for r in requests):
        return None
    parts = [r.id.split("|") for r in requests]
    if not all(len(p) == 4 and p[1] == r.policy for p, r in zip(parts, requests)):
        return None
    for p, r in zip(parts, requests):
        if r.prompt_id is None:
            r.prompt_id = p[0]
    return ("the trace's requests carry no prompt_id: taken from the request ids "
            "(PROMPT|POLICY|kK|sS, as `specsim trace` writes them)")


def _groups_with_bootstrap(trace: Trace, costs, opts: P.PredictOptions) -> list[GroupResult]:
    """predict's groups with their bootstrap speedups kept (``bootstrap_speedups``), computed
    exactly as ``predict_trace`` does (same workload, same paired prompt weights, same seed)."""
    notes: list[str] = []
    contexts, source = P.workload_contexts(trace, opts, notes)
    paired = P.prompt_weights(trace, opts.n_boot, opts.seed)
    return [P.predict_group(g, costs, opts, notes, contexts, source, paired)
            for g in trace.groups().values()]


def _optimum_group(groups: list[GroupResult], policy: str) -> GroupResult:
    return max((g for g in groups if g.policy == policy), key=lambda g: g.speedup_at_k_star)


def tuning_answer(report: PredictReport) -> dict:
    """(2): every policy at its own optimum on the grid it was evaluated on, with CIs."""
    s_by_policy = {p.policy: p.s_values for p in report.policies}
    k_by_policy = {p.policy: min(len(report.group(p.policy, s).curve) for s in p.s_values)
                   for p in report.policies}
    same = (len({tuple(v) for v in s_by_policy.values()}) == 1
            and len(set(k_by_policy.values())) == 1)
    rows = []
    for p in report.policies:
        g = report.group(p.policy, p.s_star)
        point = g.at(p.k_star)
        rows.append({"policy": p.policy, "k_star": p.k_star, "s_star": p.s_star,
                     "speedup": p.speedup, "speedup_ci": list(point.speedup_ci),
                     "expected_tokens": point.expected_tokens,
                     "k_star_ci_at_s_star": list(g.k_star_ci),
                     "extrapolated": point.extrapolated,
                     "three_step": None if p.three_step is None else p.three_step.to_json()})
    rows.sort(key=lambda r: -r["speedup"])
    return {"grid": {"k": f"1..{max(k_by_policy.values())}" if same else k_by_policy,
                     "s": next(iter(s_by_policy.values())) if same else s_by_policy,
                     "same_for_every_policy": same},
            "policies": rows}


def comparison_answer(groups: list[GroupResult], level: float) -> list[dict]:
    """(4): every pair of policies at their own optima: predict's share of bootstrap replicates
    the first wins, plus the CI of the speedup difference (paired when the trace has prompt
    ids)."""
    out = []
    for row in P.compare_policies(groups, level):
        a, b = _optimum_group(groups, row.a), _optimum_group(groups, row.b)
        sa = a.bootstrap_speedups[:, a.k_star - 1]
        sb = b.bootstrap_speedups[:, b.k_star - 1]
        n = min(sa.size, sb.size)
        ci = analytical.percentile_interval(sa[:n] - sb[:n], level)
        out.append({**row.to_json(), "a_at": {"k": a.k_star, "s": a.s},
                    "b_at": {"k": b.k_star, "s": b.s},
                    "difference": row.a_speedup - row.b_speedup,
                    "difference_ci": [ci.low, ci.high]})
    return out


def review_trace(trace: Trace, costs, opts: P.PredictOptions, holdout: float = 0.5,
                 holdout_seed: int = 0) -> dict:
    """Answers (2)–(4) from a trace and a cost model (analytical model, no simulation)."""
    notes = []
    note = infer_prompt_ids(trace)
    if note:
        notes.append(note)
    policies = {p for p, s in trace.groups() if s is not None}
    if not policies:
        raise SpecsimError("the trace has no sparse-selection groups (policy with an s) to review")
    report = P.predict_trace(trace, costs, opts)
    groups = _groups_with_bootstrap(trace, costs, opts)
    try:
        held = P.holdout_report(trace, costs, opts, holdout, holdout_seed)
    except ValueError as exc:
        raise SpecsimError(f"held-out tuning: {exc}") from None
    return {
        "trace": trace.path, "synthetic": trace.synthetic,
        "trace_model": trace.header.get("model"), "cost_model": costs.name,
        "batch": opts.batch, "bootstrap": opts.n_boot, "confidence_level": opts.level,
        "bootstrap_paired_by_prompt": report.bootstrap_paired_by_prompt,
        "requests": len(trace.requests) + len(trace.histograms),
        "prompts": len({r.prompt_id for r in trace.requests if r.prompt_id is not None}),
        "tuning": tuning_answer(report),
        "holdout": held.to_json(),
        "comparison": comparison_answer(groups, opts.level),
        "best": report.best.to_json(),
        "notes": notes + report.notes,
    }


# --------------------------------------------------------------------------------------------
# (2) and (3) by simulation
# --------------------------------------------------------------------------------------------


def simulated_answers(trace: Trace, *, model: str, hardware: str, tp: int, costs: str,
                      arrivals: tuple, max_batch: int, ks: list[int], holdout: float,
                      seed: int = 0, workers: int | None = None, progress=None) -> dict:
    """The simulator's grid sweep (``specsim tune``) over every sparse policy of the trace, on
    one grid, and the same sweep on the tuning and held-out parts. The trace (with any inferred
    prompt ids) is written to a temporary file for the worker processes."""
    from dataclasses import replace

    from specsim.simulator.tuning import SweepSpec, holdout_summary, summarise, sweep
    from specsim.traces.format import write_trace

    policies = sorted({p for p, s in trace.groups() if s is not None})
    with tempfile.TemporaryDirectory(prefix="specsim-review-") as folder:
        path = os.path.join(folder, "trace.jsonl")
        write_trace(path, trace.header, [*trace.requests, *trace.histograms])
        spec = SweepSpec(path, model, hardware, tp, arrivals, max_batch, seed=seed, costs=costs)
        try:
            swept = sweep(spec, policies, ks, workers, progress)
            parts = {part: sweep(replace(spec, part=part, holdout=holdout, holdout_seed=seed),
                                 policies, ks, workers, progress) for part in ("tune", "eval")}
        except ValueError as exc:
            raise SpecsimError(f"simulation: {exc}") from None
    summary = summarise(swept)
    rows = [{"policy": p["policy"], "k_star": p["k_star"], "s_star": p["s_star"],
             "speedup": p["speedup"], "three_step": p.get("three_step"),
             "sensitivity": p["sensitivity"]} for p in summary["policies"]]
    rows.sort(key=lambda r: -r["speedup"])
    return {"grid": {"k": ks, "s": sorted({r["s"] for r in swept["rows"]})},
            "arrivals": list(arrivals), "max_batch": max_batch,
            "plain_throughput": swept["plain"]["throughput"], "policies": rows,
            "holdout": holdout_summary(parts["tune"], parts["eval"])
            | {"holdout_fraction": holdout, "seed": seed},
            "configs": swept["configs"]}


def recorded_k(trace: Trace) -> int:
    """The largest draft length the trace recorded."""
    return max([int(r.k.max()) for r in trace.requests if r.k.size]
               + [int(h.k) for h in trace.histograms] + [1])


def simulation_configs(trace: Trace, ks: list[int]) -> int:
    """How many simulations ``simulated_answers`` runs (for a progress bar)."""
    groups = [key for key in trace.groups() if key[1] is not None]
    return 3 * (1 + len(groups) * len(ks))


__all__ = ["CONTEXT_BINS", "DEFICIT_THRESHOLD", "OVERLAP_THRESHOLD", "PROXY_VERSION", "RULES",
           "band_labels", "comparison_answer", "context_labels", "infer_prompt_ids",
           "proxy_answer", "proxy_run_summary", "read_proxy", "recorded_k", "review_trace",
           "simulated_answers", "simulation_configs", "tuning_answer"]
