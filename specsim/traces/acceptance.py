"""Acceptance estimated from a trace: per-position rates, survivals, counterfactual replay
and fitted extrapolation, with bootstrap over requests.

For one (policy, s) group, every iteration that drafted k tokens and accepted m of them says,
for each draft position i: the position was *reached* (drafted with drafts 1..i−1 all
accepted) iff ``i ≤ k and m ≥ i − 1``, and *accepted* iff ``m ≥ i``. Pooled over iterations,
``p_i = accepted_i / reached_i`` and ``P_i = Π_{j≤i} p_j``.

Counterfactual replay: under greedy decoding the answer is the same text at every k (greedy
self-speculation is lossless), so a request recorded at one fixed ``k_rec`` says, token by
token, whether the draft predicted it: the m accepted tokens of an iteration yes, the one the
verify pass corrected no, and the bonus token after an iteration that accepted all its drafts
was never drafted (taken as accepted: it follows k_rec accepted drafts). A run at any
``k ≤ k_rec`` is then replayed on that sequence — each iteration accepts the run of predicted
tokens from where the previous one ended, up to k — which gives per-k survivals
``P^(k)_i`` and ``E[m+1](k) = 1 + Σ_{i≤k} P^(k)_i`` (:func:`token_replay_expected_tokens` is
the direct definition). The per-iteration replay ``m' = min(m, k)`` (the survival curve
above: ``E = 1 + Σ_{i≤k} P_i``) starts every replayed iteration where a recorded one started,
i.e. right after a rejection; rejections cluster where drafting is hard, so it under-counts
acceptance at k < k_rec (SmolLM2 on the H200, 48 prompts recorded at k_rec = 12: −4.0% mean
tokens per iteration at k = 2..8 against the measured runs, −1.8% token by token;
VALIDATION.md). Requests whose iterations drafted different k (adaptive or forced traces) and
aggregate histograms keep the per-iteration replay (they have no token sequence to follow).
The approximation left: selection refresh points and the drafts' own KV move with k. Beyond
the positions the trace supports, a fitted per-position model — ``logit(p_i) = a + b·i``,
weighted least squares on the observed positions — extrapolates the survival curve, and is
flagged as such.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim import analytical
from specsim.traces.format import RequestTrace, Trace

#: a position needs this many iterations that reached it to count as observed
MIN_SUPPORT = 20
#: fewer resampling units than this (aggregate histograms only): bootstrap over iterations
MIN_UNITS = 10
#: numbers of one block of :func:`replay_histograms`' ``[segment, k]`` arithmetic (8 MiB)
REPLAY_BLOCK = 1 << 20


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
    # the counterfactual replay at each k = 1..k_recorded: [units, k − 1, position − 1]
    replay_reached: np.ndarray | None = None
    replay_accepted: np.ndarray | None = None

    @property
    def positions(self) -> int:
        return self.reached.shape[1]

    def pooled(self, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Summed counts; ``weights`` ``[n, units]`` gives one row per bootstrap replicate."""
        if weights is None:
            weights = self.multiplicity[None, :]
        return weights @ self.reached, weights @ self.accepted

    def pooled_replay(self, weights: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
        """The replay counts summed over units: ``[k, position]``, or ``[n, k, position]``
        with ``weights`` ``[n, units]``."""
        w = self.multiplicity if weights is None else weights
        return (np.tensordot(w, self.replay_reached, axes=(-1, 0)),
                np.tensordot(w, self.replay_accepted, axes=(-1, 0)))


def fixed_k(r: RequestTrace) -> int | None:
    """The one k every iteration of the request drafted; None when they drafted different k
    (adaptive or forced traces) or there are none."""
    if r.k.size == 0 or np.any(r.k != r.k[0]):
        return None
    return int(r.k[0])


def token_acceptance(r: RequestTrace) -> np.ndarray | None:
    """Per token the request's iterations emitted: 1 where the draft predicted it, 0 where the
    verify pass corrected it, −1 for a bonus token (after an iteration that accepted all its
    drafts: never drafted). None for a request whose iterations drafted different k."""
    k, m = fixed_k(r), r.m.astype(np.int64)
    if k is None:
        return None
    out = np.ones(int(np.sum(m + 1)), np.int8)
    ends = np.cumsum(m + 1) - 1          # each iteration's last token: corrected or bonus
    out[ends] = np.where(m < k, 0, -1)
    return out


def predicted_runs(predicted: np.ndarray) -> np.ndarray:
    """Per token of a :func:`token_acceptance` sequence: how many tokens in a row from it the
    drafts predicted (a bonus token counts as predicted)."""
    n = predicted.size
    stops = np.append(np.flatnonzero(predicted == 0), n)     # rejected tokens, then the end
    at = np.arange(n)
    return stops[np.searchsorted(stops, at)] - at


def replay_tokens(predicted: np.ndarray, k: int, runs: np.ndarray | None = None
                  ) -> np.ndarray:
    """m per iteration of a run at draft length k over a request's token sequence
    (``predicted`` from :func:`token_acceptance`; a bonus token counts as predicted): each
    iteration accepts the run of predicted tokens where the previous one ended, up to k, and
    emits one more (the correction, or the bonus). ``runs``: its :func:`predicted_runs`, when
    the caller has them."""
    run = predicted_runs(predicted) if runs is None else runs
    n = predicted.size
    ms, t = [], 0
    while t < n:
        m = min(int(run[t]), k)
        ms.append(m)
        t += m + 1
    return np.asarray(ms, np.int64)


def replay_histograms(predicted: np.ndarray, k_max: int) -> np.ndarray:
    """``counts[k − 1, m]``, k = 1..k_max, m = 0..k_max: how many iterations of
    :func:`replay_tokens` at draft length k accept m drafts, in time linear in the rejections.
    Between two rejected tokens lie L predicted ones; the run there accepts k drafts
    ``L // (k+1)`` times and then ``L % (k+1)`` (its last iteration emits the rejected
    token); after the last rejection the remainder counts only when it is not 0. The
    segments are taken a block at a time (:data:`REPLAY_BLOCK` numbers of ``[segment, k]``
    at most), so memory stays flat however long the request."""
    n = predicted.size
    zeros = np.flatnonzero(predicted == 0)
    lengths = np.concatenate((zeros, [n])) - np.concatenate(([0], zeros + 1))
    ks = np.arange(1, k_max + 1)
    width = k_max + 1
    offset = (ks - 1)[None, :] * width
    counts = np.zeros(k_max * width, np.int64)
    full = np.zeros(k_max, np.int64)             # iterations that accept all k drafts
    terminated = lengths[:-1]                    # segments that end in a rejected token
    rows = max(1, REPLAY_BLOCK // k_max)
    for start in range(0, terminated.size, rows):
        q, rem = np.divmod(terminated[start:start + rows, None], ks[None, :] + 1)
        full += q.sum(0)
        counts += np.bincount((rem + offset).ravel(), minlength=k_max * width)
    counts = counts.reshape(k_max, width)
    q_last, last = np.divmod(lengths[-1], ks + 1)
    counts[ks - 1, ks] += full + q_last
    hit = last > 0
    counts[ks[hit] - 1, last[hit]] += 1
    return counts


def replay_histogram(predicted: np.ndarray, k: int) -> np.ndarray:
    """``counts[m]``, m = 0..k, of the run at draft length k (:func:`replay_histograms`)."""
    return replay_histograms(predicted, k)[k - 1]


def _histogram_position_counts(counts: np.ndarray, positions: int):
    """Per row (one k each) and position i = 1..positions: iterations that reached and
    accepted it, from ``counts[row, m]`` of iterations that drafted k = row + 1 and accepted m
    (``counts`` has k_max + 1 columns)."""
    rows, width = counts.shape
    at_least = np.cumsum(counts[:, ::-1], axis=1)[:, ::-1].astype(float)   # m ≥ j
    i = np.arange(1, positions + 1)[None, :]
    k = np.arange(1, rows + 1)[:, None]
    upto = i <= k
    reached = np.zeros((rows, positions))
    accepted = np.zeros((rows, positions))
    cols = min(positions, width - 1)
    reached[:, :cols] = at_least[:, :cols]                       # m ≥ i − 1
    accepted[:, :cols] = at_least[:, 1:cols + 1]                 # m ≥ i
    return reached * upto, accepted * upto


def _replay_counts(r: RequestTrace | None, positions: int, reached: np.ndarray,
                   accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[k − 1, position − 1]`` counts of the counterfactual runs at k = 1..positions of one
    unit whose per-iteration position counts are ``reached``/``accepted``: token by token up
    to the request's own k; beyond it, for variable-k requests and for histograms (``r`` None)
    the per-iteration form ``min(m, k)`` — those counts cut at position k."""
    i = np.arange(1, positions + 1)
    upto = i[None, :] <= i[:, None]                      # [k, position]: position ≤ k
    rr, ra = reached[None, :] * upto, accepted[None, :] * upto
    predicted = None if r is None else token_acceptance(r)
    if predicted is None:
        return rr, ra
    rr, ra = rr.astype(float), ra.astype(float)
    k_rec = fixed_k(r)
    rr[:k_rec], ra[:k_rec] = _histogram_position_counts(replay_histograms(predicted, k_rec),
                                                        positions)
    return rr, ra


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
    # a few aggregate histograms (e.g. one per serving engine) are too few units to resample:
    # resample their iterations instead (narrower CIs: between-request variation is lost)
    by_iteration = not trace.requests and len(trace.histograms) < MIN_UNITS
    units = len(trace.requests) + sum(int(np.count_nonzero(h.counts)) if by_iteration else 1
                                      for h in trace.histograms)
    # [units, k, position]: filled in place (a list of per-unit arrays would double the peak)
    replay_reached = np.zeros((units, positions, positions))
    replay_accepted = np.zeros((units, positions, positions))
    reached_rows, accepted_rows, mult = [], [], []
    iterations = tokens = drafted = 0
    contexts = []
    for r in trace.requests:
        reached, accepted = _position_counts(r.k, r.m, positions)
        reached_rows.append(reached.sum(0))
        accepted_rows.append(accepted.sum(0))
        unit = len(reached_rows) - 1
        replay_reached[unit], replay_accepted[unit] = _replay_counts(
            r, positions, reached_rows[-1], accepted_rows[-1])
        mult.append(1.0)
        iterations += r.iterations
        tokens += r.tokens
        drafted += int(r.k.sum())
        contexts.append(r.context)
    for h in trace.histograms:
        m_values = np.arange(h.k + 1)
        reached, accepted = _position_counts(np.full(h.k + 1, h.k), m_values, positions)
        if by_iteration:
            keep = h.counts > 0
            rows = list(zip(reached[keep], accepted[keep]))
            mult.extend(h.counts[keep].astype(float))
        else:
            rows = [(h.counts @ reached, h.counts @ accepted)]
            mult.append(1.0)
        for reach, acc in rows:   # no token sequence: the per-iteration replay min(m, k)
            reached_rows.append(reach)
            accepted_rows.append(acc)
            unit = len(reached_rows) - 1
            replay_reached[unit], replay_accepted[unit] = _replay_counts(None, positions, reach,
                                                                         acc)
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
        k_recorded=positions,
        replay_reached=replay_reached, replay_accepted=replay_accepted)


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


def survival_by_k(replay_reached: np.ndarray, replay_accepted: np.ndarray, k_max: int,
                  observed: int, survival: np.ndarray) -> np.ndarray:
    """``[k − 1, i − 1]``: the survivals ``P^(k)_i`` (zero for i > k) of the counterfactual
    run at each k = 1..k_max — replayed where k ≤ ``observed``, beyond it the fitted curve
    ``survival`` cut at k. Row-wise over a leading replicate axis (``[n, k, position]``
    counts, ``[n, k_max]`` survival)."""
    lead = replay_reached.shape[:-2]
    out = np.zeros(lead + (k_max, k_max))
    for k in range(1, k_max + 1):
        if k <= min(observed, replay_reached.shape[-2]):
            p = np.nan_to_num(analytical.conditional_rates_from_counts(
                replay_reached[..., k - 1, :k], replay_accepted[..., k - 1, :k]))
            out[..., k - 1, :k] = analytical.survival_from_conditional(np.clip(p, 0.0, 1.0))
        else:
            out[..., k - 1, :k] = survival[..., :k]
    return out


@dataclass
class AcceptanceEstimate:
    """What the trace says for one group, and the curve E[m+1](k) for k = 1..k_max."""

    counts: AcceptanceCounts
    observed: int                  # positions measured directly (support ≥ MIN_SUPPORT)
    conditional: np.ndarray        # p_i, i = 1..positions (NaN where never reached)
    reached: np.ndarray            # iterations that reached position i
    survival: np.ndarray           # P_i, i = 1..k_max (fitted beyond `observed`)
    k_max: int
    survival_k: np.ndarray         # [k−1, i−1]: P^(k)_i of the replayed run at each k

    def survival_at(self, k: int) -> np.ndarray:
        """``P^(k)_1..P^(k)_k``: the survivals of a run at draft length k."""
        if not 1 <= k <= self.k_max:
            raise ValueError(f"k must lie in 1..{self.k_max}")
        return self.survival_k[k - 1, :k]

    @property
    def ks(self) -> np.ndarray:
        return np.arange(1, self.k_max + 1)

    @property
    def expected_tokens(self) -> np.ndarray:
        """E[m+1] for k = 1..k_max: ``1 + Σ_{i≤k} P^(k)_i``."""
        return 1.0 + self.survival_k.sum(-1)

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

    def bootstrap_survival_k(self, n_boot: int, rng: np.random.Generator,
                             weights: np.ndarray | None = None) -> np.ndarray:
        """``[n_boot, k, i]``: the per-k survivals (:func:`survival_by_k`) of bootstrap
        replicates, resampling units (requests) with replacement; ``weights`` as in
        :meth:`bootstrap_survival` (the same ``rng`` draws give the same replicates)."""
        w = weights if weights is not None else analytical.bootstrap_weights(
            self.counts.multiplicity, n_boot, rng)
        fitted = self.bootstrap_survival(n_boot, rng, w)
        rr, ra = self.counts.pooled_replay(w)
        return survival_by_k(rr, ra, self.k_max, self.observed, fitted)


def estimate_acceptance(trace: Trace, k_max: int | None = None,
                        min_support: int = MIN_SUPPORT) -> AcceptanceEstimate:
    """The acceptance of one (policy, s) group for k = 1..``k_max`` (default: the largest k
    recorded); a ``k_max`` beyond :data:`~specsim.analytical.MAX_K` is refused at once."""
    if k_max is not None:
        k_max = analytical.check_k_max(k_max, "k_max")
    counts = count_acceptance(trace)
    reached, accepted = counts.pooled()
    reached, accepted = reached[0], accepted[0]
    # observed: the longest prefix of positions with enough support (at least position 1)
    short = np.flatnonzero(reached < min_support)
    observed = max(1, int(short[0]) if short.size else counts.positions)
    k_max = k_max or counts.k_recorded
    survival = survival_curve(reached, accepted, k_max, observed)
    conditional = analytical.conditional_rates_from_counts(reached, accepted)
    rr, ra = counts.pooled_replay()
    return AcceptanceEstimate(counts, observed, conditional, reached, survival, k_max,
                              survival_by_k(rr, ra, k_max, observed, survival))


def token_replay_expected_tokens(trace: Trace, k: int) -> float:
    """Direct token-by-token counterfactual replay (the definition ``expected_tokens`` must
    reproduce for fixed-k requests at k ≤ their k): tokens over iterations of the runs at
    draft length k over every request's token sequence."""
    tokens = iterations = 0
    for r in trace.requests:
        predicted = token_acceptance(r)
        if predicted is None or k > fixed_k(r):
            raise ValueError(f"request {r.id}: no token sequence to replay at k = {k}")
        ms = replay_tokens(predicted, k)
        tokens += int(np.sum(ms + 1))
        iterations += ms.size
    if iterations == 0:
        raise ValueError("no requests to replay")
    return tokens / iterations


def replay_expected_tokens(trace: Trace, k: int) -> float:
    """Per-iteration counterfactual replay: mean of ``min(m, k) + 1`` over recorded iterations
    that drafted at least k tokens (the definition the survival curve ``survival`` reproduces;
    ``expected_tokens`` replays token by token where it can)."""
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
    measured = analytical.expected_tokens_from_survival(full.survival)[1: full.observed + 1]
    ks = np.arange(fit_positions_upto + 1, full.observed + 1)
    rel = predicted[ks - 1] / measured[ks - 1] - 1.0
    return {"fit_positions": fit_positions_upto, "k": ks.tolist(),
            "predicted": predicted[ks - 1].tolist(), "replayed": measured[ks - 1].tolist(),
            "relative_error": rel.tolist(), "max_abs_relative_error": float(np.abs(rel).max())}


def truncate_trace(trace: RequestTrace, k: int) -> RequestTrace:
    """Counterfactual replay at k ≤ the recorded k, as ``specsim predict`` replays it: a
    request recorded at one fixed k is followed token by token (a run at k accepts the run of
    tokens the recorded drafts predicted from where the previous iteration ended, up to k;
    ``specsim.traces.acceptance.replay_tokens``), with the contexts those iterations start at;
    a variable-k request per recorded iteration, ``m' = min(m, k)``. Exact under greedy
    decoding up to where the selection refreshes and the drafts' own KV move with k."""
    predicted = token_acceptance(trace)
    if predicted is None or k >= fixed_k(trace):
        return RequestTrace(trace.id, trace.policy, trace.s, trace.context,
                            np.minimum(trace.k, k), np.minimum(trace.m, k),
                            prompt_id=trace.prompt_id)
    m = replay_tokens(predicted, k)
    context = int(trace.context[0]) + np.concatenate([[0], np.cumsum(m + 1)[:-1]])
    return RequestTrace(trace.id, trace.policy, trace.s, context.astype(np.int64),
                        np.full(m.size, k, dtype=np.int64), m, prompt_id=trace.prompt_id)
