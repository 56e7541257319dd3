"""Verify and sparse draft attention kernels against their torch references.

Without a GPU the kernels run in Triton's interpreter (fp32 inputs, small shapes: the
interpreter has no bf16 arithmetic and its cost grows with loop iterations); on a GPU the same
tests run in bf16 at realistic shapes. Outputs are poisoned with NaN before every run, so an
element the kernel forgets to write fails the test.
"""
import math
import os

import torch

if not torch.cuda.is_available():  # before triton kernels are defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import seeding  # noqa: E402

from specsim.kernels import (plan_sparse, plan_verify, sparse_attention,  # noqa: E402
                             sparse_attention_reference, verify_attention,
                             verify_attention_reference)
from specsim.kernels import split_kv  # noqa: E402
from specsim.kernels.verify_attention import (default_collect_rows,  # noqa: E402
                                              new_logits_buffer, summed_logits)

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPE = torch.bfloat16 if GPU else torch.float32
TOLERANCE = 1e-2 if GPU else 1e-5   # ‖out − ref‖ / ‖ref‖: bf16 operands vs fp32 arithmetic


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def random_cache(batch, kv_heads, max_len, head_dim, generator):
    shape = (batch, kv_heads, max_len, head_dim)
    k = torch.randn(shape, generator=generator, device=DEVICE).to(DTYPE)
    v = torch.randn(shape, generator=generator, device=DEVICE).to(DTYPE)
    return k, v


def make_generator(offset):
    """Fresh inputs every run (``seeding``), distinct per case."""
    return seeding.generator(offset, DEVICE)


# (heads, kv_heads, head_dim, q_len, lengths, num_splits, block_n); lengths are ragged, include
# the shortest possible (= q_len), and are not multiples of the block.
VERIFY_CASES_CPU = [
    (4, 2, 64, 4, [4, 37, 100], 1, 16),
    (4, 2, 64, 4, [4, 37, 100], 3, 16),
    (8, 2, 128, 1, [1, 2, 65], 2, 32),
    (2, 2, 64, 16, [16, 17, 80], 2, 32),
    (8, 1, 64, 16, [16, 50], None, 64),
]
VERIFY_CASES_GPU = [
    (32, 8, 128, 8, [8, 1000, 32768, 4099], None, None),
    (32, 8, 128, 1, [1, 77, 131072, 20000], None, None),
    (32, 8, 128, 16, [16, 130, 65536, 3], None, None),
    (64, 8, 64, 16, [16, 8191, 32768, 100], None, None),
    (64, 8, 64, 2, [2, 5, 9000, 1 << 15], 1, None),
]
VERIFY_CASES = VERIFY_CASES_GPU if GPU else VERIFY_CASES_CPU


def _check_verify(case, collect, seed, separate=None, align=1, v_layout="same"):
    heads, kv_heads, head_dim, q_len, lengths, num_splits, block_n = case
    lengths = [max(q_len, n) for n in lengths]
    batch, max_len = len(lengths), -(-(max(lengths) + 3) // align) * align
    generator = make_generator(seed)
    k, v = random_cache(batch, kv_heads, max_len, head_dim, generator)
    if v_layout == "other":   # V a view of a padded buffer: every stride but the last differs
        padded = torch.randn(batch, kv_heads, max_len + 5, 2 * head_dim, generator=generator,
                             device=DEVICE).to(DTYPE)
        v = padded[:, :, :max_len, :head_dim]
        assert v.stride()[:3] != k.stride()[:3] and v.stride(-1) == 1
    q = torch.randn(batch, q_len, heads, head_dim, generator=generator, device=DEVICE).to(DTYPE)
    length_tensor = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    plan = plan_verify(batch, heads, kv_heads, head_dim, q_len, max(lengths), device=DEVICE,
                       collect_rows=collect, collect_separate=separate, block_n=block_n,
                       num_splits=num_splits)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((batch, heads, q_len), float("nan"), device=DEVICE)
    logits = None
    if plan.collect_rows:
        logits = torch.full((batch, heads, len(plan.collect_rows), max_len), float("nan"),
                            dtype=DTYPE, device=DEVICE)
    verify_attention(q, k, v, length_tensor, plan, out=out, logits=logits, lse=lse)
    ref_out, ref_logits, ref_lse = verify_attention_reference(
        q, k, v, length_tensor, collect_rows=plan.collect_rows)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert relative_error(out, ref_out) < TOLERANCE
    assert relative_error(lse, ref_lse) < TOLERANCE
    if plan.collect_rows:
        for b, length in enumerate(lengths):
            written = logits[b, :, :, :length]
            assert torch.isfinite(written).all()
            assert relative_error(written, ref_logits[b, :, :, :length]) < TOLERANCE
            assert torch.isnan(logits[b, :, :, length:]).all(), "wrote past the length"
    return plan


@pytest.mark.parametrize("case", VERIFY_CASES)
def test_verify_matches_reference(case):
    _check_verify(case, (), seed=1)


@pytest.mark.parametrize("separate", [True, False], ids=["separate-tile", "main-tile"])
@pytest.mark.parametrize("case", VERIFY_CASES)
def test_verify_collect_two_rows(case, separate):
    plan = _check_verify(case, None, seed=2, separate=separate)
    assert plan.collect_rows == default_collect_rows(case[3])
    assert plan.collect_separate == separate


@pytest.mark.parametrize("rows", [None, "all"], ids=["collect-2-query", "all-rows"])
@pytest.mark.parametrize("case", VERIFY_CASES)
def test_verify_collect_sum(case, rows):
    """collect_sum: one fp32 row per sequence, Σ over every query head and the collected rows
    of the scaled logits (what Vegas ranks by), from the collecting tile, added across the KV
    heads; equal to the reference's logits summed, zero past each length (the buffer is zeroed
    by the call, whatever it held), attention outputs unchanged."""
    heads, kv_heads, head_dim, q_len, lengths, num_splits, block_n = case
    lengths = [max(q_len, n) for n in lengths]
    batch, max_len = len(lengths), max(lengths) + 3
    generator = make_generator(31)
    k, v = random_cache(batch, kv_heads, max_len, head_dim, generator)
    q = torch.randn(batch, q_len, heads, head_dim, generator=generator, device=DEVICE).to(DTYPE)
    length_tensor = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    collect = tuple(range(q_len)) if rows == "all" else None
    plan = plan_verify(batch, heads, kv_heads, head_dim, q_len, max(lengths), device=DEVICE,
                       collect_rows=collect, collect_sum=True, block_n=block_n,
                       num_splits=num_splits)
    # Collect-2-Query's rows from the separate tile, all rows from the main one
    assert plan.collect_sum and plan.collect_separate == (rows != "all" and q_len > 1)
    every = tuple(range(16))
    assert not plan_verify(batch, heads, kv_heads, head_dim, 16, 64, device=DEVICE,
                           collect_rows=every, collect_separate=True).collect_separate
    scores = new_logits_buffer(plan, max_len, device=DEVICE).fill_(float("nan"))
    assert scores.shape == (batch, 1, 1, max_len) and scores.dtype == torch.float32
    out = torch.full_like(q, float("nan"))
    verify_attention(q, k, v, length_tensor, plan, out=out, logits=scores)
    ref_out, ref_logits, _ = verify_attention_reference(q, k, v, length_tensor,
                                                        collect_rows=plan.collect_rows)
    assert relative_error(out, ref_out) < TOLERANCE
    expected = summed_logits(ref_logits)
    assert expected.shape == (batch, 1, 1, max_len)
    for b, length in enumerate(lengths):
        assert torch.isfinite(scores[b, :, :, :length]).all()
        assert relative_error(scores[b, :, :, :length], expected[b, :, :, :length]) < TOLERANCE
        assert (scores[b, :, :, length:] == 0).all(), "wrote past the length"
    # a second call adds nothing to the first's sums (the call zeroes the row first)
    verify_attention(q, k, v, length_tensor, plan, out=out, logits=scores)
    for b, length in enumerate(lengths):
        assert relative_error(scores[b, :, :, :length], expected[b, :, :, :length]) < TOLERANCE
    with pytest.raises(ValueError, match="collect_rows"):
        plan_verify(batch, heads, kv_heads, head_dim, q_len, 64, device=DEVICE,
                    collect_sum=True)


@pytest.mark.parametrize("case", VERIFY_CASES)
def test_verify_reads_v_by_its_own_strides(case):
    """A V cache laid out otherwise than K (a view of a padded buffer: every stride but the
    last differs) is read by its own strides, collecting or not."""
    _check_verify(case, None, seed=41, v_layout="other")
    _check_verify(case, (), seed=42, v_layout="other")


@pytest.mark.parametrize("case", [VERIFY_CASES[1], VERIFY_CASES[3]])
def test_verify_collect_all_rows(case):
    _check_verify(case, tuple(range(case[3])), seed=3)


def test_verify_collect_odd_rows_in_separate_tile():
    case = (4, 2, 64, 16, [16, 40], 2, 16)
    _check_verify(case, (0, 3, 4, 9, 15), seed=7, separate=True)


def test_default_collect_rows_convention():
    assert default_collect_rows(1) == (0,)
    assert default_collect_rows(2) == (1,)
    assert default_collect_rows(9) == (1, 8)


def test_verify_is_causal_among_query_tokens():
    # Changing the key/value of the last token must not move the outputs of earlier rows.
    heads, kv_heads, head_dim, q_len, length = 4, 2, 64, 4, 40
    generator = make_generator(4)
    k, v = random_cache(1, kv_heads, length, head_dim, generator)
    q = torch.randn(1, q_len, heads, head_dim, generator=generator, device=DEVICE).to(DTYPE)
    lengths = torch.tensor([length], dtype=torch.int32, device=DEVICE)
    plan = plan_verify(1, heads, kv_heads, head_dim, q_len, length, device=DEVICE, block_n=16)
    before = verify_attention(q, k, v, lengths, plan).clone()
    k[:, :, -1] += 3.0
    v[:, :, -1] -= 2.0
    after = verify_attention(q, k, v, lengths, plan)
    assert torch.equal(before[:, :-1], after[:, :-1])
    assert not torch.equal(before[:, -1], after[:, -1])


@pytest.mark.parametrize("collect", [(), None], ids=["plain", "collect-2-query"])
@pytest.mark.parametrize("case", VERIFY_CASES[:3])
def test_verify_with_whole_wave_chunks(case, collect):
    """The planner's own chunk counts and key blocks (on the GPU, the 4 chunks and 128-key
    blocks of batch 4 × 8 KV heads) give the reference's outputs."""
    plan = _check_verify(case[:5] + (None, None), collect, seed=11)
    assert plan.split.num_splits >= 1


def test_wave_splits_fill_whole_waves():
    """Chunks per (sequence, KV head) so that the programs fill the multiprocessors in whole
    waves: 32 (sequence, KV head) pairs on 132 SMs take 4 chunks (128 programs, one wave),
    not 5 (160 programs: a second wave 21% full)."""
    W = split_kv.wave_splits
    assert W(32, 132, 64) == 4
    assert W(33, 132, 64) == 4          # 132 programs: exactly one wave
    assert W(8, 132, 64) == 16          # batch 1 × 8 KV heads
    assert W(8, 132, 3) == 3            # short context: capped by the blocks
    assert W(132, 132, 64) == 1
    assert W(96, 132, 8) == 1           # one wave 73% full: no partials, no combine
    assert W(93, 132, 8) == 1 and W(92, 132, 64) > 1    # 70% of the SMs (92.4): one chunk
    assert W(192, 132, 64) == 2         # past one wave: 3 waves 97% full, not 2 at 73%
    assert W(1, 132, 64) >= 60          # one sequence, one KV head: about as many as allowed
    for p in (5, 32, 50, 90):
        n = W(p, 132, 64)
        waves = math.ceil(p * n / 132)
        assert waves / n <= math.ceil(p / 132) + 1e-12, p     # never slower than one chunk
        assert p * n / (waves * 132) >= 0.7, (p, n)           # the waves are mostly full


def test_plan_verify_split_rules(monkeypatch):
    """Whole waves with WAVE_CONFIGS' key blocks; a caller's programs_per_sm or num_splits
    wins."""
    monkeypatch.setattr(split_kv, "multiprocessor_count", lambda device: 132)
    plan = plan_verify(4, 32, 8, 128, 1, 32768, device=DEVICE)
    assert (plan.split.block_n, plan.num_warps, plan.num_stages, plan.split.num_splits) == \
        (128, 4, 3, 4)
    plan = plan_verify(4, 32, 8, 128, 8, 32768, device=DEVICE)
    assert (plan.block_m, plan.split.num_splits) == (32, 4)
    # SmolLM2 at batch 32 (3 KV heads, hd64): one wave 73% full, one chunk of 256-key blocks;
    # at batch 64 two chunks of 128-key blocks
    plan = plan_verify(32, 9, 3, 64, 1, 4096, device=DEVICE)
    assert (plan.split.num_splits, plan.split.block_n, plan.partial_out) == (1, 256, None)
    plan = plan_verify(64, 9, 3, 64, 1, 4096, device=DEVICE)
    assert (plan.split.num_splits, plan.split.block_n, plan.num_stages) == (2, 128, 4)
    plan = plan_verify(4, 64, 8, 64, 1, 32768, device=DEVICE)
    assert (plan.split.num_splits, plan.split.block_n) == (4, 128)
    # a caller's num_splits=1 keeps the tile's own blocks
    assert plan_verify(32, 9, 3, 64, 1, 4096, device=DEVICE,
                       num_splits=1).split.block_n == 128
    plan = plan_verify(4, 32, 8, 128, 16, 131072, device=DEVICE)
    assert (plan.split.block_n, plan.num_warps, plan.num_stages,
            plan.split.num_splits) == (128, 4, 3, 4)
    for heads, head_dim, expected in ((32, 128, (128, 4, 3, 4)), (64, 64, (128, 8, 3, 4))):
        plan = plan_verify(4, heads, 8, head_dim, 16, 131072, device=DEVICE, collect_rows=None,
                           collect_sum=True)
        assert (plan.split.block_n, plan.num_warps, plan.num_stages,
                plan.split.num_splits) == expected, head_dim
    for context in (131072, 32768, 8192):
        plan = plan_verify(4, 64, 8, 64, 16, context, device=DEVICE)
        assert (plan.block_m, plan.split.block_n, plan.num_warps, plan.num_stages,
                plan.split.num_splits) == (128, 64, 4, 4, 8), context
    assert plan_verify(4, 64, 8, 64, 16, 131072, device=DEVICE,
                       block_n=64).split.num_splits == 4
    assert plan_verify(4, 32, 8, 128, 1, 32768, device=DEVICE,   # 17 asked, 16 blocks each
                       programs_per_sm=4).split.num_splits == 16
    assert plan_verify(4, 32, 8, 128, 1, 32768, device=DEVICE,
                       num_splits=7).split.num_splits == 7


def test_plan_rejects_bad_shapes():
    with pytest.raises(ValueError):
        plan_verify(1, 6, 4, 64, 2, 100, device=DEVICE)
    with pytest.raises(ValueError):
        plan_verify(1, 4, 2, 64, 17, 100, device=DEVICE)
    with pytest.raises(ValueError):
        plan_verify(1, 4, 2, 96, 2, 100, device=DEVICE)
    with pytest.raises(ValueError):
        plan_verify(1, 4, 2, 64, 2, 100, device=DEVICE, collect_rows=(2,))


# (heads, kv_heads, head_dim, lengths, counts, per_kv_head, sorted, num_splits, block_n)
SPARSE_CASES_CPU = [
    (8, 2, 128, [1, 70, 200], [1, 33, 200], False, True, 1, 32),
    (8, 2, 128, [1, 70, 200], [1, 33, 200], False, False, 3, 32),
    (4, 2, 64, [50, 90], [[1, 0], [90, 17]], True, False, 4, 16),
    (4, 4, 64, [64, 3], [[64, 5, 1, 64], [3, 2, 1, 0]], True, True, 2, 32),
]
SPARSE_CASES_GPU = [
    (32, 8, 128, [131072, 5000, 1, 9000], [9175, 5000, 1, 630], False, True, None, None),
    (32, 8, 128, [32768, 300, 20000, 7], [2294, 300, 1400, 7], False, False, None, None),
    (64, 8, 64, [32768, 4000], [[2300] * 8, [1, 0, 4000, 3, 77, 250, 1000, 2]], True, True,
     None, None),
]
SPARSE_CASES = SPARSE_CASES_GPU if GPU else SPARSE_CASES_CPU


@pytest.mark.parametrize("case", SPARSE_CASES)
def test_sparse_matches_reference(case):
    _check_sparse(case, seed=5)


@pytest.mark.parametrize("case", SPARSE_CASES)
def test_sparse_reads_v_by_its_own_strides(case):
    """As for verify: a V cache laid out otherwise than K is read by its own strides."""
    _check_sparse(case, seed=43, v_layout="other")


def _check_sparse(case, seed, v_layout="same"):
    heads, kv_heads, head_dim, lengths, counts, per_kv_head, sort, num_splits, block_n = case
    batch, max_len = len(lengths), max(lengths)
    generator = make_generator(seed)
    k, v = random_cache(batch, kv_heads, max_len, head_dim, generator)
    if v_layout == "other":   # V a view of a padded buffer: every stride but the last differs
        v = torch.randn(batch, kv_heads, max_len + 5, 2 * head_dim, generator=generator,
                        device=DEVICE).to(DTYPE)[:, :, :max_len, :head_dim]
    q = torch.randn(batch, heads, head_dim, generator=generator, device=DEVICE).to(DTYPE)
    counts = torch.tensor(counts, dtype=torch.int32, device=DEVICE)
    lists = counts.shape[1] if per_kv_head else None
    capacity = max_len + 5
    indices = torch.full((batch, lists, capacity) if per_kv_head else (batch, capacity), -7,
                         dtype=torch.int32, device=DEVICE)
    for b, length in enumerate(lengths):
        for g in range(lists or 1):
            n = int(counts[b, g] if per_kv_head else counts[b])
            chosen = torch.randperm(length, generator=generator, device=DEVICE)[:n].int()
            if sort:
                chosen = chosen.sort().values
            (indices[b, g] if per_kv_head else indices[b])[:n] = chosen
    plan = plan_sparse(batch, heads, kv_heads, head_dim, capacity, device=DEVICE,
                       block_n=block_n, num_splits=num_splits)
    out = torch.full_like(q, float("nan"))
    sparse_attention(q, k, v, indices, counts, plan, out=out)
    ref = sparse_attention_reference(q, k, v, indices, counts,
                                     torch.tensor(lengths, device=DEVICE))
    assert torch.isfinite(out).all()
    assert relative_error(out, ref) < TOLERANCE
    return plan


@pytest.mark.parametrize("shape", [(3, 2, 4, 3, 64, 16, 5), (2, 1, 8, 2, 128, 16, 80),
                                   (1, 2, 2, 1, 64, 4, 1)],
                         ids=["ragged", "splits-past-one-block", "one-split"])
def test_combine_merges_the_chunks_exactly(shape):
    """The combine against a float64 merge of random partial results: ragged key counts (0:
    a zero output and -inf), chunks with empty rows (lse -inf), and NaN in every workspace
    entry the merge must not read (padding rows, chunks past a sequence's count)."""
    batch, kv_heads, group, q_len, head_dim, block_m, num_splits = shape
    heads, rows = kv_heads * group, group * q_len
    split = split_kv.SplitPlan(num_splits=num_splits, split_size=32, block_n=32)
    g = seeding.generator(22)
    counts = torch.randint(1, num_splits * 32 + 1, (batch,), generator=g)
    counts[-1] = num_splits * 32          # every chunk used
    counts[0] = 0 if batch > 1 else counts[0]
    part_out = torch.randn(batch * kv_heads, num_splits, block_m, head_dim, generator=g)
    part_lse = 4 * torch.randn(batch * kv_heads, num_splits, block_m, generator=g)
    part_lse[:, -1] += 8                   # the largest last: a later block rescales the first
    part_lse[:, :, 0][torch.rand(part_lse[:, :, 0].shape, generator=g) < 0.3] = float("-inf")
    part_out[..., rows:, :] = float("nan")
    part_lse[..., rows:] = float("nan")
    used = (counts + 31) // 32
    for bh in range(batch * kv_heads):
        part_out[bh, used[bh // kv_heads]:] = float("nan")
        part_lse[bh, used[bh // kv_heads]:] = float("nan")
    out = torch.full((batch, q_len, heads, head_dim), float("nan"))
    lse = torch.full((batch, heads, q_len), float("nan"))
    args = [t.to(DEVICE) for t in (part_out, part_lse, counts.int(), out, lse)]
    split_kv.combine(args[0], args[1], args[2], False, args[3], args[4], split,
                     num_kv_heads=kv_heads, q_len=q_len, group=group)
    got_out, got_lse = args[3].cpu().double(), args[4].cpu().double()
    for bh in range(batch * kv_heads):
        b, kvh = divmod(bh, kv_heads)
        for r in range(rows):
            head, tok = kvh * group + r // q_len, r % q_len
            lse_j = part_lse[bh, :used[b], r].double()
            if used[b] == 0 or torch.isinf(lse_j).all():
                want_out, want_lse = torch.zeros(head_dim, dtype=torch.float64), float("-inf")
            else:
                w = torch.softmax(lse_j * math.log(2), 0)
                want_out = (w[:, None] * part_out[bh, :used[b], r].double()).sum(0)
                want_lse = float(torch.logsumexp(lse_j * math.log(2), 0))
            assert torch.allclose(got_out[b, tok, head], want_out, atol=1e-5), (bh, r)
            assert got_lse[b, head, tok] == pytest.approx(want_lse, abs=1e-5), (bh, r)


def test_sparse_over_whole_context_equals_decode():
    # Selecting every position is plain decoding: the verify kernel with q = 1 must agree.
    heads, kv_heads, head_dim, lengths = 4, 2, 64, [33, 64]
    generator = make_generator(6)
    k, v = random_cache(2, kv_heads, 64, head_dim, generator)
    q = torch.randn(2, heads, head_dim, generator=generator, device=DEVICE).to(DTYPE)
    length_tensor = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    indices = torch.arange(64, dtype=torch.int32, device=DEVICE).flip(0).repeat(2, 1)
    indices[0, :33] = torch.arange(33, dtype=torch.int32, device=DEVICE).flip(0)
    sparse = sparse_attention(q, k, v, indices, length_tensor,
                              plan_sparse(2, heads, kv_heads, head_dim, 64, device=DEVICE,
                                          block_n=16, num_splits=2))
    full = verify_attention(q[:, None], k, v, length_tensor,
                            plan_verify(2, heads, kv_heads, head_dim, 1, 64, device=DEVICE,
                                        block_n=16))[:, 0]
    assert relative_error(sparse, full) < TOLERANCE


def test_fp32_caches_get_configs_that_fit_in_shared_memory():
    from specsim.kernels.split_kv import fit_shared_memory
    assert fit_shared_memory(64, 128, 128, 3, 2) == (128, 3)        # tuned bf16 config untouched
    bn, stages = fit_shared_memory(64, 128, 128, 3, 4)
    tile = lambda bn, st, size: (st * 2 * bn * 128 + 64 * 128 + 64 * bn) * size  # noqa: E731
    assert tile(bn, stages, 4) <= tile(128, 3, 2) and stages >= 1 and bn >= 16


def test_kernel_resources_compiles_for_hopper_on_the_cpu(tmp_path):
    """scripts/kernel_resources.py compiles the verify kernel for sm_90 without a GPU, with
    Triton's argument specialisation (without it the K/V loads are neither vectorised nor
    pipelined: no LDGSTS), and reads back registers and the SASS mix."""
    import json
    import subprocess
    import sys

    import triton

    from repo import REPO_ROOT
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia",
                                       "bin", "ptxas")):
        pytest.skip("this Triton wheel ships no ptxas")
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "kernel_resources.py"),
                           "--head-dims", "64", "--q-lens", "4", "--modes", "off,sum",
                           "--block-n", "64", "--json", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert {r["mode"] for r in rows} == {"off", "sum"}
    for r in rows:
        assert 0 < r["registers"] <= 255 and r["instructions"] > 100
        assert r["LDGSTS"] > 0, "the K/V loads were not pipelined (specialisation lost)"
        assert r["HMMA"] + r["HGMMA"] > 0            # the dots run on the tensor cores

