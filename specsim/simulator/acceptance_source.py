"""Where a simulated sequence's accepted-draft counts m come from.

- :class:`ReplaySource` replays recorded requests of one (policy, s) trace group: simulated
  request j follows the record of its own prompt when its arrival names one the group
  recorded, else recorded request ``j mod R`` (wrapping around when the recording is shorter
  than the simulated output). When every request drafted one fixed k, it follows the recorded
  answer token by token (``by_tokens``: ``step`` is the position in the answer, and the
  simulator advances it by m + 1): an iteration at k accepts the run of tokens the recorded
  drafts predicted from there, up to k (``specsim.traces.acceptance``: the per-iteration
  ``m' = min(m, k)`` under-counts acceptance where it clusters). Otherwise iteration by
  iteration with ``m' = min(m, k)``. For k > k_rec, an iteration that accepted k_rec drafts
  continues with the fitted per-position model (counted as extrapolated).
- :class:`FittedSource` samples m from the per-position survival model, one survival curve per
  context-length bin where the trace supports it (≥ ``MIN_BIN_ITERATIONS`` per bin).

Both are vectorised over the batch: ``draw(recorded, step, ks, contexts, rng)`` returns one m
per slot (and whether it was extrapolated), where ``recorded`` is the recorded request each
slot follows (from ``start``) and ``step`` its iteration index.
Draft entropies (for SparseSpec-L's adaptive k) come with the recorded iterations when the
trace has them.
"""
from __future__ import annotations

import numpy as np

from specsim import analytical
from specsim.traces.acceptance import (MIN_SUPPORT, AcceptanceCounts,
                                       estimate_acceptance, fixed_k, predicted_runs,
                                       survival_curve, token_acceptance)
from specsim.traces.format import RaggedRows, Trace

MIN_BIN_ITERATIONS = 2000
MAX_BINS = 4


def draw_from_survival(survival: np.ndarray, ks: np.ndarray, u: np.ndarray) -> np.ndarray:
    """m with ``P(m ≥ i) = P_i`` for i ≤ k: ``m = #{i ≤ k : u < P_i}`` (P is non-increasing).

    ``survival`` is ``[k_max]`` or one row per draw ``[n, k_max]``."""
    survival = np.atleast_2d(survival)
    positions = np.arange(1, survival.shape[1] + 1)[None, :]
    hit = (u[:, None] < survival) & (positions <= ks[:, None])
    return hit.sum(axis=1)


class FittedSource:
    """Samples m from fitted per-position survivals, conditioned on context length: where the
    trace is too short for context bins, from the run at each k (``survival_at(k)``: the
    token-by-token replay of ``specsim.traces.acceptance``), else from each bin's curve."""

    kind = "fitted"
    by_tokens = False

    def __init__(self, trace: Trace, k_max: int):
        self.k_max = k_max
        est = estimate_acceptance(trace, k_max=k_max)
        self.k_recorded = est.counts.k_recorded
        self.survival_k = est.survival_k
        self.edges, self.survival = self._bins(trace, est.counts, k_max, est.survival)
        self.entropy_available = False

    @staticmethod
    def _bins(trace: Trace, counts: AcceptanceCounts, k_max: int, overall: np.ndarray):
        contexts = np.concatenate([r.context for r in trace.requests]) if trace.requests \
            else np.zeros(0)
        n_bins = min(MAX_BINS, contexts.size // MIN_BIN_ITERATIONS)
        if n_bins < 2:
            return np.array([]), overall[None, :]
        edges = np.quantile(contexts, np.linspace(0, 1, n_bins + 1)[1:-1])
        k_all = np.concatenate([r.k for r in trace.requests])
        m_all = np.concatenate([r.m for r in trace.requests])
        positions = np.arange(1, counts.positions + 1)[None, :]
        bins = np.searchsorted(edges, contexts, side="right")
        curves = []
        for b in range(n_bins):
            sel = bins == b
            reached = ((positions <= k_all[sel, None]) & (m_all[sel, None] >= positions - 1)).sum(0)
            accepted = (m_all[sel, None] >= positions).sum(0)
            short = np.flatnonzero(reached < MIN_SUPPORT)
            observed = max(1, int(short[0]) if short.size else counts.positions)
            curves.append(survival_curve(reached.astype(float), accepted.astype(float), k_max,
                                         observed))
        return edges, np.array(curves)

    def start(self, request_index: int, prompt_id: str | None = None) -> int:
        return 0

    def draw(self, recorded, step, ks, contexts, rng) -> tuple[np.ndarray, np.ndarray]:
        """(m per slot, extrapolated flag per slot)."""
        u = rng.random(len(ks))
        curve = self.survival[np.searchsorted(self.edges, contexts, side="right")] \
            if self.edges.size else self.survival_k[np.clip(ks, 1, self.k_max) - 1]
        m = draw_from_survival(curve, ks, u)
        return m, ks > self.k_recorded


class ReplaySource:
    """Replays recorded requests iteration by iteration (counterfactual for k ≤ k_rec)."""

    kind = "replay"

    def __init__(self, trace: Trace, k_max: int):
        if not trace.requests:
            raise ValueError("replay needs per-request records; this group has only "
                             "aggregate histograms (use the fitted source)")
        self.k_max = k_max
        reqs = trace.requests
        self.lengths = np.array([r.iterations for r in reqs])
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])
        self.m = np.concatenate([r.m for r in reqs])
        self.k_rec = np.concatenate([r.k for r in reqs])
        self.k_recorded = int(self.k_rec.max())
        self.by_prompt: dict[str, list[int]] = {}
        for i, r in enumerate(reqs):
            if r.prompt_id:
                self.by_prompt.setdefault(r.prompt_id, []).append(i)
        self.entropy_available = all(r.entropy is not None for r in reqs)
        if self.entropy_available:
            width = self.k_recorded
            self.entropy = np.concatenate([RaggedRows.of(r.entropy).padded(width)
                                           for r in reqs])
        est = estimate_acceptance(trace, k_max=max(k_max, self.k_recorded))
        self.conditional = analytical.conditional_from_survival(est.survival)
        sequences = [token_acceptance(r) for r in reqs]
        self.by_tokens = all(q is not None for q in sequences)
        if self.by_tokens:    # per token: predicted tokens in a row from it, its iteration
            self.tok_lengths = np.array([q.size for q in sequences])
            self.tok_offsets = np.concatenate([[0], np.cumsum(self.tok_lengths)[:-1]])
            runs, rows = [], []
            for r, q, first in zip(reqs, sequences, self.offsets):
                runs.append(predicted_runs(q))
                rows.append(first + np.repeat(np.arange(r.iterations), r.m + 1))
            self.tok_run = np.concatenate(runs)
            self.tok_row = np.concatenate(rows)
            self.tok_k = np.repeat(np.array([fixed_k(r) for r in reqs]), self.tok_lengths)

    def start(self, request_index: int, prompt_id: str | None = None) -> int:
        """The recorded request a simulated one follows: its own prompt's record when the
        arrival names a prompt the group recorded (several records of it: taken in turn),
        else recorded request ``request_index mod R``."""
        mine = self.by_prompt.get(prompt_id) if prompt_id is not None else None
        if mine:
            return mine[request_index % len(mine)]
        return int(request_index % self.lengths.size)

    def _rows(self, recorded: np.ndarray, step: np.ndarray) -> np.ndarray:
        """The recorded iteration at ``step`` (with ``by_tokens``: the one that emitted the
        token at that position)."""
        if self.by_tokens:
            return self.tok_row[self._tokens(recorded, step)]
        return self.offsets[recorded] + step % self.lengths[recorded]

    def _tokens(self, recorded: np.ndarray, step: np.ndarray) -> np.ndarray:
        return self.tok_offsets[recorded] + step % self.tok_lengths[recorded]

    def draw(self, recorded, step, ks, contexts, rng) -> tuple[np.ndarray, np.ndarray]:
        if self.by_tokens:
            at = self._tokens(recorded, step)
            k_rec = self.tok_k[at]
            m_rec = np.minimum(self.tok_run[at], k_rec)
        else:
            rows = self._rows(recorded, step)
            m_rec, k_rec = self.m[rows], self.k_rec[rows]
        m = np.minimum(m_rec, ks)
        # beyond the recorded draft length: continue the chain with the fitted rates
        beyond = (ks > k_rec) & (m_rec == k_rec)
        if beyond.any():
            idx = np.flatnonzero(beyond)
            for j in idx:
                extra = 0
                for pos in range(int(k_rec[j]) + 1, int(ks[j]) + 1):
                    if rng.random() < self.conditional[pos - 1]:
                        extra += 1
                    else:
                        break
                m[j] += extra
        return m, ks > k_rec

    def entropies(self, recorded, step) -> np.ndarray:
        return self.entropy[self._rows(recorded, step)]


def make_source(kind: str, trace: Trace, k_max: int):
    if kind == "replay":
        return ReplaySource(trace, k_max)
    if kind == "fitted":
        return FittedSource(trace, k_max)
    raise ValueError(f"unknown acceptance source '{kind}'; use replay or fitted")
