"""Plain and self-speculative decoding with sparse drafting, batched, recording traces.

One iteration of self-speculative decoding for every sequence b of the batch (cache holds L_b
tokens; x0, the last emitted token, has no KV yet):

    draft   k steps: token x0, d1, .., d_{k−1} at positions L_b.. with sparse attention over the
            selected KV (+ the drafts' own KV) → d1..dk; then roll the k draft KV rows back
    verify  one pass over [x0, d1..dk] with full attention (+ collected logits) → p_0..p_k
    accept  greedy match, or min(1, p(x)/q(x)) with a residual/bonus draw → m_b, next token
    rollback the k − m_b rejected rows; emit d1..d_{m_b}, next; refresh the draft selection

Sequences accept independently (ragged lengths throughout); a finished sequence keeps running
in the batch with everything rejected, so its cache does not grow. The loop does one host read
per iteration (the accepted tokens); everything else is tensor ops on fixed-shape buffers, and
on CUDA the draft step and the verify pass are CUDA graphs (``graphs``) with CUDA-event timing
split into draft / verify / selection / other (``timing``).

``Engine`` composes parts with one job each: ``steps.Steps`` (the model passes on static
buffers, eager or graphed), ``prefill.Prefill`` (prompts into the cache slots and their first
selection), ``loop`` (the plain and speculative loops, an iteration's phases, the refills of
continuous batching, host-to-device transfers) and ``run.Run`` (one call's host-side
bookkeeping: slots, queue, outputs, trace rows, bytes moved, the per-iteration clock).

Options: SparseSpec-L's entropy-guided adaptive k (``AdaptiveK``, through
``specsim.analytical.adaptive_k``); forced acceptance (``forced=`` traces: replay each
iteration's k and m, for timing with random weights at real shapes); the proxy check
(``Engine(proxy_check=True)``, vegas / vegas-all: after every verify, per layer, the overlap of
Collect-2-Query's top-K with the top-K by all k+1 rows, in ``Generation.proxy``; see
``selection.ProxyCheck``; its verify passes collect every row, so a checked run's timings are
not the policy's own). Without it the loop does none of that work.

What a trace records per iteration (``specsim.traces.format``): ``context`` = KV entries in the
cache at the start (the prompt length on the first iteration), ``k`` drafted, ``m`` accepted,
``entropy`` = entropy (nats) of each draft distribution (the warped q a draft is sampled from;
under greedy decoding the plain softmax of the draft logits), ``accept_prob`` = min(1, p(x)/q(x))
per draft under sampling, 1.0/0.0 (draft == argmax p) under greedy. Entries after the first
rejection are what the verify pass computed for them (conditioned on a rejected prefix).
"""
from __future__ import annotations

import contextlib
import gc
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from specsim.analytical import EntropyCentres, adaptive_k, update_entropy_centres
from specsim.engine import attention
from specsim.engine.loop import PlainLoop, SpeculativeLoop, Transfers
from specsim.engine.model import Transformer
from specsim.engine.prefill import Prefill, PrefillState
from specsim.engine.run import Run
from specsim.engine.sampling import GREEDY, SamplingParams, next_token
from specsim.engine.selection import DraftSelection, ProxyRecords
from specsim.engine.steps import Steps
from specsim.engine.timing import PhaseTimer
from specsim.errors import SpecsimError
from specsim.policies import Policy, get_policy
from specsim.settings import DEFAULT, EngineSettings
from specsim.traces.acceptance import truncate_trace  # noqa: F401  (exported)
from specsim.traces.format import RequestTrace

PAGE = 16  # cache lengths are padded to whole Quest pages
#: ... and, where the model's positions allow, to a page count that is a multiple of 8. On the
#: H200 a Quest draft step at batch 4, 32K took 17.8 ms with 2075 pages (the calibration's
#: cache, 33 200 positions) and 15.8 ms with 2070 (a validation run's, 33 120): same code and
#: GPU, one call; an odd page count is the likely cause (page scores are a bf16 matmul over
#: the page axis).
CACHE_ALIGN = 128


@dataclass(frozen=True)
class AdaptiveK:
    """SparseSpec-L's adaptive k: stop drafting after step j when Eq. 8's best k is ≤ j, the
    future drafts' entropies taken equal to the last one; centres updated by Eq. 6."""

    gamma: float = 0.1                    # C_d / C_v: cost of a draft step over a verify pass
    beta: float = 0.9                     # EMA smoothing of the entropy centres
    start: EntropyCentres = EntropyCentres(accepted=0.5, rejected=2.5)

    def stop(self, entropies: list[float], centres: EntropyCentres, k_max: int) -> bool:
        j = len(entropies)
        if j >= k_max:
            return True
        future = list(entropies) + [entropies[-1]] * (k_max - j)
        return adaptive_k(future, centres, self.gamma, 1.0, range(1, k_max + 1)) <= j

    def update(self, centres: EntropyCentres, entropies, m: int, k: int) -> EntropyCentres:
        rejected = entropies[m:m + 1] if m < k else []
        return update_entropy_centres(centres, entropies[:m], rejected, self.beta)


@dataclass
class Generation:
    """What one ``Engine.generate`` call produced and how long each phase took."""

    tokens: list[list[int]]                 # generated tokens per sequence (prompt excluded)
    traces: list[RequestTrace]              # speculative runs: one per sequence
    timing: dict[str, float]                # seconds per phase (timing.PHASES)
    wall_seconds: float
    iterations: int                         # speculative iterations or plain steps
    forwards: dict[str, int] = field(default_factory=dict)      # draft steps, verify passes
    bytes_moved: dict[str, float] = field(default_factory=dict)  # weights + KV, per phase
    prefill: "PrefillState | None" = None   # with keep_prefill=True
    proxy: ProxyRecords | None = None       # with Engine(proxy_check=True)
    #: per iteration (plain step): wall seconds, sequences active at its start, tokens emitted
    steps: list[tuple[float, int, int]] = field(default_factory=list)
    batch: int = 0                          # slots (0: one per prompt, as a static batch)
    request_iterations: list[int] = field(default_factory=list)   # per prompt (speculative)
    #: the decode loop's own CPU time (its wall time less its waits for the GPU's results);
    #: it overlaps the GPU's work, so it is not a phase
    host_seconds: float = 0.0

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def decode_seconds(self) -> float:
        return sum(v for name, v in self.timing.items() if name not in ("prefill", "proxy"))

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / max(self.decode_seconds, 1e-12)

    @property
    def tokens_per_iteration(self) -> float:
        """Mean m + 1 over all (sequence, iteration) pairs (1.0 for plain decoding)."""
        n = sum(t.iterations for t in self.traces)
        return sum(t.tokens for t in self.traces) / n if n else 1.0

    @property
    def emitted_tokens_per_iteration(self) -> float:
        """Tokens that reached the outputs per (sequence, iteration): unlike
        ``tokens_per_iteration`` it leaves out what a last iteration accepted past
        ``max_new_tokens`` (and each prompt's first token, which the prefill gave)."""
        pairs = [(len(t) - 1, n) for t, n in zip(self.tokens, self.request_iterations) if n]
        n = sum(i for _, i in pairs)
        return sum(e for e, _ in pairs) / n if n else 1.0

    @property
    def steady_window(self) -> list[tuple[float, int]]:
        """(wall seconds, tokens emitted) of the iterations that start with every slot busy.
        A finished sequence keeps its slot until a queued prompt takes it (continuous
        batching) or, once none is left, until the last sequence is done; so the whole run
        ends in a tail where few sequences emit (with as many prompts as slots, a static batch,
        that tail can be most of it). This window is a full batch in steady state."""
        slots = self.batch or len(self.tokens)
        return [(sec, n) for sec, active, n in self.steps if active == slots]

    @property
    def steady_tokens_per_second(self) -> float:
        """Throughput over ``steady_window``; NaN when no iteration had the whole batch."""
        window = self.steady_window
        seconds = sum(sec for sec, _ in window)
        return sum(n for _, n in window) / seconds if seconds > 0 else float("nan")

    def bandwidth(self, phase: str | None = None) -> float:
        """Achieved bytes/s, all decode phases or one."""
        if phase is not None:
            return self.bytes_moved.get(phase, 0.0) / max(self.timing.get(phase, 0.0), 1e-12)
        return sum(self.bytes_moved.values()) / max(self.decode_seconds, 1e-12)


class Engine:
    """A model with a KV cache, draft lists, kernel plans (and CUDA graphs) for one batch size,
    maximum length, selection policy, sparsity and maximum k: plan once, ``generate`` often."""

    def __init__(self, model: Transformer, *, batch: int, max_len: int,
                 policy: str | Policy = "vegas", s: float = 0.05, k_max: int = 8,
                 settings: EngineSettings = DEFAULT, use_triton: bool | None = None,
                 beyond_max_position: bool = False, proxy_check: bool = False):
        args = self.args = model.args
        self.settings = settings
        model.prepare(settings)
        self.model, self.batch, self.k_max, self.s = model, batch, k_max, s
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        self.device = model.lm_head.weight.device
        self.dtype = model.lm_head.weight.dtype
        self.max_len = cache_length(max_len, args.max_position)
        if self.max_len > args.max_position:
            if not beyond_max_position:
                raise SpecsimError(f"max length {self.max_len} exceeds the model's "
                                   f"{args.max_position} positions")
            # timing with random weights: positions past the trained range cost the same
            model.setup_rope(self.max_len)
        self.cache = attention.KVCache(
            batch, args.num_kv_heads, self.max_len, args.head_dim, num_layers=args.num_layers,
            dtype=self.dtype, device=self.device,
            page_size=self.policy.page_size if self.policy.name == "quest" else None)
        self.backend = attention.AttentionBackend(
            self.device, num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim, batch=batch, max_len=self.max_len, use_triton=use_triton)
        # appends by one Triton kernel with the Triton backend (the CPU path writes with torch)
        self.cache.fused_append = self.backend.use_triton
        self.selection = DraftSelection(
            self.policy, s, num_layers=args.num_layers, batch=batch, num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads, max_len=self.max_len, k_max=k_max,
            backend=self.backend, logits_dtype=self.dtype, device=self.device,
            proxy_check=proxy_check, c2q=settings.c2q,
            ranking=settings.ranking,
            layers=args.full_layers)
        self.steps = Steps(model, self.cache, self.backend, self.selection, batch=batch,
                           k_max=k_max,
                           cuda_graphs=self.device.type == "cuda" and settings.cuda_graphs)
        self.prefiller = Prefill(model, self.cache, self.selection, self.steps, batch)
        self.transfers = Transfers(batch, self.device)
        params = {id(p): p for p in model.parameters()}.values()
        self.weight_bytes = float(sum(p.numel() * p.element_size() for p in params))
        self.kv_bytes_per_token = float(2 * args.num_layers * args.num_kv_heads * args.head_dim
                                        * self.cache.k(0).element_size())

    # ---- the parts' entry points ------------------------------------------------------------
    @property
    def prefill_rows(self) -> int:
        """How many of the last prompt rows the last prefill collected for the selection."""
        return self.prefiller.rows

    def prefill(self, prompts: list[list[int]], state: "PrefillState | str | None" = None,
                keep: bool = False) -> tuple[torch.Tensor, "PrefillState | None"]:
        """Prompts one at a time into the cache, prompt b into slot b → (last-position logits
        [B, V], state).

        The last prompt rows' logits feed the first selection. With ``keep`` the cache rows,
        logits and collected rows are also returned as a ``PrefillState``; passing one as
        ``state`` loads it instead of recomputing (same prompts: another policy, k or s);
        ``state="random"`` fills the cache with random numbers instead (timing only)."""
        if len(prompts) > self.batch:
            raise SpecsimError(f"prefill: {len(prompts)} prompts for {self.batch} slots (queue "
                               f"more prompts through generate)")
        keep_state = PrefillState([len(p) for p in prompts]) if keep else None
        logits = self.prefiller.fill(prompts, state, keep_state, min(len(p) for p in prompts))
        return logits, keep_state

    def verify(self, q_len: int, collect: bool = True) -> torch.Tensor:
        """One verify pass (``Steps.verify``): logits [B, q, V]."""
        return self.steps.verify(q_len, collect)

    def draft_chain(self, k_iter: int) -> torch.Tensor:
        """``k_iter`` greedy draft steps as one launch (``Steps.draft_chain``)."""
        return self.steps.draft_chain(k_iter)

    def refresh(self, rows: int, last_row: torch.Tensor | None = None,
                lse_rows: slice | None = None) -> None:
        """The selection's refresh at the current lengths (``Steps.refresh``)."""
        self.steps.refresh(rows, last_row, lse_rows)

    # ---- decoding --------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], max_new_tokens: int, *,
                 speculative: bool = True, k: int | None = None,
                 sampling: SamplingParams = GREEDY, adaptive: AdaptiveK | None = None,
                 forced: list[RequestTrace] | None = None, eos_token_ids=(), seed: int = 0,
                 request_ids: list[str] | None = None,
                 prefill: "PrefillState | str | None" = None,
                 keep_prefill: bool = False) -> Generation:
        """Decode ``max_new_tokens`` per prompt (token ids; at least ``batch`` prompts).

        The first ``batch`` prompts fill the slots; with more, the rest queue and each takes
        the slot of a sequence that finished, prefilled there while the others wait
        (continuous batching; the prefill is timed apart from the decode phases). With exactly
        ``batch`` prompts it is a static batch.

        ``speculative=False``: plain decoding. ``k``: drafts per iteration (≤ k_max; the
        maximum with ``adaptive``). ``forced``: one trace per prompt whose k and m each
        iteration replays (``max_new_tokens`` is then ignored). Generation stops at a token in
        ``eos_token_ids`` (kept in the output) or after ``max_new_tokens``. ``keep_prefill``
        returns every prompt's ``PrefillState`` in the result; ``prefill=`` reuses one, or
        ``prefill="random"`` fills the cache with random numbers (timing with random weights).
        """
        if len(prompts) < self.batch:
            raise SpecsimError(f"engine planned for batch {self.batch}, got {len(prompts)} "
                               f"prompts (at least {self.batch}: more queue for freed slots)")
        if any(len(p) == 0 for p in prompts):
            raise SpecsimError("empty prompt")
        if request_ids is not None and len(request_ids) != len(prompts):
            raise SpecsimError(f"{len(request_ids)} request ids for {len(prompts)} prompts")
        if isinstance(prefill, PrefillState) and prefill.lengths != [len(p) for p in prompts]:
            raise SpecsimError("the prefill state was made for other prompts")
        if len(prompts) > self.batch and self.selection.proxy is not None:
            raise SpecsimError("the proxy check records by slot: give exactly one prompt per "
                               "slot (no queue)")
        k = self.k_max if k is None else int(k)
        if speculative and not 1 <= k <= self.k_max:
            raise SpecsimError(f"k must lie in 1..{self.k_max} (the engine's k_max), got {k}")
        if forced is not None:
            if len(forced) != len(prompts):
                raise SpecsimError("forced acceptance needs one trace per prompt")
            max_new_tokens = max(t.tokens for t in forced) + 1  # + the prefill's token
            k = max(k, int(max(t.k.max() for t in forced)))
            if k > self.k_max:
                raise SpecsimError(f"trace drafts k={k} > engine k_max={self.k_max}")
        need = cache_positions(max(len(p) for p in prompts), max_new_tokens, k)
        if need > self.max_len:
            raise SpecsimError(f"prompt + new tokens + k need {need} cache positions, the "
                               f"engine has {self.max_len}")
        generator = torch.Generator(device=self.device).manual_seed(seed)
        timer = PhaseTimer(self.device)
        # a computed prefill is recorded for every prompt as its slot is filled
        keep = PrefillState([len(p) for p in prompts]) if keep_prefill and prefill is None \
            else None
        t0 = time.perf_counter()
        with torch.inference_mode(), collector_paused():
            with timer.phase("prefill"):
                logits = self.prefiller.fill(prompts[:self.batch], prefill, keep,
                                             min(len(p) for p in prompts))
                x0 = next_token(logits, sampling, generator)
            run = Run(self.batch, prompts, max_new_tokens, x0,
                      set(int(t) for t in eos_token_ids), request_ids, source=prefill,
                      keep=keep, forced=forced)
            if speculative and self.selection.proxy is not None:
                run.proxy = ProxyRecords(recent=self.policy.recent)
            if speculative:
                SpeculativeLoop(self, run, sampling, generator, timer, k, adaptive,
                                forced).decode()
            else:
                PlainLoop(self, run, sampling, generator, timer).decode()
            timing = timer.totals()
        return Generation(tokens=run.tokens, traces=run.traces(self.policy.name, self.s)
                          if speculative else [], timing=timing,
                          wall_seconds=time.perf_counter() - t0, iterations=run.iterations,
                          forwards=dict(run.forwards), bytes_moved=dict(run.bytes),
                          prefill=(prefill if isinstance(prefill, PrefillState) else keep)
                          if keep_prefill else None, proxy=run.proxy,
                          steps=run.steps, batch=self.batch,
                          request_iterations=[len(r["k"]) for r in run.rows],
                          host_seconds=run.host_seconds)


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector paused while a generate call decodes (restored after,
    also on errors). The loop allocates small objects every iteration (host reads, per-token
    bookkeeping), which trigger collections that scan every live object — pauses of
    milliseconds landing on random iterations. On the H200 (SmolLM2, batch 32, 4K, forced
    k = 4) the loop's time beyond its priced steps is 1.81 ms per iteration with the
    collector on and 1.07 ms with it off. Reference counting
    still frees everything without cycles; cycles wait for the next collection after the
    call."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def cache_length(positions: int, max_position: int) -> int:
    """The cache an engine allocates for ``positions`` positions: whole Quest pages
    (``PAGE``), rounded up to ``CACHE_ALIGN`` where the model's ``max_position`` allows."""
    paged = math.ceil(positions / PAGE) * PAGE
    aligned = math.ceil(positions / CACHE_ALIGN) * CACHE_ALIGN
    return aligned if aligned <= max_position or paged > max_position else paged


def cache_positions(prompt_len: int, max_new_tokens: int, k: int) -> int:
    """Cache positions a sequence can reach in ``generate``: its last iteration may keep up to
    k + 1 tokens past the one that completes it (the cache is not trimmed to the output), so
    it ends at prompt + max_new − 1 + k; while other sequences go on, a finished one still
    drafts k and verifies k + 1 positions each iteration (static shapes), so + 2k + 1."""
    return prompt_len + max_new_tokens + 2 * k + 1


# --------------------------------------------------------------------------------------------
# one-call helpers
# --------------------------------------------------------------------------------------------


def _engine_for(model, prompts, max_new_tokens, k, policy, s, **kw) -> Engine:
    max_len = cache_positions(max(len(p) for p in prompts), max_new_tokens, k)
    return Engine(model, batch=len(prompts), max_len=max_len, policy=policy, s=s, k_max=k, **kw)


def plain_decode(model: Transformer, prompts: list[list[int]], max_new_tokens: int, *,
                 sampling: SamplingParams = GREEDY, seed: int = 0, eos_token_ids=(),
                 **engine_kw) -> Generation:
    """Plain (non-speculative) decoding of a batch of prompts."""
    engine = _engine_for(model, prompts, max_new_tokens, 1, "full", 1.0, **engine_kw)
    return engine.generate(prompts, max_new_tokens, speculative=False, sampling=sampling,
                           seed=seed, eos_token_ids=eos_token_ids)


def speculative_decode(model: Transformer, prompts: list[list[int]], max_new_tokens: int, *,
                       policy: str | Policy = "vegas", k: int = 8, s: float = 0.05,
                       sampling: SamplingParams = GREEDY, adaptive: AdaptiveK | None = None,
                       seed: int = 0, eos_token_ids=(), request_ids=None,
                       **engine_kw) -> Generation:
    """Self-speculative decoding of a batch of prompts with one selection policy."""
    engine = _engine_for(model, prompts, max_new_tokens, k, policy, s, **engine_kw)
    return engine.generate(prompts, max_new_tokens, k=k, sampling=sampling, adaptive=adaptive,
                           seed=seed, eos_token_ids=eos_token_ids, request_ids=request_ids)


def forced_prompts(traces: list[RequestTrace], vocab_size: int, seed: int = 0,
                   length: int | None = None) -> list[list[int]]:
    """Random prompts for forced-acceptance replay: as long as each trace's first context, or
    ``length`` tokens each."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, length or int(t.context[0])).tolist() for t in traces]


__all__ = ["AdaptiveK", "Engine", "Generation", "PrefillState", "forced_prompts", "plain_decode",
           "speculative_decode", "truncate_trace"]
