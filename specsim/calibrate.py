"""`specsim calibrate --gpu`: time the engine's own steps on this GPU at a grid of shapes.

GPU side (torch, the engine and its kernels; no simpy/plotly). With random weights of the
model's real shapes and the KV cache filled with random numbers (no prefill), for every batch
size and context length that fits in memory it times, as the engine runs them (CUDA graphs,
Triton kernels):

- ``plain``: one plain decoding step (q = 1, full attention, no collection);
- ``verify``: one verify pass of q tokens (with the Vegas Collect-2-Query rows, as in a run);
  ``verify:<policy>`` the same pass on a policy's own engine where it differs
  (``POLICY_VERIFY_QS``: Quest's page bounds, the all-row logits of last-token and
  SparseSpec-L, StreamingLLM's pass that collects none);
- ``draft:<policy>``: one sparse draft step at sparsity s, after a real selection — timed as
  runs draft, a chain of ``DRAFT_CHAIN`` greedy steps in one CUDA graph, divided by its length;
- ``selection:<policy>``: one refresh of every layer's index lists after a verify, replayed
  as the engine's CUDA graph (Quest's page scoring runs inside each of its draft steps, so it
  is part of ``draft:quest``); SparseSpec-L's at several numbers of ranked rows
  (``SELECTION_ROWS``, recorded as q);
- ``overhead:plain`` and ``overhead:speculative:<policy>``: what a real decoding loop spends
  beyond those steps — accept/reject, rollback (Quest's page bounds included), the host's
  bookkeeping and the GPU's idle gaps between launches — per plain step, and per speculative
  iteration of each policy (forced acceptance at each k of ``OVERHEAD_KS``, recorded as
  q = k + 1: the host's per-iteration work grows with the drafts it reads back; the grid's
  first sparsity): the loop's own per-iteration clock (what a run's steady window measures)
  minus its CUDA-event totals of the priced phases, per step.

The engine runs with the given settings (``specsim.settings.EngineSettings``: by default as real
runs use it, projections fused and layers compiled); ``provenance.engine`` records them, with
their hash, beside the facts of the engine (``settings.engine_provenance``).

Each point: warm-up calls, then ``repeats`` calls timed one by one with CUDA events (the cache
length is rolled back after each, so every call sees the same context). The ceilings (copy
bandwidth, bf16 matrix rate) are measured in the same run, and the provenance recorded.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from specsim.costs.calibration_file import Calibration, Measurement, collect_provenance
from specsim.settings import DEFAULT, EngineSettings, engine_provenance
from specsim.shipped import catalog_file
from specsim.specs import ModelSpec


#: Draft length of Quest's own verify measurement (``verify:quest``, q = k + 1).
OVERHEAD_K = 4
#: Draft lengths of the ``overhead:speculative`` measurements (recorded as q = k + 1): the
#: loop's host work grows with k (SmolLM2, batch 32, free-running on the H200: ~1.0 ms per
#: iteration at k = 2, ~1.8 ms at k = 15), so two points give it a slope.
OVERHEAD_KS = (2, 8)
#: Verify passes timed on a policy's own engine (``verify:<policy>``), at these q: Quest's cache
#: updates page bounds on every K write (a constant extra), and last-token and SparseSpec-L
#: collect every verify row's logits (an extra that grows with q; the shared ``verify`` is
#: timed on Vegas' engine, which collects two rows), while StreamingLLM collects none. In the
#: H200 validation runs (Qwen3-8B, batch 4, 32K) SparseSpec-L's verify took +0.0 ms at q = 3,
#: +0.1 at q = 5, +1.2 at q = 9 and +2.0 at q = 13 over Vegas', StreamingLLM's 0.6–1.1 ms less.
POLICY_VERIFY_QS = {"quest": (OVERHEAD_K + 1,), "last-token": (3, 9, 13, 16),
                    "sparsespec": (3, 9, 13, 16), "streamingllm": (3, 9, 16)}
#: Rows a policy's selection refresh ranks by, timed at each (recorded as q): SparseSpec-L's
#: attention mass is summed over the last min(k + 1, W) verify rows, so its refresh grows with
#: k (Qwen3-8B, batch 4, 32K: 3.0 ms at k = 2, 5.1 ms at k = 12).
SELECTION_ROWS = {"sparsespec": (3, 9, 16)}
#: Draft steps per timed chain (``draft:<policy>`` is the chain's time over this).
DRAFT_CHAIN = 4
#: Plain steps / speculative iterations per overhead measurement.
OVERHEAD_STEPS = 24
#: What a calibration measures, by op family (the part of an op's name before ':').
OP_FAMILIES = ("plain", "verify", "draft", "selection", "overhead", "prefill")
#: Timed prefills per prompt length (after one warm-up of the same length: compiled layers
#: specialise on it); a 128K prompt takes seconds.
PREFILL_REPEATS = 3


@dataclass
class CalibrationGrid:
    batches: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    contexts: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384,
                                                         32768, 65536, 131072])
    qs: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 12, 16])
    sparsities: list[float] = field(default_factory=lambda: [0.03, 0.05, 0.1])
    policies: list[str] = field(default_factory=lambda: ["vegas", "sparsespec",
                                                         "streamingllm", "quest"])
    repeats: int = 20
    warmup: int = 3
    memory_fraction: float = 0.85
    time_budget_s: float | None = None   # stop starting new shapes after this long
    overheads: bool = True               # measure overhead:plain / overhead:speculative
    #: only these op families (``OP_FAMILIES``; None: all) — e.g. ``["overhead"]`` re-measures
    #: the loop overheads alone (after a change to the loop's host code) at the shapes where
    #: they are measured, for ``specsim calibrate --merge --replace`` to put into a shipped
    #: file
    only: list[str] | None = None

    def __post_init__(self):
        unknown = sorted(set(self.only or ()) - set(OP_FAMILIES))
        if unknown or self.only == []:
            raise ValueError(f"only: unknown op families {unknown or '(none given)'}; "
                             f"expected some of {', '.join(OP_FAMILIES)}")
        if self.only and "overhead" in self.only and not self.overheads:
            raise ValueError("only=['overhead', ...] with overheads=False measures nothing")

    def wants(self, family: str) -> bool:
        return (self.only is None or family in self.only) and \
            (family != "overhead" or self.overheads)

    def shape_needed(self, batch: int, context: int) -> bool:
        """Whether the (batch, context) shape has anything to measure: the decoding steps at
        every shape, the loop overheads at the overhead contexts only, a prefill at the
        smallest batch only (so ``only`` overhead or prefill visits just those shapes, and a
        run of them is complete without the others)."""
        fams = set(self.only) if self.only is not None else set(OP_FAMILIES)
        return bool(fams - {"overhead", "prefill"}) \
            or ("overhead" in fams and self.overheads_at(context)) \
            or ("prefill" in fams and batch == min(self.batches))

    def overhead_contexts(self) -> list[int]:
        """Loop overheads are measured at the grid's shortest, middle and longest contexts
        only (the middle one lets the held-out check score them): they are host work and
        launch gaps, which change with the batch far more than with the context, and each
        costs a few decoding loops per policy and k."""
        if not self.overheads:
            return []
        ordered = sorted(self.contexts)
        return sorted({ordered[0], ordered[len(ordered) // 2], ordered[-1]})

    def overheads_at(self, context: int) -> bool:
        return context in self.overhead_contexts()


def shared_verify_policy(policies) -> str:
    """The policy whose engine times the shared ``verify`` op: the first that keeps no page
    bounds (Quest's cache updates them on every K write: its own verify is ``verify:quest``)."""
    return ([p for p in policies if p != "quest"] or list(policies))[0]


def _bisection_ranks(values: list) -> dict:
    """Rank of each value in coarse-to-fine order: the ends first, then the middle of each
    gap (in index terms), recursively."""
    values = sorted(values)
    n = len(values)
    ranks: dict = {}
    if n == 0:
        return ranks
    ranks[values[0]] = 0
    if n > 1:
        ranks[values[-1]] = 1
    gaps, rank = [(0, n - 1)], 2
    while gaps:
        nxt = []
        for lo, hi in gaps:
            if hi - lo < 2:
                continue
            mid = (lo + hi) // 2
            ranks[values[mid]] = rank
            rank += 1
            nxt += [(lo, mid), (mid, hi)]
        gaps = nxt
    return ranks


def shape_order(batches: list[int], contexts: list[int]) -> list[tuple[int, int]]:
    """The order the calibration measures (batch, context) shapes in: coarse to fine over both
    axes, so that a time budget that ends the run early leaves a grid that spans every batch
    and context range sparsely rather than one batch densely (measured batch by batch, a cut
    left only batch 1 of an 8B model)."""
    rb, rc = _bisection_ranks(batches), _bisection_ranks(contexts)
    return sorted(((b, c) for b in batches for c in contexts),
                  key=lambda x: (max(rb[x[0]], rc[x[1]]), rb[x[0]] + rc[x[1]], rb[x[0]]))


def kernel_config_hash() -> str:
    """Hash of the kernels' source: a calibration is tied to the kernels it timed."""
    from pathlib import Path
    import specsim.kernels as K
    digest = hashlib.sha256()
    for path in sorted(Path(K.__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _ceilings(torch) -> dict:
    a = torch.empty(2**30, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    copy = _time(torch, lambda: b.copy_(a), 10, 3)
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm = _time(torch, lambda: x @ x, 10, 3)
    del a, b, x
    return {"copy_bandwidth_Bps": 2 * 2**31 / float(np.median(copy)),
            "bf16_matmul_flops": 2 * 8192**3 / float(np.median(mm))}


def _time(torch, fn, repeats: int, warmup: int, after=None) -> list[float]:
    """Seconds of ``fn`` per call, each call timed alone with CUDA events."""
    for _ in range(warmup):
        fn()
        if after:
            after()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
        if after:
            after()
    return out


def measure(spec: ModelSpec, grid: CalibrationGrid, config: dict | None = None,
            progress: bool = True, settings: EngineSettings = DEFAULT,
            checkpoint: str | None = None) -> Calibration:
    import functools

    import torch

    from specsim.engine import Engine, build_model
    from specsim.engine.decode import CACHE_ALIGN

    if config is None:
        config = json.loads(catalog_file(f"{spec.name}/config.json").read_text())
    model = build_model(config, weights="random", dtype=torch.bfloat16, device="cuda")
    model.prepare(settings)
    engine_of = functools.partial(Engine, settings=settings)
    free = torch.cuda.mem_get_info()[0]
    ceilings = _ceilings(torch)
    needed = [(b, c) for b, c in shape_order(grid.batches, grid.contexts)
              if grid.shape_needed(b, c)]
    shapes = [(b, c) for b, c in needed
              if b * (c + 64) * spec.kv_bytes_per_token < grid.memory_fraction * free]
    prov = collect_provenance(spec, kernel_config_hash())
    prov["grid"] = {"batches": grid.batches, "contexts": grid.contexts, "qs": grid.qs,
                    "sparsities": grid.sparsities, "policies": grid.policies,
                    "repeats": grid.repeats,
                    "shapes_skipped_for_memory": len(needed) - len(shapes),
                    "overhead_k": list(OVERHEAD_KS) if grid.overheads else None,
                    "overhead_contexts": grid.overhead_contexts() or None,
                    "overhead_clock": "loop steps"}
    if grid.only is not None:
        prov["grid"]["only"] = sorted(grid.only)
    prov["engine"] = engine_provenance(settings, draft_timed_as_chain_of=DRAFT_CHAIN,
                                       cache_align=CACHE_ALIGN)

    def measure_one(batch, context):
        rows = _measure_shape(torch, engine_of, model, grid, batch, context)
        torch.cuda.empty_cache()
        return rows

    return measure_shapes(shapes, measure_one, prov, ceilings, grid.time_budget_s,
                          checkpoint=checkpoint, progress=progress)


#: Provenance that must match for a checkpoint to be resumed (besides the grid and engine).
RESUME_FIELDS = ("gpu", "driver", "cuda", "torch", "triton", "kernel_config_hash",
                 "model_spec_hash", "model")


def resumable(path: str, prov: dict) -> Calibration | None:
    """The calibration in ``path`` when it may be resumed by a run with provenance ``prov``
    (same GPU, software, kernels, model, grid and engine settings), None when there is no file.
    Anything else there is refused with the reason, not overwritten: it may be someone's
    finished measurement."""
    import os

    from specsim.costs.calibration_file import read_calibration
    from specsim.errors import SpecsimError

    if not os.path.exists(path):
        return None
    have = read_calibration(path)
    old = have.provenance
    differ = [f for f in RESUME_FIELDS if old.get(f) != prov.get(f)]
    grid_old = {k: v for k, v in (old.get("grid") or {}).items()
                if k != "shapes_skipped_for_memory"}
    grid_new = {k: v for k, v in prov["grid"].items() if k != "shapes_skipped_for_memory"}
    if grid_old != grid_new:
        differ.append("grid")
    if old.get("engine") != prov.get("engine"):
        differ.append(engine_difference(old.get("engine") or {}, prov.get("engine") or {}))
    if old.get("merged"):
        differ.append("merged (a merged file)")
    if differ:
        raise SpecsimError(
            f"{path} holds a calibration made with other settings ({', '.join(differ)}): "
            f"not resuming it and not overwriting it; remove it or write to another file")
    return have


def engine_difference(there: dict, here: dict) -> str:
    """How two calibrations' ``provenance.engine`` differ, in a few words: the engine
    settings and retired settings that differ (``engine settings c2q=rows there, sum
    here``), else the keys whose records differ (``engine (draft_timed_as_chain_of)``)."""
    from specsim.errors import SpecsimError
    from specsim.settings import retired_values

    try:
        changed = EngineSettings.from_provenance(there).differences(
            EngineSettings.from_provenance(here))
        a, b = retired_values(there), retired_values(here)
        changed.update({name: (a[name], b[name]) for name in a if a[name] != b[name]})
    except SpecsimError:
        changed = {}
    if not changed:
        keys = sorted(k for k in set(there) | set(here) if there.get(k) != here.get(k))
        return f"engine ({', '.join(keys)})" if keys else "engine"
    return "engine settings " + "; ".join(f"{name}={str(a).lower()} there, {str(b).lower()} here"
                                          for name, (a, b) in changed.items())


def measure_shapes(shapes: list[tuple[int, int]], measure_one, prov: dict, ceilings: dict,
                   time_budget_s: float | None = None, *, checkpoint: str | None = None,
                   progress: bool = True) -> Calibration:
    """Measure each (batch, context) shape with ``measure_one(batch, context)`` → rows, in
    order, until ``time_budget_s`` has passed. With ``checkpoint`` the calibration so far is
    written there (atomically) after every shape, and a run that finds its own checkpoint
    (``resumable``) measures only the shapes it lacks — a run cut short (a call's time limit,
    Ctrl-C) loses at most the shape in flight. ``provenance.complete`` says whether every
    shape was measured; ``shapes_left`` how many were not."""
    rows: list[Measurement] = []
    prior = resumable(checkpoint, prov) if checkpoint else None
    if prior is not None:
        rows = list(prior.measurements)
        prov = dict(prov, resumed=list(prior.provenance.get("resumed", []))
                    + [prior.provenance.get("date")])
        done = {(m.batch, m.context) for m in rows}
        if progress:
            print(f"resuming {checkpoint}: {len(done)} shapes already measured",
                  file=sys.stderr, flush=True)
    else:
        done = set()
    todo = [x for x in shapes if x not in done]

    def result(left: int) -> Calibration:
        return Calibration(dict(prov, complete=left == 0, shapes_left=left), ceilings,
                           list(rows))

    started = time.perf_counter()
    for n, (batch, context) in enumerate(todo):
        if time_budget_s and time.perf_counter() - started > time_budget_s:
            print(f"time budget reached: {len(todo) - n} shapes left unmeasured",
                  file=sys.stderr)
            break
        if progress:
            spent = time.perf_counter() - started
            eta = spent / n * (len(todo) - n) if n else float("nan")
            print(f"[{len(done) + n + 1}/{len(done) + len(todo)}] batch {batch}, context "
                  f"{context} (elapsed {spent:.0f} s, ETA {eta:.0f} s)", file=sys.stderr,
                  flush=True)
        rows += measure_one(batch, context)
        if checkpoint:
            result(len(todo) - n - 1).write(checkpoint)
    measured = {(m.batch, m.context) for m in rows}
    cal = result(sum(1 for x in shapes if x not in measured))
    if checkpoint:
        cal.write(checkpoint)
    return cal


def _measure_shape(torch, Engine, model, grid: CalibrationGrid, batch: int, context: int
                   ) -> list[Measurement]:
    prompts = [[0] * context] * batch
    q_max = max(grid.qs)
    room = max(q_max, max(OVERHEAD_KS) + 1) * (OVERHEAD_STEPS + 2) + 8 if grid.overheads \
        else q_max + 8
    with torch.inference_mode():
        out = _measure_plain(torch, Engine, model, grid, batch, context, prompts, room)
        for policy in grid.policies:
            for s in grid.sparsities:
                if s != grid.sparsities[0] and not (grid.wants("draft")
                                                    or grid.wants("selection")):
                    continue        # verify and overheads are measured at the first s only
                try:
                    out += _measure_policy(torch, Engine, model, grid, batch, context, prompts,
                                           room, policy, s)
                except torch.OutOfMemoryError:
                    print(f"  out of memory: {policy} s={s} at batch {batch}, context "
                          f"{context} skipped", file=sys.stderr, flush=True)
                torch.cuda.empty_cache()
    return out


def _measure_plain(torch, Engine, model, grid: CalibrationGrid, batch: int, context: int,
                   prompts, room: int) -> list[Measurement]:
    """The full-attention engine's step, loop overhead and one-prompt prefill at one shape,
    those the grid wants there; none wanted: nothing, and no engine built (its cache would be
    filled with random KV for nothing)."""
    overhead = grid.wants("overhead") and grid.overheads_at(context)
    prefill = grid.wants("prefill") and batch == min(grid.batches)
    out: list[Measurement] = []
    if not (grid.wants("plain") or overhead or prefill):
        return out

    def record(op, seconds, q=1, s=None):
        out.append(Measurement(op, batch, context, q, s, [t * 1e3 for t in seconds]))

    plain = Engine(model, batch=batch, max_len=context + room, policy="full",
                   k_max=1, beyond_max_position=True)
    plain.prefill(prompts, "random")
    if grid.wants("plain"):
        record("plain", _time(torch, lambda: plain.verify(1, collect=False), grid.repeats,
                              grid.warmup, lambda: plain.cache.rollback(1)))
    if overhead:
        record("overhead:plain", _loop_overhead(torch, plain, prompts, speculative=False))
    if prefill:
        # one prompt a pass, as the engine prefills: batch 1 is the only shape it has
        seconds = _time(torch, lambda: plain.prefill(prompts[:1]), PREFILL_REPEATS, 1)
        out.append(Measurement("prefill", 1, context, 1, None, [t * 1e3 for t in seconds]))
    return out


def _measure_policy(torch, Engine, model, grid: CalibrationGrid, batch: int, context: int,
                    prompts, room: int, policy: str, s: float) -> list[Measurement]:
    """One policy at one sparsity and shape: draft step, selection refresh, at the grid's
    first sparsity the policy's speculative-loop overhead (and Quest's own verify), and for the
    grid's first policy other than Quest, at its first sparsity, the shared verify passes."""
    q_max = max(grid.qs)
    out: list[Measurement] = []

    def record(op, seconds, q=1, s=None):
        out.append(Measurement(op, batch, context, q, s, [t * 1e3 for t in seconds]))

    with torch.inference_mode():
        engine = Engine(model, batch=batch, max_len=context + room,
                        policy=policy, s=s, k_max=q_max - 1, beyond_max_position=True)
        engine.prefill(prompts, "random")
        rows = engine.prefill_rows
        zeros = torch.zeros(batch, dtype=torch.long, device=engine.device)

        def refresh():
            engine.refresh(rows, zeros, slice(0, rows))

        refresh()
        counts = engine.selection.counts
        saved = counts.clone() if counts is not None else None

        def undo_chain():   # each draft step appended its position to every list
            if saved is not None:
                counts.copy_(saved)

        first = policy == shared_verify_policy(grid.policies) and s == grid.sparsities[0]
        if first and grid.wants("verify"):
            for q in grid.qs:
                record("verify", _time(torch, lambda: engine.verify(q), grid.repeats,
                                       grid.warmup, lambda: engine.cache.rollback(q)), q=q)
            refresh()
        # as runs draft: DRAFT_CHAIN greedy steps in one graph (the chain rolls the cache back
        # itself), per step — a single-step graph timed ~12% slower for Quest than the chain
        chain = max(1, min(DRAFT_CHAIN, engine.k_max))
        if grid.wants("draft"):
            record(f"draft:{policy}", [t / chain for t in _time(
                torch, lambda: engine.draft_chain(chain), grid.repeats, grid.warmup,
                undo_chain)], s=s)
        selection = grid.wants("selection") and policy != "streamingllm"
        if selection and policy in SELECTION_ROWS:   # the refresh ranks by r rows: at each
            for r in sorted({min(r, rows) for r in SELECTION_ROWS[policy]}):
                record(f"selection:{policy}", _time(
                    torch, lambda r=r: engine.refresh(r, zeros, slice(0, r)), grid.repeats,
                    grid.warmup), q=r, s=s)
            refresh()
        elif selection:
            record(f"selection:{policy}", _time(torch, refresh, grid.repeats, grid.warmup), s=s)
        if s == grid.sparsities[0] and grid.wants("verify"):
            # the policy's own verify where it differs from the shared one (module doc)
            for q0 in sorted({min(q, q_max) for q in POLICY_VERIFY_QS.get(policy, ())}):
                record(f"verify:{policy}", _time(torch, lambda q0=q0: engine.verify(q0),
                                                 grid.repeats, grid.warmup,
                                                 lambda q0=q0: engine.cache.rollback(q0)),
                       q=q0)
        if s == grid.sparsities[0] and grid.wants("overhead") and grid.overheads_at(context):
            # per policy (Quest's rollback)
            for k in sorted({min(k, engine.k_max) for k in OVERHEAD_KS}):
                record(f"overhead:speculative:{policy}",
                       _loop_overhead(torch, engine, prompts, speculative=True, k=k), q=k + 1)
        del engine
    return out


def _loop_overhead(torch, engine, prompts, *, speculative: bool, k: int = OVERHEAD_K,
                   repeats: int = 2) -> list[float]:
    """Per step (plain) or per iteration (speculative, forced draft length ``k``, m = k // 2)
    of a real decoding loop: what it spends beyond its own timed steps, in seconds (like
    ``_time``).

    The first run compiles and captures; then ``repeats`` timed runs. Each run's loop is timed
    by its own per-iteration clock (``Generation.steps``: from the loop's start to each
    iteration's host read — what a validation run's steady window measures), and the engine's
    CUDA-event totals of the steps the cost model prices separately (draft, verify, the
    in-loop selection refreshes) are subtracted, so what remains — the ``other`` phase
    (accept/reject, rollback) and the host's gaps — is measured in the same run rather than as
    the small difference of separately measured medians (which over-estimates it). The call's
    fixed costs outside the loop (prefill, the first selection, building the outputs and
    traces) are not in that clock, so they are not spread over the loop's iterations."""
    from specsim.traces.format import RequestTrace

    n = OVERHEAD_STEPS
    forced = None
    if speculative:
        context = np.array([len(p) for p in prompts])
        forced = [RequestTrace(str(b), engine.policy.name, engine.s,
                               context[b] + np.arange(n) * (k // 2 + 1),
                               np.full(n, k), np.full(n, k // 2))
                  for b in range(len(prompts))]
    out = []
    for i in range(repeats + 1):
        gen = engine.generate(prompts, n + 1, speculative=speculative, k=k
                              if speculative else None, forced=forced, prefill="random")
        priced = sum(gen.timing.get(p, 0.0) for p in ("draft", "verify", "selection"))
        loop = sum(step[0] for step in gen.steps)
        if i:
            out.append((loop - priced) / len(gen.steps))
    return out
