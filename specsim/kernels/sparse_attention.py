"""Sparse draft attention: one query token per sequence over a selected subset of its KV cache.

What it computes. Sequence ``b`` drafts one token; query head ``h`` (KV head ``g = h // group``)
attends only to the cache positions listed for it, ``I = indices[b, :counts[b]]`` (one list per
sequence, shared by its KV heads) or ``I = indices[b, g, :counts[b, g]]`` (one list per KV
head):

    out_{b,h} = Σ_{n∈I} softmax_{n∈I}(scale · q_{b,h} · K_{b,g,n}) V_{b,g,n}

— exactly full attention restricted to ``I``. With ``sinks`` (fp32 [num_heads], gpt-oss) each
head's sink logit joins the softmax's denominator (``split_kv``'s ``add_sink``). Lists hold
int32 positions into the sequence's cache, each ``< lengths[b]``, without duplicates, in any
order (sorted lists read memory in order, which is kinder to DRAM pages). Entries past the
count are ignored. An empty list gives a zero output. Positions are not bounds-checked in the
kernel (that would cost a compare per key); ``sparse_attention_reference`` checks them.

Draft tokens appended after the selection was made are *not* added automatically: append their
positions to the lists (``selection.append_positions``).

Layouts. ``q``: [batch, num_heads, head_dim]; ``out`` likewise. KV cache [batch, kv_heads,
max_len, head_dim] (see ``kv_cache``). ``indices`` int32 [batch, capacity] with ``counts`` int32
[batch], or [batch, kv_heads, capacity] with ``counts`` [batch, kv_heads].

How. One program per (sequence, KV head, chunk of the list): its tile holds the ``group`` query
heads of the KV head, each gathered K/V row is read once for all of them; the list is split into
chunks of ``split_size`` entries and merged by the combine step of ``split_kv``. bf16 in, fp32
accumulation. API: ``plan_sparse`` once per batch shape, ``sparse_attention`` every step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specsim.kernels._runtime import default_device, next_power_of_2, tl, triton
from specsim.kernels.split_kv import (SplitPlan, add_sink, combine, fit_shared_memory,
                                      plan_splits, softmax_update, store_partial, workspace)


@triton.jit
def _sparse_kernel(Q, K, V, Indices, Counts, Out, PartOut, PartLse, Sinks,
                   stride_qb, stride_qh,
                   stride_kb, stride_kh, stride_kt,
                   stride_vb, stride_vh, stride_vt,
                   stride_ib, stride_ih, stride_cb, stride_ch,
                   stride_ob, stride_oh,
                   split_size, num_splits, sm_scale,
                   NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT_OUTPUT: tl.constexpr,
                   HAS_SINKS: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = (pid // NUM_KV_HEADS).to(tl.int64)  # 64-bit: batch strides can pass 2**31
    kvh = (pid % NUM_KV_HEADS).to(tl.int64)
    count = tl.load(Counts + b * stride_cb + kvh * stride_ch)
    start = split * split_size
    end = tl.minimum(start + split_size, count)

    rows = tl.arange(0, BLOCK_M)
    head = kvh * GROUP + rows
    row_ok = rows < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + head[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    qk_scale = sm_scale * 1.4426950408889634

    index_base = Indices + b * stride_ib + kvh * stride_ih
    k_base = K + b * stride_kb + kvh * stride_kh
    v_base = V + b * stride_vb + kvh * stride_vh
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
    for n0 in range(start, full_end, BLOCK_N):
        positions = tl.load(index_base + n0 + offs_n)
        k = tl.load(k_base + positions[:, None] * stride_kt + dims[None, :])
        s = tl.dot(q, tl.trans(k))
        v = tl.load(v_base + positions[:, None] * stride_vt + dims[None, :])
        acc, m_i, l_i = softmax_update(acc, m_i, l_i, s, qk_scale, v)
    for n0 in range(full_end, end, BLOCK_N):  # the list's ragged tail
        slots = n0 + offs_n
        slot_ok = slots < end
        positions = tl.load(index_base + slots, mask=slot_ok, other=0)
        k = tl.load(k_base + positions[:, None] * stride_kt + dims[None, :],
                    mask=slot_ok[:, None], other=0.0)
        s = tl.where(slot_ok[None, :], tl.dot(q, tl.trans(k)), float("-inf"))
        v = tl.load(v_base + positions[:, None] * stride_vt + dims[None, :],
                    mask=slot_ok[:, None], other=0.0)
        acc, m_i, l_i = softmax_update(acc, m_i, l_i, s, qk_scale, v)

    if DIRECT_OUTPUT:
        if HAS_SINKS:
            acc, m_i, l_i = add_sink(acc, m_i, l_i, Sinks, head, row_ok)
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(Out + b * stride_ob + head[:, None] * stride_oh + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        if start < count:
            store_partial(PartOut, PartLse, pid * num_splits + split, acc, m_i, l_i,
                          BLOCK_M, HEAD_DIM)


@dataclass(frozen=True)
class SparsePlan:
    """Everything about a sparse draft launch that depends only on the batch shape."""

    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    split: SplitPlan
    block_m: int
    num_warps: int
    num_stages: int
    partial_out: torch.Tensor | None = field(repr=False, default=None)
    partial_lse: torch.Tensor | None = field(repr=False, default=None)

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


def plan_sparse(batch: int, num_heads: int, num_kv_heads: int, head_dim: int,
                max_selected: int, *, device: torch.device | str | None = None,
                block_n: int | None = None, num_splits: int | None = None,
                num_warps: int | None = None, num_stages: int | None = None,
                programs_per_sm: float | None = 2.0, element_size: int = 2) -> SparsePlan:
    """Plan sparse draft launches for lists of up to ``max_selected`` positions
    (``programs_per_sm=None``: whole waves of programs, ``split_kv.wave_splits``)."""
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of kv heads {num_kv_heads}")
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim must be 64 or 128, got {head_dim}")
    device = default_device(device)
    group = num_heads // num_kv_heads
    block_m = max(16, next_power_of_2(group))
    # Defaults: the fastest swept on an H200 at s = 0.07, context 131072 (BENCHMARKS.md).
    block_n = block_n or 128
    num_warps = num_warps or 4
    num_stages = num_stages or 3
    block_n, num_stages = fit_shared_memory(block_m, block_n, head_dim, num_stages, element_size)
    split = plan_splits(max_selected, batch * num_kv_heads, block_n, device,
                        num_splits=num_splits, programs_per_sm=programs_per_sm)
    partial_out = partial_lse = None
    if split.num_splits > 1:
        partial_out, partial_lse = workspace(batch * num_kv_heads, split, block_m, head_dim,
                                             device)
    return SparsePlan(batch, num_heads, num_kv_heads, head_dim, split, block_m, num_warps,
                      num_stages, partial_out, partial_lse)


def sparse_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     indices: torch.Tensor, counts: torch.Tensor,
                     plan: SparsePlan | None = None, *, out: torch.Tensor | None = None,
                     sm_scale: float | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Run sparse draft attention (module docstring); returns ``out`` [batch, heads, head_dim].
    ``sinks``: fp32 [num_heads] sink logits, or None.

    ``counts`` must not exceed the ``max_selected`` the plan was made for (not checked).
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    per_kv_head = indices.dim() == 3
    if plan is None:
        plan = plan_sparse(batch, num_heads, num_kv_heads, head_dim, indices.shape[-1],
                           device=q.device)
    assert (batch, num_heads, head_dim) == (plan.batch, plan.num_heads, plan.head_dim)
    assert num_kv_heads == plan.num_kv_heads
    assert indices.dtype == torch.int32 and counts.dtype == torch.int32
    assert indices.stride(-1) == 1 and counts.dim() == indices.dim() - 1
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert sinks is None or (sinks.dtype == torch.float32 and sinks.shape == (num_heads,))
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    if out is None:
        out = torch.empty_like(q)
    stride_ih = indices.stride(1) if per_kv_head else 0
    stride_ch = counts.stride(1) if per_kv_head else 0
    split = plan.split
    direct = split.num_splits == 1
    grid = (batch * num_kv_heads, split.num_splits)
    _sparse_kernel[grid](
        q, k_cache, v_cache, indices, counts, out,
        plan.partial_out if not direct else out, plan.partial_lse if not direct else out,
        sinks if sinks is not None else out,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        indices.stride(0), stride_ih, counts.stride(0), stride_ch,
        out.stride(0), out.stride(1),
        split.split_size, split.num_splits, sm_scale,
        NUM_KV_HEADS=num_kv_heads, GROUP=plan.group, HEAD_DIM=head_dim,
        BLOCK_M=plan.block_m, BLOCK_N=split.block_n, DIRECT_OUTPUT=direct,
        HAS_SINKS=sinks is not None, num_warps=plan.num_warps, num_stages=plan.num_stages)
    if not direct:
        combine(plan.partial_out, plan.partial_lse, counts, per_kv_head, out.unsqueeze(1), None,
                split, num_kv_heads=num_kv_heads, q_len=1, group=plan.group, sinks=sinks)
    return out


def sparse_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               indices: torch.Tensor, counts: torch.Tensor,
                               lengths: torch.Tensor | None = None, *,
                               sm_scale: float | None = None,
                               sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The definition, in fp32 torch, one (sequence, KV head) at a time; checks the lists
    (``sinks`` [H]: one more logit per head, of value 0, in the softmax)."""
    batch, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = num_heads // kv_heads
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    out = torch.zeros(batch, num_heads, head_dim, dtype=torch.float32, device=q.device)
    for b in range(batch):
        for g in range(kv_heads):
            if indices.dim() == 3:
                chosen = indices[b, g, :int(counts[b, g])].long()
            else:
                chosen = indices[b, :int(counts[b])].long()
            heads = slice(g * group, (g + 1) * group)
            if chosen.numel() == 0:
                continue
            limit = int(lengths[b]) if lengths is not None else k_cache.shape[2]
            assert int(chosen.min()) >= 0 and int(chosen.max()) < limit, "position out of range"
            assert chosen.unique().numel() == chosen.numel(), "duplicate positions"
            keys = k_cache[b, g, chosen].float()
            values = v_cache[b, g, chosen].float()
            s = q[b, heads].float() @ keys.T * scale
            if sinks is not None:
                s = torch.cat([s, sinks.float()[heads, None]], -1)
            out[b, heads] = torch.softmax(s, -1)[:, :chosen.numel()] @ values
    return out


__all__ = ["SparsePlan", "plan_sparse", "sparse_attention", "sparse_attention_reference"]
