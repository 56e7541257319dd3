"""The engine's attention adapter and sampling pieces against their definitions.

Engine-local torch attention vs the kernels' references (ragged batch, GQA, collected rows,
lse, per-sequence and per-KV-head lists); the SparseSpec-L stand-in vs the kernels' selection
(Triton interpreter); prefill page bounds; temperature/top-k/top-p vs transformers' warpers;
the exponential-race sampler and one speculative-sampling step vs exact distributions.
"""
import math

import numpy as np
import pytest
import torch
from scipy import stats

from specsim.engine import attention
from specsim.engine.sampling import (SamplingParams, accept_greedy, accept_speculative,
                                     entropy, probabilities, sample)
from specsim.kernels import (KVCache, page_bounds_reference, sparse_attention_reference,
                             sparsespec_select, verify_attention_reference)
from specsim.policies import Policy


def chi2_pvalue(counts, probs) -> float:
    """Pearson's test of observed counts against probabilities (float64, renormalised)."""
    probs = np.asarray(probs, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    return float(stats.chisquare(counts, counts.sum() * probs / probs.sum()).pvalue)


def cache(batch, kv_heads, length, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, kv_heads, length, dim)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def test_verify_torch_matches_reference():
    batch, q_len, heads, kv_heads, dim, max_len = 3, 5, 6, 2, 16, 80
    k, v = cache(batch, kv_heads, max_len, dim)
    q = torch.randn(batch, q_len, heads, dim, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([40, 77, 5], dtype=torch.int32)
    rows = (1, 4)
    logits = torch.full((batch, heads, 2, max_len), float("nan"))
    lse = torch.empty(batch, heads, q_len)
    out = attention.verify_attention_torch(q, k, v, lengths, collect_rows=rows, logits=logits,
                                           lse=lse)
    ref_out, ref_logits, ref_lse = verify_attention_reference(q, k, v, lengths,
                                                              collect_rows=rows)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(logits[b, :, :, :n], ref_logits[b, :, :, :n])


@pytest.mark.parametrize("per_kv_head", [False, True])
def test_sparse_torch_matches_reference(per_kv_head):
    batch, heads, kv_heads, dim, max_len, capacity = 3, 8, 2, 16, 64, 20
    k, v = cache(batch, kv_heads, max_len, dim, seed=2)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(batch, heads, dim, generator=g)
    lists = (batch, kv_heads) if per_kv_head else (batch,)
    indices = torch.zeros(*lists, capacity, dtype=torch.int32)
    counts = torch.randint(0, capacity, lists, generator=g, dtype=torch.int32)
    counts.view(-1)[0] = 0                                  # an empty list gives zeros
    for idx, n in zip(indices.view(-1, capacity), counts.view(-1).tolist()):
        idx[:n] = torch.randperm(50, generator=g)[:n].int()
    out = attention.sparse_attention_torch(q, k, v, indices, counts)
    ref = sparse_attention_reference(q, k, v, indices, counts,
                                     torch.full((batch,), 50, dtype=torch.int32))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert torch.all(out[0, :heads // kv_heads if per_kv_head else heads] == 0)


def test_sparsespec_selection_stand_in_matches_kernel():
    batch, heads, kv_heads, window, n = 2, 4, 2, 3, 96
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(batch, heads, window, n, generator=g) * 3
    lengths = torch.tensor([90, 61], dtype=torch.int32)
    policy = Policy("sparsespec", sink=2, recent=5, per_kv_head=True)
    ours, our_counts = attention.sparsespec_select_torch(logits, None, lengths, 0.3, kv_heads,
                                                         policy)
    theirs, their_counts = sparsespec_select(logits, lengths, 0.3, kv_heads, policy=policy)
    assert torch.equal(our_counts, their_counts)
    for b in range(batch):
        for h in range(kv_heads):
            c = int(our_counts[b, h])
            assert torch.equal(ours[b, h, :c], theirs[b, h, :c])


def test_prefill_writes_rows_and_quest_pages():
    kv = KVCache(2, 2, 64, 8, num_layers=1, dtype=torch.float32, device="cpu", page_size=16)
    g = torch.Generator().manual_seed(5)
    k, v = torch.randn(37, 2, 8, generator=g), torch.randn(37, 2, 8, generator=g)
    kv.lengths[1] = 37
    attention.write_prefill(kv, 0, 1, k, v)
    assert torch.equal(kv.k(0)[1, :, :37], k.transpose(0, 1))
    low, high = page_bounds_reference(kv.k(0), kv.lengths, 16)
    page_min, page_max = kv.pages(0)
    torch.testing.assert_close(page_min[1, :, :3], low[1, :, :3])
    torch.testing.assert_close(page_max[1, :, :3], high[1, :, :3])


def test_prefill_logits_are_causal_rows():
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(3, 4, 8, generator=g), torch.randn(10, 2, 8, generator=g)
    logits, lse = attention.prefill_logits(q, k, first_row=7)
    keys = k.repeat_interleave(2, 1)                                    # [T, H, D]
    expected = torch.einsum("rhd,thd->hrt", q, keys) / math.sqrt(8)
    torch.testing.assert_close(logits, expected)
    torch.testing.assert_close(lse[:, 0], torch.logsumexp(expected[:, 0, :8], -1))


# --------------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------------


def test_warping_matches_transformers_warpers():
    transformers = pytest.importorskip("transformers")
    from transformers.generation import logits_process as lp
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(7)) * 2
    for params in (SamplingParams(0.7, 0.9, 0), SamplingParams(0.6, 0.95, 20),
                   SamplingParams(1.3, 1.0, 5), SamplingParams(0.2, 0.5, 3)):
        scores = lp.TemperatureLogitsWarper(params.temperature)(None, logits.clone())
        if params.top_k:
            scores = lp.TopKLogitsWarper(params.top_k)(None, scores)
        if params.top_p < 1:
            scores = lp.TopPLogitsWarper(params.top_p)(None, scores)
        torch.testing.assert_close(probabilities(logits, params), torch.softmax(scores, -1))
    assert transformers  # imported for the warpers


def test_exponential_race_samples_the_distribution():
    p = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    draws = sample(p.expand(40000, -1), torch.Generator().manual_seed(8))
    counts = torch.bincount(draws, minlength=5).numpy()
    assert counts[4] == 0
    assert chi2_pvalue(counts[:4], p[:4].numpy()) > 1e-3


def test_greedy_acceptance():
    target = torch.full((2, 4, 6), -1.0)
    target[0, torch.arange(4), torch.tensor([3, 1, 2, 5])] = 1.0  # argmaxes per row
    target[1, torch.arange(4), torch.tensor([0, 0, 0, 4])] = 1.0
    drafts = torch.tensor([[3, 1, 4], [0, 0, 0]])
    m, nxt, accept = accept_greedy(drafts, target)
    assert m.tolist() == [2, 3] and nxt.tolist() == [2, 4]
    assert accept.tolist() == [[1, 1, 0], [1, 1, 1]]
    m, nxt, _ = accept_greedy(drafts, target, k_seq=torch.tensor([1, 2]))
    assert m.tolist() == [1, 2] and nxt.tolist() == [1, 0]
    m, nxt, accept = accept_greedy(drafts, target, forced_m=torch.tensor([0, 3]))
    assert m.tolist() == [0, 3] and nxt.tolist() == [3, 4]     # the argmax after the forced m
    assert accept.tolist() == [[1, 1, 0], [1, 1, 1]]           # acceptance as matched


@pytest.mark.parametrize("k_cap", [None, 1])
def test_speculative_step_is_exact(k_cap):
    """One step with k = 2: the first emitted token is distributed as p_0, and the pair of
    the first two tokens as p_0(x)·p_1(y | x) when x was the accepted draft."""
    vocab, n = 4, 60000
    g = torch.Generator().manual_seed(9)
    p = torch.softmax(torch.randn(3, vocab, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(2, vocab, generator=g) * 1.5, -1)
    x1 = sample(q[0].expand(n, -1), g)
    x2 = sample(q[1].expand(n, -1), g)
    drafts = torch.stack([x1, x2], 1)
    k_seq = None if k_cap is None else torch.full((n,), k_cap)
    m, nxt, accept = accept_speculative(drafts, q.expand(n, -1, -1), p.expand(n, -1, -1), g,
                                        k_seq)
    first = torch.where(m >= 1, x1, nxt)
    counts = torch.bincount(first, minlength=vocab).numpy()
    assert chi2_pvalue(counts, p[0].numpy()) > 1e-3
    assert torch.allclose(accept[:, 0], (p[0, x1] / q[0, x1]).clamp(max=1))
    assert 0 < float((m == 0).float().mean()) < 1
    if k_cap == 1:
        assert int(m.max()) <= 1
    # second token after an accepted first draft is p_1 (row 1 = after x1; x1 fixed here
    # by the test's p rows, which do not depend on x1)
    second = torch.where(m >= 2, x2, nxt)[m >= 1]
    counts = torch.bincount(second, minlength=vocab).numpy()
    assert chi2_pvalue(counts, p[1].numpy()) > 1e-3


def test_entropy_in_nats():
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    assert torch.allclose(entropy(p), torch.tensor([math.log(2), 0.0]))
    assert np.isfinite(entropy(torch.full((1, 8), 1 / 8)).item())
