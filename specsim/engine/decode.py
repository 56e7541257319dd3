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
from specsim.engine.model import Transformer
from specsim.engine.sampling import (GREEDY, SamplingParams, accept_greedy, accept_speculative,
                                     choose, entropy, probabilities)
from specsim.engine.selection import DraftSelection, ProxyRecords
from specsim.engine.timing import PhaseTimer
from specsim.errors import SpecsimError
from specsim.policies import SPARSESPEC_WINDOW, Policy, get_policy
from specsim.settings import DEFAULT, EngineSettings
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


class PrefillState:
    """The prefill of a generate call's prompts (all of them, queued ones included), kept to
    be loaded into other engines (same prompts; another policy, k or s): per prompt and layer
    the prompt's K/V [T, G, D], the pre-softmax logits [H, R, T] and lse [H, R] of its last
    R ≤ 16 rows, and the last logits [N, V]."""

    def __init__(self, lengths: list[int]):
        self.lengths = list(lengths)
        batch = len(lengths)
        self.k: list[list] = [[] for _ in range(batch)]
        self.v: list[list] = [[] for _ in range(batch)]
        self.row_logits: list[list] = [[] for _ in range(batch)]
        self.row_lse: list[list] = [[] for _ in range(batch)]
        self.logits: torch.Tensor | None = None
        self._last: dict[int, torch.Tensor] = {}

    def set_logits(self, r: int, logits: torch.Tensor) -> None:
        self._last[r] = logits.clone()
        if len(self._last) == len(self.lengths):
            self.logits = torch.stack([self._last[i] for i in range(len(self.lengths))])

    @staticmethod
    def rows(length: int) -> int:
        return min(length, SPARSESPEC_WINDOW)

    def add(self, b, layer, k, v, row_logits, row_lse) -> None:
        assert len(self.k[b]) == layer
        self.k[b].append(k.clone())
        self.v[b].append(v.clone())
        self.row_logits[b].append(row_logits)
        self.row_lse[b].append(row_lse)

    def subset(self, sequences: list[int]) -> "PrefillState":
        out = PrefillState([self.lengths[b] for b in sequences])
        for name in ("k", "v", "row_logits", "row_lse"):
            setattr(out, name, [getattr(self, name)[b] for b in sequences])
        out.logits = self.logits[sequences]
        return out


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
        self._k_tensors: dict[int, torch.Tensor] = {}   # uniform k per iteration, on the device
        self._staging: dict[str, tuple[np.ndarray, torch.Tensor, torch.Tensor]] = {}
        self.device = model.lm_head.weight.device
        self.dtype = model.lm_head.weight.dtype
        paged = math.ceil(max_len / PAGE) * PAGE
        aligned = math.ceil(max_len / CACHE_ALIGN) * CACHE_ALIGN
        self.max_len = aligned if aligned <= args.max_position or paged > args.max_position \
            else paged
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
        # one-position writes by one Triton kernel with the Triton backend (the CPU path
        # writes with torch)
        self.cache.fused_append = self.backend.use_triton
        self.selection = DraftSelection(
            self.policy, s, num_layers=args.num_layers, batch=batch, num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads, max_len=self.max_len, k_max=k_max,
            backend=self.backend, logits_dtype=self.dtype, device=self.device,
            proxy_check=proxy_check, c2q=settings.c2q, ranking=settings.ranking)
        self.cuda_graphs = self.device.type == "cuda" and settings.cuda_graphs
        self._graphs: dict = {}
        self.draft_input = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        # static buffers of the greedy draft chain and of the selection refresh (graphed)
        self.chain_x0 = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.drafts = torch.zeros(batch, max(k_max, 1), dtype=torch.long, device=self.device)
        self.entropies = torch.zeros(batch, max(k_max, 1), dtype=torch.float32,
                                     device=self.device)
        self.last_row = torch.zeros(batch, dtype=torch.long, device=self.device)
        self._refresh_pool = None
        self._verify_inputs: dict[int, torch.Tensor] = {}
        params = {id(p): p for p in model.parameters()}.values()
        self.weight_bytes = float(sum(p.numel() * p.element_size() for p in params))
        self.kv_bytes_per_token = float(2 * args.num_layers * args.num_kv_heads * args.head_dim
                                        * self.cache.k(0).element_size())

    # ---- attention callables for the model ----------------------------------------------------
    def _prefill_attend(self, b: int, length: int, rows: int, keep: "PrefillState | None",
                        r: int):
        """Prefill of one prompt into slot ``b`` (recorded as prompt ``r`` of ``keep``)."""
        cache = self.cache

        def attend(layer, q, k, v):
            attention.write_prefill(cache, layer, b, k[0], v[0])
            wanted = keep.rows(length) if keep is not None else rows
            if wanted:
                logits, lse = attention.prefill_logits(q[0, -wanted:], k[0], length - wanted)
                if rows:
                    self._store_prefill_rows(layer, b, logits, lse)
                if keep is not None:
                    keep.add(r, layer, k[0], v[0], logits, lse)
            return attention.prefill_attention(q, k, v)
        return attend

    def _store_prefill_rows(self, layer: int, b: int, logits: torch.Tensor,
                            lse: torch.Tensor) -> None:
        """The last prompt rows' logits [H, R, T] and lse [H, R] → the selection buffers
        (the policy's last ``prefill_rows`` of them)."""
        self.selection.store_prefill_rows(layer, b, logits, lse, self._prefill_rows)

    def _verify_attend(self, q_len: int, rows: tuple[int, ...]):
        cache, selection, backend = self.cache, self.selection, self.backend

        def attend(layer, q, k, v):
            cache.write(layer, k.transpose(1, 2), v.transpose(1, 2))
            logits = selection.layer_logits(layer, len(rows)) if rows else None
            lse = selection.layer_lse(layer, q_len) if rows else None
            return backend.verify(q, cache.k(layer), cache.v(layer), cache.lengths,
                                  collect_rows=rows, logits=logits, lse=lse,
                                  collect_sum=selection.summed)
        return attend

    def _draft_attend(self):
        cache, selection, backend, kind = self.cache, self.selection, self.backend, self.policy.name

        def attend(layer, q, k, v):
            cache.write(layer, k.transpose(1, 2), v.transpose(1, 2))
            if kind == "full":
                return backend.verify(q, cache.k(layer), cache.v(layer), cache.lengths)
            if kind == "quest":
                indices, counts = selection.quest_lists(q[:, 0], cache, layer)
            else:
                indices, counts = selection.layer_lists(layer)
            return backend.draft(q[:, 0], cache.k(layer), cache.v(layer), indices,
                                 counts)[:, None]
        return attend

    # ---- steps on static buffers (graph-capturable) -------------------------------------------
    def _draft_step(self) -> torch.Tensor:
        """One draft token per sequence from ``draft_input``: logits [B, V]."""
        self.cache.extend(1)
        positions = (self.cache.lengths.long() - 1)[:, None]
        self.selection.append(positions[:, 0])
        return self.model(self.draft_input, positions, self._draft_attend())[:, -1]

    def _verify_step(self, q_len: int, collect: bool) -> torch.Tensor:
        """Full-attention pass over ``verify_input(q_len)``: logits [B, q, V]."""
        self.cache.extend(q_len)
        positions = (self.cache.lengths.long()[:, None] - q_len
                     + torch.arange(q_len, device=self.device))
        rows = self.selection.collect_rows(q_len) if collect else ()
        return self.model(self.verify_input(q_len), positions, self._verify_attend(q_len, rows))

    def _draft_chain_step(self, k_iter: int) -> torch.Tensor:
        """Greedy drafting of ``k_iter`` tokens from ``chain_x0`` with no host read between
        steps: each step's argmax feeds the next; tokens land in ``drafts[:, :k_iter]``, their
        entropies in ``entropies``; the cache is rolled back to where it started."""
        token = self.chain_x0
        for j in range(k_iter):
            self.draft_input[:, 0] = token
            token, probs = choose(self._draft_step(), GREEDY)
            self.drafts[:, j] = token
            self.entropies[:, j] = entropy(probs)
        self.cache.rollback(k_iter)
        return self.drafts

    def _refresh_step(self, rows: int, lse_rows: slice) -> torch.Tensor:
        self.selection.refresh(self.cache.lengths, rows, self.last_row, lse_rows)
        return self.last_row

    def verify_input(self, q_len: int) -> torch.Tensor:
        if q_len not in self._verify_inputs:
            self._verify_inputs[q_len] = torch.zeros(self.batch, q_len, dtype=torch.long,
                                                      device=self.device)
        return self._verify_inputs[q_len]

    def _snapshot(self):
        saved = [t.clone() for t in (self.cache.lengths, self.selection.counts) if t is not None]

        def restore():
            for t, s in zip((x for x in (self.cache.lengths, self.selection.counts)
                             if x is not None), saved):
                t.copy_(s)
        return restore

    def _run(self, key, step, capturable: bool, pool=None):
        """Run ``step`` eagerly, or as a CUDA graph (its own memory pool unless ``pool``)
        captured on first use."""
        if not (self.cuda_graphs and capturable):
            return step()
        if key not in self._graphs:
            from specsim.engine.graphs import CapturedStep
            self._graphs[key] = CapturedStep(step, self._snapshot, pool=pool)
        return self._graphs[key]()

    def draft_chain(self, k_iter: int) -> torch.Tensor:
        """``k_iter`` greedy draft steps from ``chain_x0`` as one launch (one CUDA graph per
        k): drafts [B, ≥ k_iter] (and ``entropies``), the cache length unchanged."""
        capturable = self.backend.capturable(1 if self.policy.name == "full" else None)
        return self._run(("chain", k_iter), lambda: self._draft_chain_step(k_iter), capturable)

    def refresh(self, rows: int, last_row: torch.Tensor | None = None,
                lse_rows: slice | None = None) -> None:
        """The selection's refresh (``DraftSelection.refresh``) at the current lengths, as one
        CUDA graph per (rows, lse rows); the graphs share one memory pool (their outputs are
        copied into the static index lists, so nothing outlives a replay)."""
        if self.selection.indices is None:
            return
        if last_row is not None:
            self.last_row.copy_(last_row)
        lse_rows = lse_rows or slice(0, rows)
        if self.cuda_graphs and self._refresh_pool is None:
            self._refresh_pool = torch.cuda.graph_pool_handle()
        self._run(("refresh", rows, lse_rows.start, lse_rows.stop),
                  lambda: self._refresh_step(rows, lse_rows), self.backend.capturable(),
                  pool=self._refresh_pool)

    def draft(self) -> torch.Tensor:
        """One draft step (input ``draft_input``): logits [B, V]."""
        capturable = self.backend.capturable(1 if self.policy.name == "full" else None)
        return self._run("draft", self._draft_step, capturable)

    def verify(self, q_len: int, collect: bool = True) -> torch.Tensor:
        """One verify pass (input ``verify_input(q_len)``): logits [B, q, V]."""
        return self._run(("verify", q_len, collect), lambda: self._verify_step(q_len, collect),
                         self.backend.capturable(q_len))

    # ---- prefill ---------------------------------------------------------------------------
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
        logits = self._prefill_batch(prompts, state, keep_state, min(len(p) for p in prompts))
        return logits, keep_state

    def _prefill_batch(self, prompts, source, keep_state, min_prompt: int) -> torch.Tensor:
        """The first ``batch`` prompts into their slots; the selection collects the last
        ``prefill_rows(min_prompt)`` prompt rows (the shortest prompt of the call, queued
        ones included, so that a refilled slot has as many)."""
        self.cache.lengths.zero_()
        self._prefill_rows = self.selection.prefill_rows(min_prompt)
        if isinstance(source, str):
            if source != "random":
                raise SpecsimError(f"prefill: a PrefillState or 'random', not {source!r}")
            return self._random_prefill(prompts)
        return torch.stack([self._prefill_slot(b, b, prompt, source, keep_state)
                            for b, prompt in enumerate(prompts)])

    def _prefill_slot(self, b: int, r: int, prompt: list[int], source, keep_state
                      ) -> torch.Tensor:
        """Prompt ``r`` into slot ``b`` (computed, loaded from the ``PrefillState`` ``source``,
        or random numbers) → its last-position logits [V]."""
        n = len(prompt)
        self.cache.lengths[b] = n
        if isinstance(source, str):
            return self._random_slot(b, n)
        if source is not None:
            if source.lengths[r] != n:
                raise SpecsimError("prefill state of other prompts")
            for layer in range(self.args.num_layers):
                attention.write_prefill(self.cache, layer, b, source.k[r][layer],
                                        source.v[r][layer])
                if self._prefill_rows:
                    self._store_prefill_rows(layer, b, source.row_logits[r][layer],
                                             source.row_lse[r][layer])
            return source.logits[r].to(self.device)
        tokens = torch.tensor(prompt, dtype=torch.long, device=self.device)[None]
        positions = torch.arange(n, device=self.device)[None]
        attend = self._prefill_attend(b, n, self._prefill_rows, keep_state, r)
        logits = self.model(tokens, positions, attend, last_only=True)[0, -1]
        if keep_state is not None:
            keep_state.set_logits(r, logits)
        return logits

    def _random_prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Timing only: fill the cache (and the collected rows) with random numbers instead of
        running the prompts — at real scale a prefill of random weights costs minutes and its
        KV values do not change a decode step's cost."""
        self._random_generator = torch.Generator(device=self.device).manual_seed(0)
        for b, prompt in enumerate(prompts):
            self.cache.lengths[b] = len(prompt)
        return torch.stack([self._random_slot(b, len(p)) for b, p in enumerate(prompts)])

    def _random_slot(self, b: int, n: int) -> torch.Tensor:
        """Random K/V for the first ``n`` positions of slot ``b`` (and its Quest page bounds
        and collected rows) → random last-position logits [V]."""
        generator = getattr(self, "_random_generator", None)
        if generator is None:
            generator = self._random_generator = torch.Generator(
                device=self.device).manual_seed(0)
        for layer in range(self.args.num_layers):
            self.cache.k(layer)[b, :, :n].normal_(generator=generator)
            self.cache.v(layer)[b, :, :n].normal_(generator=generator)
            if self.cache.page_size:
                attention.write_prefill(self.cache, layer, b,
                                        self.cache.k(layer)[b, :, :n].transpose(0, 1),
                                        self.cache.v(layer)[b, :, :n].transpose(0, 1))
            if self.selection.logits is not None:
                logits = self.selection.logits[layer, b].normal_(generator=generator)
                if self.selection.lse is not None:
                    self.selection.lse[layer, b] = torch.logsumexp(logits.float(), -1)[..., :1]
        return torch.randn(self.args.vocab_size, generator=generator, device=self.device)

    def _refresh_slots(self, slots: list[int]) -> None:
        """First selection of refilled ``slots`` from their prompt rows; the other slots keep
        the lists their last verify gave them (the refresh runs batched, then they are put
        back)."""
        selection = self.selection
        if selection.indices is None:
            return
        saved = selection.indices.clone(), selection.counts.clone()
        rows = self._prefill_rows
        self.refresh(rows, torch.zeros(self.batch, dtype=torch.long, device=self.device),
                     slice(0, rows))
        others = torch.ones(self.batch, dtype=torch.bool)
        others[slots] = False
        others = others.to(self.device)
        selection.indices[:, others] = saved[0][:, others]
        selection.counts[:, others] = saved[1][:, others]

    def _refill(self, run: "_Run", x0: torch.Tensor, sampling, generator,
                timer: PhaseTimer) -> list[int]:
        """Continuous batching: queued prompts into the slots whose sequence finished (their
        first token into ``x0``), timed as prefill; the iteration clock restarts after it."""
        refilled: list[int] = []
        if not run.free_slots():      # nothing queued or nothing finished: no timed phase
            return refilled
        with timer.phase("prefill"):
            while slots := run.free_slots():
                for b in slots:
                    r = run.next_request()
                    logits = self._prefill_slot(b, r, run.prompts[r], run.source, run.keep)
                    token, _ = choose(logits[None], sampling, generator)
                    x0[b] = token[0]
                    run.start(b, r, int(token[0]))
                    refilled.append(b)
            if refilled:
                self._refresh_slots(sorted(set(refilled)))
        if refilled:
            run.sync_active()
            run.mark()
        return refilled

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
                logits = self._prefill_batch(prompts[:self.batch], prefill, keep,
                                             min(len(p) for p in prompts))
                x0, _ = choose(logits, sampling, generator)
            run = _Run(self, prompts, max_new_tokens, x0, set(int(t) for t in eos_token_ids),
                       request_ids, source=prefill, keep=keep, forced=forced)
            if speculative and self.selection.proxy is not None:
                run.proxy = ProxyRecords(recent=self.policy.recent)
            if speculative:
                self._speculative(run, k, sampling, generator, timer, adaptive, forced)
            else:
                self._plain(run, sampling, generator, timer)
            timing = timer.totals()
        return Generation(tokens=run.tokens, traces=run.traces(self.policy.name, self.s)
                          if speculative else [], timing=timing,
                          wall_seconds=time.perf_counter() - t0, iterations=run.iterations,
                          forwards=dict(run.forwards), bytes_moved=dict(run.bytes),
                          prefill=(prefill if isinstance(prefill, PrefillState) else keep)
                          if keep_prefill else None, proxy=run.proxy,
                          steps=run.steps, batch=self.batch,
                          request_iterations=[len(r["k"]) for r in run.rows])

    def _plain(self, run: "_Run", sampling, generator, timer: PhaseTimer) -> None:
        x0 = run.x0
        self._refill(run, x0, sampling, generator, timer)
        run.mark()
        while run.any_active():
            with timer.phase("verify"):
                self.verify_input(1)[:, 0] = x0
                logits = self.verify(1, collect=False)[:, 0]
            with timer.phase("other"):
                token, _ = choose(logits, sampling, generator)
                self.cache.rollback((~run.active_t).int())
                x0 = torch.where(run.active_t, token, x0)
                run.bytes["verify"] += self.weight_bytes + self.kv_bytes_per_token * sum(
                    n + 1 for n in run.lengths)
                run.forwards["verify"] += 1
                run.step_plain(token.tolist())
            self._refill(run, x0, sampling, generator, timer)

    def _speculative(self, run: "_Run", k: int, sampling: SamplingParams, generator,
                     timer: PhaseTimer, adaptive: AdaptiveK | None,
                     forced: list[RequestTrace] | None) -> None:
        batch, vocab, device = self.batch, self.args.vocab_size, self.device
        with timer.phase("prefill"):   # the first lists, from the prompts: part of the prefill
            rows = self._prefill_rows
            self.refresh(rows, torch.zeros(batch, dtype=torch.long, device=device),
                         slice(0, rows))
        # greedy drafting without the adaptive controller needs no host read between draft
        # steps: one launch drafts all k (a CUDA graph per k on the GPU)
        chained = sampling.greedy and adaptive is None
        drafts = torch.zeros(batch, k, dtype=torch.long, device=device)
        entropies = torch.zeros(batch, k, dtype=torch.float32, device=device)
        draft_probs = None if sampling.greedy else torch.zeros(batch, k, vocab, device=device)
        centres = [adaptive.start if adaptive else None] * batch
        x0 = run.x0
        self._refill(run, x0, sampling, generator, timer)
        run.mark()
        while run.any_active():
            k_seq = [k] * batch
            if forced is not None:
                k_seq = [int(run.forced_of(b).k[min(run.iteration_of[b],
                                                     run.forced_of(b).iterations - 1)])
                         for b in range(batch)]
            k_iter = max(k_seq[b] for b in range(batch) if run.active[b])
            with timer.phase("draft"):
                token, stopped = x0, [not a for a in run.active]
                if chained:
                    self.chain_x0.copy_(x0)
                    self.draft_chain(k_iter)
                    drafts[:, :k_iter] = self.drafts[:, :k_iter]
                    entropies[:, :k_iter] = self.entropies[:, :k_iter]
                for j in range(0 if chained else k_iter):
                    self.draft_input[:, 0] = token
                    token, probs = choose(self.draft(), sampling, generator)
                    drafts[:, j] = token
                    entropies[:, j] = entropy(probs)
                    if draft_probs is not None:
                        draft_probs[:, j] = probs
                    if adaptive is not None:  # host read per step: SparseSpec-L's controller
                        h = entropies[:, :j + 1].tolist()
                        for b in range(batch):
                            if not stopped[b] and adaptive.stop(h[b], centres[b], k):
                                stopped[b], k_seq[b] = True, j + 1
                        if all(stopped):
                            k_iter = j + 1
                            break
                if not chained:
                    self.cache.rollback(k_iter)
            with timer.phase("verify"):
                q_len = k_iter + 1
                inputs = self.verify_input(q_len)
                inputs[:, 0] = x0
                inputs[:, 1:] = drafts[:, :k_iter]
                logits = self.verify(q_len)
            with timer.phase("other"):
                k_t = self._k_tensor(k_seq, k_iter)
                if sampling.greedy:
                    m, token, accept = accept_greedy(drafts[:, :k_iter], logits, k_t)
                else:
                    m, token, accept = accept_speculative(
                        drafts[:, :k_iter], draft_probs[:, :k_iter],
                        probabilities(logits, sampling), generator, k_t)
                if forced is not None:
                    m = self._to_device("forced_m", [min(int(run.forced_of(b).m[min(
                        run.iteration_of[b], run.forced_of(b).iterations - 1)]), k_seq[b])
                        for b in range(batch)])
                    token = logits.argmax(-1).gather(1, m[:, None]).squeeze(1)
                kept = torch.where(run.active_t, m + 1, 0)
                self.cache.rollback((q_len - kept).int())
                x0 = torch.where(run.active_t, token, x0)
            if run.proxy is None:   # queue the refresh before the host reads below
                with timer.phase("selection"):
                    rows = self.selection.ranked_rows(q_len)
                    self.refresh(rows, m, slice(q_len - rows, q_len))
            with timer.phase("other"):
                self._count_bytes(run, k_seq, k_iter)
                # one device-to-host read of everything the host keeps (token ids are exact in
                # float64): each separate read is a synchronising copy
                packed = torch.cat([m[:, None].double(), token[:, None].double(),
                                    drafts[:, :k_iter].double(), entropies[:, :k_iter].double(),
                                    accept.double()], 1).cpu().numpy()
                ids = packed[:, :2 + k_iter].astype(np.int64)
                m_h, token_h, drafts_h = ids[:, 0].tolist(), ids[:, 1].tolist(), ids[:, 2:]
                entropy_h = packed[:, 2 + k_iter:2 + 2 * k_iter]
                accept_h = np.clip(packed[:, 2 + 2 * k_iter:], 0.0, 1.0)
                for b in range(batch):
                    if run.active[b] and adaptive is not None:
                        centres[b] = adaptive.update(centres[b], entropy_h[b], m_h[b], k_seq[b])
                if run.proxy is not None:   # who is checked, before the step updates them
                    checked = [b for b in range(batch) if run.active[b]]
                    iteration_of = list(run.iteration_of)
                run.step_speculative(k_seq, m_h, drafts_h, token_h, entropy_h, accept_h,
                                     forced)
            if run.proxy is not None:   # the check reads the rows before the refresh
                with timer.phase("proxy"):
                    run.proxy.add(self.selection.check_proxy(self.cache.lengths, q_len),
                                  checked, iteration_of, run.lengths, k_seq)
                with timer.phase("selection"):
                    rows = self.selection.ranked_rows(q_len)
                    self.refresh(rows, m, slice(q_len - rows, q_len))
            for b in self._refill(run, x0, sampling, generator, timer):
                centres[b] = adaptive.start if adaptive else None

    def _k_tensor(self, k_seq: list[int], k_iter: int) -> torch.Tensor:
        """``k_seq`` clamped to ``k_iter`` on the device; the common case (every sequence at
        one k) from a cache instead of a host-to-device copy per iteration."""
        first = k_seq[0]
        if all(k == first for k in k_seq):
            key = min(first, k_iter)
            if key not in self._k_tensors:
                self._k_tensors[key] = torch.full((self.batch,), key, dtype=torch.long,
                                                  device=self.device)
            return self._k_tensors[key]
        return self._to_device("k", k_seq).clamp(max=k_iter)

    def _to_device(self, name: str, values: list[int]) -> torch.Tensor:
        """``values`` (one int per slot) as a device tensor, without stalling the host: written
        into a pinned host buffer and copied asynchronously. A plain ``torch.tensor(values,
        device="cuda")`` copies from pageable memory, which waits for the stream to drain: for
        the forced m that is the verify pass, so the host could not queue the rest of the
        iteration while it ran (a stall a free-running loop does not have, and which the
        forced-acceptance loop overheads of a calibration then carried). Reusing the buffer is
        safe: every iteration ends in a synchronising device-to-host read, so the previous copy
        out of it has completed. The returned tensor is overwritten by the next call."""
        if name not in self._staging:
            cuda = torch.device(self.device).type == "cuda"
            host = torch.zeros(self.batch, dtype=torch.long, pin_memory=cuda)
            self._staging[name] = (host.numpy(), host,
                                   torch.zeros(self.batch, dtype=torch.long, device=self.device))
        view, host, device = self._staging[name]
        view[:] = values
        return device.copy_(host, non_blocking=True)

    def _count_bytes(self, run: "_Run", k_seq: list[int], k_iter: int) -> None:
        """Weights once per forward; KV rows each pass attends to (drafts: the policy's
        selection + the drafts so far; verify: the whole context + q)."""
        run.forwards["draft"] += k_iter
        run.forwards["verify"] += 1
        lengths = np.asarray(run.lengths, dtype=np.int64)
        steps = k_iter * (k_iter + 1) // 2                      # Σ_j (j + 1) appended drafts
        draft = k_iter * float(self.policy.selected_array(lengths, self.s).sum()) \
            + steps * lengths.size
        verify = float((lengths + k_iter + 1).sum())
        run.bytes["draft"] += k_iter * self.weight_bytes + draft * self.kv_bytes_per_token
        run.bytes["verify"] += self.weight_bytes + verify * self.kv_bytes_per_token


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


def cache_positions(prompt_len: int, max_new_tokens: int, k: int) -> int:
    """Cache positions a sequence can reach in ``generate``: its last iteration may keep up to
    k + 1 tokens past the one that completes it (the cache is not trimmed to the output), so
    it ends at prompt + max_new − 1 + k; while other sequences go on, a finished one still
    drafts k and verifies k + 1 positions each iteration (static shapes), so + 2k + 1."""
    return prompt_len + max_new_tokens + 2 * k + 1


class _Run:
    """Host-side bookkeeping of one generate call: which prompt each slot holds, the queue,
    outputs and trace rows per prompt, lengths and activity per slot."""

    def __init__(self, engine: Engine, prompts, max_new: int, x0: torch.Tensor, eos: set[int],
                 request_ids, source=None, keep: "PrefillState | None" = None,
                 forced: list[RequestTrace] | None = None):
        self.engine, self.max_new, self.eos, self.x0 = engine, max_new, eos, x0
        self.prompts, self.source, self.keep, self.forced = prompts, source, keep, forced
        batch = engine.batch
        self.ids = request_ids or [str(r) for r in range(len(prompts))]
        self.slot_request = list(range(batch))   # the prompt each slot holds
        self._queue_head = batch                 # the next prompt to take a freed slot
        self.lengths = [len(p) for p in prompts[:batch]]
        first = x0.tolist()
        self.tokens: list[list[int]] = [[t] for t in first] + [[] for _ in prompts[batch:]]
        self.active = [self._live(t) for t in first]
        self.active_t = torch.tensor(self.active, device=x0.device)
        self._active_sent = list(self.active)    # what active_t holds
        self.iterations = 0
        self.iteration_of = [0] * batch
        self.rows: list[dict[str, list]] = [{"context": [], "k": [], "m": [], "entropy": [],
                                             "accept_prob": []} for _ in prompts]
        self.forwards: dict[str, int] = {"draft": 0, "verify": 0}
        self.bytes: dict[str, float] = {"draft": 0.0, "verify": 0.0}
        self.proxy: ProxyRecords | None = None
        self.steps: list[tuple[float, int, int]] = []
        self._mark = time.perf_counter()   # the decode loop's start (mark() resets it)

    def _live(self, first_token: int) -> bool:
        return self.max_new > 1 and first_token not in self.eos

    # ---- the queue (continuous batching) ------------------------------------------------------
    def free_slots(self) -> list[int]:
        """Slots whose sequence is done, as many as there are prompts still queued."""
        free = [b for b, a in enumerate(self.active) if not a]
        return free[:len(self.prompts) - self._queue_head]

    def next_request(self) -> int:
        r = self._queue_head
        self._queue_head += 1
        return r

    def start(self, b: int, r: int, first_token: int) -> None:
        """Prompt ``r`` now holds slot ``b`` (prefilled; ``first_token`` from its logits)."""
        self.slot_request[b] = r
        self.lengths[b] = len(self.prompts[r])
        self.tokens[r] = [first_token]
        self.iteration_of[b] = 0
        self.active[b] = self._live(first_token)

    def forced_of(self, b: int) -> RequestTrace:
        return self.forced[self.slot_request[b]]

    # ---- per iteration ------------------------------------------------------------------------
    def mark(self) -> None:
        """The loop starts (or resumes after a refill) now: the next iteration's clock."""
        if self.x0.is_cuda:
            torch.cuda.synchronize(self.x0.device)
        self._mark = time.perf_counter()

    def _log_step(self, active_before: int, emitted: int) -> None:
        # each step's host read waits for the iteration's GPU work: end − previous end is the
        # iteration's wall time
        now = time.perf_counter()
        self.steps.append((now - self._mark, active_before, emitted))
        self._mark = now

    def any_active(self) -> bool:
        return any(self.active)

    def _emit(self, b: int, new: list[int]) -> None:
        for i, t in enumerate(new):
            if t in self.eos:
                new = new[:i + 1]
                self.active[b] = False
                break
        out = self.tokens[self.slot_request[b]]
        out.extend(new[:self.max_new - len(out)])
        if len(out) >= self.max_new:
            self.active[b] = False

    def step_plain(self, tokens: list[int]) -> None:
        self.iterations += 1
        before, emitted = sum(self.active), self.new_tokens()
        for b, t in enumerate(tokens):
            if self.active[b]:
                self.lengths[b] += 1
                self._emit(b, [t])
        self.sync_active()
        self._log_step(before, self.new_tokens() - emitted)

    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    def step_speculative(self, k_seq, m, drafts, token, entropies, accept, forced) -> None:
        self.iterations += 1
        before, emitted = sum(self.active), self.new_tokens()
        for b in range(len(m)):
            if not self.active[b]:
                continue
            k_b, m_b, rows = k_seq[b], m[b], self.rows[self.slot_request[b]]
            rows["context"].append(self.lengths[b])
            rows["k"].append(k_b)
            rows["m"].append(m_b)
            rows["entropy"].append(entropies[b][:k_b])
            rows["accept_prob"].append(accept[b][:k_b])
            self.lengths[b] += m_b + 1
            self.iteration_of[b] += 1
            self._emit(b, drafts[b][:m_b].tolist() + [token[b]])
            if forced is not None and self.iteration_of[b] >= self.forced_of(b).iterations:
                self.active[b] = False
        self.sync_active()
        self._log_step(before, self.new_tokens() - emitted)

    def sync_active(self) -> None:
        """The device copy of which slots are active, copied only when it changed."""
        if self.active != self._active_sent:
            self.active_t.copy_(torch.tensor(self.active))
            self._active_sent = list(self.active)

    def traces(self, policy: str, s: float) -> list[RequestTrace]:
        out = []
        for r, rows in enumerate(self.rows):
            if not rows["k"]:
                continue
            out.append(RequestTrace(
                self.ids[r], policy, None if policy == "full" else float(s),
                np.asarray(rows["context"], dtype=np.int64), np.asarray(rows["k"], np.int64),
                np.asarray(rows["m"], np.int64),
                entropy=[np.asarray(e, float) for e in rows["entropy"]],
                accept_prob=[np.asarray(a, float) for a in rows["accept_prob"]]))
        return out


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


def truncate_trace(trace: RequestTrace, k: int) -> RequestTrace:
    """Counterfactual replay at k ≤ the recorded k, as ``specsim predict`` replays it: a
    request recorded at one fixed k is followed token by token (a run at k accepts the run of
    tokens the recorded drafts predicted from where the previous iteration ended, up to k;
    ``specsim.traces.acceptance.replay_tokens``), with the contexts those iterations start at;
    a variable-k request per recorded iteration, ``m' = min(m, k)``. Exact under greedy
    decoding up to where the selection refreshes and the drafts' own KV move with k."""
    from specsim.traces.acceptance import fixed_k, replay_tokens, token_acceptance
    predicted = token_acceptance(trace)
    if predicted is None or k >= fixed_k(trace):
        return RequestTrace(trace.id, trace.policy, trace.s, trace.context,
                            np.minimum(trace.k, k), np.minimum(trace.m, k),
                            prompt_id=trace.prompt_id)
    m = replay_tokens(predicted, k)
    context = int(trace.context[0]) + np.concatenate([[0], np.cumsum(m + 1)[:-1]])
    return RequestTrace(trace.id, trace.policy, trace.s, context.astype(np.int64),
                        np.full(m.size, k, dtype=np.int64), m, prompt_id=trace.prompt_id)


__all__ = ["AdaptiveK", "Engine", "Generation", "PrefillState", "forced_prompts", "plain_decode",
           "speculative_decode", "truncate_trace"]
