"""Roofline cost model: bytes and FLOPs over measured ceilings, plus explicit overheads.

Each forward pass costs ``max(bytes / bandwidth, flops / matrix rate) + overhead + all-reduce``
(per GPU), where the bytes are:

- weights: read once per forward (MoE: the experts the batch's tokens touch);
- KV: each sequence reads the KV it attends to exactly once — its whole context for a plain
  step or a verify pass of q rows (sliding-window layers: at most the last W + q − 1 keys),
  ``selected(ctx, s)`` entries in full-attention layers for a draft step (sliding-window
  layers are not sparsified: they read their window), plus the new tokens' KV written;
- other: index lists, collected logits, page metadata, per-token activations.

KV bytes per token and layer are ``kv_heads · head_dim · 2 · dtype bytes`` (GQA counted
correctly). Tensor parallelism over ``tp`` GPUs: each GPU holds ``1/tp`` of the weights and
``ceil(kv_heads/tp)`` KV heads, and every layer does two all-reduces of the activations
(ring: ``2·(tp−1)/tp · bytes / link bandwidth + latency``).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from specsim.costs.base import Cost, IterationCost, as_contexts, compose_iteration
from specsim.policies import SPARSESPEC_WINDOW, get_policy
from specsim.specs import FULL_ATTENTION, HardwareSpec, ModelSpec, Overheads

INDEX_BYTES = 4          # int32 token indices
SCORE_BYTES = 4          # fp32 intermediate scores
LOGIT_BYTES = 2          # collected pre-softmax logits are written as bf16


class RooflineCostModel:
    name = "roofline"

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tp: int = 1,
                 overheads: Overheads | None = None, c2q: str = "sum"):
        if c2q not in ("rows", "sum"):
            raise ValueError(f"c2q must be rows or sum, got {c2q!r}")
        #: what Vegas' verify writes (the engine's ``SPECSIM_C2Q``, default "sum"): its two
        #: collected rows per query head in bf16, or their sum, one fp32 row per sequence
        self.c2q = c2q
        if tp < 1:
            raise ValueError("tensor parallelism tp must be ≥ 1")
        if tp > 1 and model.num_heads % tp:
            raise ValueError(f"tp={tp} does not divide {model.num_heads} attention heads")
        self.model, self.hardware, self.tp = model, hardware, tp
        self.overheads = overheads or hardware.overheads
        # per-GPU shares
        self.kv_head_share = math.ceil(model.num_kv_heads / tp) / model.num_kv_heads
        self.head_share = 1.0 / tp
        self._full = [t == FULL_ATTENTION for t in model.layer_types]
        self.kv_layer_bytes = model.kv_bytes_per_token_layer() * self.kv_head_share

    # ---- building blocks ----------------------------------------------------------------
    def _attended(self, contexts: np.ndarray, full_layer_tokens: np.ndarray, q: int = 1
                  ) -> float:
        """KV entries read by a pass of ``q`` rows, summed over sequences and layers:
        full-attention layers read ``full_layer_tokens`` per sequence, sliding layers their
        window's keys (``ModelSpec.window_keys``)."""
        m = self.model
        n_full = sum(self._full)
        n_sliding = m.num_layers - n_full
        total = n_full * float(np.sum(full_layer_tokens))
        if n_sliding:
            total += n_sliding * float(np.sum(m.window_keys(contexts, q)))
        return total

    def _allreduce_s(self, tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        msg = tokens * self.model.hidden_size * self.model.dtype_bytes
        per = 2.0 * (self.tp - 1) / self.tp * msg / self.hardware.interconnect_bandwidth
        return 2 * self.model.num_layers * (per + self.overheads.allreduce_latency)

    def _forward(self, contexts: np.ndarray, q: int, kv_entries: float, other_bytes: float = 0.0,
                 extra_flops: float = 0.0, notes: tuple[str, ...] = ()) -> Cost:
        """One forward pass of ``q`` new tokens per sequence attending to ``kv_entries``
        (token·layer) KV entries in all."""
        m, hw = self.model, self.hardware
        batch = contexts.size
        tokens = batch * q
        weight_bytes = m.weight_bytes_per_forward(tokens) / self.tp
        kv_bytes = (kv_entries + tokens * m.num_layers) * self.kv_layer_bytes  # read + append
        activations = tokens * m.hidden_size * m.dtype_bytes * 4 * m.num_layers
        other = other_bytes + activations / self.tp
        # attention: QK and PV, 2 FLOPs per multiply-add, per query head, per query token
        attn_flops = 4.0 * m.head_dim * m.num_heads * self.head_share * q * kv_entries
        flops = tokens * m.matmul_flops_per_token() / self.tp + attn_flops + extra_flops
        memory_s = (weight_bytes + kv_bytes + other) / hw.bandwidth
        compute_s = flops / hw.flops
        overhead = self.overheads.forward
        comm = self._allreduce_s(tokens)
        bound = "memory" if memory_s >= compute_s else "compute"
        seconds = max(memory_s, compute_s) + overhead + comm
        return Cost(seconds, weight_bytes, kv_bytes, other, flops, overhead, comm, bound, notes)

    # ---- the interface ------------------------------------------------------------------
    def plain_step(self, contexts: Sequence[int]) -> Cost:
        ctx = as_contexts(contexts)
        return self._forward(ctx, 1, self._attended(ctx, ctx))

    def verify(self, contexts: Sequence[int], q: int) -> Cost:
        if q < 1:
            raise ValueError("a verify pass needs q ≥ 1 query tokens")
        ctx = as_contexts(contexts)
        # query j of q attends to ctx − q + j + 1 keys; the KV is read once for all q (GQA-packed)
        return self._forward(ctx, q, self._attended(ctx, ctx, q))

    def draft_step(self, contexts: Sequence[int], s: float, policy: str) -> Cost:
        ctx = as_contexts(contexts)
        pol = get_policy(policy)
        selected = pol.selected_array(ctx, s)
        n_full = sum(self._full)
        lists = self.model.num_kv_heads * self.kv_head_share if pol.per_kv_head else 1
        index_bytes = 0.0 if pol.name in ("full", "streamingllm") else \
            float(np.sum(np.ceil(selected / pol.page_size))) * n_full * lists * INDEX_BYTES
        return self._forward(ctx, 1, self._attended(ctx, selected), other_bytes=index_bytes)

    def selection(self, contexts: Sequence[int], s: float, policy: str, k: int) -> Cost:
        """Selection work of one iteration (all layers, all sequences), as a memory-bound pass.

        - vegas / last-token: the verify pass writes the pre-softmax logits of the collected
          rows (bf16, every query head, every key, full-attention layers); selection reads them,
          sums over heads (fp32 scores per position), ranks (top-k) and writes indices.
          Vegas with ``c2q="sum"`` (the engine's default): the verify pass writes the rows'
          sum over every head instead, one fp32 row per sequence (zeroed, then added into by
          the KV heads in L2, then written), which the refresh ranks as it is.
        - sparsespec: the same with the last ``min(W, k+1)`` verify rows, normalised and summed
          per KV head, one ranking per KV head.
        - quest: at each of the k draft steps, read the min/max key of every page of every KV
          head and score it against the query; rank pages; write page indices.
        - streamingllm, full: nothing to compute (the window is arithmetic).
        """
        return self._selection(as_contexts(contexts), s, policy, k)[0]

    def _selection(self, ctx: np.ndarray, s: float, policy: str, k: int) -> tuple[Cost, float]:
        """:meth:`selection`'s cost and, of its bytes, what the refresh moves."""
        pol = get_policy(policy)
        m, ov = self.model, self.overheads
        n_full = sum(self._full)
        heads = m.num_heads * self.head_share
        kv_heads = m.num_kv_heads * self.kv_head_share
        if pol.name in ("full", "streamingllm"):
            return Cost(0.0, bound="overhead", notes=(f"{pol.name}: no selection work",)), 0.0
        selected = pol.selected_array(ctx, s)
        total_ctx = float(ctx.sum())
        if pol.rescore_every_draft:  # quest
            pages = float(np.sum(np.ceil(ctx / pol.page_size)))
            meta = 2 * kv_heads * m.head_dim * m.dtype_bytes * pages * n_full
            flops = 2.0 * 2 * heads * m.head_dim * pages * n_full
            scores = heads * pages * n_full * SCORE_BYTES
            idx = float(np.sum(np.ceil(selected / pol.page_size))) * kv_heads * n_full * INDEX_BYTES
            per_step = meta + 2 * scores + idx
            other = k * per_step
            flops *= k
            launches = k
            refresh = 0.0
            note = f"quest: page metadata of {pages:.0f} pages scored at each of k={k} draft steps"
        else:
            rows = (min(SPARSESPEC_WINDOW, k + 1) if pol.per_kv_head
                    else pol.collected_rows or k + 1)
            summed = pol.name == "vegas" and self.c2q == "sum"
            lists = kv_heads if pol.per_kv_head else 1
            scores = lists * total_ctx * n_full * SCORE_BYTES
            idx = float(selected.sum()) * lists * n_full * INDEX_BYTES
            if summed:     # the scores themselves: zeroed, written (verify), read (refresh)
                written, refresh = 2 * scores, scores + idx
            else:          # logits written in verify and read, scores written and read
                written = rows * heads * total_ctx * n_full * LOGIT_BYTES
                refresh = written + 2 * scores + idx
            other = written + refresh
            flops = 0.0
            launches = 1
            note = (f"{pol.name}: {rows} collected row(s) "
                    + ("summed over every head (one fp32 row)" if summed else
                       f"× {heads:.0f} heads")
                    + f", {'per KV head' if pol.per_kv_head else 'one ranking per layer'}")
        memory_s = other / self.hardware.bandwidth
        compute_s = flops / self.hardware.flops
        overhead = launches * ov.selection
        return Cost(max(memory_s, compute_s) + overhead, other_bytes=other, flops=flops,
                    overhead_s=overhead, bound="memory" if memory_s >= compute_s else "compute",
                    notes=(note,)), refresh

    def refresh_bytes(self, contexts: Sequence[int], s: float, policy: str, k: int) -> float:
        """Bytes the refresh after a verify moves: :meth:`selection`'s less what the verify
        pass writes for it (the collected logits or the summed row); Quest's page scoring runs
        in its draft steps: 0."""
        return self._selection(as_contexts(contexts), s, policy, k)[1]

    def prefill(self, prompt_lengths: Sequence[int], past: Sequence[int] | None = None
                ) -> Cost:
        """Prefill of a batch of prompt chunks, ``prompt_lengths`` new positions each after
        ``past`` cached ones (default none: whole prompts): weights once, every new token's KV
        written and the cached KV read, and causal attention FLOPs ``4·head_dim·heads`` per
        query-key product of each layer (``specsim.costs.prefill.ideal_elements``)."""
        from specsim.costs.prefill import chunks, ideal_elements
        lengths, before = (a.astype(float) for a in chunks(prompt_lengths, past))
        m = self.model
        tokens = float(lengths.sum())
        window = m.sliding_window or None
        n_full = sum(self._full)
        pairs = sum(n_full * ideal_elements(n, p)
                    + (m.num_layers - n_full) * ideal_elements(n, p, window)
                    for n, p in zip(lengths, before))
        attn_flops = 4.0 * m.head_dim * m.num_heads * self.head_share * pairs
        flops = tokens * m.matmul_flops_per_token() / self.tp + attn_flops
        weight_bytes = m.weight_bytes_per_forward(int(tokens)) / self.tp
        capped = np.minimum(before, window) if window else before
        read = n_full * float(before.sum()) + (m.num_layers - n_full) * float(capped.sum())
        kv_bytes = (tokens * m.num_layers + read) * self.kv_layer_bytes
        memory_s = (weight_bytes + kv_bytes) / self.hardware.bandwidth
        compute_s = flops / self.hardware.flops
        comm = self._allreduce_s(int(tokens))
        return Cost(max(memory_s, compute_s) + self.overheads.forward + comm, weight_bytes,
                    kv_bytes, 0.0, flops, self.overheads.forward, comm,
                    "memory" if memory_s >= compute_s else "compute")

    def iteration(self, contexts: Sequence[int], k: int, s: float, policy: str) -> IterationCost:
        return compose_iteration(self, contexts, k, s, policy)


def draft_state_bytes(model: ModelSpec, policy: str, context: int, s: float) -> float:
    """Memory a sequence's sparse-draft state holds beside its KV cache: index lists (per
    layer, or per KV head) and, for Quest, the min/max key of every page."""
    pol = get_policy(policy)
    n_full = sum(t == FULL_ATTENTION for t in model.layer_types)
    if pol.name in ("full", "streamingllm"):
        return 0.0
    lists = model.num_kv_heads if pol.per_kv_head else 1
    index = pol.selected(context, s) / pol.page_size * lists * n_full * INDEX_BYTES
    meta = 0.0
    if pol.rescore_every_draft:
        pages = math.ceil(context / pol.page_size)
        meta = 2 * model.num_kv_heads * model.head_dim * model.dtype_bytes * pages * n_full
    return index + meta


def decode_floor_s(model: ModelSpec, hardware: HardwareSpec, contexts: Sequence[int],
                   tp: int = 1) -> float:
    """Bytes over bandwidth of one plain decoding step: weights + the batch's KV, no overheads."""
    cost = RooflineCostModel(model, hardware, tp).plain_step(contexts)
    return (cost.weight_bytes + cost.kv_bytes) / hardware.bandwidth


__all__ = ["RooflineCostModel", "decode_floor_s", "draft_state_bytes"]
