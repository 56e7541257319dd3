"""The engine's attention and selection adapter: the one module that talks to specsim.kernels.

Three attention shapes feed the decoder (``model.Attend`` callables built here):

- **prefill**: one sequence's prompt, causal (banded for a sliding-window layer), with torch
  SDPA (causal; with sinks the causal kernel's log-sum-exp folding the sink in; batched chunks
  of rows under a band mask for a window); it writes
  rows ``0..T-1`` of that sequence's cache and can collect the pre-softmax logits of the last
  ``R`` prompt rows (+ their log-sum-exp) for the first selection.
- **verify**: q = k+1 new tokens per sequence, causal among themselves, over the full cache,
  optionally collecting chosen rows' logits (Collect-2-Query) and each row's log-sum-exp.
- **draft**: one token per sequence over per-layer index lists (sparse attention); a
  sliding-window layer drafts over its window instead (verify attention with q = 1), which
  is exactly what it attends.

Every shape takes the layer's sinks (gpt-oss) and, for verify and prefill, its window
(``ModelArgs.window``, ``Transformer.attention_sinks``). The KV cache keeps every position of
every layer, window layers too (one layout for all layers, simplest; a window layer reads
only its last W + q − 1 positions, and its memory is what a full layer's is).

On a CUDA device with supported shapes (head_dim 64/128, q ≤ ``MAX_Q_LEN``) verify and draft
run the Triton kernels with plans made once per shape; everywhere else they run the engine-local
torch versions below (``verify_attention_torch``, ``sparse_attention_torch``), which the tests
check against the kernels' own references. ``KVCache`` and the selection functions are the
kernels' (pure torch, so they run anywhere) except SparseSpec-L's attention-mass step, whose
Triton kernel has an engine-local torch stand-in on CPU.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from specsim.kernels import (KVCache, append_positions, attention_mass_reference,
                             picked_row_sum, picked_row_sum_reference, plan_sparse,
                             plan_verify, quest_select, selected_counts, sparse_attention,
                             sparsespec_select, streamingllm_select, vegas_select,
                             verify_attention)
from specsim.kernels.verify_attention import MAX_Q_LEN, default_collect_rows
from specsim.costs.prefill import window_rows, windowed
from specsim.policies import Policy

KERNEL_HEAD_DIMS = (64, 128)


# --------------------------------------------------------------------------------------------
# Engine-local torch attention (CPU path; any head_dim, any q)
# --------------------------------------------------------------------------------------------


def softmax_with_sinks(s: torch.Tensor, sinks: torch.Tensor | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax weights and log-sum-exp of logits ``s`` [..., H, R, n] (fp32, masked = −inf)
    whose rows also hold their head's sink logit ``sinks`` [H] (or [G, group] for s
    [..., G, group, R, n]; None: no sink), which adds to the denominator only; a row with no
    key and no sink gets weights 0."""
    if sinks is not None:
        sink = sinks.float()[..., None, None].expand(*s.shape[:-1], 1)
        s = torch.cat([s, sink], dim=-1)
    lse = torch.logsumexp(s, -1)
    weight = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (weight[..., :-1] if sinks is not None else weight), lse


def verify_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           lengths: torch.Tensor, *, collect_rows: tuple[int, ...] = (),
                           logits: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                           collect_sum: bool = False, sinks: torch.Tensor | None = None,
                           window: int | None = None, collect_head_sum: bool = False
                           ) -> torch.Tensor:
    """Verify attention, batched: q [B, T, H, D] at positions ``p = L_b − T + t`` over keys
    ``n ≤ p`` (with ``window`` W: ``p − W < n ≤ p``), each head's sink logit ``sinks`` [H]
    joining the softmax. Writes ``logits[b, h, i, n] = scale·q_{rows[i]}·k_n`` (no causal
    mask; with ``collect_sum`` their sum over heads and rows into ``logits[b, 0, 0, n]``, with
    ``collect_head_sum`` each row's sum over the heads into ``logits[b, 0, i, n]``) for
    ``n < max L`` and ``lse`` [B, H, T] (the sink included) when given (as the kernel does).
    Reads the lengths on the host, so it is not CUDA-graph capturable."""
    batch, q_len, heads, dim = q.shape
    groups = k_cache.shape[1]
    group = heads // groups
    n = int(lengths.max())
    keys, values = k_cache[:, :, :n].float(), v_cache[:, :, :n].float()      # [B, G, n, D]
    # rows of one KV head's tile: (query head of the group, token), token fastest
    qg = q.float().view(batch, q_len, groups, group, dim).permute(0, 2, 3, 1, 4)
    s = qg.reshape(batch, groups, group * q_len, dim) @ keys.transpose(-1, -2) / math.sqrt(dim)
    s = s.view(batch, groups, group, q_len, n)
    if collect_rows and collect_sum:    # [B, 1, 1, n]: summed over every head and the rows
        logits[:, 0, 0, :n] = s[:, :, :, list(collect_rows)].sum((1, 2, 3))
    elif collect_rows and collect_head_sum:          # [B, 1, rows, n]: over the heads
        logits[:, 0, :, :n] = s[:, :, :, list(collect_rows)].sum((1, 2))
    elif collect_rows:
        logits[..., :n] = s[:, :, :, list(collect_rows)].reshape(batch, heads, -1, n)
    position = lengths.long()[:, None] - q_len + torch.arange(q_len, device=q.device)
    key = torch.arange(n, device=q.device)
    visible = key <= position[..., None]                                   # [B, T, n]
    if window:
        visible &= key > position[..., None] - window
    s = s.masked_fill(~visible[:, None, None], float("-inf"))
    weight, row_lse = softmax_with_sinks(s, None if sinks is None else sinks.view(groups, group))
    if lse is not None:
        lse.copy_(row_lse.reshape(batch, heads, q_len))
    weight = weight.view(batch, groups, group * q_len, n)
    out = (weight @ values).view(batch, groups, group, q_len, dim)
    return out.permute(0, 3, 1, 2, 4).reshape(batch, q_len, heads, dim).to(q.dtype)


def sparse_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           indices: torch.Tensor, counts: torch.Tensor,
                           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Sparse draft attention, batched: q [B, H, D] over ``indices[b, (g,) :counts]``, each
    head's sink logit ``sinks`` [H] joining the softmax."""
    batch, heads, dim = q.shape
    groups = k_cache.shape[1]
    width = max(1, int(counts.max()))
    indices = indices[..., :width].long()
    if indices.dim() == 2:  # one list per sequence, shared by its KV heads
        indices, counts = indices[:, None].expand(-1, groups, -1), counts[:, None]
    gather = indices[..., None].expand(-1, groups, -1, dim)
    keys = k_cache.gather(2, gather).float()                                   # [B, G, C, D]
    values = v_cache.gather(2, gather).float()
    s = q.float().view(batch, groups, heads // groups, dim) @ keys.transpose(-1, -2)
    s = s / math.sqrt(dim)
    used = torch.arange(width, device=q.device) < counts[..., None]            # [B, G|1, C]
    s = s.masked_fill(~used[:, :, None].expand_as(s), float("-inf"))
    weight, _ = softmax_with_sinks(s[:, :, :, None],                            # empty list: 0
                                   None if sinks is None else sinks.view(groups, -1))
    weight = weight[:, :, :, 0]
    return (weight @ values).reshape(batch, heads, dim).to(q.dtype)


def top_positions(score: torch.Tensor, lengths: torch.Tensor, keep_first: int, keep_last: int,
                  counts: torch.Tensor, capacity: int) -> torch.Tensor:
    """Engine-local: the ``counts`` best positions of ``score`` [B, G, n] (first ``keep_first``
    and last ``keep_last`` valid positions forced in, positions ≥ length out), sorted, padded
    with 0; int32 [B, G, capacity]."""
    n = score.shape[-1]
    position = torch.arange(n, device=score.device)
    length = lengths.long()[:, None, None]
    forced = (position < keep_first) | (position >= length - keep_last)
    score = torch.where(forced, float("inf"), score.float())
    score = torch.where(position < length, score, float("-inf"))
    chosen = torch.topk(score, min(capacity, n), dim=-1).indices
    valid = torch.arange(chosen.shape[-1], device=score.device) < counts[..., None]
    chosen = torch.where(valid, chosen, torch.iinfo(torch.int64).max).sort(-1).values
    return torch.where(valid, chosen, 0).to(torch.int32)


def sparsespec_select_torch(logits: torch.Tensor, lse: torch.Tensor, lengths: torch.Tensor,
                            s: float, num_kv_heads: int, policy: Policy
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Engine-local SparseSpec-L selection (CPU): the attention mass of the collected rows per
    KV head, then sink ∪ top ∪ recent, ``policy.selected`` positions per list."""
    mass = attention_mass_reference(logits, lengths, num_kv_heads, lse)          # [B, G, n]
    counts = selected_counts(policy, lengths, s)[:, None].expand(-1, num_kv_heads)
    capacity = policy.selected(logits.shape[-1], s)
    chosen = top_positions(mass, lengths, policy.sink, policy.recent, counts, capacity)
    return chosen, counts.to(torch.int32).contiguous()


# --------------------------------------------------------------------------------------------
# Prefill (both devices)
# --------------------------------------------------------------------------------------------


def write_prefill(cache: KVCache, layer: int, b: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Rows ``0..T-1`` of sequence ``b`` (k, v [T, G, D]); Quest page bounds of those pages.
    ``cache.lengths[b]`` must already be T."""
    t = k.shape[0]
    cache.k(layer)[b, :, :t] = k.transpose(0, 1).to(cache.k(layer).dtype)
    cache.v(layer)[b, :, :t] = v.transpose(0, 1).to(cache.v(layer).dtype)
    if cache.page_size:
        size = cache.page_size
        pages = math.ceil(t / size)
        rows = cache.k(layer)[b, :, :pages * size]                           # [G, P·size, D]
        rows = rows.reshape(rows.shape[0], pages, size, -1)
        valid = (torch.arange(pages * size, device=k.device) < t).view(1, pages, size, 1)
        inf = torch.tensor(float("inf"), dtype=rows.dtype, device=rows.device)
        cache.page_min[layer, b, :, :pages] = torch.where(valid, rows, inf).amin(2)
        cache.page_max[layer, b, :, :pages] = torch.where(valid, rows, -inf).amax(2)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      window: int | None = None, sinks: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """Causal self-attention of one prompt: q [1, T, H, D], k/v [1, T, G, D] (SDPA, GQA), by
    the path :func:`specsim.costs.prefill.path` names (the cost models count its products):

    - no window, no sinks: SDPA's causal kernel;
    - ``sinks`` [H] (one logit per head in every row's denominator) on a full layer: the causal
      kernel returning its log-sum-exp (:func:`causal_with_lse`), each output row then scaled
      by σ(lse − sink_h), which is the softmax with the sink in its denominator;
    - a ``window`` W (row p sees keys ``p − W < n ≤ p``), with or without sinks: the rows in
      chunks of R = :func:`~specsim.costs.prefill.window_rows` (W), every chunk's R + W − 1 keys
      (+ the sink) gathered as a strided view and the chunks batched into one SDPA call (blocks
      of them for a long prompt) under one shared band mask. The sink there is SDPA's own
      softmax over one more key: each query gets one more dimension holding ``sink_h / scale``,
      every real key a 0 there and the sink key a 1, so its logit is ``sink_h``, its value 0.

    K and V are repeated to every query head on the window path (the memory-efficient kernel,
    which takes a mask, takes no grouped heads); a window no shorter than the prompt hides
    nothing, so that layer runs the causal or sink path."""
    length, heads, dim = q.shape[1:]
    if not windowed(window, length):
        window = None                           # a window no shorter than the prompt
    if window is None and sinks is None:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True, enable_gqa=True)
        return out.transpose(1, 2)
    if window is None:                          # sinks on a full layer
        out, lse = causal_with_lse(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return fold_sinks(out, lse, sinks).transpose(1, 2)
    groups = k.shape[2]
    scale = 1.0 / math.sqrt(dim)
    qh, kh, vh = q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1)
    sink_key = sink_value = None
    if sinks is not None:                            # [.., D] → [.., width]: the sink column D
        width = -(-(dim + 1) // 8) * 8
        column = (sinks.float() / scale).to(q.dtype)[:, None, None].expand(heads, length, 1)
        qh = torch.cat([qh, column, qh.new_zeros(heads, length, width - dim - 1)], -1)
        kh, vh = F.pad(kh, (0, width - dim)), F.pad(vh, (0, width - dim))
        sink_key = kh.new_zeros(groups, 1, width)
        sink_key[..., dim] = 1
        sink_value = vh.new_zeros(groups, 1, width)
    out = _window_prefill(qh, kh, vh, window, sink_key, sink_value, scale)
    return out[..., :dim].transpose(0, 1)[None]


def fold_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Attention ``out`` [B, H, T, D] without sinks, given its rows' log-sum-exp ``lse``
    [B, H, T], as with one sink logit per head ``sinks`` [H] in every row's denominator:
    out · σ(lse − sink_h)."""
    return out * torch.sigmoid(lse.float() - sinks.float()[None, :, None]).to(out.dtype)[..., None]


#: Which kernel :func:`causal_with_lse` found to run, by (device type, dtype, head_dim, whether
#: K/V have fewer heads than q): "cudnn", "cudnn-repeated" or "flash".
_LSE_KERNELS: dict[tuple, str] = {}


def causal_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention that also returns each row's log-sum-exp of its scaled scores:
    q [B, H, T, D], k/v [B, G, T, D] → (out [B, H, T, D], lse [B, H, T] fp32). On the GPU
    cuDNN's kernel, the one SDPA runs plain causal attention on (at the same rate:
    BENCHMARKS.md), with K/V at their own heads where it takes them, else repeated; the flash
    kernel where cuDNN's is not built; off the GPU the flash kernel's CPU form."""
    heads, groups = q.shape[1], k.shape[1]
    key = (q.device.type, q.dtype, q.shape[-1], groups != heads)

    def repeated():
        return (k.repeat_interleave(heads // groups, 1), v.repeat_interleave(heads // groups, 1))

    if q.device.type != "cuda":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, *repeated(), 0.0, True)[:2]
        return out, lse.reshape(out.shape[:3]).float()

    def run(name: str):
        if name.startswith("cudnn"):
            cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention
            kv = (k, v) if name == "cudnn" else repeated()
            out, lse = cudnn(q, *kv, None, True, 0.0, True)[:2]
        else:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
                q, *repeated(), 0.0, True)[:2]
        _LSE_KERNELS[key] = name
        return out, lse.reshape(out.shape[:3]).float()

    if key in _LSE_KERNELS:
        return run(_LSE_KERNELS[key])
    for name in ("cudnn", "cudnn-repeated"):
        try:
            return run(name)
        except (RuntimeError, NotImplementedError, AttributeError, TypeError):
            continue            # not built for this GPU, or another torch's signature
    return run("flash")


#: Elements of a window prefill's gathered keys per batched SDPA call (a block of chunks).
WINDOW_BLOCK_ELEMENTS = 1 << 26


def _window_prefill(qh, kh, vh, window: int, sink_key, sink_value, scale: float) -> torch.Tensor:
    """:func:`prefill_attention`'s window path: qh [H, T, E], kh/vh [G, T, E] (G KV heads),
    the sink's key and value [G, 1, E] or None → [H, T, E]. Keys are gathered a block of
    chunks at a time and repeated to the query heads there, so a long prompt never holds them
    all."""
    heads, length, width = qh.shape
    rep = heads // kh.shape[0]
    rows = window_rows(window)
    n = -(-length // rows)
    span = rows + window - 1       # keys of one chunk: cR − W + 1 .. cR + R − 1
    pad_q = n * rows - length
    qc = F.pad(qh, (0, 0, 0, pad_q)).view(heads, n, rows, width).transpose(0, 1)
    # keys before position 0 and after the last are zeros, masked below (front) or seen only
    # by padded rows (back); a strided view of every chunk's keys: [G, n, span, E]
    kp = F.pad(kh, (0, 0, window - 1, pad_q)).unfold(1, span, rows).transpose(-1, -2)
    vp = F.pad(vh, (0, 0, window - 1, pad_q)).unfold(1, span, rows).transpose(-1, -2)
    r = torch.arange(rows, device=qh.device)[:, None]
    j = torch.arange(span, device=qh.device)[None, :]
    band = (j >= r) & (j <= r + window - 1)           # key cR − W + 1 + j within row cR + r's W
    first = band & (j >= window - 1)                  # chunk 0: no keys before position 0
    if sink_key is not None:
        band, first = F.pad(band, (0, 1), value=True), F.pad(first, (0, 1), value=True)
    out = qh.new_empty(n, heads, rows, width)
    block = max(1, WINDOW_BLOCK_ELEMENTS // (heads * (span + 1) * width))
    for c0 in range(0, n, block):
        c1 = min(n, c0 + block)
        keys = kp[:, c0:c1].transpose(0, 1)                       # [b, G, span, E]
        values = vp[:, c0:c1].transpose(0, 1)
        if sink_key is not None:
            keys = torch.cat([keys, sink_key.expand(c1 - c0, -1, -1, -1)], 2)
            values = torch.cat([values, sink_value.expand(c1 - c0, -1, -1, -1)], 2)
        mask = band.expand(c1 - c0, 1, -1, -1)
        if c0 == 0:
            mask = torch.cat([first[None, None], mask[1:]], 0)
        out[c0:c1] = F.scaled_dot_product_attention(
            qc[c0:c1], keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1),
            attn_mask=mask, scale=scale)
    return out.transpose(0, 1).reshape(heads, n * rows, width)[:, :length]


def prefill_logits(q_rows: torch.Tensor, k: torch.Tensor, first_row: int,
                   sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pre-softmax logits and causal lse of the prompt rows ``first_row..`` : q_rows [R, H, D],
    k [T, G, D] → logits [H, R, T] (raw) and lse [H, R] (with ``sinks`` [H]: the sink in
    it, as verify's lse)."""
    rows, heads, dim = q_rows.shape
    groups = k.shape[1]
    keys = k.float().transpose(0, 1).repeat_interleave(heads // groups, 0)    # [H, T, D]
    s = q_rows.float().transpose(0, 1) @ keys.transpose(1, 2) / math.sqrt(dim)  # [H, R, T]
    position = first_row + torch.arange(rows, device=k.device)
    visible = torch.arange(k.shape[0], device=k.device) <= position[:, None]
    return s, softmax_with_sinks(s.masked_fill(~visible, float("-inf")), sinks)[1]


# --------------------------------------------------------------------------------------------
# The backend: kernels on CUDA, torch elsewhere; plans made once per shape
# --------------------------------------------------------------------------------------------


class AttentionBackend:
    """Runs verify and draft attention on one device, choosing kernels or torch per shape."""

    def __init__(self, device: torch.device, *, num_heads: int, num_kv_heads: int,
                 head_dim: int, batch: int, max_len: int, use_triton: bool | None = None):
        self.device = torch.device(device)
        kernels_fit = head_dim in KERNEL_HEAD_DIMS
        if use_triton is None:
            use_triton = self.device.type == "cuda" and kernels_fit
        self.use_triton = bool(use_triton) and kernels_fit
        self.shape = (batch, num_heads, num_kv_heads, head_dim)
        self.max_len = max_len
        self._verify_plans: dict = {}
        self._sparse_plan = None

    def capturable(self, q_len: int | None = None) -> bool:
        """Whether a step of this shape runs without host synchronisation (the Triton path);
        the torch path reads lengths on the host and must run eagerly."""
        return self.use_triton and (q_len is None or q_len <= MAX_Q_LEN)

    def verify(self, q, k_cache, v_cache, lengths, *, collect_rows=(), logits=None, lse=None,
               collect_sum=False, sinks=None, window=None, collect_head_sum=False):
        """Full (or, with ``window``, sliding-window) attention of q [B, T, H, D] over the
        cache, each head's sink logit ``sinks`` (fp32 [H]) in the softmax. A window layer's
        verify is the kernel's window option: its chunks cut the last W + T − 1 keys (static
        shapes, no host read, so a CUDA graph captures it), and a window layer drafts through
        it with T = 1 (the window is its exact draft set)."""
        q_len = q.shape[1]
        collect_sum = bool(collect_sum and collect_rows)
        collect_head_sum = bool(collect_head_sum and collect_rows)
        if not self.use_triton or q_len > MAX_Q_LEN:
            return verify_attention_torch(q, k_cache, v_cache, lengths, collect_rows=collect_rows,
                                          logits=logits, lse=lse, collect_sum=collect_sum,
                                          sinks=sinks, window=window,
                                          collect_head_sum=collect_head_sum)
        key = (q_len, tuple(collect_rows), collect_sum, window, collect_head_sum)
        plan = self._verify_plans.get(key)
        if plan is None:
            plan = self._verify_plans[key] = plan_verify(*self.shape, q_len, self.max_len,
                                                         device=self.device,
                                                         collect_rows=collect_rows,
                                                         element_size=k_cache.element_size(),
                                                         collect_sum=collect_sum, window=window,
                                                         collect_head_sum=collect_head_sum)
        return verify_attention(q.contiguous(), k_cache, v_cache, lengths, plan,
                                logits=logits if collect_rows else None, lse=lse, sinks=sinks)

    def draft(self, q, k_cache, v_cache, indices, counts, sinks=None):
        if not self.use_triton:
            return sparse_attention_torch(q, k_cache, v_cache, indices, counts, sinks)
        if self._sparse_plan is None or self._sparse_plan.split.max_keys < indices.shape[-1]:
            self._sparse_plan = plan_sparse(*self.shape, indices.shape[-1], device=self.device,
                                            element_size=k_cache.element_size())
        return sparse_attention(q.contiguous(), k_cache, v_cache, indices, counts,
                                self._sparse_plan, sinks=sinks)

    def sparsespec_select(self, logits, lse, lengths, s, num_kv_heads, policy, ranking="best"):
        if self.use_triton:
            return sparsespec_select(logits, lengths, s, num_kv_heads, lse=lse, policy=policy,
                                     ranking=ranking)
        return sparsespec_select_torch(logits, lse, lengths, s, num_kv_heads, policy)

    def picked_row_sum(self, logits, pick, lengths, max_context=None):
        """Each list's picked collected row summed over the heads, fp32 [N, 1, 1, n] (the
        last-token policy's scores): one Triton pass on the GPU, torch elsewhere."""
        if self.use_triton:
            return picked_row_sum(logits, pick, lengths, max_context)
        return picked_row_sum_reference(logits, pick, lengths, max_context)


__all__ = ["AttentionBackend", "KVCache", "MAX_Q_LEN", "append_positions",
           "default_collect_rows", "prefill_attention", "prefill_logits", "quest_select",
           "selected_counts", "softmax_with_sinks", "sparse_attention_torch",
           "sparsespec_select_torch",
           "streamingllm_select", "top_positions", "vegas_select", "verify_attention_torch",
           "write_prefill"]
