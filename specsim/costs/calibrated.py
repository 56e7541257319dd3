"""Calibrated cost model: measured step times behind the cost interface.

It prices each operation from a calibration file (:mod:`specsim.costs.calibration_file`):
plain steps, verify passes, draft steps and refreshes on their measured (batch, context) grid
inside it (:class:`~specsim.costs.fitting.MeasuredGrid`), elsewhere by the op's two monotone
terms ``W(tokens) + K(bytes)`` (:func:`~specsim.costs.fitting.fit_terms`). Outside the measured
ranges it never extrapolates silently: it falls back to the fit's roofline, and every
:class:`~specsim.costs.base.Cost` it returns says so in ``notes``. What is not calibrated at all
(an op, a policy, the prefill) is the roofline model's, noted too.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from specsim.costs.base import Cost, IterationCost, as_contexts, compose_iteration, memoized
from specsim.costs.calibration_file import STEP_KINDS, Calibration, Measurement
from specsim.costs.fitting import (MeasuredGrid, TermFit, bracket, fit_terms, interpolate,
                                   strictly_between)
from specsim.costs.provenance import provenance_warnings
from specsim.costs.roofline import RooflineCostModel
from specsim.errors import SpecsimError
from specsim.policies import SPARSESPEC_WINDOW, get_policy
from specsim.specs import FULL_ATTENTION, HardwareSpec, ModelSpec


class CalibratedCostModel:
    """Measured costs behind the :class:`~specsim.costs.base.CostModel` interface."""

    name = "calibrated"

    def __init__(self, calibration: Calibration, model: ModelSpec, hardware: HardwareSpec,
                 tp: int = 1):
        if tp != 1:
            raise SpecsimError("calibrations are measured on one GPU; use the roofline model "
                               "for tensor parallelism")
        self.calibration, self.model, self.hardware = calibration, model, hardware
        # the roofline beneath the fits prices Vegas' refresh as the calibrated engine ran it
        self.roofline = RooflineCostModel(model, hardware, tp, c2q=calibration.settings.c2q)
        self.warnings = provenance_warnings(calibration, model, hardware)
        self.overheads = self.roofline.overheads
        #: the GPU's operator table that prices prefill (a path, read at the first prefill;
        #: None: the roofline)
        self.prefill_table = None
        self._full = [t == FULL_ATTENTION for t in model.layer_types]
        self.fits: dict[tuple[str, int, float | None], TermFit] = {}
        groups: dict[tuple, list[Measurement]] = {}
        #: the measured prefills of one prompt: (prompt tokens, seconds), by length, and the
        #: (a, b, c) of ``_measured_prefill`` fitted on them where there are three or more
        self.prefills = sorted((m.context, m.median_ms / 1e3) for m in calibration.measurements
                               if m.op == "prefill")
        self.prefill_fit = _prefill_fit(self.prefills) if len(self.prefills) >= 3 else None
        for m in calibration.measurements:
            if m.op == "prefill":
                continue
            # a draft step's cost depends on s only through the bytes it attends to: one fit
            # over every measured s, so s between them is interpolated in bytes
            draft = m.op.startswith("draft:")
            groups.setdefault((m.op, m.q, None if draft else m.s), []).append(m)
        for key, rows in groups.items():
            op, q, s = key
            tokens = np.array([r.batch * q for r in rows], float)
            kv = np.array([self._op_bytes(op, np.full(r.batch, r.context), r.s, q)
                           for r in rows])
            seconds = np.array([r.median_ms / 1e3 for r in rows])
            if np.unique(tokens).size * np.unique(kv).size < 2 or len(rows) < 2:
                continue
            self.fits[key] = fit_terms(tokens, kv, seconds)
        # the ops ``_gridded`` names are interpolated on their measured (batch, context) grid
        # inside it (``_on_grid``); the fits price what lies outside
        by_s: dict[tuple, list[Measurement]] = {}
        for m in calibration.measurements:
            by_s.setdefault((m.op, m.q, m.s), []).append(m)
        self.grids: dict[tuple[str, int, float | None], MeasuredGrid] = {
            key: MeasuredGrid.of(rows) for key, rows in by_s.items() if self._gridded(key[0])}

    # ---- bytes each operation's K term is a function of --------------------------------
    def _op_bytes(self, op: str, contexts: np.ndarray, s: float | None, q: int = 1) -> float:
        kind, _, policy = op.partition(":")
        per = self.model.kv_bytes_per_token_layer()
        n_full = sum(self._full)
        sliding = (self.model.num_layers - n_full) * float(
            np.sum(self.model.window_keys(contexts, q if kind == "verify" else 1)))
        if kind in ("plain", "verify"):
            return per * (n_full * float(contexts.sum()) + sliding)
        if kind == "draft":
            pol = get_policy(policy)
            selected = pol.selected_array(contexts, s).astype(float)
            if pol.rescore_every_draft:
                # Quest reads every page's min and max key at each draft step: 2 key rows per
                # page = one token's K+V bytes, a driver that does not shrink with s (fitted
                # on selected bytes alone, s = 0.03 and 0.1 disagreed by up to 23%); it scores
                # the pages of the whole cache buffer, sized for the longest sequence
                selected = selected + np.ceil(contexts.max() / pol.page_size)
            return per * (n_full * float(selected.sum()) + sliding)
        # a refresh ranks every row over the whole buffer, which the engine sizes for the
        # longest sequence: a short one in a ragged batch costs as much as the longest
        # (SmolLM2 batch 32, prompts 2K–6.5K, H200: Vegas' refresh measured 0.62 ms where
        # Σ contexts priced 0.48; SparseSpec-L's 1.42 / 1.49 / 1.85 / 2.12 / 2.19 ms at
        # k = 2 / 4 / 8 / 12 / 15, priced 1.45 / 1.59 / 1.87 / 2.11 / 2.29 on the longest and
        # 1.05 / 1.15 / 1.35 / 1.51 / 1.63 on the mean — its attention-mass kernel skips the
        # blocks past each length, its top-K does not)
        if kind == "selection":
            return per * n_full * float(contexts.max()) * contexts.size
        return per * n_full * float(contexts.sum())          # loop overheads

    def _lookup(self, op: str, q: int, s: float | None, contexts: np.ndarray,
                roofline_cost: Cost) -> Cost:
        tokens = contexts.size * q
        kv = self._op_bytes(op, contexts, s, q)
        key = (op, q, None if op.startswith("draft:") else s)
        fit = self.fits.get(key)
        note = None
        if self._gridded(op):
            on_grid = self._on_grid(op, q, s, contexts)
            if on_grid is not None:
                seconds, label = on_grid
                return _relabel(roofline_cost, float(seconds), label)
        if fit is None and op.startswith("selection:"):
            between = self._between_s(op, q, s, tokens, kv)
            if between is not None:
                seconds, inside, note = between
                return _relabel(roofline_cost, float(seconds), note if inside else
                                note + "; outside the measured grid: fitted roofline")
        if fit is None and op == "verify":
            fit, note = self._verify_between_q(q, tokens, kv,
                                               self._equivalent_context(op, contexts))
            if fit is not None:
                seconds, inside = fit
                return _relabel(roofline_cost, float(seconds), note if inside else
                                note + "; outside the measured grid: fitted roofline")
        if fit is None:
            nearest = self._nearest_s(op, q, s)
            if nearest is not None:
                fit = self.fits[nearest]
                note = f"{op}: s={s} not calibrated, used the fit at s={nearest[2]}"
        if fit is None:
            return _relabel(roofline_cost, roofline_cost.seconds,
                            f"{op} q={q} not calibrated: roofline model")
        seconds, inside = fit.predict(tokens, kv)
        label = "calibrated" if inside else (
            f"{op}: outside the measured grid (tokens {tokens}, KV {kv / 1e9:.2f} GB): "
            f"fitted roofline")
        if note:
            label = f"{note}; {label}"
        return _relabel(roofline_cost, float(seconds), label)

    def _equivalent_context(self, op: str, contexts: np.ndarray) -> float:
        """The uniform context a ragged batch is priced at on a measured grid: its longest
        sequence for a selection refresh (``_op_bytes``) and a draft step, its mean for a plain
        step or a verify pass.

        A draft step's attention launch is planned for the longest list in the batch (the
        engine sizes the index lists, and so the split plan, by the selection at the cache
        buffer's length, the longest sequence's): at SmolLM2's batch 32 its longest chunks,
        not the batch's bytes, set most of the time. Validation runs on the H200
        (SmolLM2 b32, prompts 2K–7K), draft phase per iteration predicted vs measured
        over the 40 non-Quest configurations: the two-term fit in selected bytes MAPE 2.3%
        (worst 5.6%; it under-prices the step's growth with s: 0.08 ms per step from s = 0.03
        to 0.1 where the runs took 0.19), the grid at the mean context 1.5% (bias −1.2%), at
        the longest 1.3% (bias +1.2%); throughput: StreamingLLM's k*/s* regret 0.963 with the
        fit, 1.000 on the grid at the longest (every policy ≤ 2.4% MAPE)."""
        if op.startswith(("selection:", "draft:")):
            return float(contexts.max())
        return float(contexts.mean())

    @classmethod
    def _gridded(cls, op: str) -> bool:
        """Priced on its measured grid inside it: plain steps, verify passes (``verify:<policy>``
        too), selection refreshes and draft steps; the fits price what lies outside.

        Quest's draft re-scores every page of the buffer (~25 launches per layer of page
        scoring and ranking, not a read of the selected rows): the two-term fit missed it
        (held-out 6.1% on Qwen3-8B, 3.5% on the grid; the H200 runs at batch 4, 32K: 15.2 ms
        per step, fit 16.1, grid 15.4). The other drafts' fit is exact at the calibration's
        uniform shapes (0.6–1.3% held-out) but not in ragged runs (``_equivalent_context``)."""
        return op.split(":", 1)[0] in STEP_KINDS

    def _on_grid(self, op: str, q: int, s: float | None, contexts: np.ndarray
                 ) -> tuple[float, str] | None:
        """An op ``_gridded`` names, interpolated on its measured (batch, context) grid, at
        ``s`` (or between the two measured sparsities around it: a draft linearly in the
        positions it selects at that context, which the floor of ``min_selected`` and the
        recent window make non-linear in s; other ops linearly in s); None outside the grid.

        The two-term fit (tokens, bytes) smooths across shapes what the kernels do not: a
        refresh ranks rows whose cost trades rows against length and jumps where
        ``torch.topk`` changes algorithm, and the verify kernel's tile and split plan change
        with batch and q. Held-out on the shipped files (each batch's series interpolated in
        context, then across batches): Qwen3-8B verify 5.2 → 1.5%, Vegas' refresh 9.1 →
        4.1%, Llama-3.1-8B verify 6.2 → 1.6%."""
        batch, context = contexts.size, self._equivalent_context(op, contexts)
        grid = self.grids.get((op, q, s))
        if grid is not None:
            got = grid(batch, context)
            return None if got is None else (got, "calibrated (measured grid)")
        around = strictly_between([k[2] for k in self.grids if k[0] == op and k[1] == q], s)
        if around is None:
            return None
        lo, hi = around
        t_lo, t_hi = self.grids[(op, q, lo)](batch, context), self.grids[(op, q, hi)](batch,
                                                                                    context)
        if t_lo is None or t_hi is None:
            return None
        w = (s - lo) / (hi - lo)
        if op.startswith("draft:"):
            pol = get_policy(op.split(":", 1)[1])
            n_lo, n_s, n_hi = (float(pol.selected_array(np.array([context]), x)[0])
                               for x in (lo, s, hi))
            w = (n_s - n_lo) / (n_hi - n_lo) if n_hi > n_lo else 0.0
        return ((1 - w) * t_lo + w * t_hi,
                f"{op}: s={s} interpolated between measured s={lo} and s={hi} (measured grid)")

    def _verify_tile(self, q: int) -> int:
        """Rows of the verify kernel's tile at ``q`` (``plan_verify``: the KV head's group × q
        query rows, to a power of two ≥ 16): its configuration changes where this does."""
        rows = self.model.group_size * q
        return max(16, 1 << (rows - 1).bit_length())

    def _verify_between_q(self, q: int, tokens: float, kv: float, context: float):
        """A verify at an unmeasured q, linear in q between measured ones *of the same tile*
        (the kernel's configuration changes with its row count: SmolLM2's q = 9 runs the
        32-row tile of q = 6–10, 3.64 ms in the H200 runs, where interpolating between q = 8
        and q = 12 (64 rows) priced 3.09); beyond them in the tile, linear through its two
        nearest (held with one); across tiles only when the tile has no measured q."""
        measured = sorted(k[1] for k in self.fits if k[0] == "verify")
        tile = [x for x in measured if self._verify_tile(x) == self._verify_tile(q)]
        if tile:
            lo, hi = bracket(tile, q, extrapolate=True)
            how = f"in its {self._verify_tile(q)}-row tile from measured q={lo}" + \
                (f" and q={hi}" if hi != lo else "")
        else:
            around = strictly_between(measured, q)
            if around is None:
                return None, None
            lo, hi = around
            how = f"between measured q={lo} and q={hi}"
        batch = tokens / q

        def at(q0):   # the measured grid where it covers the shape, else the fit
            grid = self.grids.get(("verify", q0, None))
            got = grid(int(round(batch)), context) if grid is not None else None
            if got is not None:
                return got, True
            return self.fits[("verify", q0, None)].predict(batch * q0, kv)

        (t_lo, in_lo), (t_hi, in_hi) = at(lo), at(hi)
        w = 0.0 if hi == lo else (q - lo) / (hi - lo)
        return (max(0.0, (1 - w) * t_lo + w * t_hi), bool(in_lo and in_hi)), \
            f"verify q={q} interpolated {how}"

    def _between_s(self, op, q, s, tokens, kv):
        """A selection at an s between two calibrated ones: linear in s between their fits."""
        around = strictly_between([k[2] for k in self.fits if k[0] == op and k[1] == q], s)
        if around is None:
            return None
        lo, hi = around
        t_lo, in_lo = self.fits[(op, q, lo)].predict(tokens, kv)
        t_hi, in_hi = self.fits[(op, q, hi)].predict(tokens, kv)
        w = (s - lo) / (hi - lo)
        return ((1 - w) * t_lo + w * t_hi, bool(in_lo and in_hi),
                f"{op}: s={s} interpolated between measured s={lo} and s={hi}")

    def _nearest_s(self, op, q, s):
        candidates = [k for k in self.fits if k[0] == op and k[1] == q and k[2] is not None]
        if not candidates or s is None:
            return None
        return min(candidates, key=lambda k: abs(k[2] - s))

    # ---- the interface ------------------------------------------------------------------
    def loop_overhead(self, op: str, contexts: np.ndarray, k: int | None = None
                      ) -> tuple[float, str] | None:
        """A measured loop overhead (``overhead:plain`` / ``overhead:speculative``) at these
        contexts, seconds ≥ 0, or None when the calibration has none. Speculative overheads
        measured at several draft lengths (q = k + 1) are linear in k between and beyond them
        (the host's per-iteration work grows with the drafts it reads back); one measured k
        is used at every k."""
        qs = sorted(key[1] for key in self.fits if key[0] == op)
        if not qs:
            return None
        kv = self._op_bytes(op, contexts, None)

        def at(q):
            return self.fits[(op, q, None)].predict(contexts.size * q, kv)

        if k is None or len(qs) == 1:
            seconds, inside = at(qs[0])
            how = ""
        else:
            q = k + 1
            lo, hi = bracket(qs, q, extrapolate=True)
            seconds = interpolate(lambda x: at(x)[0], lo, hi, q)
            inside = at(lo)[1] and at(hi)[1]
            how = (f" at k={k}, " + ("interpolated" if qs[0] <= q <= qs[-1] else
                                     "extrapolated") + f" from k={lo - 1}, {hi - 1}")
        note = f"{op} measured{how}" + ("" if inside else
                                        " (outside the grid: fitted roofline)")
        return max(float(seconds), 0.0), note

    def measured_step(self, op: str, contexts: Sequence[int], q: int = 1,
                      s: float | None = None) -> Cost:
        """One step op (``plain``, ``verify``, ``draft:<policy>``, ``selection:<policy>``) as
        the calibration timed it alone: no loop overhead added, no policy's verify difference
        composed."""
        ctx = as_contexts(contexts)
        family, _, policy = op.partition(":")
        base = {"plain": lambda: self.roofline.plain_step(ctx),
                "verify": lambda: self.roofline.verify(ctx, q),
                "draft": lambda: self.roofline.draft_step(ctx, s, policy),
                "selection": lambda: self.roofline.selection(ctx, s, policy, 1)}[family]()
        return self._lookup(op, q, s, ctx, base)

    def plain_step(self, contexts: Sequence[int]) -> Cost:
        """One plain step in a decoding loop: the measured step plus, when calibrated, the
        loop's measured per-step overhead (host work and launch gaps)."""
        ctx = as_contexts(contexts)
        cost = self._lookup("plain", 1, None, ctx, self.roofline.plain_step(ctx))
        extra = self.loop_overhead("overhead:plain", ctx)
        if extra is None:
            return cost
        out = _relabel(cost, cost.seconds + extra[0], extra[1])
        return Cost(out.seconds, out.weight_bytes, out.kv_bytes, out.other_bytes, out.flops,
                    out.overhead_s + extra[0], out.comm_s, out.bound, out.notes)

    def verify(self, contexts: Sequence[int], q: int) -> Cost:
        ctx = as_contexts(contexts)
        return memoized(self, ("verify", ctx.tobytes(), q), lambda: self._lookup(
            "verify", q, None, ctx, self.roofline.verify(ctx, q)))

    def policy_verify(self, contexts: Sequence[int], q: int, policy: str) -> Cost:
        """A verify pass as ``policy``'s engine runs it, where the calibration timed it there
        (``verify:<policy>``): the shared ``verify`` (timed on a Vegas engine, which collects
        two rows' logits) plus the measured difference — negative for a policy that collects
        none (StreamingLLM: 0.6–1.1 ms below Vegas' at Qwen3-8B batch 4, 32K), never more
        negative than half the shared pass. Quest's page-bound updates are measured at one q
        and added at every q (they depend on the pages a pass touches, not on q); the
        all-row logits of last-token and SparseSpec-L at several q, the difference
        interpolated linearly in q between them and held at the nearest beyond."""
        ctx = as_contexts(contexts)
        return memoized(self, ("policy_verify", ctx.tobytes(), q, policy),
                        lambda: self._policy_verify(ctx, q, policy))

    def _policy_verify(self, ctx: np.ndarray, q: int, policy: str) -> Cost:
        base = self.verify(ctx, q)
        op = f"verify:{get_policy(policy).name}"
        qs = sorted(key[1] for key in self.fits if key[0] == op)
        if not qs:
            return base

        def extra_at(q0):
            own = self._lookup(op, q0, None, ctx, self.roofline.verify(ctx, q0))
            shared = self.verify(ctx, q0).seconds
            return max(-0.5 * shared, own.seconds - shared)

        lo, hi = bracket(qs, q)
        extra = interpolate(extra_at, lo, hi, q)
        where = f"q={lo}" if lo == hi else f"q={lo}..{hi}"
        return _relabel(base, base.seconds + extra,
                        f"{op} measured: {extra * 1e6:+.0f} µs over the shared verify at "
                        f"{where}")

    def draft_step(self, contexts: Sequence[int], s: float, policy: str) -> Cost:
        ctx = as_contexts(contexts)
        return memoized(self, ("draft", ctx.tobytes(), s, policy), lambda: self._lookup(
            f"draft:{policy}", 1, s, ctx, self.roofline.draft_step(ctx, s, policy)))

    def selection(self, contexts: Sequence[int], s: float, policy: str, k: int) -> Cost:
        ctx = as_contexts(contexts)
        return memoized(self, ("selection", ctx.tobytes(), s, policy, k),
                        lambda: self._selection(ctx, s, policy, k))

    def _selection(self, ctx: np.ndarray, s: float, policy: str, k: int) -> Cost:
        base = self.roofline.selection(ctx, s, policy, k)
        if get_policy(policy).name in ("full", "streamingllm"):
            return base
        # Quest's per-step page scoring runs inside its measured draft step; what remains here
        # is the refresh after each verify, once per iteration like every other policy
        op = f"selection:{policy}"
        rows = sorted(key[1] for key in self.fits if key[0] == op and key[1] != 1)
        if not rows:
            return self._lookup(op, 1, s, ctx, base)
        # measured at several numbers of ranked rows (SparseSpec-L: the last min(k + 1, W)
        # verify rows): linear between them, the nearest beyond
        want = min(k + 1, SPARSESPEC_WINDOW)
        lo, hi = bracket(rows, want)
        t_lo = self._lookup(op, lo, s, ctx, base)
        if lo == hi:
            return t_lo
        seconds = interpolate(lambda r: self._lookup(op, r, s, ctx, base).seconds, lo, hi, want)
        return _relabel(t_lo, seconds, f"{op}: {want} rows interpolated between measured "
                                       f"{lo} and {hi}")

    def prefill(self, prompt_lengths: Sequence[int], past: Sequence[int] | None = None
                ) -> Cost:
        """Measured where the calibration timed prefills (:meth:`_measured_prefill`), else
        composed from the GPU's operator table where one is set (:attr:`prefill_table`, as
        ``make_cost_model`` does for a shipped table), else the roofline; the note says
        which."""
        if self.prefill_fit is not None:
            return self._measured_prefill(prompt_lengths, past)
        if self.prefill_table is not None:
            if "_prefill_operators" not in self.__dict__:
                from specsim.costs.operator_file import read_operator_table
                from specsim.costs.operators import OperatorCostModel
                self._prefill_operators = OperatorCostModel(
                    read_operator_table(str(self.prefill_table)), self.model, self.hardware)
            cost = self._prefill_operators.prefill(prompt_lengths, past)
            return _relabel(cost, cost.seconds, "prefill not calibrated: composed from the "
                                                "GPU's operator table")
        cost = self.roofline.prefill(prompt_lengths, past)
        return _relabel(cost, cost.seconds, "prefill not calibrated: roofline model")

    def _measured_prefill(self, prompt_lengths, past) -> Cost:
        """Each chunk from the measured one-prompt prefills, ``t(L) = a + b·L + c·E(L)``
        fitted over their lengths L (relative least squares), E the causal query-key
        products (:func:`~specsim.costs.prefill.ideal_elements`, ``L(L+1)/2`` for a whole
        prompt): a chunk of n new positions after p cached ones costs ``a + b·n + c·E(n, p)``,
        a pass per sequence, as the engine prefills."""
        from specsim.costs.prefill import chunks, ideal_elements
        new, before = chunks(prompt_lengths, past)
        a, b, c = self.prefill_fit
        seconds = sum(max(a + b * n + c * ideal_elements(n, p), 0.0)
                      for n, p in zip(new, before))
        lengths = [L for L, _ in self.prefills]
        total = int((new + before).max())
        note = ("prefill: the calibration's measured prefills of "
                f"{lengths[0]}–{lengths[-1]} tokens, a quadratic in the length")
        if total > lengths[-1] or int(new.min()) < lengths[0] and not before.any():
            note += " (outside the measured lengths: extrapolated)"
        cost = self.roofline.prefill(new, before)
        return _relabel(cost, float(seconds), note)

    def iteration(self, contexts: Sequence[int], k: int, s: float, policy: str) -> IterationCost:
        """``compose_iteration``, with the measured per-iteration loop overhead (accept,
        rollback, host bookkeeping, launch gaps) in place of the roofline's constant when the
        calibration has it: the policy's own (``overhead:speculative:<policy>``), else the
        policy-agnostic one (``overhead:speculative``) of files that time no policy's own."""
        ctx = as_contexts(contexts)
        return memoized(self, ("iteration", ctx.tobytes(), k, s, policy),
                        lambda: self._iteration(ctx, k, s, policy))

    def _iteration(self, ctx: np.ndarray, k: int, s: float, policy: str) -> IterationCost:
        cost = compose_iteration(self, ctx, k, s, policy)
        if any(key[0] == f"verify:{get_policy(policy).name}" for key in self.fits):
            cost = dataclasses.replace(cost, verify=self.policy_verify(ctx, k + 1, policy))
        extra = self.loop_overhead(f"overhead:speculative:{get_policy(policy).name}", ctx, k) \
            or self.loop_overhead("overhead:speculative", ctx, k)
        return cost if extra is None else dataclasses.replace(cost, overhead_s=extra[0])


def _relabel(cost: Cost, seconds: float, note: str) -> Cost:
    return Cost(seconds, cost.weight_bytes, cost.kv_bytes, cost.other_bytes, cost.flops,
                cost.overhead_s, cost.comm_s, cost.bound, (*cost.notes, note))


def _prefill_fit(prefills: list[tuple[int, float]]) -> tuple[float, float, float]:
    """(a, b, c) of ``t(L) = a + b·L + c·L(L+1)/2`` over measured (L, seconds), relative
    least squares."""
    from specsim.costs.fitted import relative_lstsq
    L = np.array([x for x, _ in prefills], float)
    t = np.array([y for _, y in prefills])
    x = np.stack([np.ones_like(L), L, L * (L + 1) / 2], 1)
    return tuple(float(v) for v in relative_lstsq(x, t))
