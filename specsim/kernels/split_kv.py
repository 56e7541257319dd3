"""Split-KV (flash-decoding) pieces shared by the verify and the sparse draft kernels.

A decode-shaped attention has few query rows per sequence, so one program per (sequence, KV
head) would leave most of the GPU idle at small batch. Instead the keys of each (sequence, KV
head) are cut into ``num_splits`` consecutive chunks of ``split_size`` keys; program
``(b·kv_heads + h, j)`` attends its rows over chunk ``j`` and writes a *partial* result

    o_j = Σ_{n∈chunk j} 2^{s_n − m_j} v_n / ℓ_j,    lse_j = m_j + log2 ℓ_j,
    with s_n = log2(e)·scale·q·k_n,  m_j = max_n s_n,  ℓ_j = Σ_n 2^{s_n − m_j}

(base-2 log-sum-exp; every kernel works in exp2). The combine step merges the chunks exactly:

    o = Σ_j 2^{lse_j − M} o_j / Σ_j 2^{lse_j − M},    M = max_j lse_j.

Chunks past a sequence's key count are empty; their programs write nothing and the combine
reads only the first ``ceil(count / split_size)`` chunks. A row that attends to no key at all
(a sparse list of length 0) gets an output of zeros.

Attention sinks (gpt-oss: one logit ``sink_h`` per query head that joins every row's softmax
denominator and nothing else) are folded in once, where a row is normalised: by the kernel
itself when it writes its output directly, else by the combine (``add_sink``):

    o = Σ_n 2^{s_n} v_n / (Σ_n 2^{s_n} + 2^{log2(e)·sink_h}),

and the log-sum-exp the kernels return then includes the sink (the log of that denominator),
so that ``exp(scale·q·k_n − lse)`` is key n's actual attention weight. Sink-free launches
compile without it (``HAS_SINKS`` false).

Workspace layout (fp32, allocated once by the planners):
``partial_out[b·kv_heads + h, j, row, d]`` and ``partial_lse[b·kv_heads + h, j, row]``.
Row ``r`` of a tile is query head ``h·group + r // q_len`` at query token ``r % q_len``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specsim.kernels._runtime import LOG2E, multiprocessor_count, tl, triton


@dataclass(frozen=True)
class SplitPlan:
    """How one batch shape is cut into programs: computed once, reused every step."""

    num_splits: int    # chunks per (sequence, KV head)
    split_size: int    # keys per chunk, a multiple of block_n
    block_n: int       # keys per loop iteration inside a program

    @property
    def max_keys(self) -> int:
        """The most keys per (sequence, KV head) this plan covers."""
        return self.num_splits * self.split_size


def wave_splits(batch_kv_heads: int, multiprocessors: int, max_splits: int,
                wave_cost: float = 0.02, tolerance: float = 0.02,
                single_wave: float = 0.7) -> int:
    """The chunk count whose programs finish soonest, counting whole waves.

    ``batch_kv_heads · n`` equal programs run in ``w(n) = ceil(batch_kv_heads · n / SMs)``
    waves of ``1/n`` of the keys each, so the kernel takes about ``w(n) / n``; each wave
    also pays a fixed start (its pipeline filling), ``wave_cost`` of a program's time. The
    fewest chunks within ``tolerance`` of the best win (less for the combine to read).
    Batch 4 × 8 KV heads on 132 multiprocessors: 4 chunks (one wave of 128 programs); 8 and
    16 chunks (2 and 4 full waves) run 2% and 6% slower on an H200, 17 chunks (5 waves, the
    last one 12% full) 8–22% slower. When one chunk each makes one wave ``single_wave`` to
    100% full, one it is: no partials and no combine (batch 32 × 3 KV heads: 1 chunk of
    256-key blocks 28.7 µs, 4 chunks 30.8). Past one wave the count is the formula's (batch 64
    × 3 KV heads: 2 chunks, 3 waves 97% full; one chunk runs 2 waves 73% full, up to 17%
    slower).
    """
    p = max(1, batch_kv_heads)
    if single_wave * multiprocessors <= p <= multiprocessors:
        return 1
    costs = []
    for n in range(1, max(1, max_splits) + 1):
        waves = math.ceil(p * n / multiprocessors)
        costs.append(waves / n * (1.0 + wave_cost * waves))
    best = min(costs)
    return next(n for n, cost in enumerate(costs, 1) if cost <= best * (1.0 + tolerance))


def plan_splits(max_keys: int, batch_kv_heads: int, block_n: int, device: torch.device | str,
                *, num_splits: int | None = None, programs_per_sm: float | None = 2.0,
                min_blocks_per_split: int = 4, resident_per_sm: int = 1) -> SplitPlan:
    """Choose ``num_splits`` so that ``batch_kv_heads · num_splits`` programs fill the GPU.

    Aim at ``programs_per_sm`` programs per multiprocessor, or, with ``programs_per_sm=None``,
    at the fewest whole waves (:func:`wave_splits`) of ``resident_per_sm`` programs on each
    multiprocessor at once; never give a program fewer than ``min_blocks_per_split`` loop
    iterations (short contexts use fewer, longer chunks: a chunk that only loads and writes
    its partial costs more than it saves).
    """
    max_keys = max(1, int(max_keys))
    blocks = math.ceil(max_keys / block_n)
    if num_splits is None:
        longest = max(1, blocks // min_blocks_per_split)
        if programs_per_sm is None:
            num_splits = wave_splits(batch_kv_heads,
                                     multiprocessor_count(device) * resident_per_sm, longest)
        else:
            target = programs_per_sm * multiprocessor_count(device)
            num_splits = math.ceil(target / max(1, batch_kv_heads))
            num_splits = min(num_splits, longest)
    num_splits = max(1, min(int(num_splits), blocks))
    split_size = math.ceil(blocks / num_splits) * block_n
    num_splits = math.ceil(max_keys / split_size)  # drop chunks rounding left empty
    return SplitPlan(num_splits=num_splits, split_size=split_size, block_n=block_n)


@triton.jit
def softmax_update(acc, m_i, l_i, s, qk_scale, v):
    """One online-softmax step: fold raw scores ``s = q·k`` [M, N] (masked = -inf) and values
    ``v`` [N, D] into the running output ``acc`` [M, D], max ``m_i`` and sum ``l_i`` [M], which
    are kept in base-2 units (``qk_scale = scale·log2 e``, applied inside one FMA per score)."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key seen yet
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s * qk_scale - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def add_sink(acc, m_i, l_i, Sinks, head, row_ok):
    """Fold each row's sink logit (natural units, ``Sinks[head]``) into its running output
    ``acc``, base-2 max ``m_i`` and sum ``l_i``, as one more key with value 0."""
    sink = tl.load(Sinks + head, mask=row_ok, other=0.0) * 1.4426950408889634
    m_new = tl.maximum(m_i, sink)
    alpha = tl.exp2(m_i - m_new)                      # 0 for a row that saw no key
    return acc * alpha[:, None], m_new, l_i * alpha + tl.exp2(sink - m_new)


@triton.jit
def store_partial(PartOut, PartLse, part, acc, m_i, l_i,
                  BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Write one chunk's normalised output and base-2 log-sum-exp to the workspace."""
    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    tl.store(PartOut + (part * BLOCK_M + rows)[:, None] * HEAD_DIM + dims[None, :], out)
    tl.store(PartLse + part * BLOCK_M + rows, lse)


@triton.jit
def _store_merged(Out, Lse, Sinks, b, kvh, rows, dims, acc, m, total,
                  stride_ob, stride_ot, stride_oh, stride_lb, stride_lh, stride_lt,
                  Q_LEN: tl.constexpr, GROUP: tl.constexpr, WRITE_LSE: tl.constexpr,
                  HAS_SINKS: tl.constexpr):
    """Normalise the merged rows (tile row r = head ``kvh·GROUP + r // Q_LEN``, token
    ``r % Q_LEN``; with ``HAS_SINKS`` each head's sink in the denominator) into ``Out`` and,
    with ``WRITE_LSE``, their natural log-sum-exp into ``Lse``; padding rows are not
    written."""
    head = kvh * GROUP + rows // Q_LEN
    tok = rows % Q_LEN
    row_ok = rows < GROUP * Q_LEN
    if HAS_SINKS:
        acc, m, total = add_sink(acc, m, total, Sinks, head, row_ok)
    out = acc / tl.where(total > 0.0, total, 1.0)[:, None]
    tl.store(Out + b * stride_ob + tok[:, None] * stride_ot + head[:, None] * stride_oh
             + dims[None, :], out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        lse_nat = (m + tl.log2(tl.where(total > 0.0, total, 1.0))) / 1.4426950408889634
        tl.store(Lse + b * stride_lb + head * stride_lh + tok * stride_lt, lse_nat, mask=row_ok)


@triton.jit
def _combine_kernel(PartOut, PartLse, Counts, Out, Lse, Sinks,
                    stride_cb, stride_ch,
                    stride_ob, stride_ot, stride_oh,
                    stride_lb, stride_lh, stride_lt,
                    split_size, num_splits,
                    NUM_KV_HEADS: tl.constexpr, Q_LEN: tl.constexpr, GROUP: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, WRITE_LSE: tl.constexpr,
                    HAS_SINKS: tl.constexpr, WINDOW: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // NUM_KV_HEADS).to(tl.int64)  # 64-bit: batch strides can pass 2**31
    kvh = (pid % NUM_KV_HEADS).to(tl.int64)
    count = tl.load(Counts + b * stride_cb + kvh * stride_ch)
    if WINDOW > 0:      # a window layer's chunks cut its last W + q − 1 keys, not all of them
        count = tl.minimum(count, WINDOW + Q_LEN - 1)
    used_splits = tl.cdiv(count, split_size)

    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for j in range(0, used_splits):
        part = pid * num_splits + j
        lse = tl.load(PartLse + part * BLOCK_M + rows)
        o = tl.load(PartOut + (part * BLOCK_M + rows)[:, None] * HEAD_DIM + dims[None, :])
        m_new = tl.maximum(m, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        w = tl.exp2(lse - m_safe)
        acc = acc * alpha[:, None] + w[:, None] * o
        total = total * alpha + w
        m = m_new

    _store_merged(Out, Lse, Sinks, b, kvh, rows, dims, acc, m, total,
                  stride_ob, stride_ot, stride_oh, stride_lb, stride_lh, stride_lt,
                  Q_LEN, GROUP, WRITE_LSE, HAS_SINKS)


def combine(partial_out: torch.Tensor, partial_lse: torch.Tensor, counts: torch.Tensor,
            counts_per_kv_head: bool, out: torch.Tensor, lse: torch.Tensor | None,
            split: SplitPlan, *, num_kv_heads: int, q_len: int, group: int,
            sinks: torch.Tensor | None = None, window: int = 0) -> None:
    """Merge the chunks of every (sequence, KV head) into ``out[b, t, head, d]`` (and the natural
    log-sum-exp of each row into ``lse[b, head, t]`` when given), each head's sink logit
    (``sinks`` fp32 [heads]) in the denominator. ``window`` W > 0: the chunks cut each
    sequence's last ``min(count, W + q − 1)`` keys (a sliding-window verify)."""
    batch = out.shape[0]
    head_dim = out.shape[-1]
    block_m = partial_out.shape[2]
    stride_cb = counts.stride(0)
    stride_ch = counts.stride(1) if counts_per_kv_head else 0
    lse_arg = lse if lse is not None else partial_lse
    lse_strides = lse.stride() if lse is not None else (0, 0, 0)
    _combine_kernel[(batch * num_kv_heads,)](
        partial_out, partial_lse, counts, out, lse_arg,
        sinks if sinks is not None else partial_lse,
        stride_cb, stride_ch,
        out.stride(0), out.stride(1), out.stride(2),
        *lse_strides,
        split.split_size, split.num_splits,
        NUM_KV_HEADS=num_kv_heads, Q_LEN=q_len, GROUP=group, HEAD_DIM=head_dim,
        BLOCK_M=block_m, WRITE_LSE=lse is not None, HAS_SINKS=sinks is not None,
        WINDOW=window, num_warps=4)


def workspace(batch_kv_heads: int, split: SplitPlan, block_m: int, head_dim: int,
              device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partial outputs and log-sum-exps for ``split`` (see the module docstring)."""
    partial_out = torch.empty(batch_kv_heads, split.num_splits, block_m, head_dim,
                              dtype=torch.float32, device=device)
    partial_lse = torch.empty(batch_kv_heads, split.num_splits, block_m,
                              dtype=torch.float32, device=device)
    return partial_out, partial_lse


def fit_shared_memory(block_m: int, block_n: int, head_dim: int, num_stages: int,
                      element_size: int) -> tuple[int, int]:
    """(block_n, num_stages) for caches of ``element_size`` bytes.

    The tuned configurations are for 2-byte (bf16/fp16) caches and are kept as they are. Wider
    elements (fp32) double every tile, so fewer stages, then smaller key blocks, are taken until
    the tiles need no more shared memory than the tuned 2-byte configuration does."""
    def need(bn, stages, size):
        return (stages * 2 * bn * head_dim + block_m * head_dim + block_m * bn) * size

    if element_size <= 2:
        return block_n, num_stages
    budget = need(block_n, num_stages, 2)
    while need(block_n, num_stages, element_size) > budget and num_stages > 1:
        num_stages -= 1
    while need(block_n, num_stages, element_size) > budget and block_n > 16:
        block_n //= 2
    return block_n, num_stages


__all__ = ["LOG2E", "SplitPlan", "add_sink", "combine", "fit_shared_memory", "plan_splits",
           "softmax_update", "store_partial", "wave_splits",
           "workspace"]
