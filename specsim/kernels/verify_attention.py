"""Verify attention: the full-attention pass that checks ``k`` drafted tokens at once.

What it computes. Sequence ``b`` has ``L_b = lengths[b]`` keys in the cache, the last ``q = k+1``
of which belong to the tokens being verified (they are appended before the call). Query token
``t`` (0 ≤ t < q) sits at absolute position ``p_t = L_b − q + t`` and sees keys ``0..p_t``
(causal among the q tokens, full over the context). For query head ``h`` of KV head
``g = h // group``:

    s_{t,n} = scale · q_{b,t,h} · K_{b,g,n},      n < L_b      (scale = 1/sqrt(head_dim))
    out_{b,t,h} = Σ_{n ≤ p_t} softmax_n(s_{t,·})  V_{b,g,n}

Sliding windows and sinks. A plan made with ``window`` W attends each row to keys
``p_t − W < n ≤ p_t`` only: its chunks cover the sequence's last ``W + q − 1`` keys (from
``max(0, L_b − q − W + 1)``), so a window layer reads about W keys whatever the context.
``sinks`` (fp32 [num_heads], gpt-oss) adds ``exp(sink_h)`` to every row's softmax
denominator (``split_kv``'s ``add_sink``); ``lse`` then includes it.

Row conventions. Row 0 is the last accepted token, rows ``1..k`` are the drafts, so row 1 is the
**first draft token** and row ``q − 1`` the **last token**, whose output yields the bonus token.

Collect-2-Query. With ``collect_rows`` set (default ``(1, q − 1)``, or ``(0,)`` when q = 1), the
kernel also writes the scaled pre-softmax logits ``s_{t,n}`` of those rows for every query head
and every key ``n < L_b``:  ``logits[b, h, i, n] = s_{collect_rows[i], n}`` (bf16 on the GPU).
The causal mask is *not* applied to these (keys after ``p_t`` hold their raw logits; they are
the newest tokens, which every selection policy keeps in its recent window). Entries at
``n ≥ L_b`` are left untouched. Without ``collect_rows`` the store is compiled out.
With ``collect_sum`` it writes instead what Vegas ranks by, one fp32 row per sequence,
``logits[b, 0, 0, n] = Σ_h Σ_i s_{collect_rows[i], n}`` over every query head: each program
adds its KV head's share by fp32 atomic adds (in L2) into the row, which ``verify_attention``
zeroes first (entries at ``n ≥ L_b`` stay 0). With ``collect_head_sum`` it writes one fp32 row
per collected row, ``logits[b, 0, i, n] = Σ_h s_{collect_rows[i], n}``, the same way, each
program's share from the row's queries summed over its query heads (one small dot): what a
ranking by a row chosen after the verify (the last accepted token's) reads, at a head's
fraction of the per-head rows' bytes. The order of the adds varies from run to run, so the
last bits of the sums may too.

Layouts. ``q``: [batch, q, num_heads, head_dim] (any strides, last dim contiguous).
KV cache: ``k_cache``/``v_cache`` [batch, kv_heads, max_len, head_dim] (see ``kv_cache``),
``lengths`` int32 [batch]. ``out``: like ``q``. Optional ``lse`` [batch, num_heads, q] fp32,
the natural log-sum-exp of each row's scaled logits over the keys it sees.

How. GQA-packed: one program owns one (sequence, KV head) and a chunk of its keys; its tile
holds all ``group · q`` query rows of that KV head (row r = head ``r // q``, token ``r % q``),
so each K/V block is read from memory once for all of them. Split-KV with a combine step (see
``split_kv``). bf16 in, fp32 accumulation. Blocks that every row sees in full (all but the last
one or two) run without masks. Collected logits come either from a second, small tile holding
only the collected rows (``collect_separate``, the default when some rows are collected: one
extra small dot per key block) or from the main tile stored under a row mask (the default when
all rows are collected).

API (FlashInfer-like): ``plan_verify`` once per batch shape (split sizes, block sizes, fp32
workspace), then ``verify_attention`` every step. ``verify_attention_reference`` is the torch
definition the tests compare against.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specsim.kernels._runtime import INTERPRETED, default_device, next_power_of_2, tl, triton
from specsim.kernels.split_kv import (SplitPlan, add_sink, combine, fit_shared_memory,
                                      plan_splits, softmax_update, store_partial, workspace)
from specsim.settings import MAX_Q_LEN


def default_collect_rows(q_len: int) -> tuple[int, ...]:
    """Collect-2-Query's rows: the first draft token (row 1) and the last token (row q − 1)."""
    return (0,) if q_len == 1 else tuple(sorted({1, q_len - 1}))


@triton.jit
def _store_collected(s, k, q_c, q_lo, c_ptrs, c_ok, keys, key_ok, sm_scale,
                     COLLECT_SEPARATE: tl.constexpr, COLLECT_SUM: tl.constexpr,
                     MASK_KEYS: tl.constexpr):
    """Write one key block's collected logits: the separate tile's dot (``q_c``) or the main
    tile's raw scores ``s``, scaled; per-head rows at ``c_ptrs`` [rows]; with COLLECT_SUM 1
    their sum over the rows added atomically into the sequence's row (``c_ptrs``: one pointer;
    the other KV heads' programs add theirs); with COLLECT_SUM 2 each collected row's sum over
    this KV head's query heads added into that row's fp32 row (``c_ptrs`` [slots]) from the
    rows' queries summed over those heads (``q_c`` + ``q_lo``, two 16-bit
    parts of the fp32 sum); keys under ``key_ok`` only when MASK_KEYS (whole blocks store
    unmasked along the keys: vectorised)."""
    if COLLECT_SUM == 2:
        # Σ_h q_h·k = (Σ_h q_h)·k: one row per slot from two small dots with the loaded keys
        # (its first 16 bits and the rest: the fp32 sum's precision); summing the tile's
        # rows by a masked sum per slot ran 7x the per-head rows' time at 16 rows; a dot of
        # the tile with a one-hot matrix ran out of shared memory there (H200, hd128 128K)
        s_c = tl.dot(q_c, tl.trans(k)) + tl.dot(q_lo, tl.trans(k))
    elif COLLECT_SEPARATE:
        s_c = tl.dot(q_c, tl.trans(k))
    else:
        s_c = s
    if COLLECT_SUM:
        # an eighth of a per-KV-head row's DRAM bytes at 8 KV heads: the adds meet in L2
        # (H200, hd128 128K q8: 1.027x off, a row per KV head 1.061x). Whole blocks add under
        # an always-true mask: unmasked, the hd128 q = 16 tile compiles to 176 B of spills
        # against 132 and runs 1.24x off against 1.02x
        if MASK_KEYS:
            ok = key_ok
        else:
            ok = keys >= 0
        if COLLECT_SUM == 2:
            tl.atomic_add(c_ptrs[:, None] + keys[None, :], s_c * sm_scale,
                          mask=c_ok[:, None] & ok[None, :], sem="relaxed")
        else:
            row = tl.sum(tl.where(c_ok[:, None], s_c, 0.0), 0) * sm_scale
            tl.atomic_add(c_ptrs + keys, row, mask=ok, sem="relaxed")
    else:
        if MASK_KEYS:
            mask = c_ok[:, None] & key_ok[None, :]
        else:
            mask = c_ok[:, None]
        tl.store(c_ptrs[:, None] + keys[None, :], (s_c * sm_scale).to(c_ptrs.dtype.element_ty),
                 mask=mask)


@triton.jit
def _verify_kernel(Q, K, V, Lengths, Out, Lse, PartOut, PartLse, Logits, Sinks,
                   stride_qb, stride_qt, stride_qh,
                   stride_kb, stride_kh, stride_kt,
                   stride_vb, stride_vh, stride_vt,
                   stride_ob, stride_ot, stride_oh,
                   stride_lb, stride_lh, stride_lt,
                   stride_gb, stride_gh, stride_gr,
                   split_size, num_splits, sm_scale,
                   NUM_KV_HEADS: tl.constexpr, Q_LEN: tl.constexpr, GROUP: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   DIRECT_OUTPUT: tl.constexpr, WRITE_LSE: tl.constexpr,
                   COLLECT_MASK: tl.constexpr, COLLECT_SEPARATE: tl.constexpr,
                   N_COLLECT: tl.constexpr, COLLECT_TOKENS: tl.constexpr,
                   BLOCK_C: tl.constexpr, SLOTS: tl.constexpr, COLLECT_SUM: tl.constexpr,
                   WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = (pid // NUM_KV_HEADS).to(tl.int64)  # 64-bit: batch strides can pass 2**31
    kvh = (pid % NUM_KV_HEADS).to(tl.int64)
    length = tl.load(Lengths + b)
    if WINDOW > 0:      # the chunks cut the last W + q − 1 keys
        start = tl.maximum(length - Q_LEN - WINDOW + 1, 0) + split * split_size
    else:
        start = split * split_size
    end = tl.minimum(start + split_size, length)

    rows = tl.arange(0, BLOCK_M)
    head = kvh * GROUP + rows // Q_LEN
    tok = rows % Q_LEN
    row_ok = rows < GROUP * Q_LEN
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + tok[:, None] * stride_qt + head[:, None] * stride_qh
                + dims[None, :], mask=row_ok[:, None], other=0.0)
    q_pos = length - Q_LEN + tok              # absolute position of each row's token
    qk_scale = sm_scale * 1.4426950408889634  # logits in base-2 units

    q_lo = q
    if COLLECT_MASK != 0:
        if COLLECT_SUM == 2:
            # slot i: the i-th collected token, its queries summed over this KV head's heads
            crow = tl.arange(0, SLOTS)
            c_ok = crow < N_COLLECT
            c_slot = crow
            c_tok = tl.zeros([SLOTS], tl.int32)
            seen = tl.zeros([SLOTS], tl.int32)       # collected tokens up to t
            for t in tl.static_range(Q_LEN):
                seen += (COLLECT_MASK >> t) & 1
                c_tok += (seen <= crow).to(tl.int32)
            q_sum = tl.zeros([SLOTS, HEAD_DIM], tl.float32)
            for h in tl.static_range(GROUP):
                q_sum += tl.load(Q + b * stride_qb + c_tok[:, None] * stride_qt
                                 + (kvh * GROUP + h) * stride_qh + dims[None, :],
                                 mask=c_ok[:, None], other=0.0).to(tl.float32)
            q_c = q_sum.to(Q.dtype.element_ty)
            q_lo = (q_sum - q_c.to(tl.float32)).to(Q.dtype.element_ty)
        elif COLLECT_SEPARATE:
            # A second, smaller tile holding only the collected rows (head, i-th collected
            # token); its logits are one extra small dot per block, stored in full (or, with
            # COLLECT_SUM, summed over the tile's rows and added into one fp32 row per sequence).
            crow = tl.arange(0, BLOCK_C)
            c_slot = crow % N_COLLECT
            c_head = kvh * GROUP + crow // N_COLLECT
            c_tok = (tl.full([BLOCK_C], COLLECT_TOKENS, tl.int64) >> (4 * c_slot)) & 15
            c_ok = crow < GROUP * N_COLLECT
            q_c = tl.load(Q + b * stride_qb + c_tok[:, None] * stride_qt
                          + c_head[:, None] * stride_qh + dims[None, :],
                          mask=c_ok[:, None], other=0.0)
        else:
            # The collected rows of the main tile, stored under a row mask.
            c_ok = (((tl.full([BLOCK_M], COLLECT_MASK, tl.int32) >> tok) & 1) != 0) & row_ok
            c_slot = tl.zeros([BLOCK_M], tl.int32)   # rank among the collected rows
            for i in tl.static_range(Q_LEN):
                if (COLLECT_MASK >> i) & 1:
                    c_slot += (tok > i).to(tl.int32)
            c_head = head
            q_c = q                                  # (unused: the main tile's own scores)
        if COLLECT_SUM == 2:
            c_ptrs = Logits + b * stride_gb + c_slot * stride_gr     # a row per slot
        elif COLLECT_SUM:
            c_ptrs = Logits + b * stride_gb          # one row per sequence
        else:
            c_ptrs = Logits + b * stride_gb + c_head * stride_gh + c_slot * stride_gr

    k_base = K + b * stride_kb + kvh * stride_kh
    v_base = V + b * stride_vb + kvh * stride_vh
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # Keys below length − q + 1 are visible to every row: whole blocks of them need no mask
    # (with a window every block is masked: its first keys are out of the first rows' reach).
    open_end = tl.minimum(end, length - Q_LEN + 1)
    if WINDOW > 0:
        full_end = start
    else:
        full_end = start + tl.maximum(open_end - start, 0) // BLOCK_N * BLOCK_N
    for n0 in range(start, full_end, BLOCK_N):
        keys = n0 + offs_n
        k = tl.load(k_base + keys[:, None] * stride_kt + dims[None, :])
        s = tl.dot(q, tl.trans(k))
        if COLLECT_MASK != 0:
            _store_collected(s, k, q_c, q_lo, c_ptrs, c_ok, keys, keys, sm_scale,
                             COLLECT_SEPARATE, COLLECT_SUM, False)
        v = tl.load(v_base + keys[:, None] * stride_vt + dims[None, :])
        acc, m_i, l_i = softmax_update(acc, m_i, l_i, s, qk_scale, v)
    # The rest (at most a block or two): split boundary and causal mask.
    for n0 in range(full_end, end, BLOCK_N):
        keys = n0 + offs_n
        key_ok = keys < end
        k = tl.load(k_base + keys[:, None] * stride_kt + dims[None, :], mask=key_ok[:, None],
                    other=0.0)
        s = tl.dot(q, tl.trans(k))
        if COLLECT_MASK != 0:        # before the causal mask: raw logits
            _store_collected(s, k, q_c, q_lo, c_ptrs, c_ok, keys, key_ok, sm_scale,
                             COLLECT_SEPARATE, COLLECT_SUM, True)
        visible = (keys[None, :] <= q_pos[:, None]) & key_ok[None, :]
        if WINDOW > 0:
            visible = visible & (keys[None, :] > q_pos[:, None] - WINDOW)
        s = tl.where(visible, s, float("-inf"))
        v = tl.load(v_base + keys[:, None] * stride_vt + dims[None, :], mask=key_ok[:, None],
                    other=0.0)
        acc, m_i, l_i = softmax_update(acc, m_i, l_i, s, qk_scale, v)

    if DIRECT_OUTPUT:  # a single chunk: normalise and write the final rows here
        if HAS_SINKS:
            acc, m_i, l_i = add_sink(acc, m_i, l_i, Sinks, head, row_ok)
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(Out + b * stride_ob + tok[:, None] * stride_ot + head[:, None] * stride_oh
                 + dims[None, :], out.to(Out.dtype.element_ty), mask=row_ok[:, None])
        if WRITE_LSE:
            lse = (m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0))) / 1.4426950408889634
            tl.store(Lse + b * stride_lb + head * stride_lh + tok * stride_lt, lse, mask=row_ok)
    else:
        if start < length:
            store_partial(PartOut, PartLse, pid * num_splits + split, acc, m_i, l_i,
                          BLOCK_M, HEAD_DIM)


@dataclass(frozen=True)
class VerifyPlan:
    """Everything about a verify launch that depends only on the batch shape."""

    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_len: int
    collect_rows: tuple[int, ...]
    split: SplitPlan
    block_m: int
    num_warps: int
    num_stages: int
    collect_separate: bool = False
    partial_out: torch.Tensor | None = field(repr=False, default=None)
    partial_lse: torch.Tensor | None = field(repr=False, default=None)
    collect_sum: bool = False
    window: int = 0          # sliding window W (0: full attention)
    collect_head_sum: bool = False

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def collect_mask(self) -> int:
        return sum(1 << r for r in self.collect_rows)

    @property
    def collect_tokens(self) -> int:
        """The collected rows packed 4 bits each (slot i in bits 4i..4i+3)."""
        return sum(r << (4 * i) for i, r in enumerate(self.collect_rows)) if \
            self.collect_separate else 0

    @property
    def block_c(self) -> int:
        return max(16, next_power_of_2(self.group * len(self.collect_rows)))


#: (head_dim, tile rows, collect mode) -> (block_n, num_warps, num_stages, programs_per_sm,
#: padded tile rows or None): the fastest of the configurations swept on an H200 (batch 4,
#: 8 KV heads, context 131072; BENCHMARKS.md). Collect modes: "off", "separate" (the collected
#: rows in a second tile), "main" (stored from the main tile under a row mask).
DEFAULT_CONFIGS = {
    (128, 16, "off"): (64, 4, 4, 4, None), (128, 32, "off"): (64, 4, 3, 1, 64),
    (128, 64, "off"): (64, 4, 3, 1, None), (128, 128, "off"): (64, 8, 3, 2, None),
    (64, 16, "off"): (128, 4, 4, 4, None), (64, 32, "off"): (128, 4, 4, 4, None),
    (64, 64, "off"): (64, 4, 3, 2, None), (64, 128, "off"): (256, 8, 3, 4, None),
    (128, 32, "separate"): (128, 4, 3, 4, None), (128, 64, "separate"): (64, 4, 3, 1, None),
    (64, 64, "separate"): (64, 4, 3, 2, None), (64, 128, "separate"): (128, 4, 3, 4, None),
    (128, 32, "main"): (64, 4, 4, 4, None), (128, 64, "main"): (128, 4, 3, 4, None),
    (64, 64, "main"): (64, 4, 3, 2, None), (64, 128, "main"): (64, 4, 3, 4, None),
}
FALLBACK_CONFIG = (64, 4, 3, 2, None)

#: (head_dim, tile rows, collect mode) -> (block_n, num_warps, num_stages[, programs resident
#: per multiprocessor, default 1]) of the tiles whose keys are cut into the fewest whole waves
#: of programs (``split_kv.wave_splits``, no tile padding); the other tiles take
#: ``DEFAULT_CONFIGS``' programs per multiprocessor. Swept on an H200 (batch 4 × 8 KV heads,
#: 8K/32K/128K, q = 1 and 8: 4 chunks of 128-key blocks beat programs-per-multiprocessor plans
#: by 7–60%) and kept to the tiles whose engine steps ran faster in whole waves at every batch
#: and context the SmolLM2 and Qwen3-4B calibrations measure (plain step 3.5% faster for
#: Qwen3-8B at batch 4, 32K, 7.7% for SmolLM2 at batch 32, 4K). Whole waves of the other tiles'
#: key blocks ran up to 33% slower at batch 32–64 (SmolLM2's collecting tiles) and 7% at
#: Qwen3-4B's 16-row collecting tiles.
WAVE_CONFIGS = {
    (128, 16, "off"): (128, 4, 3), (128, 32, "off"): (128, 4, 3),
    # q 12/16: 0.94-0.96x the programs-per-multiprocessor plan's time at 8K/32K/128K
    (128, 64, "off"): (128, 4, 3),
    (128, 32, "separate"): (128, 4, 3), (128, 64, "main"): (128, 4, 3),
    (64, 16, "off"): (128, 4, 4), (64, 32, "off"): (128, 4, 4), (64, 64, "off"): (128, 4, 4),
    # collect_sum (batch 4, 128K and 32K): the off tiles' key blocks; at the 64-row hd128 /
    # 128-row hd64 tiles 1.005 / 1.014× off, where programs-per-multiprocessor off plans ran
    # 1.16 / 3.5×
    (128, 16, "sum"): (128, 4, 3), (128, 32, "sum"): (128, 4, 3), (128, 64, "sum"): (128, 4, 3),
    (64, 16, "sum"): (128, 4, 4), (64, 32, "sum"): (128, 4, 4), (64, 64, "sum"): (128, 4, 4),
    (64, 128, "sum"): (128, 8, 3),
    # a fourth entry: programs resident on each multiprocessor at once (whole waves of them).
    # hd64's 128-row tile on 64-key blocks, 4 warps, fits two (128K, batch 4 × 8 KV heads):
    # 8 chunks 334 us, 4 chunks 430, the programs-per-multiprocessor plan (256-key blocks,
    # 8 warps, 17 chunks) 414
    (64, 128, "off"): (64, 4, 4, 2),
}
#: Key blocks when a tile of ``WAVE_CONFIGS`` runs as one chunk (one wave 70–100% full): a
#: program then streams its whole context, and at hd64 256-key blocks keep enough bytes in
#: flight (SmolLM2 batch 32, 4K: 28.7 µs against 32.8 with 128-key blocks).
SINGLE_CHUNK_CONFIGS = {(64, 16, "off"): (256, 4, 3), (64, 32, "off"): (256, 4, 3)}


def plan_verify(batch: int, num_heads: int, num_kv_heads: int, head_dim: int, q_len: int,
                max_context: int, *, device: torch.device | str | None = None,
                collect_rows: tuple[int, ...] | None = (), collect_separate: bool | None = None,
                block_m: int | None = None, block_n: int | None = None,
                num_splits: int | None = None, num_warps: int | None = None,
                num_stages: int | None = None, programs_per_sm: float | None = None,
                element_size: int = 2, collect_sum: bool = False,
                window: int | None = None, collect_head_sum: bool = False) -> VerifyPlan:
    """Plan verify launches for sequences of up to ``max_context`` keys.

    ``window`` W: a sliding-window layer's verify (rows see their last W keys; the chunks cut
    the last ``min(max_context, W + q − 1)`` keys).
    ``collect_rows``: query rows whose logits are written (``()`` = none, ``None`` = the
    Collect-2-Query default ``default_collect_rows(q_len)``). ``collect_separate``: compute the
    collected rows' logits with a second small tile (default when only some rows are collected)
    rather than storing them from the main tile under a row mask. ``collect_sum``: write, instead
    of per-head logits, one fp32 row per sequence: the sum over every query head and the
    collected rows (what Vegas ranks by), ``Σ_{h, r} scale·q_{r,h}·k_n`` (the collecting tile's
    logits summed over its rows, from the separate tile or the main one as for per-head logits,
    added across the KV heads atomically; ``new_logits_buffer`` sizes it). ``collect_head_sum``:
    one fp32 row per collected row and sequence, its logits summed over every query head
    (``Σ_h scale·q_{r,h}·k_n``, added across the KV heads the same way): what ranking by one
    row chosen after the verify (the last accepted token's) needs. Block sizes, warps,
    stages and programs per multiprocessor default to ``DEFAULT_CONFIGS``; pass them to
    override.
    ``element_size``: bytes per cache element (4 for fp32 caches: fewer stages / smaller key
    blocks so the tiles fit in shared memory).
    ``block_m`` pads the tile to more rows (at least ``group · q``). ``num_splits`` sets how
    many chunks each (sequence, KV head)'s keys are cut into; by default the tiles of
    :data:`WAVE_CONFIGS` take the fewest whole waves of programs (unless ``programs_per_sm``
    or another launch parameter is given), the others about ``programs_per_sm`` programs per
    multiprocessor.
    """
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of kv heads {num_kv_heads}")
    if not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"q_len must lie in 1..{MAX_Q_LEN}, got {q_len}")
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim must be 64 or 128, got {head_dim}")
    if collect_rows is None:
        collect_rows = default_collect_rows(q_len)
    collect_rows = tuple(sorted(set(int(r) for r in collect_rows)))
    if any(not 0 <= r < q_len for r in collect_rows):
        raise ValueError(f"collect_rows {collect_rows} outside 0..{q_len - 1}")
    if (collect_sum or collect_head_sum) and not collect_rows:
        raise ValueError("collect_sum and collect_head_sum sum collected rows: give "
                         "collect_rows")
    if collect_sum and collect_head_sum:
        raise ValueError("collect_sum (over heads and rows) or collect_head_sum (over heads, "
                         "per row): not both")
    if collect_separate is None:
        collect_separate = 0 < len(collect_rows) < q_len
    # a separate tile packs its row numbers 4 bits each into collect_tokens' signed 64 bits:
    # 16 collected rows (all of q = 16) stay in the main tile
    collect_separate = bool(collect_separate and collect_rows and len(collect_rows) < MAX_Q_LEN)
    if window is not None and window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    device = default_device(device)
    window = int(window or 0)
    if window:
        max_context = min(max_context, window + q_len - 1)
    group = num_heads // num_kv_heads
    rows = max(16, next_power_of_2(group * q_len))
    # the summed row (the separate tile's small dot summed over its rows) runs within 4-5% of
    # off on the plain tile's configs (H200, hd128 q8)
    # (the per-row head sums take the summed row's configurations)
    mode = "off" if not collect_rows else "sum" if collect_sum or collect_head_sum else \
        "separate" if collect_separate else "main"
    base_mode = "off" if mode == "sum" else mode     # programs per SM: the plain tile's
    default = DEFAULT_CONFIGS.get((head_dim, rows, base_mode), FALLBACK_CONFIG)
    waves = (head_dim, rows, mode) in WAVE_CONFIGS
    caller = bool(block_n or num_warps or num_stages or programs_per_sm)
    resident = 1        # programs on each multiprocessor at once, for whole waves
    if waves:
        block_n_w, warps_w, stages_w, *more = WAVE_CONFIGS[(head_dim, rows, mode)]
        default = (block_n_w, warps_w, stages_w, None, None)
        resident = more[0] if more and not caller else 1
    if caller:  # the caller's config: no padding
        default = default[:4] + (None,)
    block_m = max(rows, next_power_of_2(block_m or default[4] or 1))
    block_n = block_n or default[0]
    num_warps = num_warps or default[1]
    num_stages = num_stages or default[2]
    programs_per_sm = programs_per_sm or default[3]
    block_n, num_stages = fit_shared_memory(block_m, block_n, head_dim, num_stages, element_size)
    split = plan_splits(max_context, batch * num_kv_heads, block_n, device,
                        num_splits=num_splits, programs_per_sm=programs_per_sm,
                        resident_per_sm=resident)
    single = SINGLE_CHUNK_CONFIGS.get((head_dim, rows, base_mode))
    if waves and not caller and num_splits is None and split.num_splits == 1 and single:
        block_n, num_warps, num_stages = single
        block_n, num_stages = fit_shared_memory(block_m, block_n, head_dim, num_stages,
                                                element_size)
        split = plan_splits(max_context, batch * num_kv_heads, block_n, device, num_splits=1)
    partial_out = partial_lse = None
    if split.num_splits > 1:
        partial_out, partial_lse = workspace(batch * num_kv_heads, split, block_m, head_dim,
                                             device)
    return VerifyPlan(batch, num_heads, num_kv_heads, head_dim, q_len, collect_rows, split,
                      block_m, num_warps, num_stages, collect_separate, partial_out,
                      partial_lse, bool(collect_sum), window, bool(collect_head_sum))


def launch_constexprs(plan: VerifyPlan, *, write_lse: bool, has_sinks: bool = False) -> dict:
    """The compile-time arguments ``verify_attention`` launches ``_verify_kernel`` with."""
    return dict(NUM_KV_HEADS=plan.num_kv_heads, Q_LEN=plan.q_len, GROUP=plan.group,
                HEAD_DIM=plan.head_dim, BLOCK_M=plan.block_m, BLOCK_N=plan.split.block_n,
                DIRECT_OUTPUT=plan.split.num_splits == 1, WRITE_LSE=write_lse,
                COLLECT_MASK=plan.collect_mask, COLLECT_SEPARATE=plan.collect_separate,
                N_COLLECT=max(1, len(plan.collect_rows)), COLLECT_TOKENS=plan.collect_tokens,
                BLOCK_C=plan.block_c, SLOTS=max(16, next_power_of_2(len(plan.collect_rows))),
                COLLECT_SUM=2 if plan.collect_head_sum else int(plan.collect_sum),
                WINDOW=plan.window,
                HAS_SINKS=has_sinks)


def verify_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     lengths: torch.Tensor, plan: VerifyPlan | None = None, *,
                     out: torch.Tensor | None = None, logits: torch.Tensor | None = None,
                     lse: torch.Tensor | None = None, sm_scale: float | None = None,
                     collect_rows: tuple[int, ...] | None = (),
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Run verify attention (module docstring); returns ``out`` [batch, q, num_heads, head_dim].

    ``lengths`` counts each sequence's keys including its ``q`` tokens being verified and must
    not exceed the ``max_context`` the plan was made for (not checked: that would synchronise).
    When the plan collects rows, pass ``logits`` [batch, num_heads, len(collect_rows), ≥ max
    length] (``new_logits_buffer``); the kernel writes the collected rows into it (with
    ``collect_sum``: fp32 [batch, 1, 1, ≥ max length], their sum per sequence; with
    ``collect_head_sum``: fp32 [batch, 1, len(collect_rows), ≥ max length], each row's sum over
    the heads; both zeroed here first, the whole buffer). ``lse``
    [batch, num_heads, q] fp32, when given, receives each row's natural log-sum-exp (with
    ``sinks``, fp32 [num_heads], the sink term included).
    ``collect_rows`` is used only when ``plan`` is None (a plan is then made on the spot).
    """
    batch, q_len, num_heads, head_dim = q.shape
    if plan is None:
        plan = plan_verify(batch, num_heads, k_cache.shape[1], head_dim, q_len,
                           k_cache.shape[2], device=q.device, collect_rows=collect_rows)
    assert (batch, q_len, num_heads, head_dim) == (plan.batch, plan.q_len, plan.num_heads,
                                                   plan.head_dim), "q does not match the plan"
    assert k_cache.shape[1] == plan.num_kv_heads and q.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert lengths.dtype == torch.int32
    assert sinks is None or (sinks.dtype == torch.float32 and sinks.shape == (num_heads,))
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    if out is None:
        out = torch.empty_like(q)
    if plan.collect_rows:
        if logits is None:
            raise ValueError("this plan collects logits: pass logits= (see new_logits_buffer)")
        gstrides = logits.stride()[:3]
        assert logits.stride(-1) == 1
        if plan.collect_sum:
            assert logits.shape[1:3] == (1, 1) and logits.dtype == torch.float32, \
                "collect_sum: fp32 [batch, 1, 1, n]"
            logits.zero_()          # the KV heads' programs add into it
        elif plan.collect_head_sum:
            assert logits.shape[1:3] == (1, len(plan.collect_rows)) and \
                logits.dtype == torch.float32, "collect_head_sum: fp32 [batch, 1, rows, n]"
            logits.zero_()
        else:
            assert logits.shape[2] == len(plan.collect_rows)
    else:
        logits, gstrides = out, (0, 0, 0)
    lse_strides = lse.stride() if lse is not None else (0, 0, 0)
    split = plan.split
    direct = split.num_splits == 1
    part_out = plan.partial_out if not direct else out
    part_lse = plan.partial_lse if not direct else out
    grid = (batch * plan.num_kv_heads, split.num_splits)
    _verify_kernel[grid](
        q, k_cache, v_cache, lengths, out, lse if lse is not None else out, part_out, part_lse,
        logits, sinks if sinks is not None else out,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        *lse_strides, *gstrides,
        split.split_size, split.num_splits, sm_scale,
        **launch_constexprs(plan, write_lse=lse is not None, has_sinks=sinks is not None),
        num_warps=plan.num_warps, num_stages=plan.num_stages)
    if not direct:
        combine(plan.partial_out, plan.partial_lse, lengths, False, out, lse, split,
                num_kv_heads=plan.num_kv_heads, q_len=q_len, group=plan.group, sinks=sinks,
                window=plan.window)
    return out


def new_logits_buffer(plan: VerifyPlan, max_len: int, *,
                      device: torch.device | str | None = None,
                      dtype: torch.dtype | None = None) -> torch.Tensor:
    """A ``[batch, num_heads, len(collect_rows), max_len]`` buffer for collected logits: bf16,
    or fp32 under the interpreter (which has no bf16 arithmetic); for a ``collect_sum`` plan
    fp32 ``[batch, 1, 1, max_len]``, for a ``collect_head_sum`` one fp32
    ``[batch, 1, len(collect_rows), max_len]``."""
    if plan.collect_sum or plan.collect_head_sum:
        rows = len(plan.collect_rows) if plan.collect_head_sum else 1
        return torch.empty(plan.batch, 1, rows, max_len, dtype=torch.float32,
                           device=default_device(device))
    if dtype is None:
        dtype = torch.float32 if INTERPRETED else torch.bfloat16
    return torch.empty(plan.batch, plan.num_heads, len(plan.collect_rows), max_len,
                       dtype=dtype, device=default_device(device))


def summed_logits(logits: torch.Tensor, *, rows: bool = True) -> torch.Tensor:
    """Per-head collected logits [batch, heads, rows, n] summed over every query head and the
    rows, in fp32: [batch, 1, 1, n] (what ``collect_sum`` writes); with ``rows=False`` over
    the heads only: [batch, 1, rows, n] (what ``collect_head_sum`` writes)."""
    return logits.float().sum((1, 2) if rows else 1, keepdim=True)


def verify_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               lengths: torch.Tensor, *, collect_rows: tuple[int, ...] = (),
                               sm_scale: float | None = None, window: int | None = None,
                               sinks: torch.Tensor | None = None
                               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The definition, in fp32 torch, one sequence at a time (``window``: row p sees keys
    ``p − W < n ≤ p``; ``sinks`` [H]: one more logit per head, of value 0, in the softmax).

    Returns ``(out [b, q, h, d], logits [b, h, len(collect_rows), max_len] or None,
    lse [b, h, q])``; logits past each sequence's length are NaN.
    """
    batch, q_len, num_heads, head_dim = q.shape
    kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // kv_heads
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    out = torch.empty(batch, q_len, num_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, num_heads, q_len, dtype=torch.float32, device=q.device)
    logits = None
    if collect_rows:
        logits = torch.full((batch, num_heads, len(collect_rows), max_len), float("nan"),
                            dtype=torch.float32, device=q.device)
    for b in range(batch):
        length = int(lengths[b])
        assert q_len <= length <= max_len
        keys = k_cache[b, :, :length].float().repeat_interleave(group, 0)    # [h, n, d]
        values = v_cache[b, :, :length].float().repeat_interleave(group, 0)
        s = q[b].float().transpose(0, 1) @ keys.transpose(1, 2) * scale      # [h, t, n]
        if collect_rows:
            logits[b, :, :, :length] = s[:, list(collect_rows)]
        position = length - q_len + torch.arange(q_len, device=q.device)
        key = torch.arange(length, device=q.device)[None, :]
        visible = key <= position[:, None]
        if window:
            visible &= key > position[:, None] - window
        s = s.masked_fill(~visible, float("-inf"))
        if sinks is not None:                                     # [h, t, n + 1]
            s = torch.cat([s, sinks.float()[:, None, None].expand(-1, q_len, 1)], -1)
        lse[b] = torch.logsumexp(s, -1)
        weight = torch.softmax(s, -1)[..., :length]
        out[b] = (weight @ values).transpose(0, 1)
    return out, logits, lse


__all__ = ["DEFAULT_CONFIGS", "FALLBACK_CONFIG", "MAX_Q_LEN", "VerifyPlan", "default_collect_rows",
           "new_logits_buffer",
           "plan_verify", "summed_logits", "verify_attention", "verify_attention_reference"]
