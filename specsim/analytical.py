"""The analytical speedup model of sparse-attention self-speculative decoding.

Every formula of the method lives here exactly once; the rest of specsim calls these functions.
Notation (DESIGN.md): ``k`` draft length, ``s`` sparsity ratio, ``m`` accepted drafts in one
iteration (each iteration emits ``m + 1`` tokens), ``α = E[m/k]``, ``p_i`` the conditional
per-position acceptance rate, ``P_i = Π_{j≤i} p_j`` the survival, ``C_d`` one draft step,
``C_v(q)`` one verify pass over q query tokens, ``C_sel`` the selection cost per iteration,
``T_ar`` one plain decoding step, ``γ = C_d / C_v``.

All functions are pure: numbers or numpy arrays in, numbers or arrays out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

#: The longest draft (k) the models take. The verify kernel runs k ≤ 15 (16 query rows); the
#: analytical model and the simulator are exact at any k, but their per-k tables grow as k²
#: (``survival_by_k``), so a larger k is refused rather than half-allocated.
MAX_K = 64


def check_k_max(k_max, what: str = "k") -> int:
    """``k_max`` when it is an integer in 1..:data:`MAX_K`; else a one-line
    :class:`~specsim.errors.LimitError` naming the limit."""
    from specsim.errors import LimitError, quote
    if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)):
        raise LimitError(what, f"expected an integer draft length, got {quote(k_max)}")
    if not 1 <= int(k_max) <= MAX_K:
        raise LimitError(what, f"draft length {quote(int(k_max))} is outside 1..{MAX_K} "
                               f"(the longest draft specsim models is k = {MAX_K})")
    return int(k_max)


# --------------------------------------------------------------------------------------------
# SparseSpec-L's closed form (acceptance summarised by α = E[m/k])
# --------------------------------------------------------------------------------------------


def sparsespec_speedup(alpha, k, gamma):
    """SparseSpec-L Eq. 1: ``S = (α·k + 1) / (k·γ + 1)``.

    One iteration emits ``α·k + 1`` tokens on average and costs ``k`` draft steps of relative
    cost γ plus one verify pass (cost 1, taken equal to a plain step).
    """
    alpha, k, gamma = np.asarray(alpha, float), np.asarray(k, float), np.asarray(gamma, float)
    if k.size and float(np.max(k)) > MAX_K:
        check_k_max(int(np.max(k)))
    return (alpha * k + 1.0) / (k * gamma + 1.0)


def sparsespec_speedup_slope(alpha, k, gamma):
    """SparseSpec-L Eq. 2: ``∂S/∂k = (α − γ) / (k·γ + 1)²``.

    Its sign does not depend on k: under Eq. 1's model a longer draft helps iff α > γ.
    """
    alpha, k, gamma = np.asarray(alpha, float), np.asarray(k, float), np.asarray(gamma, float)
    return (alpha - gamma) / (k * gamma + 1.0) ** 2


# --------------------------------------------------------------------------------------------
# Expected tokens per iteration, E[m + 1]
# --------------------------------------------------------------------------------------------


def expected_tokens_iid(a, k):
    """``E[m+1] = (1 − a^{k+1}) / (1 − a)`` for i.i.d. acceptance probability ``a`` per draft.

    (Leviathan et al. 2023; MagicDec's Ω.) The limit a → 1 is ``k + 1``.
    """
    a, k = np.asarray(a, float), np.asarray(k, float)
    near_one = np.isclose(a, 1.0)
    safe_a = np.where(near_one, 0.5, a)
    value = (1.0 - safe_a ** (k + 1.0)) / (1.0 - safe_a)
    return np.where(near_one, k + 1.0, value)[()]


def survival_from_conditional(p) -> np.ndarray:
    """``P_i = Π_{j≤i} p_j``: probability that drafts 1..i are all accepted."""
    p = np.asarray(p, float)
    if np.any((p < 0) | (p > 1)):
        raise ValueError("conditional acceptance rates must lie in [0, 1]")
    return np.cumprod(p, axis=-1)


def conditional_from_survival(P) -> np.ndarray:
    """Inverse of :func:`survival_from_conditional`: ``p_i = P_i / P_{i-1}`` (``P_0 = 1``).

    Where ``P_{i-1} = 0`` the rate is undefined; it is returned as 0.
    """
    P = np.asarray(P, float)
    prev = np.concatenate([np.ones(P.shape[:-1] + (1,)), P[..., :-1]], axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(prev > 0, P / np.where(prev > 0, prev, 1.0), 0.0)


def emitted_tokens_per_iteration(P, k: int, tokens: int):
    """Tokens a request emits per iteration when it stops after ``tokens`` of them.

    ``E[m+1]`` counts every accepted draft, but a request's last iteration is cut at its
    output length, so over a finite answer fewer tokens per iteration reach the user:
    ``tokens / E[iterations]``, where with i.i.d. iterations (``P_i = P(m ≥ i)``, i ≤ k) the
    expected iterations to emit n tokens satisfy ``I(n) = 1 + Σ_j P(m+1 = j) I(n − j)``,
    ``I(n ≤ 0) = 0``. Tends to ``E[m+1]`` as ``tokens`` grows. ``P`` is [K] (→ a float) or
    one survival curve per row, e.g. bootstrap replicates [R, K] (→ [R])."""
    P = np.asarray(P, float)
    if tokens < 1:
        raise ValueError("tokens must be ≥ 1")
    if not 0 <= k <= P.shape[-1]:
        raise ValueError(f"k must lie in 0..{P.shape[-1]}")
    rows = np.atleast_2d(P)[:, :k]
    ones, zeros = np.ones((rows.shape[0], 1)), np.zeros((rows.shape[0], 1))
    survival = np.concatenate([ones, rows, zeros], axis=1)        # P(m ≥ i), i = 0..k+1
    pmf = survival[:, :-1] - survival[:, 1:]                      # P(m + 1 = j), j = 1..k+1
    iters = np.zeros((rows.shape[0], tokens + 1))
    for n in range(1, tokens + 1):
        width = min(n, k + 1)
        iters[:, n] = 1.0 + np.sum(pmf[:, :width] * iters[:, n - 1::-1][:, :width], axis=1)
    out = tokens / iters[:, tokens]
    return float(out[0]) if P.ndim == 1 else out


def expected_tokens_from_survival(P, k=None):
    """Per-position form: ``E[m+1] = 1 + Σ_{i=1..k} P_i``.

    With ``k=None`` returns the whole curve for k = 0..len(P) (index = k).
    """
    P = np.asarray(P, float)
    curve = np.concatenate([np.ones(P.shape[:-1] + (1,)), 1.0 + np.cumsum(P, axis=-1)], axis=-1)
    if k is None:
        return curve
    k = np.asarray(k, int)
    if np.any(k < 0) or np.any(k > P.shape[-1]):
        raise ValueError(f"k must lie in 0..{P.shape[-1]} for {P.shape[-1]} known positions")
    return curve[..., k]


def alpha_from_survival(P, k: int) -> float:
    """``α = E[m/k] = (Σ_{i≤k} P_i) / k``: SparseSpec-L's acceptance rate from survivals."""
    P = np.asarray(P, float)
    return float(np.sum(P[:k]) / k)


# --------------------------------------------------------------------------------------------
# Iteration time and speedup
# --------------------------------------------------------------------------------------------


def iteration_time(k, draft_step, verify_pass, selection=0.0, overhead=0.0):
    """``T(k, s) = k·C_d(s) + C_v(k+1) + C_sel(s) + overhead``.

    ``verify_pass`` is ``C_v`` already evaluated at ``k + 1`` query tokens; the caller's cost
    model knows how C_v depends on q.
    """
    k = np.asarray(k, float)
    return k * np.asarray(draft_step, float) + np.asarray(verify_pass, float) \
        + np.asarray(selection, float) + np.asarray(overhead, float)


def speedup(expected_tokens, plain_step, iteration_seconds):
    """``S(k, s) = E[m+1]·T_ar / T(k, s)``: tokens per second relative to plain decoding."""
    return np.asarray(expected_tokens, float) * np.asarray(plain_step, float) \
        / np.asarray(iteration_seconds, float)


def best_k(speedups, ks) -> tuple[int, float]:
    """``k* = argmax_k S(k)`` by exhaustive search; ties go to the smaller k (less waste)."""
    speedups = np.asarray(speedups, float)
    i = int(np.argmax(speedups))  # argmax returns the first maximum: the smallest k
    return int(np.asarray(ks)[i]), float(speedups[i])


def best_k_s(speedup_grid, ks, ss) -> tuple[int, float, float]:
    """``(k*, s*) = argmax`` over a grid ``speedup_grid[i_k, i_s]``; ties → smaller k, then s."""
    grid = np.asarray(speedup_grid, float)
    if grid.shape != (len(ks), len(ss)):
        raise ValueError(f"grid shape {grid.shape} does not match ({len(ks)}, {len(ss)})")
    flat = np.nanargmax(grid)
    i_k, i_s = np.unravel_index(flat, grid.shape)
    return int(np.asarray(ks)[i_k]), float(np.asarray(ss)[i_s]), float(grid[i_k, i_s])


def extend_k_helps(survival_next, relative_step_cost, speedup_k) -> bool:
    """Exact efficiency-inversion test: does drafting k+1 tokens beat drafting k?

    Let ``E_k = 1 + Σ_{i≤k} P_i`` be the expected tokens per iteration and ``T_k`` the iteration
    time, so the throughput is ``R_k = E_k / T_k`` and the speedup ``S_k = E_k·T_ar / T_k``.
    One more draft adds ``P_{k+1}`` expected tokens and ``ΔT = T_{k+1} − T_k`` seconds (one more
    draft step, one more verify query, any change in selection). Then::

        R_{k+1} > R_k  ⟺  (E_k + P_{k+1}) / (T_k + ΔT) > E_k / T_k
                       ⟺  P_{k+1}·T_k > E_k·ΔT                      (T_k, ΔT > 0)
                       ⟺  P_{k+1} > (ΔT / T_ar)·(E_k·T_ar / T_k)
                       ⟺  P_{k+1} > γ'·S_k,          γ' = ΔT / T_ar.

    So extending k helps iff the survival of the next draft exceeds the current speedup times
    the relative cost γ' of one more draft step. Under SparseSpec-L's model (T_ar = C_v, ΔT =
    C_d, i.i.d.-free α) this is the discrete analogue of Eq. 2's sign condition. Equality means
    no change; it returns False then (ties favour the shorter draft).
    """
    return bool(survival_next > relative_step_cost * speedup_k)


# --------------------------------------------------------------------------------------------
# SparseSpec-L entropy-guided adaptive k (Eqs. 6–8)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntropyCentres:
    """EMA class centres of draft entropy for accepted and rejected tokens (Eq. 6)."""

    accepted: float
    rejected: float


def update_entropy_centres(centres: EntropyCentres, accepted_entropies, rejected_entropies,
                           beta: float) -> EntropyCentres:
    """Eq. 6: ``H̄ ← β·H̄ + (1 − β)·mean(H of this iteration's tokens in that class)``.

    A class with no token this iteration keeps its centre.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError("smoothing beta must lie in [0, 1]")

    def ema(old, values):
        values = np.asarray(values, float)
        return old if values.size == 0 else beta * old + (1.0 - beta) * float(values.mean())

    return EntropyCentres(ema(centres.accepted, accepted_entropies),
                          ema(centres.rejected, rejected_entropies))


def entropy_acceptance_estimate(entropies, centres: EntropyCentres) -> np.ndarray:
    """Eq. 7: ``p_i = softmax(−|H_i − H̄_acc|, −|H_i − H̄_rej|)`` taken at the accepted class.

    Equivalently ``p_i = 1 / (1 + exp(|H_i − H̄_acc| − |H_i − H̄_rej|))``.
    """
    h = np.asarray(entropies, float)
    return 1.0 / (1.0 + np.exp(np.abs(h - centres.accepted) - np.abs(h - centres.rejected)))


def adaptive_k(entropies, centres: EntropyCentres, draft_step: float, verify_pass: float,
               k_choices: Sequence[int]):
    """Eq. 8: ``k* = argmax_{k∈K} (1 + Σ_{m≤k} Π_{i≤m} p_i) / (k·C_d + C_v)``.

    ``entropies`` are the draft entropies H_1..H_{k_max} of positions 1..max(K); a 2-D array
    ``[batch, k_max]`` gives one k* per row (ties → the smaller k).
    """
    k_choices = np.array(sorted(int(k) for k in k_choices))
    h = np.asarray(entropies, float)
    if h.shape[-1] < k_choices[-1]:
        raise ValueError(f"need {k_choices[-1]} entropies, got {h.shape[-1]}")
    p = entropy_acceptance_estimate(h[..., : k_choices[-1]], centres)
    tokens = expected_tokens_from_survival(survival_from_conditional(p))
    rates = tokens[..., k_choices] / (k_choices * draft_step + verify_pass)
    best = k_choices[np.argmax(rates, axis=-1)]
    return int(best) if np.ndim(best) == 0 else best


# --------------------------------------------------------------------------------------------
# Vegas' 3-step tuning
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TuningPath:
    """Result of Vegas' 3-step procedure, beside the joint grid optimum."""

    k_max: int                # step 1 runs at the largest k of the grid
    plateau_s: float          # step 1: smallest s whose accepted tokens reach the plateau at k_max
    k_step2: int              # step 2: best k at plateau_s
    s_step3: float            # step 3: best s at k_step2
    speedup: float            # speedup at (k_step2, s_step3)
    joint_k: int
    joint_s: float
    joint_speedup: float

    @property
    def path(self) -> list[tuple[int, float]]:
        return [(self.k_max, self.plateau_s), (self.k_step2, self.plateau_s), (self.k_step2, self.s_step3)]

    @property
    def gap(self) -> float:
        """Fraction of the joint optimum's speedup that the 3-step procedure loses (≥ 0)."""
        return 1.0 - self.speedup / self.joint_speedup


def vegas_three_step(expected_tokens_grid, speedup_grid, ks, ss, plateau_tolerance=0.02
                     ) -> TuningPath:
    """Vegas' tuning: (1) at the largest k, sweep s upward until the expected accepted tokens
    plateau (within ``plateau_tolerance`` of the best over s); (2) at that s pick the k of
    maximal throughput; (3) at that k re-pick s for throughput. Grids are ``[i_k, i_s]``.
    """
    tokens = np.asarray(expected_tokens_grid, float)
    grid = np.asarray(speedup_grid, float)
    ks, ss = list(ks), list(ss)
    order = np.argsort(ss)
    at_kmax = tokens[int(np.argmax(ks))]
    ceiling = np.nanmax(at_kmax)
    plateau_i = next(int(i) for i in order if at_kmax[i] >= (1.0 - plateau_tolerance) * ceiling)
    i_k2 = int(np.nanargmax(grid[:, plateau_i]))
    i_s3 = int(np.nanargmax(grid[i_k2, :]))
    joint_k, joint_s, joint = best_k_s(grid, ks, ss)
    return TuningPath(k_max=int(max(ks)), plateau_s=float(ss[plateau_i]), k_step2=int(ks[i_k2]),
                      s_step3=float(ss[i_s3]), speedup=float(grid[i_k2, i_s3]),
                      joint_k=joint_k, joint_s=joint_s, joint_speedup=joint)


# --------------------------------------------------------------------------------------------
# Bootstrap confidence intervals over requests
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def bootstrap_weights(multiplicity, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Resampling weights ``[n_boot, units]``: how often each unit (a request, or an
    iteration when only aggregates exist) is drawn in each bootstrap replicate.

    ``multiplicity[u]`` is how many identical copies unit u stands for (1 for a request).
    """
    multiplicity = np.asarray(multiplicity, float)
    n = int(round(multiplicity.sum()))
    return rng.multinomial(n, multiplicity / multiplicity.sum(), size=n_boot).astype(float)


def conditional_rates_from_counts(reached, accepted):
    """``p_i = (#iterations that accepted draft i) / (#iterations that drafted i with drafts
    1..i−1 all accepted)``. Counts are summed over units already; 0/0 gives NaN."""
    reached, accepted = np.asarray(reached, float), np.asarray(accepted, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(reached > 0, accepted / np.where(reached > 0, reached, 1.0), np.nan)


def percentile_interval(samples, level: float = 0.95) -> Interval:
    samples = np.asarray(samples, float)
    samples = samples[np.isfinite(samples)]
    tail = (1.0 - level) / 2.0 * 100.0
    return Interval(float(np.percentile(samples, tail)), float(np.percentile(samples, 100 - tail)))

