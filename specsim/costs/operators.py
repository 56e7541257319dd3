"""Operator cost model: a model's steps composed from a GPU's measured operators.

It prices any :class:`~specsim.specs.ModelSpec` from an operator table
(:mod:`specsim.costs.operator_file`), as the engine runs the model (its settings are the
table's): one forward pass of ``T = batch·q`` tokens is, per layer,

- the GEMMs at the engine's widths: q|k|v fused into one ``(H + 2·KVH)·head_dim`` wide
  matmul and gate|up into one ``2·I`` wide (three and two matmuls when the table's engine does
  not fuse projections), ``o_proj`` (``H·head_dim`` → hidden) and ``down`` (``I`` → hidden);
  MoE layers: the router and, per expert the batch's tokens touch (uniform routing), its
  gate|up and down GEMMs: the engine's grouped GEMM over the token-expert pairs
  (``grouped_gemm``), else, in a table without it, each touched expert's GEMM over its share of
  the tokens; uniform routing, as random routers give; around them the routing, dispatch and
  weighted combine (``moe_routing``);
- attention: full-attention layers by the verify kernel (q query tokens, collecting what the
  policy collects) over each sequence's context, or by the sparse draft kernel over the
  longest selected list; sliding-window layers by the verify kernel over their rows' last
  ``W + q − 1`` keys (a draft step: its window W, whatever the policy), collecting nothing;
  keyed by head_dim and GQA group, at ``batch·KV heads`` programs' rows;
- the K/V append (the fused one-position kernel for q = 1; the torch write of q rows modelled as
  element-wise kernels);
- the element-wise kernels around the matmuls (``ELEMENTWISE_PER_LAYER``: input norm,
  q/k-norm with rotary, residual with post norm, SwiGLU, residual), priced by the bytes each
  moves;

then the final norm, the LM head GEMM over the tokens whose logits are computed, the fp32 cast
and the greedy sampling, and one CUDA-graph replay. A policy's selection is its measured
``selection`` operator (Quest's page scoring inside each of its draft steps, per layer).

Inside the measured ranges each operator is interpolated (piecewise linear in each axis, and
linearly between measured keys: q, group, rows); outside, a stated model, and the returned
:class:`~specsim.costs.base.Cost` says so in ``notes``: attention and element-wise times beyond
the largest measured point grow as the bytes (the achieved rate there held), below the smallest
point they are held (launch-bound), but a selection over fewer lists than measured follows its
two smallest points; a GEMM, or an MoE layer's grouped GEMM, between measured widths is
interpolated on log time over log n and log k, held below the smallest width and grown as its
bytes or FLOPs beyond the largest. What the table does not hold at all is bytes over the
probe's copy bandwidth (noted).

With :class:`~specsim.costs.fitted.FittedTerms` (fitted on *other* models' calibrations on the
table's GPU) each step is corrected by its family's composition residual and the decoding
loop's host overhead is added per plain step and per iteration; without them the loop's
overhead is the hardware spec's constant (noted).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Sequence

import numpy as np

from specsim.costs.base import Cost, IterationCost, as_contexts, compose_iteration, memoized
from specsim.costs.operator_file import OPERATORS, OperatorTable
from specsim.costs.provenance import engine_choices, gpu_mismatch
from specsim.costs.roofline import RooflineCostModel
from specsim.errors import SpecsimError
from specsim.policies import SPARSESPEC_WINDOW, get_policy
from specsim.settings import RETIRED
from specsim.specs import FULL_ATTENTION, HardwareSpec, ModelSpec

#: Compiled element-wise kernels per layer around the matmuls, as torch.compile emits them for
#: the engine's two compiled halves of a layer (``DecoderLayer.before_attention`` /
#: ``after_attention``): name → bytes moved per token as a function of the model.
ELEMENTWISE_PER_LAYER = {
    "input norm": lambda m: 2 * m.hidden_size,
    "q/k norm and rotary": lambda m: 2 * (m.num_heads + 2 * m.num_kv_heads) * m.head_dim,
    "residual and post norm": lambda m: 4 * m.hidden_size,
    "SwiGLU": lambda m: 3 * _mlp_width(m),
    "residual": lambda m: 3 * m.hidden_size,
}
#: What each policy's verify pass collects (the ``verify`` operator's ``collect`` key).
COLLECT = {"vegas": "sum", "vegas-all": "all", "last-token": "rows", "sparsespec": "all",
           "streamingllm": "off", "quest": "off", "full": "off"}
#: Policies whose selection cost depends on the model's group and the ranked rows.
PER_HEAD_SELECTION = ("sparsespec",)


def _mlp_width(m: ModelSpec) -> int:
    return (m.moe_intermediate_size or m.intermediate_size) if m.is_moe else m.intermediate_size


BELOW = "below the measured range: extrapolated along its two smallest points"


def _below(x: float, x0: float, t0: float, x1: float | None, t1: float | None) -> float:
    """The time at ``x`` below the smallest measured ``x0``: the line through the two smallest
    points, between holding ``t0`` (a launch-bound operator) and shrinking in proportion to
    ``x`` (one bound by what ``x`` counts)."""
    slope = 0.0 if x1 is None else max((t1 - t0) / (x1 - x0), 0.0)
    return max(t0 - slope * (x0 - x), t0 * x / x0)


HELD = "below the measured range: held at its smallest point"


def _series(xs: np.ndarray, ts: np.ndarray, x: float) -> tuple[float, str | None]:
    """Piecewise-linear interpolation of a measured series at ``x``; beyond the largest point
    the time grows as ``x`` (the rate there held), below the smallest it is held. Returns
    (seconds, None inside | what was assumed outside)."""
    if x < xs[0] * (1 - 1e-9):
        return float(ts[0]), HELD
    if x > xs[-1] * (1 + 1e-9):
        return float(ts[-1] * x / xs[-1]), "beyond the measured range: grown as its bytes"
    return float(np.interp(x, xs, ts)), None


class _Grid:
    """One operator key's points: a 1-D series or a 2-D grid (a series along the second axis
    for each measured value of the first), medians in seconds; the series are sorted once."""

    def __init__(self, points, at=None, extrapolate_below: bool = False):
        #: fewer lists than measured (the first axis): along the two smallest instead of held
        self.extrapolate_below = extrapolate_below
        rows: dict[tuple, list[float]] = {}
        for p in points:
            rows.setdefault(at(p) if at else p.at_tuple, []).append(
                statistics.median(p.samples_ms) / 1e3)
        self.values = {at: float(statistics.median(ts)) for at, ts in rows.items()}
        self.dims = len(next(iter(self.values)))
        if self.dims == 1:
            xs = sorted(a[0] for a in self.values)
            self.series = (np.array(xs), np.array([self.values[(x,)] for x in xs]))
        else:
            self.firsts = sorted({a[0] for a in self.values})
            self.along_first = {}
            for a0 in self.firsts:
                xs = sorted(a[1] for a in self.values if a[0] == a0)
                self.along_first[a0] = (np.array(xs),
                                        np.array([self.values[(a0, x)] for x in xs]))

    def __call__(self, *at: float) -> tuple[float, str | None]:
        if self.dims == 1:
            return _series(*self.series, at[0])
        firsts = self.firsts

        def along(a0):
            return _series(*self.along_first[a0], at[1])

        a = at[0]
        if a <= firsts[0] or a >= firsts[-1]:
            edge = firsts[0] if a <= firsts[0] else firsts[-1]
            t, note = along(edge)
            if a < edge * (1 - 1e-9):
                if not self.extrapolate_below or len(firsts) < 2:
                    return t, HELD
                return _below(a, edge, t, firsts[1], along(firsts[1])[0]), BELOW
            if a > edge * (1 + 1e-9):
                return t * a / edge, "beyond the measured range: grown as its bytes"
            return t, note
        hi = next(x for x in firsts if x >= a)
        lo = max(x for x in firsts if x <= a)
        (t_lo, n_lo), (t_hi, n_hi) = along(lo), along(hi)
        w = 0.0 if hi == lo else (a - lo) / (hi - lo)
        return (1 - w) * t_lo + w * t_hi, n_lo or n_hi


def _grouped_axes(p) -> tuple:
    """A grouped GEMM point on the axes its time follows: (token-expert pairs per expert,
    experts), every expert given pairs (the sweep's layout)."""
    rows, groups = p.at_tuple
    return rows / groups, groups


def _grouped_layout_is_old(points) -> bool:
    """Points of fewer pairs than experts: an older sweep's layout, whose points touched only
    ``rows`` of their experts, priced on the file's (pairs, experts) axes."""
    return any(p.at_tuple[0] < p.at_tuple[1] for p in points)


def _grid(op: str, points) -> "_Grid":
    old = op == "grouped_gemm" and _grouped_layout_is_old(points)
    # a selection (page scoring, ranking) costs in proportion to its lists above a launch
    # floor: fewer lists than measured follow its two smallest points (Quest's page scoring
    # at 2 sequences x 4 KV heads runs 0.11 ms a layer at 128K, held at 32 lists 0.16, on that
    # line 0.107); the attention kernels split their work over the SMs and are held
    grid = _Grid(points, _grouped_axes if op == "grouped_gemm" and not old else None,
                 extrapolate_below=op == "selection")
    grid.old_layout = old
    return grid


def _grids(table: OperatorTable) -> dict:
    """Every key's :class:`_Grid`, built once per table object (kept on it)."""
    cached = getattr(table, "_grids_cache", None)
    if cached is None:
        cached = {key: _grid(key[0], points) for key, points in table.groups.items()}
        table._grids_cache = cached
    return cached


class OperatorCostModel:
    """A model priced from a GPU's operator table behind the
    :class:`~specsim.costs.base.CostModel` interface."""

    name = "operators"

    def __init__(self, table: OperatorTable, model: ModelSpec, hardware: HardwareSpec,
                 tp: int = 1, fitted=None, verify_append: str | None = None):
        if tp != 1:
            raise SpecsimError("operator tables are measured on one GPU; use the roofline model "
                               "for tensor parallelism")
        self.table, self.model, self.hardware = table, model, hardware
        self.settings = table.settings
        #: how the priced engine writes a verify pass's K/V rows: as the engine does now
        #: (fused), or as a calibration's engine did where its steps are composed to be
        #: compared with it (:meth:`as_calibrated`)
        self.verify_append = verify_append or RETIRED["verify_append"][0]
        if self.verify_append not in ("fused", "torch"):
            raise SpecsimError(f"verify_append={self.verify_append!r}: expected fused or torch")
        self.roofline = RooflineCostModel(model, hardware, tp, c2q=self.settings.c2q)
        self.overheads = self.roofline.overheads
        self.bandwidth = float(table.probe["copy_bandwidth_Bps"])
        self.matmul_rate = float(table.probe["bf16_matmul_flops"])
        self.grids = _grids(table)
        self.keys: dict[str, list[tuple]] = {}
        for op, key in self.grids:
            self.keys.setdefault(op, []).append(key)
        self.n_full = sum(t == FULL_ATTENTION for t in model.layer_types)
        self.n_sliding = model.num_layers - self.n_full
        path = getattr(table, "path", None)
        if path:
            from specsim.shipped import display_name
            path = display_name(path)
        self.source = path or "operator table"
        #: residuals and loop overheads fitted on other models' calibrations
        #: (:class:`~specsim.costs.fitted.FittedTerms`), or None: composed operators alone
        self.fitted = fitted
        self.warnings = self._layout_warnings()

    @classmethod
    def as_calibrated(cls, table: OperatorTable, model: ModelSpec, hardware: HardwareSpec,
                      calibration, fitted=None) -> "OperatorCostModel":
        """``model`` composed from ``table`` as ``calibration``'s engine ran (its
        ``verify_append``), to be compared with that calibration's measured steps."""
        return cls(table, model, hardware, fitted=fitted,
                   verify_append=engine_choices(calibration)["verify_append"])

    def _layout_warnings(self) -> list[str]:
        m = self.model
        out = []
        if m.head_dim not in {k[0] for k in self.keys.get("verify", [])}:
            out.append(f"head_dim {m.head_dim} not measured: attention priced as its KV "
                       f"bytes over the probe's copy bandwidth")
        other = None if self.table.provenance.get("scaled_to") else gpu_mismatch(
            self.table.provenance.get("gpu"), self.hardware)
        if other:
            out.append(f"operator table {other}")
        timing = self.table.provenance.get("timing")
        if timing != "cuda graph replay":
            out.append(f"operators timed by {timing or 'an unrecorded clock'}, not as the "
                       f"engine's graphed steps run")
        eager = self.table.provenance.get("timed_eagerly") or []
        if eager:
            out.append(f"{len(eager)} operator(s) timed eagerly, host launches included "
                       f"(e.g. {eager[0]})")
        retired = self.table.retired_prefill_points
        if retired and (m.attention_sinks or self.n_sliding):
            out.append(f"the table's {retired} prefill_attention points of sink and window "
                       f"layers timed the engine's earlier masked path and are not read: those "
                       f"layers' prefill priced as the causal kernel until re-measured "
                       f"(specsim calibrate --gpu --operators --only prefill_attention)")
        if m.is_moe:
            out.append("MoE experts priced with uniform routing (random routers' case) "
                       + ("as the engine's grouped GEMM" if "grouped_gemm" in self.keys else
                          "as the touched experts' GEMMs one by one: the table lacks the "
                          "engine's grouped GEMM"))
        return out

    # ---- one operator --------------------------------------------------------------------
    def _at_key(self, op: str, key: tuple, at: tuple) -> tuple[float, list[str]] | None:
        grid = self.grids.get((op, key))
        if grid is None:
            return None
        t, note = grid(*at)
        return t, [f"{_key_text(op, key)}: {note}"] if note else []

    def _priced(self, op: str, key: tuple, at: tuple, fallback_bytes: float | None,
                interpolated=()) -> tuple[float, list[str]]:
        """An operator's seconds and notes: measured (through ``interpolated`` key fields,
        linearly between the measured values around each, held at the nearest beyond them),
        else ``fallback_bytes`` over the probe's copy bandwidth (None: :class:`_Unmeasured`).
        Along an interpolated field only the values measured with the key's fields that are
        not free there count (a verify pass collecting the summed row at q = 2 reads the
        summed-row points at q = 3 and above, not the q = 1 point measured collecting
        nothing)."""
        keys = self.keys.get(op, [])

        def resolve(k, axes):
            if not axes:
                return self._at_key(op, k, at)
            got = resolve(k, axes[1:])
            if got is not None:
                return got
            axis = axes[0]
            same = sorted({x[axis] for x in keys
                           if all(x[i] == k[i] for i in range(len(k)) if i not in axes)})
            if not same:
                return None
            v = k[axis]
            if v in same:
                return None
            lo = max((x for x in same if x < v), default=None)
            hi = min((x for x in same if x > v), default=None)
            if lo is None or hi is None:
                edge = lo if hi is None else hi
                got = resolve(k[:axis] + (edge,) + k[axis + 1:], axes[1:])
                return None if got is None else (got[0], got[1] + [
                    f"{_key_text(op, k)}: held at the nearest measured "
                    f"{OP_KEY_NAMES[op][axis]}={edge}"])
            got_lo = resolve(k[:axis] + (lo,) + k[axis + 1:], axes[1:])
            got_hi = resolve(k[:axis] + (hi,) + k[axis + 1:], axes[1:])
            if got_lo is None or got_hi is None:
                return None
            w = (v - lo) / (hi - lo)
            return (1 - w) * got_lo[0] + w * got_hi[0], got_lo[1] + got_hi[1]

        got = resolve(key, tuple(interpolated))
        if got is not None:
            return got
        if fallback_bytes is None:
            raise _Unmeasured(f"{_key_text(op, key)} not measured")
        return fallback_bytes / self.bandwidth, [
            f"{_key_text(op, key)} not measured: bytes over the probe's copy bandwidth"]

    def gemm(self, m: float, n: int, k: int) -> tuple[float, list[str]]:
        """A bf16 GEMM [m, k] @ [k, n]: measured at (n, k), else interpolated between the
        measured widths around it (:meth:`_gemm`; each shape priced once per model)."""
        seconds, notes = memoized(self, ("gemm", float(m), int(n), int(k)),
                                  lambda: self._gemm(float(m), int(n), int(k)))
        return seconds, list(notes)

    def _gemm(self, m: float, n: int, k: int) -> tuple[float, list[str]]:
        """One GEMM of ``m`` rows [k, n], read across the measured widths
        (``_across_widths``)."""
        if m <= 0:
            return 0.0, []
        if not self.keys.get("gemm"):
            return self._gemm_roof(m, n, k), [
                f"gemm n={n} k={k} not measured: roofline over the probe's ceilings"]
        return self._across_widths("gemm", n, k, (m,), lambda nn, kk: self._gemm_roof(m, nn, kk))

    def _across_widths(self, op: str, n: int, k: int, at: tuple, roof) -> tuple[float, list[str]]:
        """The time of a GEMM-like operator keyed by its widths (n, k) at the point ``at`` of its
        measured axes. Between measured widths the time is interpolated linearly in log n and
        log k on log time (exact both where time is the weight bytes, n·k, and where it is the
        launch alone); below the smallest measured width it is held there (a narrower GEMM is
        launch-bound, never cheaper than its launch); beyond the largest it grows as
        ``roof(n, k)``, its bytes or FLOPs, whichever bounds it. A corner the grid skipped is
        its nearest measured shape so grown. VALIDATION.md measures it against the catalogue
        models' own shapes."""
        exact = self._at_key(op, (n, k), at)
        if exact is not None:
            return exact
        shapes = self.keys[op]
        ns = sorted({s[0] for s in shapes})
        ks = sorted({s[1] for s in shapes})
        nc, kc = min(max(n, ns[0]), ns[-1]), min(max(k, ks[0]), ks[-1])
        notes: list[str] = []
        log_t, total = 0.0, 0.0
        for nn in _bracket(ns, nc):
            for kk in _bracket(ks, kc):
                w = _log_weight(ns, nc, nn) * _log_weight(ks, kc, kk)
                if w == 0:
                    continue
                got = self._at_key(op, (nn, kk), at)
                if got is None:     # a corner the grid skipped (its weight over the cap)
                    near = min(shapes, key=lambda s: abs(math.log(s[0] / nn))
                               + abs(math.log(s[1] / kk)))
                    t, said = self._at_key(op, near, at)
                    got = (t * roof(nn, kk) / roof(*near), said + [
                        f"{op} n={nn} k={kk} not measured: n={near[0]} k={near[1]} scaled by "
                        f"its bytes or FLOPs, whichever bounds it"])
                log_t += w * math.log(got[0])
                total += w
                notes += got[1]
        seconds = math.exp(log_t / total)
        if n > ns[-1] or k > ks[-1]:     # grown along the wider axes only (held below)
            seconds *= roof(max(n, ns[0]), max(k, ks[0])) / roof(nc, kc)
            notes.append(f"{op} n={n} k={k}: beyond the measured widths, n={nc} k={kc} grown "
                         f"as its bytes or FLOPs, whichever bounds it")
        if n < ns[0] or k < ks[0]:
            notes.append(f"{op} n={n} k={k}: below the measured widths, the time at n={nc} "
                         f"k={kc} held")
        return seconds, notes

    def grouped_gemm(self, rows: float, touched: float, n: int, k: int
                     ) -> tuple[float, list[str]]:
        """The grouped GEMM of ``rows`` token-expert pairs over ``touched`` experts [k, n]: the
        measured grid on (pairs per expert, experts), linear between its points (past the
        most measured experts or pairs the time grows as them), read across the measured
        (n, k) widths as a plain GEMM is (``_across_widths``; its roofline: every touched
        expert's weights, the pairs' rows in and out). A table of the older layout (points of
        fewer pairs than experts) is read on its (pairs, experts) axes, with a note."""
        if not self.keys.get("grouped_gemm"):
            return self._gemm(rows / max(touched, 1.0), n, k)[0] * max(touched, 1.0), [
                "grouped_gemm not measured: one GEMM per expert"]
        touched = max(touched, 1.0)
        old = any(g.old_layout for (op, _), g in self.grids.items() if op == "grouped_gemm")
        at = (max(rows, 1.0), touched) if old else (max(rows / touched, 1.0), touched)
        d = self.model.dtype_bytes

        def roof(nn: int, kk: int) -> float:
            moved = d * (touched * nn * kk + rows * (nn + kk))
            return max(moved / self.bandwidth, 2.0 * rows * nn * kk / self.matmul_rate)

        seconds, notes = self._across_widths("grouped_gemm", n, k, at, roof)
        if old:
            notes = notes + [
                "grouped_gemm measured in an older layout (fewer pairs than experts): "
                "re-measure it with `specsim calibrate --gpu --operators --only grouped_gemm "
                "--out TABLE`"]
        return seconds, notes

    def moe_routing(self, tokens: float, experts: int, top: int, hidden: int
                    ) -> tuple[float, list[str]]:
        """An MoE layer around its GEMMs (routing, dispatch, weighted combine): measured
        (linear between the measured experts, top and hidden around the model's), else six
        element-wise kernels moving the routing's and the pairs' bytes."""
        if "moe_routing" not in self.keys:
            moved = tokens * experts * 4 * 3 + tokens * top * hidden * self.model.dtype_bytes * 4
            seconds, notes = self._elementwise(moved)
            return 6 * seconds, notes + [
                "moe_routing not measured: priced as six element-wise kernels (the routing's "
                "sort, scatter and gathers cost more)"]
        return self._priced("moe_routing", (experts, top, hidden), (max(tokens, 1.0),), None,
                            interpolated=(0, 1, 2))

    def _gemm_roof(self, m: float, n: int, k: int) -> float:
        d = self.model.dtype_bytes
        moved = d * (n * k + m * k + m * n)
        return max(moved / self.bandwidth, 2.0 * m * n * k / self.matmul_rate)

    def _elementwise(self, moved: float) -> tuple[float, list[str]]:
        return self._priced("elementwise", (), (moved,), moved)

    def _attention(self, q: int, collect: str, batch: int, context: float
                   ) -> tuple[float, list[str]]:
        m = self.model
        kv = m.kv_bytes_per_token_layer() * batch * context
        return self._priced("verify", (m.head_dim, m.group_size, q, collect),
                            (batch * m.num_kv_heads, context), kv, interpolated=(1, 2))

    def _sparse(self, per_kv_head: bool, batch: int, selected: float) -> tuple[float, list[str]]:
        m = self.model
        kv = m.kv_bytes_per_token_layer() * batch * selected
        return self._priced("sparse", (m.head_dim, m.group_size, per_kv_head),
                            (batch * m.num_kv_heads, max(selected, 1.0)), kv, interpolated=(1,))

    # ---- a forward pass ------------------------------------------------------------------
    def _token_parts(self, tokens: float, add) -> None:
        """Every layer's work that scales with the tokens alone: the projections, the MLP or
        routed experts, and the element-wise kernels around them."""
        m = self.model
        layers = m.num_layers
        h, hd = m.hidden_size, m.head_dim
        if self.settings.fuse_projections:
            add("gemm qkv", self.gemm(tokens, (m.num_heads + 2 * m.num_kv_heads) * hd, h),
                layers)
        else:
            add("gemm qkv", self.gemm(tokens, m.num_heads * hd, h), layers)
            add("gemm qkv", self.gemm(tokens, m.num_kv_heads * hd, h), 2 * layers)
        add("gemm o_proj", self.gemm(tokens, h, m.num_heads * hd), layers)
        if m.is_moe:
            e, a = m.num_experts, m.experts_per_token
            touched = e * (1.0 - (1.0 - a / e) ** tokens)
            inter = _mlp_width(m)
            add("gemm router", self.gemm(tokens, e, h), layers)
            add("moe routing", self.moe_routing(tokens, e, a, h), layers)
            if "grouped_gemm" in self.keys:
                # the engine's grouped GEMM over the tokens' top experts (uniform routing)
                pairs = tokens * a
                add("grouped gemm gate_up", self.grouped_gemm(pairs, touched, 2 * inter, h),
                    layers)
                add("grouped gemm down", self.grouped_gemm(pairs, touched, h, inter), layers)
            else:
                rows = tokens * a / touched
                add("gemm gate_up", self.gemm(rows, 2 * inter, h), layers * touched)
                add("gemm down", self.gemm(rows, h, inter), layers * touched)
        elif self.settings.fuse_projections:
            add("gemm gate_up", self.gemm(tokens, 2 * m.intermediate_size, h), layers)
            add("gemm down", self.gemm(tokens, h, m.intermediate_size), layers)
        else:
            add("gemm gate_up", self.gemm(tokens, m.intermediate_size, h), 2 * layers)
            add("gemm down", self.gemm(tokens, h, m.intermediate_size), layers)
        for name, per_token in ELEMENTWISE_PER_LAYER.items():
            add("elementwise", self._elementwise(per_token(m) * tokens * m.dtype_bytes), layers)

    def forward_parts(self, contexts: Sequence[int], q: int, *, draft: str | None = None,
                      s: float | None = None, collect: str = "off", paged: bool = False
                      ) -> tuple[dict[str, float], list[str]]:
        """Seconds by operator of one forward pass of ``q`` tokens per sequence: full
        attention collecting ``collect`` (``COLLECT``), or with ``draft`` a policy's sparse
        draft step at ``s``; ``paged``: the cache keeps Quest's page bounds (so does a Quest
        draft's). Returns ({operator: seconds summed over layers}, notes)."""
        ctx = as_contexts(contexts)
        m = self.model
        batch = ctx.size
        tokens = batch * q
        parts, notes, add = _parts()
        hd = m.head_dim
        self._token_parts(tokens, add)
        layers, h = m.num_layers, m.hidden_size
        # attention, per layer type
        if self.n_full:
            if draft is None:
                add("attention", self._attention(q, collect, batch, float(ctx.mean())),
                    self.n_full)
            else:
                pol = get_policy(draft)
                selected = float(pol.selected_array(ctx, s).max())
                add("attention", self._sparse(pol.per_kv_head, batch, selected), self.n_full)
                if pol.rescore_every_draft:
                    add("selection", self._selection_op("quest", batch * m.num_kv_heads,
                                                        float(ctx.max()), 0, s), self.n_full)
        if self.n_sliding:
            # a window layer's verify reads its rows' last W + q − 1 keys; its draft step
            # (q = 1) is the same kernel over its window W, whatever the policy (exact)
            capped = float(np.mean(m.window_keys(ctx, q)))
            add("attention", self._attention(q, "off", batch, capped), self.n_sliding)
        # the new tokens' K/V rows
        kv_row = m.num_kv_heads * hd * m.dtype_bytes * 2
        paged = paged or draft == "quest"
        if q == 1 or self.verify_append == "fused":
            # one launch per layer whatever q: a program per (sequence, KV head) writes its
            # rows as one tile
            add("kv append", self._priced("kv_append", (hd, paged), (batch * m.num_kv_heads,),
                                          tokens * kv_row), layers)
        else:
            add("kv append", self._elementwise(2 * tokens * kv_row), 3 * layers)
            notes.append(f"kv append of q={q} rows: the torch write modelled as 3 element-wise "
                         f"kernels")
        # embedding, final norm, LM head over the tokens whose logits are computed, fp32 cast,
        # greedy sampling
        out_tokens = tokens
        add("elementwise", self._elementwise(2 * tokens * h * m.dtype_bytes))
        add("elementwise", self._elementwise(2 * out_tokens * h * m.dtype_bytes))
        add("gemm lm_head", self.gemm(out_tokens, m.vocab_size, h))
        add("sampling", self._elementwise(out_tokens * m.vocab_size * (m.dtype_bytes + 4)))
        add("sampling", self._elementwise(out_tokens * m.vocab_size * 4))
        add("graph replay", self._graph())
        return parts, notes

    def _graph(self) -> tuple[float, list[str]]:
        """One CUDA-graph replay with its host wait: the measured graph of the fewest kernels."""
        grid = self.grids.get(("graph", ()))
        if grid is None:
            return self.overheads.forward, ["graph replay not measured: the hardware spec's "
                                            "per-forward overhead"]
        smallest = min(a[0] for a in grid.values)
        return grid.values[(smallest,)], []

    def _selection_op(self, policy: str, lists: float, context: float, rows: int, s: float
                      ) -> tuple[float, list[str]]:
        group = self.model.group_size if policy in PER_HEAD_SELECTION + ("quest",) else 0
        head_dim = self.model.head_dim if policy == "quest" else 0
        key = (policy, group, rows, s, head_dim)
        return self._priced("selection", key, (lists, context), None,
                            interpolated=(1, 2, 3, 4))

    def _cost(self, base: Cost, parts: dict[str, float], notes: list[str]) -> Cost:
        seconds = float(sum(parts.values()))
        said = [f"operators ({self.source})"] + list(dict.fromkeys(notes))
        return Cost(seconds, base.weight_bytes, base.kv_bytes, base.other_bytes, base.flops,
                    parts.get("graph replay", 0.0), base.comm_s,
                    "overhead" if parts.get("graph replay", 0.0) > seconds / 2 else base.bound,
                    (*base.notes, *said))

    # ---- the interface -------------------------------------------------------------------
    def step(self, op: str, contexts: Sequence[int], q: int = 1, s: float | None = None,
             k: int | None = None, residual: bool = True) -> Cost:
        """One step as the engine's graphed step runs it, without the decoding loop's host
        overhead: ``plain``, ``verify:<policy>`` (q tokens), ``draft:<policy>`` (at s) or
        ``selection:<policy>`` (at s, after a verify of k + 1 tokens), composed from the
        operators and, with ``residual`` and fitted terms, corrected by its family's
        composition residual."""
        ctx = as_contexts(contexts)
        return memoized(self, (op, ctx.tobytes(), q, s, k, residual),
                        lambda: self._step(op, ctx, q, s, k, residual))

    def _step(self, op: str, ctx: np.ndarray, q: int, s: float | None, k: int | None,
              residual: bool) -> Cost:
        family, _, policy = op.partition(":")
        if family == "plain":
            parts, notes = self.forward_parts(ctx, 1)
            cost = self._cost(self.roofline.plain_step(ctx), parts, notes)
        elif family == "verify":
            cost = self._policy_verify(ctx, q, policy or "vegas")
        elif family == "draft":
            cost = self._draft_step(ctx, s, policy)
        elif family == "selection":
            cost = self._selection(ctx, s, policy, k if k is not None else 1)
        else:
            raise ValueError(f"op {op!r} is not a step the operators compose")
        if not residual or self.fitted is None or cost.seconds == 0.0 or \
                any(n.endswith("roofline model") for n in cost.notes):
            return cost
        key = "plain" if family == "plain" else f"{family}:{get_policy(policy or 'vegas').name}"
        seconds, note = self.fitted.residual(key, cost.seconds, self.model.num_layers)
        return cost if note is None else _relabel(cost, seconds, note)

    def plain_step(self, contexts: Sequence[int]) -> Cost:
        """One plain step in a decoding loop: the composed step and, where fitted, the loop's
        per-step host overhead."""
        ctx = as_contexts(contexts)
        cost = self.step("plain", ctx)
        extra = None if self.fitted is None else self.fitted.loop_overhead("plain", ctx.size)
        if extra is None:
            return cost
        out = _relabel(cost, cost.seconds + extra,
                       f"loop overhead per step {extra * 1e6:.0f} us ({self.fitted.source})")
        return dataclasses.replace(out, overhead_s=out.overhead_s + extra)

    def verify(self, contexts: Sequence[int], q: int) -> Cost:
        """The shared verify pass: Vegas' engine's (collecting its summed row)."""
        return self.policy_verify(contexts, q, "vegas")

    def policy_verify(self, contexts: Sequence[int], q: int, policy: str) -> Cost:
        """A verify pass of ``q`` tokens as ``policy``'s engine runs it (what it collects;
        Quest's page bounds updated on every K write)."""
        return self.step(f"verify:{get_policy(policy).name}", contexts, q)

    def _policy_verify(self, ctx, q: int, policy: str) -> Cost:
        if q < 1:
            raise ValueError("a verify pass needs q ≥ 1 query tokens")
        name = get_policy(policy).name
        collect = COLLECT.get(name, "off")
        notes = []
        if name == "vegas" and self.settings.c2q == "rows":
            notes.append("vegas with c2q=rows priced as the summed-row verify")
        parts, more = self.forward_parts(ctx, q, collect=collect, paged=name == "quest")
        if name == "quest" and self.verify_append == "torch":
            m = self.model
            bounds = ctx.size * m.num_kv_heads * m.head_dim * m.dtype_bytes * 4
            seconds, said = self._elementwise(bounds)
            parts["kv append"] = parts.get("kv append", 0.0) + seconds * 14 * m.num_layers
            notes += said + ["quest: page bounds of the written pages modelled as 14 "
                             "element-wise kernels per layer"]
        return self._cost(self.roofline.verify(ctx, q), parts, notes + more)

    def draft_step(self, contexts: Sequence[int], s: float, policy: str) -> Cost:
        return self.step(f"draft:{policy}", contexts, s=s)

    def _draft_step(self, ctx, s: float, policy: str) -> Cost:
        base = self.roofline.draft_step(ctx, s, policy)
        try:
            parts, notes = self.forward_parts(ctx, 1, draft=policy, s=s)
        except _Unmeasured as why:
            return _relabel(base, base.seconds, f"{why}: roofline model")
        return self._cost(base, parts, notes)

    def selection(self, contexts: Sequence[int], s: float, policy: str, k: int) -> Cost:
        return self.step(f"selection:{policy}", contexts, s=s, k=k)

    def _selection(self, ctx, s: float, policy: str, k: int) -> Cost:
        pol = get_policy(policy)
        base = self.roofline.selection(ctx, s, policy, k)
        if pol.name in ("full", "streamingllm", "quest"):
            # StreamingLLM's window is arithmetic; Quest scores pages inside its draft steps
            return _relabel(Cost(0.0, bound="overhead"), 0.0,
                            f"{pol.name}: no refresh work (operators)")
        m = self.model
        rows = min(k + 1, SPARSESPEC_WINDOW) if pol.name in PER_HEAD_SELECTION else 0
        lists = self.n_full * ctx.size * (m.num_kv_heads if pol.per_kv_head else 1)
        try:
            seconds, notes = self._selection_op(pol.name, lists, float(ctx.max()), rows, s)
        except _Unmeasured as why:
            return _relabel(base, base.seconds, f"{why}: roofline model")
        graph, more = self._graph()
        return self._cost(base, {"selection": seconds, "graph replay": graph}, notes + more)

    def prefill(self, prompt_lengths: Sequence[int], past: Sequence[int] | None = None
                ) -> Cost:
        """A prefill pass over prompt chunks (``prompt_lengths`` new positions each after
        ``past`` cached ones, default none), composed as :meth:`prefill_parts` says, plus the
        hardware spec's per-forward overhead (the engine prefills eagerly, not from a graph)."""
        from specsim.costs.prefill import chunks
        new, before = chunks(prompt_lengths, past)
        return memoized(self, ("prefill", new.tobytes(), before.tobytes()),
                        lambda: self._prefill(new, before))

    def _prefill(self, new: np.ndarray, before: np.ndarray) -> Cost:
        parts, notes = self.prefill_parts(new, before)
        parts["launch"] = self.overheads.forward
        return self._cost(self.roofline.prefill(new, before), parts, notes)

    def prefill_parts(self, new: np.ndarray, before: np.ndarray
                      ) -> tuple[dict[str, float], list[str]]:
        """Seconds by operator of one prefill pass: the token-proportional layers at every new
        token, each layer's prefill attention at the query-key products of every sequence's
        chunk on the kernel the engine runs it on (:func:`specsim.costs.prefill.path`: causal,
        sinks — the causal kernel and the sink's fold — or a window shorter than the
        sequence), the new K/V rows written, and the LM head over each sequence's last row."""
        from specsim.costs.prefill import (attention_elements, operator_path, path,
                                           sink_fold_bytes)
        m = self.model
        parts, notes, add = _parts()
        tokens = float(new.sum())
        self._token_parts(tokens, add)
        window = m.sliding_window or None
        for layers, w in ((self.n_full, None), (self.n_sliding, window)):
            if not layers:
                continue
            by_path: dict[str, float] = {}
            folded = 0.0
            for n, p in zip(new, before):
                kind = path(w, m.attention_sinks, n + p)
                folded += n if kind == "sinks" else 0
                kind = operator_path(kind)
                by_path[kind] = by_path.get(kind, 0.0) + m.num_heads * attention_elements(
                    n, p, w, m.attention_sinks)
            for kind, elements in by_path.items():
                add("attention", self._prefill_attention(elements, kind), layers)
            if folded:
                add("sink fold", self._elementwise(sink_fold_bytes(
                    folded, m.num_heads, m.head_dim, m.dtype_bytes)), layers)
        kv_row = m.num_kv_heads * m.head_dim * m.dtype_bytes * 2
        add("kv append", self._elementwise(2 * tokens * kv_row), m.num_layers)
        h, out = m.hidden_size, float(new.size)
        add("elementwise", self._elementwise(2 * tokens * h * m.dtype_bytes))
        add("elementwise", self._elementwise(2 * out * h * m.dtype_bytes))
        add("gemm lm_head", self.gemm(out, m.vocab_size, h))
        add("sampling", self._elementwise(out * m.vocab_size * (m.dtype_bytes + 4)))
        return parts, notes

    def _prefill_attention(self, elements: float, path: str) -> tuple[float, list[str]]:
        """One layer's prefill attention at ``elements`` query-key products (over the query
        heads) on ``path`` (:data:`specsim.costs.prefill.OPERATOR_PATHS`): measured, linear
        between the measured groups; a path the table lacks priced as the causal kernel's
        products; neither measured, its FLOPs (4·head_dim per product) at the probe's matmul
        rate. Each fallback is noted."""
        m = self.model
        notes: list[str] = []
        for tried in dict.fromkeys((path, "causal")):
            key = (m.head_dim, m.group_size, tried)
            try:
                seconds, said = self._priced("prefill_attention", key, (max(elements, 1.0),),
                                             None, interpolated=(1,))
                return seconds, notes + said
            except _Unmeasured:
                notes.append(f"{_key_text('prefill_attention', key)} not measured"
                             + (": priced as the causal kernel's products"
                                if tried != "causal" else ""))
        return 4.0 * m.head_dim * elements / self.matmul_rate, notes + [
            "prefill_attention priced as its FLOPs at the probe's matmul rate"]

    def iteration(self, contexts: Sequence[int], k: int, s: float, policy: str) -> IterationCost:
        """``compose_iteration`` with the policy's own verify pass; the per-iteration loop
        overhead is the one fitted on other models' calibrations (the policy's own), else the
        hardware spec's constant."""
        ctx = as_contexts(contexts)
        return memoized(self, ("iteration", ctx.tobytes(), k, s, policy),
                        lambda: self._iteration(ctx, k, s, policy))

    def _iteration(self, ctx: np.ndarray, k: int, s: float, policy: str) -> IterationCost:
        cost = compose_iteration(self, ctx, k, s, policy)
        cost = dataclasses.replace(cost, verify=self.policy_verify(ctx, k + 1, policy))
        if self.fitted is None:
            return cost
        extra = self.fitted.loop_overhead(f"speculative:{get_policy(policy).name}",
                                          ctx.size, k + 1)
        return cost if extra is None else dataclasses.replace(cost, overhead_s=extra)


def _parts():
    """An empty (parts, notes) and the ``add(name, (seconds, notes), times)`` that fills them."""
    parts: dict[str, float] = {}
    notes: list[str] = []

    def add(name, priced, times=1.0):
        seconds, more = priced
        parts[name] = parts.get(name, 0.0) + seconds * times
        notes.extend(more)

    return parts, notes, add


class _Unmeasured(Exception):
    """An operator the table does not hold and no stated model replaces."""


#: Each operator's key field names (for notes), as its table file names them.
OP_KEY_NAMES = {op: names for op, (names, _) in OPERATORS.items()}


def _key_text(op: str, key: tuple) -> str:
    """``op`` with its key fields, as notes name an operator."""
    return " ".join([op] + [f"{name}={value}" for name, value in zip(OP_KEY_NAMES[op], key)])


def _bracket(values: list, x: float) -> list:
    """The measured values around ``x`` (one when ``x`` is measured or outside)."""
    if x <= values[0]:
        return [values[0]]
    if x >= values[-1]:
        return [values[-1]]
    if x in values:
        return [x]
    return [max(v for v in values if v < x), min(v for v in values if v > x)]


def _log_weight(values: list, x: float, v: float) -> float:
    """Linear weight in log space of the bracket value ``v`` for ``x``."""
    around = _bracket(values, x)
    if len(around) == 1:
        return 1.0
    lo, hi = around
    w = (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return w if v == hi else 1.0 - w


def _relabel(cost: Cost, seconds: float, note: str) -> Cost:
    return Cost(seconds, cost.weight_bytes, cost.kv_bytes, cost.other_bytes, cost.flops,
                cost.overhead_s, cost.comm_s, cost.bound, (*cost.notes, note))


__all__ = ["COLLECT", "ELEMENTWISE_PER_LAYER", "OperatorCostModel"]
