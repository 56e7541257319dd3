"""Vectorised fast path: one sequence, many iterations, no per-token Python.

For sweeps of the single-sequence (analytical) case: draw m for every iteration at once from
the survival curve, grow the context by the emitted tokens, and look the iteration time up on a
grid of contexts evaluated once by the cost model (costs are piecewise affine in the context,
so linear interpolation between grid points is exact up to budget rounding).
"""
from __future__ import annotations

import numpy as np

from specsim.costs.base import CostModel
from specsim.simulator.acceptance_source import draw_from_survival

GRID_POINTS = 65


def cost_grid(costs: CostModel, lo: int, hi: int, k: int, s: float, policy: str,
              batch: int = 1):
    """Contexts and (iteration seconds, plain-step seconds) on a grid covering [lo, hi]."""
    grid = np.unique(np.linspace(lo, max(hi, lo + 1), GRID_POINTS).astype(np.int64))
    t_iter = np.array([costs.iteration([int(c)] * batch, k, s, policy).seconds for c in grid])
    t_plain = np.array([costs.plain_step([int(c)] * batch).seconds for c in grid])
    return grid, t_iter, t_plain


def replay_single_sequence(survival, k: int, iterations: int, context: int, costs: CostModel,
                           s: float, policy: str, seed: int = 0, grid=None) -> dict:
    """Simulate ``iterations`` iterations of one sequence drafting k tokens.

    Returns tokens emitted, total time, tokens per iteration and the speedup over plain
    decoding of the same tokens from the same starting context.
    """
    survival = np.asarray(survival, float)
    if k > survival.size:
        raise ValueError(f"survival curve has {survival.size} positions, k = {k}")
    rng = np.random.default_rng(seed)
    u = rng.random(iterations)
    m = draw_from_survival(survival[:k], np.full(iterations, k), u)
    tokens = m + 1
    emitted = np.cumsum(tokens)
    total = int(emitted[-1])
    starts = context + np.concatenate([[0], emitted[:-1]])
    if grid is None:
        grid = cost_grid(costs, context, context + total, k, s, policy)
    ctx_grid, t_iter, t_plain = grid
    spec_time = float(np.interp(starts, ctx_grid, t_iter).sum())
    # plain decoding: one step per token at contexts context .. context + total − 1; the sum of
    # a piecewise-linear function over consecutive integers via its cumulative integral
    plain_time = _sum_over_integers(ctx_grid, t_plain, context, context + total)
    return {"k": k, "iterations": iterations, "tokens": total,
            "tokens_per_iteration": total / iterations, "seconds": spec_time,
            "plain_seconds": plain_time, "speedup": plain_time / spec_time}


def _sum_over_integers(x, y, lo: int, hi: int) -> float:
    """Σ_{c=lo}^{hi-1} f(c) for f linear between grid points (x, y)."""
    c = np.arange(lo, hi)
    return float(np.interp(c, x, y).sum())
