"""`specsim predict`: from a trace (or a what-if), the speedup curve over k and s, k*, s*,
confidence intervals, the cost split and which numbers are extrapolated.

The result is a :class:`~specsim.report.PredictReport` (or a
:class:`~specsim.report.WhatIfReport`); :mod:`specsim.cli` prints it as tables, ``to_json()``
is its ``--json``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from specsim import analytical
from specsim.costs.base import CostModel, IterationCost
from specsim.report import (CI, Best, Choice, ChoiceSpeedup, CostedAs, CostSplit, CurvePoint,
                            Distinction, ExtrapolationCheck, GroupResult, HardwareSummary,
                            Holdout, HoldoutRow, Measured, ModelSummary, PolicyComparison,
                            PolicyOptimum, Position, PredictReport, RunnerUp, ThreeStep,
                            WhatIfPoint, WhatIfReport)
from specsim.traces.acceptance import AcceptanceEstimate, estimate_acceptance, extrapolation_error
from specsim.traces.format import Trace

DEFAULT_POLICY = "vegas"
DEFAULT_SPARSITY = 0.05
DEFAULT_CONTEXT = 8192


def batch_contexts(contexts: np.ndarray, batch: int) -> np.ndarray:
    """A batch of ``batch`` ragged contexts that follows the recorded distribution: the
    midpoint quantiles ``(j + ½)/batch`` of the iterations' context lengths (not their mean)."""
    contexts = np.asarray(contexts)
    q = (np.arange(batch) + 0.5) / batch
    return np.maximum(1, np.round(np.quantile(contexts, q))).astype(np.int64)


def _ci(interval: analytical.Interval) -> CI:
    return CI(interval.low, interval.high)


def _ms(x: float) -> float:
    return round(float(x) * 1e3, 6)


# --------------------------------------------------------------------------------------------
# what-if modes (no trace, no hardware): T_ar = C_v = 1, γ = C_d / C_v
# --------------------------------------------------------------------------------------------


def _curve_report(ks, tokens, speedups, mode: str, gamma: float, **extra) -> WhatIfReport:
    k_star, s_star = analytical.best_k(speedups, ks)
    return WhatIfReport(mode=mode, gamma=gamma, k_star=k_star, speedup_at_k_star=s_star,
                        curve=[WhatIfPoint(int(k), float(e), float(s))
                               for k, e, s in zip(ks, tokens, speedups)], **extra)


def what_if_alpha(alpha: float, gamma: float, k_max: int = 16) -> WhatIfReport:
    """SparseSpec-L Eq. 1 over k = 1..k_max, with Eq. 2's slope."""
    _check_unit("alpha", alpha)
    _check_gamma(gamma)
    k_max = analytical.check_k_max(k_max, "--k-max")
    ks = np.arange(1, k_max + 1)
    tokens = alpha * ks + 1.0
    speedups = analytical.sparsespec_speedup(alpha, ks, gamma)
    slope = [float(x) for x in analytical.sparsespec_speedup_slope(alpha, ks, gamma)]
    return _curve_report(ks, tokens, speedups, "alpha", gamma, alpha=alpha, slope_dS_dk=slope,
                         longer_drafts_help=bool(alpha > gamma))


def what_if_rates(rates, gamma: float) -> WhatIfReport:
    """Per-position conditional rates p_1..p_K: ``S(k) = (1 + Σ_{i≤k} P_i) / (k·γ + 1)``."""
    p = np.asarray(rates, float)
    if p.size == 0:
        raise ValueError("give at least one acceptance rate")
    for r in p:
        _check_unit("acceptance rate", r)
    _check_gamma(gamma)
    survival = analytical.survival_from_conditional(p)
    ks = np.arange(1, p.size + 1)
    tokens = analytical.expected_tokens_from_survival(survival)[1:]
    iteration = analytical.iteration_time(ks, gamma, 1.0)
    speedups = analytical.speedup(tokens, 1.0, iteration)
    return _curve_report(ks, tokens, speedups, "rates", gamma, conditional=p.tolist(),
                         survival=survival.tolist())


def _check_unit(name, x):
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {x}")


def _check_gamma(gamma):
    if not gamma > 0:
        raise ValueError(f"gamma = C_d/C_v must be > 0, got {gamma}")


# --------------------------------------------------------------------------------------------
# trace mode
# --------------------------------------------------------------------------------------------


@dataclass
class PredictOptions:
    batch: int = 1
    context: int | None = None        # one context for every sequence (default: the trace's)
    k_max: int | None = None          # default: the largest k recorded
    n_boot: int = 1000
    seed: int = 0
    level: float = 0.95
    policy: str | None = None         # for trace groups whose policy specsim does not model
    sparsity: float | None = None     # for trace groups recorded without s
    #: answers of this many tokens: a last iteration's drafts past the answer are accepted
    #: but not emitted (``analytical.emitted_tokens_per_iteration``); None: unbounded answers
    output_tokens: int | None = None
    #: the drafter for groups whose trace does not record one (``--drafter``); None: such
    #: groups are costed as sparse self-speculation with ``policy``
    drafter: object | None = None
    #: an engine profile (``specsim.costs.engine_profile``) applied on top of the costs,
    #: around the drafter's: the serving engine's own steps (``--engine-profile``)
    engine_profile: object | None = None


def _profiled(costs: CostModel, opts: PredictOptions) -> CostModel:
    if opts.engine_profile is None:
        return costs
    from specsim.costs.engine_profile import ProfiledCostModel
    return ProfiledCostModel(costs, opts.engine_profile)


def _group_costs(costs: CostModel, contexts, ks, s, policy) -> list[IterationCost]:
    return [costs.iteration(contexts, int(k), s, policy) for k in ks]


def workload_contexts(trace: Trace, opts: PredictOptions, notes: list[str]
                      ) -> tuple[np.ndarray, str]:
    """The batch every group is costed on: ``--context`` for all sequences, else quantiles of
    the context lengths of all recorded iterations (one workload for all groups, so that
    groups are compared on the same batch), else an assumed length."""
    if opts.context is not None:
        return np.full(opts.batch, opts.context, dtype=np.int64), "--context"
    recorded = [r.context for r in trace.requests]
    recorded += [np.array([h.context]) for h in trace.histograms if h.context is not None]
    if recorded:
        return batch_contexts(np.concatenate(recorded), opts.batch), "trace quantiles"
    notes.append(f"the trace has no context lengths: assumed {DEFAULT_CONTEXT} tokens per "
                 f"sequence (use --context)")
    return np.full(opts.batch, DEFAULT_CONTEXT, dtype=np.int64), "assumed"


def prompt_weights(trace: Trace, n_boot: int, seed: int):
    """Bootstrap replicates over *prompts*, shared by every group, so that policy comparisons
    are paired (the same resampled prompts under each policy). None when requests carry no
    ``prompt_id`` or the trace has aggregate histograms."""
    if trace.histograms or not trace.requests or any(r.prompt_id is None for r in trace.requests):
        return None
    prompts = sorted({r.prompt_id for r in trace.requests})
    rng = np.random.default_rng(seed)
    w = analytical.bootstrap_weights(np.ones(len(prompts)), n_boot, rng)
    return {pid: w[:, i] for i, pid in enumerate(prompts)}


def predict_group(trace: Trace, costs: CostModel, opts: PredictOptions, notes: list[str],
                  contexts: np.ndarray, context_source: str, paired=None,
                  acceptance_cache: dict | None = None) -> GroupResult:
    """One (policy, s) group of a trace: its acceptance (replayed, bootstrapped) priced by
    ``costs`` at ``contexts``. ``acceptance_cache`` (a dict kept by the caller for one trace)
    holds what does not depend on the costs or the workload — the acceptance estimate, its
    bootstrap replicates and the extrapolation check — so that pricing the same trace on many
    (hardware, batch, context) settings replays it once per group. The result keeps its
    bootstrap speedups (``bootstrap_speedups``) for paired comparisons."""
    from specsim.policies import POLICIES

    first = (trace.requests or trace.histograms)[0]
    policy, s = first.policy, first.s
    model_policy, model_s = policy, s
    drafter = group_drafter(policy, trace.header, opts)
    if drafter is not None:
        return _drafter_group(trace, costs, opts, notes, contexts, context_source, paired,
                              acceptance_cache, drafter)
    if policy not in POLICIES:
        model_policy = opts.policy or DEFAULT_POLICY
        notes.append(f"policy '{policy}' is not a sparse-selection policy specsim models: "
                     f"costed as '{model_policy}'" + ("" if opts.policy else " (use --policy)"))
    elif opts.policy and opts.policy != policy:
        model_policy = opts.policy
    if s is None:
        model_s = opts.sparsity or (1.0 if model_policy == "full" else DEFAULT_SPARSITY)
        if model_policy != "full":
            notes.append(f"group '{policy}' has no sparsity: costed at s={model_s}"
                         + ("" if opts.sparsity else " (use --sparsity)"))

    return _priced_group(trace, _profiled(costs, opts), opts, notes, contexts, context_source,
                         paired, acceptance_cache, CostedAs(model_policy, model_s),
                         "token replay")


def group_drafter(policy: str, header: dict, opts: PredictOptions):
    """The drafter of a group other than sparse self-speculation: recorded in the trace, else
    ``opts.drafter`` for a group whose policy specsim does not model; None: sparse
    self-speculation (a sparse policy, or an opaque one costed with ``--policy``)."""
    from specsim.drafters import recorded_drafter

    recorded = recorded_drafter(policy, header)
    if recorded is not None:
        if recorded.kind == "sparse-self":
            return None
        given = opts.drafter
        if given is not None and given.kind == recorded.kind:
            return given       # the recorded kind, with the head and tree --drafter names
        return recorded
    given = opts.drafter
    return None if given is None or given.kind == "sparse-self" else given


def _drafter_group(trace: Trace, costs: CostModel, opts: PredictOptions, notes: list[str],
                   contexts, context_source, paired, acceptance_cache, drafter) -> GroupResult:
    """A group drafted by ``drafter``: its draft step priced through ``costs``' source, the
    target's verify, and acceptance replayed by the per-depth survival."""
    from specsim.drafters import DrafterCosts, source_kind

    first = (trace.requests or trace.histograms)[0]
    policy = first.policy
    wrapped = _profiled(DrafterCosts(costs, drafter), opts)
    priced_by = source_kind(costs)
    where = {"trace": "recorded in the trace", "--drafter": "given by --drafter",
             "assumed": "assumed"}[drafter.origin]
    notes.append(f"group '{policy}': drafter {drafter.label} ({where}); its draft step "
                 f"priced by {priced_by}" + ("" if priced_by == costs.name else
                                             f" ({costs.name} holds no draft step of it)")
                 + ", the verify by the target's " + costs.name)
    if drafter.tree_tokens is not None:
        notes.append(f"group '{policy}': a token tree of {drafter.tree_tokens} tokens, verified "
                     f"as q = {drafter.tree_tokens}; a tree shape has no counterfactual to "
                     f"another tree, so only k = k_rec replays what was recorded: other k keep "
                     f"the recorded tree's verify and truncate its accepted depth")
    else:
        notes.append(f"group '{policy}': acceptance at another k by the per-depth survival "
                     f"E[m+1](k) = 1 + Σ_(i≤k) P_i from the depths recorded at k_rec (valid "
                     f"where the i-th draft does not depend on k; tokens over time in total)")
    costed = CostedAs(drafter.label, None, drafter=drafter.label,
                      drafter_origin=drafter.origin, draft_priced_by=priced_by,
                      tree_tokens=drafter.tree_tokens, replay=drafter.replay)
    return _priced_group(trace, wrapped, opts, notes, contexts, context_source, paired,
                         acceptance_cache, costed, drafter.replay)


def _priced_group(trace: Trace, costs: CostModel, opts: PredictOptions, notes: list[str],
                  contexts, context_source, paired, acceptance_cache, costed: CostedAs,
                  replay: str) -> GroupResult:
    """A group's acceptance (``replay``: the greedy token replay, else the per-depth survival)
    priced by ``costs`` as ``costed`` says."""
    first = (trace.requests or trace.histograms)[0]
    policy, s = first.policy, first.s
    model_policy, model_s = costed.policy, costed.s
    survival_replay = replay != "token replay"
    key = (policy, s, opts.k_max, opts.n_boot, opts.seed, paired is not None, survival_replay)
    cached = acceptance_cache.get(key) if acceptance_cache is not None else None
    if cached is None:
        est: AcceptanceEstimate = estimate_acceptance(trace, k_max=opts.k_max)
        weights = None
        if paired is not None:
            weights = np.stack([paired[r.prompt_id] for r in trace.requests], axis=1)
        rng = np.random.default_rng(opts.seed)
        if survival_replay:
            from specsim.drafters import survival_by_k
            # the per-depth counterfactual: the same P_i at every k (E[m+1] = 1 + Σ_{i≤k} P_i)
            est = replace(est, survival_k=survival_by_k(est.survival))
            boot_P = survival_by_k(est.bootstrap_survival(opts.n_boot, rng, weights))
        else:
            boot_P = est.bootstrap_survival_k(opts.n_boot, rng, weights)  # [replicate, k, i]
        extrapolation = extrapolation_error(trace, est.observed // 2) \
            if est.observed >= 4 else None
        cached = (est, boot_P, extrapolation)
        if acceptance_cache is not None:
            acceptance_cache[key] = cached
    est, boot_P, extrapolation = cached
    counts = est.counts
    if counts.unit == "iteration":
        notes.append(f"group '{policy}' s={s}: only aggregate counts, so the bootstrap resamples "
                     f"iterations; its CIs ignore between-request variation (too narrow)")
    ks = est.ks
    plain = costs.plain_step(contexts)
    iters = _group_costs(costs, contexts, ks, model_s, model_policy)
    t_iter = np.array([c.seconds for c in iters])
    tokens = est.expected_tokens
    emitted = tokens
    if opts.output_tokens is not None:
        if opts.output_tokens < 2:
            raise ValueError("output tokens must be ≥ 2 (the first comes from the prefill)")
        n = opts.output_tokens - 1       # tokens the iterations emit (plain: that many steps)
        emitted = np.array([analytical.emitted_tokens_per_iteration(est.survival_at(int(k)),
                                                                    int(k), n) for k in ks])
    speedups = analytical.speedup(emitted, plain.seconds, t_iter)

    boot_tokens = 1.0 + boot_P.sum(axis=2)
    boot_emitted = boot_tokens if opts.output_tokens is None else np.stack(
        [analytical.emitted_tokens_per_iteration(boot_P[:, k - 1, :k], int(k),
                                                 opts.output_tokens - 1)
         for k in ks], axis=1)
    boot_speedups = boot_emitted * plain.seconds / t_iter[None, :]
    boot_kstar = ks[np.argmax(boot_speedups, axis=1)]
    k_star, s_at = analytical.best_k(speedups, ks)
    ci = lambda x: analytical.percentile_interval(x, opts.level)  # noqa: E731
    k_values, k_freq = np.unique(boot_kstar, return_counts=True)

    curve = []
    for j, k in enumerate(ks):
        helps = None
        if j + 1 < len(ks):
            gamma_prime = (t_iter[j + 1] - t_iter[j]) / plain.seconds
            # the tokens one more draft adds: P_{k+1} in the per-iteration form
            helps = analytical.extend_k_helps(tokens[j + 1] - tokens[j], gamma_prime,
                                              speedups[j])
        curve.append(CurvePoint(
            k=int(k), expected_tokens=float(tokens[j]),
            expected_tokens_ci=_ci(ci(boot_tokens[:, j])),
            emitted_tokens=float(emitted[j]),
            speedup=float(speedups[j]), speedup_ci=_ci(ci(boot_speedups[:, j])),
            iteration_ms=_ms(t_iter[j]),
            split_ms=CostSplit(**{name: _ms(v) for name, v in iters[j].split().items()}),
            extrapolated=bool(est.extrapolated[j]),
            replay=("fitted" if k > counts.k_recorded or est.extrapolated[j] else
                    "counterfactual" if replay != "recorded tree only" or
                    k == counts.k_recorded else "truncated tree"),
            extend_helps=helps))
    k_ci = ci(boot_kstar)
    if k_star == ks[-1]:
        notes.append(f"{policy} s={s}: k*={k_star} is the largest k evaluated; the optimum may "
                     f"lie beyond (raise --k-max to extrapolate)")
    return GroupResult(
        policy=policy, s=s, costed_as=costed,
        requests=len(trace.requests) + len(trace.histograms), bootstrap_unit=counts.unit,
        iterations=counts.iterations, k_recorded=counts.k_recorded,
        observed_positions=est.observed,
        observed_tokens_per_iteration=est.observed_tokens_per_iteration,
        observed_alpha=est.observed_alpha,
        positions=[Position(i=i + 1, reached=int(est.reached[i]),
                            p=None if not np.isfinite(est.conditional[i]) else
                            float(est.conditional[i]),
                            P=float(np.prod(np.nan_to_num(est.conditional[: i + 1]))))
                   for i in range(counts.positions)],
        contexts=contexts.tolist(), context_source=context_source,
        plain_step_ms=_ms(plain.seconds),
        curve=curve,
        k_star=k_star, speedup_at_k_star=s_at,
        speedup_at_k_star_ci=_ci(ci(boot_speedups[:, k_star - 1])),
        k_star_ci=CI(int(k_ci.low), int(k_ci.high)),
        k_star_frequency={int(k): round(float(f) / opts.n_boot, 4)
                          for k, f in zip(k_values, k_freq)},
        cost_split_at_k_star=CostSplit(**iters[k_star - 1].split()),
        extrapolation_check=None if extrapolation is None else
        ExtrapolationCheck(**extrapolation),
        bootstrap_speedups=boot_speedups)


def predict_trace(trace: Trace, costs: CostModel, opts: PredictOptions | None = None,
                  acceptance_cache: dict | None = None) -> PredictReport:
    """Speedups of every group of ``trace`` under ``costs``; ``acceptance_cache``: see
    :func:`predict_group` (a dict shared by calls on the same trace)."""
    opts = opts or PredictOptions()
    notes: list[str] = []
    if trace.synthetic:
        notes.append("this trace is SYNTHETIC (generated, not recorded on a real model): "
                     "its acceptance numbers illustrate the tool, they describe no model")
    contexts, context_source = workload_contexts(trace, opts, notes)
    if opts.output_tokens is not None:
        notes.append(f"answers of {opts.output_tokens} tokens: speedups count the tokens an "
                     f"answer emits per iteration (its last iteration's surplus drafts are not "
                     f"output), not E[m+1]")
    paired = prompt_weights(trace, opts.n_boot, opts.seed)
    groups = [predict_group(g, costs, opts, notes, contexts, context_source, paired,
                            acceptance_cache)
              for g in trace.groups().values()]
    best = max(groups, key=lambda g: g.speedup_at_k_star)
    return PredictReport(
        trace=trace.path, synthetic=trace.synthetic, trace_model=trace.header.get("model"),
        bootstrap_paired_by_prompt=paired is not None,
        cost_model=costs.name, batch=opts.batch, bootstrap=opts.n_boot,
        confidence_level=opts.level,
        groups=[replace(g, bootstrap_speedups=None) for g in groups],
        policies=_by_policy(groups),
        best=Best(best.policy, best.s, best.k_star, best.speedup_at_k_star,
                  best.speedup_at_k_star_ci, _distinguishable(groups, best)),
        notes=notes,
        policy_comparison=compare_policies(groups, opts.level))


def _boot_at_k_star(group: GroupResult) -> np.ndarray:
    return group.bootstrap_speedups[:, group.k_star - 1]


def _distinguishable(groups: list[GroupResult], best: GroupResult) -> Distinction | None:
    """Is the best (policy, s, k) better than the runner-up group in the bootstrap? Counts
    the replicates in which the best's speedup at its k* beats the runner-up's at its k*."""
    others = [g for g in groups if g is not best]
    if not others:
        return None
    runner = max(others, key=lambda g: g.speedup_at_k_star)
    a, b = _boot_at_k_star(best), _boot_at_k_star(runner)
    n = min(a.size, b.size)
    share = float(np.mean(a[:n] > b[:n]))
    return Distinction(RunnerUp(runner.policy, runner.s, runner.k_star, runner.speedup_at_k_star),
                       share_of_replicates_best_wins=share, distinguishable=share >= 0.95)


def compare_policies(groups: list[GroupResult], level: float = 0.95
                     ) -> list[PolicyComparison]:
    """Every pair of policies, each at its own optimum (best s and k): in what share of
    bootstrap replicates does the first beat the second (an exact tie counts as half a win, so
    two identical policies share 0.5, not 0)? Two policies are *distinguishable* when that
    share is ≥ level or ≤ 1 − level. The groups must carry their bootstrap speedups (as
    :func:`predict_group` returns them)."""
    best: dict[str, GroupResult] = {}
    for g in groups:
        if g.policy not in best or g.speedup_at_k_star > best[g.policy].speedup_at_k_star:
            best[g.policy] = g
    ranked = sorted(best.values(), key=lambda g: -g.speedup_at_k_star)
    out = []
    for i, a in enumerate(ranked):
        for b in ranked[i + 1:]:
            sa, sb = _boot_at_k_star(a), _boot_at_k_star(b)
            n = min(sa.size, sb.size)
            share = float(np.mean((sa[:n] > sb[:n]) + 0.5 * (sa[:n] == sb[:n])))
            out.append(PolicyComparison(a.policy, b.policy, a.speedup_at_k_star,
                                        b.speedup_at_k_star, share_a_wins=share,
                                        distinguishable=share >= level or share <= 1.0 - level))
    return out


def _by_policy(groups: list[GroupResult]) -> list[PolicyOptimum]:
    """Per policy: the joint (k*, s*) over the recorded s values and, with ≥ 2 s values,
    Vegas' 3-step tuning path beside it."""
    out = []
    for policy in sorted({g.policy for g in groups}):
        gs = sorted((g for g in groups if g.policy == policy),
                    key=lambda g: -1 if g.s is None else g.s)
        k_common = min(len(g.curve) for g in gs)
        ks = list(range(1, k_common + 1))
        ss = [g.s if g.s is not None else float("nan") for g in gs]
        speed = np.array([[g.at(k).speedup for g in gs] for k in ks])
        tokens = np.array([[g.at(k).expected_tokens for g in gs] for k in ks])
        k_star, s_star, best = analytical.best_k_s(speed, ks, ss)
        three = None
        if len(gs) >= 2 and not any(g.s is None for g in gs):
            path = analytical.vegas_three_step(tokens, speed, ks, ss)
            three = ThreeStep(path=[tuple(p) for p in path.path], k=path.k_step2,
                              s=path.s_step3, speedup=path.speedup, gap_to_joint=path.gap)
        out.append(PolicyOptimum(policy, k_star, None if np.isnan(s_star) else s_star, best,
                                 [g.s for g in gs], three))
    return out


# --------------------------------------------------------------------------------------------
# tuning on a held-out part: no tuning on the test set
# --------------------------------------------------------------------------------------------


def split_trace(trace: Trace, fraction: float, seed: int = 0) -> tuple[Trace, Trace]:
    """(tuning part, evaluation part): ``round(fraction × prompts)`` of the trace's prompts
    (``prompt_id``, else the request id; at least one on each side) go to the evaluation
    part, the first in the order of a seeded hash, so that the same prompt lands on the same
    side under every policy and s."""
    import hashlib

    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout fraction must lie in (0, 1), got {fraction}")
    if trace.histograms:
        raise ValueError("a holdout split needs per-request records; this trace has "
                         "aggregate histograms")

    def rank(key: str) -> bytes:
        return hashlib.sha256(f"{seed}:{key}".encode()).digest()

    keys = sorted({r.prompt_id or r.id for r in trace.requests}, key=rank)
    count = min(max(round(fraction * len(keys)), 1), max(len(keys) - 1, 1))
    held = set(keys[:count])
    tune, evaluate = Trace(trace.header, path=trace.path), Trace(trace.header, path=trace.path)
    for r in trace.requests:
        (evaluate if (r.prompt_id or r.id) in held else tune).requests.append(r)
    for part, name in ((tune, "tuning"), (evaluate, "evaluation")):
        missing = set(trace.groups()) - set(part.groups())
        if missing:
            raise ValueError(f"the {name} part has no requests for "
                             f"{', '.join(f'{p} s={s}' for p, s in sorted(missing, key=str))}; "
                             f"use another --holdout fraction or seed")
    return tune, evaluate


def holdout_report(trace: Trace, costs: CostModel, opts: PredictOptions, fraction: float,
                   seed: int = 0) -> Holdout:
    """Pick each policy's (k*, s*) on the tuning part, report its speedup on the evaluation
    part, and the optimism of tuning on the evaluation part itself:
    ``optimism = S_eval(tuned on eval) − S_eval(tuned on the tuning part)`` (≥ 0)."""
    tune, evaluate = split_trace(trace, fraction, seed)
    tuned = predict_trace(tune, costs, opts)
    tested = predict_trace(evaluate, costs, opts)
    rows = []
    for picked in tuned.policies:
        own = tested.policy(picked.policy)
        on_eval = tested.group(picked.policy, picked.s_star).at(picked.k_star)
        rows.append(held_out_row(picked.policy, (picked.k_star, picked.s_star), picked.speedup,
                                 on_eval.speedup, (own.k_star, own.s_star, own.speedup),
                                 speedup_ci=on_eval.speedup_ci))
    rows.sort(key=lambda r: -r.speedup_on_evaluation_part)
    return Holdout(holdout_fraction=fraction, seed=seed, tuning_requests=len(tune.requests),
                   evaluation_requests=len(evaluate.requests), policies=rows, best=rows[0])


def held_out_row(policy: str, tuned: tuple, on_tuning: float, on_evaluation: float,
                 own: tuple, speedup_ci: CI | None = None) -> HoldoutRow:
    """One policy's held-out result, the same for the analytical and the simulated tuning:
    ``tuned`` = (k, s) picked on the tuning part, its speedup there and on the evaluation
    part, and ``own`` = (k, s, speedup) picked on the evaluation part itself; ``optimism`` is
    how much tuning on the test set would have flattered the result."""
    k, s = tuned
    own_k, own_s, own_speedup = own
    return HoldoutRow(policy, Choice(k, s), on_tuning, on_evaluation,
                      ChoiceSpeedup(own_k, own_s, own_speedup), own_speedup - on_evaluation,
                      speedup_ci=speedup_ci)


def holdout_row(policy: str, tuned: tuple, on_tuning: float, on_evaluation: float,
                own: tuple) -> dict:
    """:func:`held_out_row` as its JSON object, for the simulator's held-out sweep
    (:func:`specsim.simulator.tuning.holdout_summary`), whose rows are JSON objects."""
    return held_out_row(policy, tuned, on_tuning, on_evaluation, own).to_json()


#: Words by which a cost note says a price left what was measured.
OUTSIDE_WORDS = ("outside the measured", "beyond the measured", "below the measured",
                 "not calibrated", "not measured", "extrapolated")


def describe_setting(report: PredictReport, spec, hw, tp: int, costs_note: str,
                     cost_validation: str | None = None, *, costs: CostModel | None = None,
                     trace_header: dict | None = None, model_reason: str | None = None
                     ) -> PredictReport:
    """The report with what it was costed for (model, hardware, tp, cost model) and notes:
    the batch does not fit in the GPU's memory; the trace was recorded on another model
    (``model_reason`` says how the costed model was chosen) or imported with assumptions
    (its header's ``import_warnings``); the best group's prices left what ``costs`` measured."""
    def needs(g) -> tuple[float, str]:
        if g.costed_as.drafter is None:
            return spec.memory_bytes(g.contexts, tp), ""
        from specsim.drafters import drafter_memory_bytes, parse_drafter
        extra, what = drafter_memory_bytes(parse_drafter(g.costed_as.drafter), spec,
                                           g.contexts, tp)
        return spec.memory_bytes(g.contexts, tp) + extra, what

    need, need_what = max((needs(g) for g in report.groups), key=lambda x: x[0])
    notes = list(report.notes)
    header = trace_header or {}
    notes += [f"import: {w}" for w in header.get("import_warnings") or []]
    from specsim.specs import catalogue_name
    recorded = str(header.get("model") or "")
    same = spec.name.lower() in (recorded.lower(), recorded.lower().rsplit("/", 1)[-1],
                                 catalogue_name(recorded))
    if recorded and not same:
        why = f" ({model_reason})" if model_reason else ""
        notes.append(f"the trace was recorded on '{recorded}' and is costed as {spec.name}"
                     f"{why}: acceptance is the recorded model's, step times {spec.name}'s")
    elif not recorded and model_reason and model_reason.startswith("default"):
        notes.append(f"the trace names no model; costed as {spec.name} ({model_reason})")
    if costs is not None and report.groups:
        best = max(report.groups, key=lambda g: g.speedup_at_k_star)
        priced = costs
        if best.costed_as.drafter is not None:
            from specsim.drafters import DrafterCosts, parse_drafter
            priced = DrafterCosts(costs, parse_drafter(best.costed_as.drafter,
                                                       tree_tokens=best.costed_as.tree_tokens))
        it = priced.iteration(best.contexts, best.k_star, best.costed_as.s,
                              best.costed_as.policy)
        outside = [n for part in (costs.plain_step(best.contexts), it.draft_step, it.verify,
                                  it.selection) for n in part.notes
                   if any(w in n for w in OUTSIDE_WORDS)]
        if outside:
            shown = list(dict.fromkeys(outside))
            notes.append("prices outside what the cost source measured (at the best "
                         "setting): " + "; ".join(shown[:3])
                         + (f"; and {len(shown) - 3} more" if len(shown) > 3 else ""))
    if need > hw.memory_bytes:
        notes.append(f"the batch does not fit: weights + KV need {need / 1e9:.0f} GB per GPU"
                     + (f" (with the {need_what})" if need_what else "")
                     + f", {hw.name} has {hw.memory_bytes / 1e9:.0f} GB (lower --batch or "
                       f"raise --tp)")
    return replace(report, model=ModelSummary.of(spec), hardware=HardwareSummary.of(hw), tp=tp,
                   costs=costs_note, cost_validation=cost_validation, notes=notes)


def measured_beside(report: PredictReport, trace_header: dict, hardware, recorded_on=None,
                    vanilla: dict | None = None) -> PredictReport:
    """The report with what the trace's run timed itself (a Spec-Bench file's ``measured``
    header: Σ new_tokens / Σ wall_time), against ``vanilla`` (the same totals of the plain
    run) where given, and the prediction at the recorded k beside it. ``recorded_on`` is the
    run's GPU as a :class:`~specsim.specs.HardwareSpec` (None: not given); the two compare
    only when it is the report's ``hardware``."""
    got = trace_header.get("measured")
    if not got:
        if vanilla is not None:
            raise ValueError("a vanilla run compares with a trace that timed itself (a "
                             "Spec-Bench answer file)")
        return report
    best = max(report.groups, key=lambda g: g.speedup_at_k_star)
    k_rec = min(best.k_recorded, len(best.curve))
    predicted = best.at(k_rec).speedup
    speedup = None if vanilla is None else got["tokens_per_s"] / vanilla["tokens_per_s"]
    comparable = recorded_on is not None and recorded_on.name == hardware.name
    if recorded_on is None:
        note = (f"the run's GPU is not recorded (give --recorded-on): its timing is shown, "
                f"not compared with the prediction for {hardware.name}")
    elif not comparable:
        note = (f"recorded on {recorded_on.name}, predicted for {hardware.name}: not compared "
                f"(predict with --hardware {recorded_on.name} to compare)")
    elif speedup is None:
        note = "no vanilla run given (--vanilla): the measured speedup is unknown"
    else:
        note = (f"measured {speedup:.2f}× against predicted {predicted:.2f}× at k = {k_rec} "
                f"(batch 1 in the run; the prediction at batch {report.batch})")
    return replace(report, measured=Measured(
        tokens_per_s=float(got["tokens_per_s"]), new_tokens=int(got["new_tokens"]),
        wall_time_s=float(got["wall_time_s"]),
        recorded_on=None if recorded_on is None else recorded_on.name, comparable=comparable,
        note=note, vanilla_tokens_per_s=None if vanilla is None else
        float(vanilla["tokens_per_s"]), speedup=speedup,
        predicted_speedup_at_k_recorded=float(predicted), k_recorded=int(k_rec)),
        notes=[*report.notes, f"measured: {note}"])
