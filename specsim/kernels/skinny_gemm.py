"""Decode-shaped linear layers: ``y = x · Wᵀ`` for a handful of rows (M = batch × query tokens
≤ 64) against a large weight, streaming the weight once at as much of the copy bandwidth as
possible.

Why. At decode batch sizes every projection is a read of its weight: Qwen3-8B's plain step at
batch 4 (H200, BENCHMARKS.md) spends per layer 11.1 µs in o_proj (33.5 MB: 3.0 TB/s), 15.5 µs
in q|k|v (50 MB: 3.2 TB/s) and 28.0 + 1.8 µs in down_proj and its split-K reduction (100 MB:
3.4 TB/s) under cuBLAS, where a weight stream at the measured 4.2 TB/s would take 8.0, 12.0 and
24.0 µs. This kernel is on trial against cuBLAS (``benchmarks/bench_skinny_gemm.py``); the
engine uses it for its fused projections with ``SPECSIM_LINEAR=skinny`` (off by default).

How. Program ``j`` owns output columns ``j·BLOCK_N ..`` (rows of ``W``, which is ``[N, K]``
row-major as ``nn.Linear`` keeps it) and walks K in ``BLOCK_K`` steps: each step loads a
``[BLOCK_N, BLOCK_K]`` weight tile (contiguous along K) and the ``[BLOCK_M, BLOCK_K]`` slice of
``x``, and accumulates ``x · tileᵀ`` in fp32 with ``tl.dot``. No split-K, so no reduction
kernel and no atomics: the grid is ``ceil(N / BLOCK_N)`` programs, and ``BLOCK_N`` is chosen
so that it fills the GPU. Rows past M and columns past N are masked; K need not be a multiple
of ``BLOCK_K``.
"""
from __future__ import annotations

import torch

from specsim.kernels._runtime import multiprocessor_count, next_power_of_2, tl, triton

MAX_M = 64


@triton.jit
def _skinny_gemm_kernel(X, W, Y, M, N, K,
                        stride_xm, stride_wn, stride_ym,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        EVEN_K: tl.constexpr, IEEE: tl.constexpr):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    x_ptr = X + rows[:, None] * stride_xm + ks[None, :]
    w_ptr = W + cols.to(tl.int64)[:, None] * stride_wn + ks[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptr + k0, mask=row_ok[:, None], other=0.0)
            w = tl.load(w_ptr + k0, mask=col_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + ks) < K
            x = tl.load(x_ptr + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:   # fp32 operands: full fp32 products, as torch's fp32 matmul (no TF32)
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], acc.to(Y.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


def default_block_n(n: int, device: torch.device | str | None = None,
                    programs_per_sm: float = 1.0) -> int:
    """The widest power-of-two column block (16..128) that still gives every multiprocessor
    ``programs_per_sm`` programs."""
    sms = multiprocessor_count(device)
    block = 128
    while block > 16 and n / block < programs_per_sm * sms:
        block //= 2
    return block


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, *, out: torch.Tensor | None = None,
                block_n: int | None = None, block_k: int = 128, num_warps: int = 4,
                num_stages: int = 4) -> torch.Tensor:
    """``x · weightᵀ``: x [..., K] with at most ``MAX_M`` rows in all, weight [N, K] (both with
    a contiguous last dim); returns [..., N] in x's dtype (fp32 accumulation)."""
    *lead, k = x.shape
    n, k_w = weight.shape
    if k != k_w:
        raise ValueError(f"x has {k} features, the weight {k_w}")
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if not 1 <= m <= MAX_M:
        raise ValueError(f"skinny_gemm takes 1..{MAX_M} rows, got {m}")
    if x2.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("x and weight need a contiguous last dimension")
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_n = block_n or default_block_n(n, x.device)
    block_m = max(16, next_power_of_2(m))
    _skinny_gemm_kernel[(triton.cdiv(n, block_n),)](
        x2, weight, out, m, n, k, x2.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0,
        IEEE=x.dtype == torch.float32, num_warps=num_warps, num_stages=num_stages)
    return out.view(*lead, n)


@torch.library.custom_op("specsim::skinny_gemm", mutates_args=())
def skinny_gemm_op(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """:func:`skinny_gemm` of 2-D ``x`` as a torch operator, so that ``torch.compile``d code
    (the engine's layers) calls it as one opaque op."""
    return skinny_gemm(x, weight)


@skinny_gemm_op.register_fake
def _skinny_gemm_shape(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def skinny_gemm_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The definition in fp32: ``x · weightᵀ``."""
    return x.float() @ weight.float().t()


__all__ = ["MAX_M", "default_block_n", "skinny_gemm", "skinny_gemm_op", "skinny_gemm_reference"]
