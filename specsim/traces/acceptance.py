"""Acceptance estimated from a trace: per-position rates, survivals, counterfactual replay
and fitted extrapolation, with bootstrap over requests.

For one (policy, s) group, every iteration that drafted k tokens and accepted m of them says,
for each draft position i: the position was *reached* (drafted with drafts 1..i−1 all
accepted) iff ``i ≤ k and m ≥ i − 1``, and *accepted* iff ``m ≥ i``. Pooled over iterations,
``p_i = accepted_i / reached_i`` and ``P_i = Π_{j≤i} p_j``.

Counterfactual replay: under greedy decoding a trace recorded at ``k_rec`` predicts any
``k ≤ k_rec`` by ``m' = min(m, k)`` per iteration, which is exactly ``1 + Σ_{i≤k} P_i`` with the
pooled survivals above (the approximation: selection refresh points move with k). Beyond the
positions the trace supports, a fitted per-position model — ``logit(p_i) = a + b·i``, weighted
least squares on the observed positions — extrapolates, and is flagged as such.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim import analytical
from specsim.traces.format import Trace

#: a position needs this many iterations that reached it to count as observed
MIN_SUPPORT = 20
#: fewer resampling units than this (aggregate histograms only): bootstrap over iterations
MIN_UNITS = 10


@dataclass
class AcceptanceCounts:
    """``reached[u, i−1]``, ``accepted[u, i−1]`` per resampling unit u and draft position i."""

    reached: np.ndarray
    accepted: np.ndarray
    multiplicity: np.ndarray
    unit: str                  # "request" or "iteration" (what a bootstrap resamples)
    iterations: int
    tokens: int                # Σ (m + 1) as recorded
    drafted: int               # Σ k as recorded
    contexts: np.ndarray       # context length of every recorded iteration (may be empty)
    k_recorded: int            # largest k any iteration drafted

    @property
    def positions(self) -> int:
        return self.reached.shape[1]

    def pooled(self, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Summed counts; ``weights`` ``[n, units]`` gives one row per bootstrap replicate."""
        if weights is None:
            weights = self.multiplicity[None, :]
        return weights @ self.reached, weights @ self.accepted


def _position_counts(k: np.ndarray, m: np.ndarray, positions: int):
    i = np.arange(1, positions + 1)[None, :]
    reached = (i <= k[:, None]) & (m[:, None] >= i - 1)
    accepted = m[:, None] >= i
    return reached, accepted


def count_acceptance(trace: Trace) -> AcceptanceCounts:
    """Per-unit counts for one (policy, s) group (a request, or a histogram, is one unit;
    a trace of histograms alone is resampled by iteration)."""
    ks = [int(r.k.max()) for r in trace.requests] + [h.k for h in trace.histograms]
    if not ks:
        raise ValueError("empty trace group")
    positions = max(ks)
    reached_rows, accepted_rows, mult = [], [], []
    iterations = tokens = drafted = 0
    contexts = []
    for r in trace.requests:
        reached, accepted = _position_counts(r.k, r.m, positions)
        reached_rows.append(reached.sum(0))
        accepted_rows.append(accepted.sum(0))
        mult.append(1.0)
        iterations += r.iterations
        tokens += r.tokens
        drafted += int(r.k.sum())
        contexts.append(r.context)
    # a few aggregate histograms (e.g. one per serving engine) are too few units to resample:
    # resample their iterations instead (narrower CIs: between-request variation is lost)
    by_iteration = not trace.requests and len(trace.histograms) < MIN_UNITS
    for h in trace.histograms:
        m_values = np.arange(h.k + 1)
        reached, accepted = _position_counts(np.full(h.k + 1, h.k), m_values, positions)
        if by_iteration:
            keep = h.counts > 0
            reached_rows.extend(reached[keep])
            accepted_rows.extend(accepted[keep])
            mult.extend(h.counts[keep].astype(float))
        else:
            reached_rows.append(h.counts @ reached)
            accepted_rows.append(h.counts @ accepted)
            mult.append(1.0)
        iterations += h.iterations
        tokens += int(h.counts @ (m_values + 1))
        drafted += h.k * h.iterations
        if h.context is not None:
            contexts.append(np.full(min(h.iterations, 1000), h.context))
    return AcceptanceCounts(
        reached=np.asarray(reached_rows, float), accepted=np.asarray(accepted_rows, float),
        multiplicity=np.asarray(mult, float), unit="iteration" if by_iteration else "request",
        iterations=iterations, tokens=tokens, drafted=drafted,
        contexts=np.concatenate(contexts) if contexts else np.zeros(0, np.int64),
        k_recorded=positions)


@dataclass
class PositionFit:
    """``logit(p_i) = a + b·i`` fitted on positions 1..observed (arrays: one per replicate)."""

    a: np.ndarray
    b: np.ndarray

    def rates(self, positions: np.ndarray) -> np.ndarray:
        z = self.a[..., None] + self.b[..., None] * positions
        return 1.0 / (1.0 + np.exp(-z))


def fit_positions(reached: np.ndarray, accepted: np.ndarray, observed: int) -> PositionFit:
    """Weighted least squares of the smoothed empirical logit on the position index, weights
    = iterations that reached the position. Works row-wise on ``[n, positions]`` arrays."""
    reached = np.atleast_2d(reached)[:, :observed]
    accepted = np.atleast_2d(accepted)[:, :observed]
    x = np.arange(1, observed + 1, dtype=float)[None, :]
    y = np.log((accepted + 0.5) / (reached - accepted + 0.5))
    w = reached
    sw = w.sum(1, keepdims=True)
    sw = np.where(sw > 0, sw, 1.0)
    xm = (w * x).sum(1, keepdims=True) / sw
    ym = (w * y).sum(1, keepdims=True) / sw
    sxx = (w * (x - xm) ** 2).sum(1, keepdims=True)
    sxy = (w * (x - xm) * (y - ym)).sum(1, keepdims=True)
    b = np.where(sxx > 1e-12, sxy / np.where(sxx > 1e-12, sxx, 1.0), 0.0)
    a = ym - b * xm
    return PositionFit(a[:, 0], b[:, 0])


def survival_curve(reached: np.ndarray, accepted: np.ndarray, k_max: int, observed: int
                   ) -> np.ndarray:
    """Survivals ``P_1..P_{k_max}``: measured on positions 1..observed, fitted beyond.
    Row-wise on ``[n, positions]`` (bootstrap replicates) or on 1-D counts."""
    one_d = reached.ndim == 1
    reached, accepted = np.atleast_2d(reached), np.atleast_2d(accepted)
    p = np.empty((reached.shape[0], k_max))
    n_obs = min(observed, k_max)
    p[:, :n_obs] = np.nan_to_num(
        analytical.conditional_rates_from_counts(reached[:, :n_obs], accepted[:, :n_obs]))
    if k_max > observed:
        fit = fit_positions(reached, accepted, observed)
        p[:, observed:] = fit.rates(np.arange(observed + 1, k_max + 1, dtype=float))
    P = analytical.survival_from_conditional(np.clip(p, 0.0, 1.0))
    return P[0] if one_d else P


@dataclass
class AcceptanceEstimate:
    """What the trace says for one group, and the curve E[m+1](k) for k = 1..k_max."""

    counts: AcceptanceCounts
    observed: int                  # positions measured directly (support ≥ MIN_SUPPORT)
    conditional: np.ndarray        # p_i, i = 1..positions (NaN where never reached)
    reached: np.ndarray            # iterations that reached position i
    survival: np.ndarray           # P_i, i = 1..k_max (fitted beyond `observed`)
    k_max: int

    @property
    def ks(self) -> np.ndarray:
        return np.arange(1, self.k_max + 1)

    @property
    def expected_tokens(self) -> np.ndarray:
        """E[m+1] for k = 1..k_max."""
        return analytical.expected_tokens_from_survival(self.survival)[1:]

    @property
    def extrapolated(self) -> np.ndarray:
        """True where k goes beyond the positions the trace measured."""
        return self.ks > self.observed

    @property
    def observed_tokens_per_iteration(self) -> float:
        return self.counts.tokens / self.counts.iterations

    @property
    def observed_alpha(self) -> float:
        """α = E[m/k] as recorded (pooled: Σm / Σk)."""
        return (self.counts.tokens - self.counts.iterations) / self.counts.drafted

    def bootstrap_survival(self, n_boot: int, rng: np.random.Generator,
                           weights: np.ndarray | None = None) -> np.ndarray:
        """``[n_boot, k_max]`` survivals, resampling units (requests) with replacement.
        ``weights`` ``[n_boot, units]`` imposes given replicates (e.g. paired by prompt)."""
        w = weights if weights is not None else analytical.bootstrap_weights(
            self.counts.multiplicity, n_boot, rng)
        reached, accepted = self.counts.pooled(w)
        return survival_curve(reached, accepted, self.k_max, self.observed)


def estimate_acceptance(trace: Trace, k_max: int | None = None,
                        min_support: int = MIN_SUPPORT) -> AcceptanceEstimate:
    counts = count_acceptance(trace)
    reached, accepted = counts.pooled()
    reached, accepted = reached[0], accepted[0]
    # observed: the longest prefix of positions with enough support (at least position 1)
    short = np.flatnonzero(reached < min_support)
    observed = max(1, int(short[0]) if short.size else counts.positions)
    k_max = k_max or counts.k_recorded
    survival = survival_curve(reached, accepted, k_max, observed)
    conditional = analytical.conditional_rates_from_counts(reached, accepted)
    return AcceptanceEstimate(counts, observed, conditional, reached, survival, k_max)


def replay_expected_tokens(trace: Trace, k: int) -> float:
    """Direct counterfactual replay: mean of ``min(m, k) + 1`` over recorded iterations that
    drafted at least k tokens (the definition the survival form must reproduce)."""
    total = n = 0
    for r in trace.requests:
        keep = r.k >= k
        total += float(np.sum(np.minimum(r.m[keep], k) + 1))
        n += int(keep.sum())
    for h in trace.histograms:
        if h.k >= k:
            total += float(h.counts @ (np.minimum(np.arange(h.k + 1), k) + 1))
            n += h.iterations
    if n == 0:
        raise ValueError(f"no iteration drafted k ≥ {k}")
    return total / n


def extrapolation_error(trace: Trace, fit_positions_upto: int) -> dict:
    """How wrong is the fitted extrapolation? Fit on positions 1..``fit_positions_upto`` only,
    predict E[m+1] for every larger k the trace measured, compare with replay."""
    full = estimate_acceptance(trace)
    if fit_positions_upto >= full.observed:
        raise ValueError("fit on fewer positions than the trace observed")
    truncated = survival_curve(full.reached, np.nan_to_num(full.conditional * full.reached),
                               full.observed, fit_positions_upto)
    predicted = analytical.expected_tokens_from_survival(truncated)[1:]
    measured = full.expected_tokens[: full.observed]
    ks = np.arange(fit_positions_upto + 1, full.observed + 1)
    rel = predicted[ks - 1] / measured[ks - 1] - 1.0
    return {"fit_positions": fit_positions_upto, "k": ks.tolist(),
            "predicted": predicted[ks - 1].tolist(), "replayed": measured[ks - 1].tolist(),
            "relative_error": rel.tolist(), "max_abs_relative_error": float(np.abs(rel).max())}
