"""Attention sinks and sliding windows in the verify and sparse draft kernels (and their
combine step), against the torch references and the engine's torch paths.

Without a GPU the kernels run in Triton's interpreter (fp32, small shapes); on a GPU the same
cases run in bf16.
"""
import os

import torch

if not torch.cuda.is_available():  # before triton kernels are defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import seeding  # noqa: E402

from specsim.engine import attention  # noqa: E402
from specsim.kernels import (plan_sparse, plan_verify, sparse_attention,  # noqa: E402
                             sparse_attention_reference, verify_attention,
                             verify_attention_reference)

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPE = torch.bfloat16 if GPU else torch.float32
TOLERANCE = 1e-2 if GPU else 1e-5


def relative_error(out, ref) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def inputs(seed, batch, heads, kv_heads, head_dim, q_len, max_len):
    g = seeding.generator(seed, DEVICE)
    k = torch.randn(batch, kv_heads, max_len, head_dim, generator=g, device=DEVICE).to(DTYPE)
    v = torch.randn(batch, kv_heads, max_len, head_dim, generator=g, device=DEVICE).to(DTYPE)
    q = torch.randn(batch, q_len, heads, head_dim, generator=g, device=DEVICE).to(DTYPE)
    sinks = 2.0 * torch.randn(heads, generator=g, device=DEVICE)
    return q, k, v, sinks


# (heads, kv_heads, q_len, lengths, window, num_splits, block_n)
VERIFY_CASES = [
    (4, 2, 4, [4, 37, 90], None, 1, 16),
    (4, 2, 4, [4, 37, 90], None, 3, 16),
    (4, 2, 4, [4, 9, 90], 8, 1, 16),
    (4, 2, 4, [4, 9, 90], 20, 2, 16),        # a window cut into chunks: the combine's count
    (8, 2, 1, [1, 30, 70], 16, 1, 16),       # a window layer's draft step (q = 1)
]


@pytest.mark.parametrize("case", VERIFY_CASES)
def test_verify_with_sinks_and_windows_matches_the_reference(case):
    heads, kv_heads, q_len, lengths, window, splits, block_n = case
    q, k, v, sinks = inputs(31, len(lengths), heads, kv_heads, 64, q_len, max(lengths) + 3)
    lengths_t = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    plan = plan_verify(len(lengths), heads, kv_heads, 64, q_len, max(lengths) + 3,
                       device=DEVICE, num_splits=splits, block_n=block_n, window=window,
                       element_size=k.element_size())
    assert plan.split.num_splits == splits
    out = torch.full_like(q, float("nan"))
    lse = torch.full((len(lengths), heads, q_len), float("nan"), device=DEVICE)
    verify_attention(q, k, v, lengths_t, plan, out=out, lse=lse, sinks=sinks)
    ref, _, ref_lse = verify_attention_reference(q, k, v, lengths_t, window=window, sinks=sinks)
    assert relative_error(out, ref) < TOLERANCE
    torch.testing.assert_close(lse, ref_lse, rtol=1e-3 if GPU else 1e-5, atol=1e-3)
    if not GPU:       # the engine's torch path computes the same
        lse_torch = torch.empty_like(lse)
        torch_out = attention.verify_attention_torch(q, k, v, lengths_t, lse=lse_torch,
                                                     sinks=sinks, window=window)
        assert relative_error(torch_out, ref) < TOLERANCE
        torch.testing.assert_close(lse_torch, ref_lse, rtol=1e-5, atol=1e-5)


def test_sinks_only_enlarge_the_denominator():
    """With sinks every row's weights sum to 1 − exp(sink − lse): the output is the sink-free
    output times that mass, and a very negative sink changes nothing."""
    q, k, v, sinks = inputs(32, 2, 4, 2, 64, 3, 40)
    lengths = torch.tensor([3, 40], dtype=torch.int32, device=DEVICE)
    plain, _, plain_lse = verify_attention_reference(q, k, v, lengths)
    with_sinks, _, lse = verify_attention_reference(q, k, v, lengths, sinks=sinks)
    mass = 1 - torch.exp(sinks[None, :, None] - lse)                     # [b, h, t]
    torch.testing.assert_close(with_sinks, plain * mass.permute(0, 2, 1)[..., None],
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, torch.logaddexp(plain_lse, sinks[None, :, None]))
    gone, _, _ = verify_attention_reference(q, k, v, lengths, sinks=torch.full_like(sinks, -1e4))
    torch.testing.assert_close(gone, plain)


def test_a_collecting_verify_with_sinks_returns_the_lse_with_the_sink():
    """SparseSpec-L ranks by exp(logit − lse): with sinks its lse is the full denominator's,
    so the collected rows' masses are the actual attention weights."""
    heads, kv_heads, q_len = 4, 2, 4
    q, k, v, sinks = inputs(33, 2, heads, kv_heads, 64, q_len, 60)
    lengths = torch.tensor([20, 57], dtype=torch.int32, device=DEVICE)
    rows = (1, 3)
    plan = plan_verify(2, heads, kv_heads, 64, q_len, 60, device=DEVICE, collect_rows=rows,
                       num_splits=2, block_n=16, element_size=k.element_size())
    logits = torch.zeros(2, heads, len(rows), 60, device=DEVICE)
    lse = torch.empty(2, heads, q_len, device=DEVICE)
    verify_attention(q, k, v, lengths, plan, logits=logits, lse=lse, sinks=sinks)
    ref_out, ref_logits, ref_lse = verify_attention_reference(q, k, v, lengths,
                                                              collect_rows=rows, sinks=sinks)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-3 if GPU else 1e-5, atol=1e-3)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(logits[b, ..., :n], ref_logits[b, ..., :n].to(logits.dtype),
                                   rtol=1e-2 if GPU else 1e-5, atol=1e-2 if GPU else 1e-5)


# (heads, kv_heads, counts, per_kv_head, num_splits, block_n)
SPARSE_CASES = [
    (4, 2, [0, 5, 40], False, 1, 16),
    (4, 2, [0, 5, 40], False, 3, 16),
    (8, 2, [7, 33, 1], True, 2, 16),
]


@pytest.mark.parametrize("case", SPARSE_CASES)
def test_sparse_with_sinks_matches_the_reference(case):
    heads, kv_heads, counts, per_kv_head, splits, block_n = case
    batch, max_len = len(counts), 64
    q, k, v, sinks = inputs(34, batch, heads, kv_heads, 64, 1, max_len)
    q = q[:, 0]
    g = seeding.generator(35, "cpu")
    lists = (batch, kv_heads) if per_kv_head else (batch,)
    indices = torch.stack([torch.randperm(max_len, generator=g)[:48]
                           for _ in range(int(torch.tensor(lists).prod()))])
    indices = indices.view(*lists, 48).to(torch.int32).to(DEVICE)
    count_t = torch.tensor(counts, dtype=torch.int32)
    if per_kv_head:
        count_t = count_t[:, None].expand(-1, kv_heads).contiguous()
    count_t = count_t.to(DEVICE)
    plan = plan_sparse(batch, heads, kv_heads, 64, 48, device=DEVICE, num_splits=splits,
                       block_n=block_n, element_size=k.element_size())
    out = torch.full_like(q, float("nan"))
    sparse_attention(q, k, v, indices, count_t, plan, out=out, sinks=sinks)
    ref = sparse_attention_reference(q, k, v, indices, count_t, sinks=sinks)
    assert relative_error(out, ref) < TOLERANCE
    if not GPU:
        torch_out = attention.sparse_attention_torch(q, k, v, indices, count_t, sinks)
        assert relative_error(torch_out, ref) < TOLERANCE


def test_a_window_plan_covers_only_the_window():
    plan = plan_verify(4, 8, 2, 64, 5, 1 << 16, device=DEVICE, window=128)
    assert plan.window == 128 and plan.split.max_keys >= 132
    assert plan.split.max_keys < 1024
    with pytest.raises(ValueError, match="window"):
        plan_verify(4, 8, 2, 64, 5, 1 << 16, device=DEVICE, window=0)
