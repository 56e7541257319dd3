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
from hypothesis import given, settings, strategies as st  # noqa: E402

from specsim.kernels import (plan_sparse, plan_verify, sparse_attention,  # noqa: E402
                             sparse_attention_reference, verify_attention,
                             verify_attention_reference)
from specsim.kernels import split_kv  # noqa: E402
from specsim.kernels.verify_attention import WAVE_CONFIGS  # noqa: E402
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


@pytest.mark.parametrize("per_row", [False, True], ids=["sum", "head-sum"])
@pytest.mark.parametrize("rows", [None, "all"], ids=["collect-2-query", "all-rows"])
@pytest.mark.parametrize("case", VERIFY_CASES)
def test_verify_collect_sum(case, rows, per_row):
    """collect_sum: one fp32 row per sequence, Σ over every query head and the collected rows
    of the scaled logits (what Vegas ranks by); collect_head_sum: one fp32 row per collected
    row, Σ over every query head (what ranking by the last accepted token's row needs). From
    the collecting tile, added across the KV heads; equal to the reference's logits summed,
    zero past each length (the buffer is zeroed by the call, whatever it held), attention
    outputs unchanged."""
    heads, kv_heads, head_dim, q_len, lengths, num_splits, block_n = case
    lengths = [max(q_len, n) for n in lengths]
    batch, max_len = len(lengths), max(lengths) + 3
    generator = make_generator(31)
    k, v = random_cache(batch, kv_heads, max_len, head_dim, generator)
    q = torch.randn(batch, q_len, heads, head_dim, generator=generator, device=DEVICE).to(DTYPE)
    length_tensor = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    collect = tuple(range(q_len)) if rows == "all" else None
    plan = plan_verify(batch, heads, kv_heads, head_dim, q_len, max(lengths), device=DEVICE,
                       collect_rows=collect, collect_sum=not per_row,
                       collect_head_sum=per_row, block_n=block_n, num_splits=num_splits)
    # Collect-2-Query's rows from the separate tile, all rows from the main one
    assert plan.collect_sum != per_row and plan.collect_head_sum == per_row
    assert plan.collect_separate == (rows != "all" and q_len > 1)
    every = tuple(range(16))
    assert not plan_verify(batch, heads, kv_heads, head_dim, 16, 64, device=DEVICE,
                           collect_rows=every, collect_separate=True).collect_separate
    scores = new_logits_buffer(plan, max_len, device=DEVICE).fill_(float("nan"))
    width = len(plan.collect_rows) if per_row else 1
    assert scores.shape == (batch, 1, width, max_len) and scores.dtype == torch.float32
    out = torch.full_like(q, float("nan"))
    verify_attention(q, k, v, length_tensor, plan, out=out, logits=scores)
    ref_out, ref_logits, _ = verify_attention_reference(q, k, v, length_tensor,
                                                        collect_rows=plan.collect_rows)
    assert relative_error(out, ref_out) < TOLERANCE
    expected = summed_logits(ref_logits, rows=not per_row)
    # the sums' error relative to the size of what they add (a short row's sum of many
    # heads' logits can cancel to far less than its terms; fp32's error scales with the terms)
    magnitude = summed_logits(ref_logits.abs(), rows=not per_row)
    assert expected.shape == (batch, 1, width, max_len)

    def sum_error(b, length):
        return float((scores[b, :, :, :length] - expected[b, :, :, :length]).norm()
                     / magnitude[b, :, :, :length].norm())

    for b, length in enumerate(lengths):
        assert torch.isfinite(scores[b, :, :, :length]).all()
        assert sum_error(b, length) < TOLERANCE
        assert (scores[b, :, :, length:] == 0).all(), "wrote past the length"
    # a second call adds nothing to the first's sums (the call zeroes the rows first)
    verify_attention(q, k, v, length_tensor, plan, out=out, logits=scores)
    for b, length in enumerate(lengths):
        assert sum_error(b, length) < TOLERANCE
    with pytest.raises(ValueError, match="collect_rows"):
        plan_verify(batch, heads, kv_heads, head_dim, q_len, 64, device=DEVICE,
                    collect_sum=not per_row, collect_head_sum=per_row)
    with pytest.raises(ValueError, match="not both"):
        plan_verify(batch, heads, kv_heads, head_dim, q_len, 64, device=DEVICE,
                    collect_rows=collect, collect_sum=True, collect_head_sum=True)


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


#: An H200's multiprocessors and its most shared memory per program (bytes): the planners'
#: tiles are for this GPU.
H200_SMS, H200_SHARED_MEMORY = 132, 232448


def wave_time(programs_per_chunk: int, chunks: int, sms: int, wave_cost: float = 0.02) -> float:
    """The time of ``chunks`` equal chunks per (sequence, KV head) in units of one chunk's whole
    context, counting whole waves of programs and a fixed start per wave (``wave_splits``'
    model of a split-KV launch)."""
    waves = math.ceil(programs_per_chunk * chunks / sms)
    return waves / chunks * (1.0 + wave_cost * waves)


@given(st.integers(1, 600), st.integers(1, 300), st.sampled_from([66, 108, 132]))
def test_wave_splits_finish_in_the_fewest_whole_waves(pairs, most, sms):
    """For any number of (sequence, KV head) pairs, multiprocessors and allowed chunks: the
    chunk count stays in bounds and is never slower than one chunk; when one chunk each fills
    one wave 70–100%, one chunk it is (no partials, no combine: on the H200 one chunk of
    SmolLM2's batch 32 ran 28.7 µs against 4 chunks' 30.8, a cost the wave model leaves out);
    otherwise it is within 2% of the fastest count allowed by the whole-wave model, and no
    fewer chunks are."""
    n = split_kv.wave_splits(pairs, sms, most)
    assert 1 <= n <= most
    times = [wave_time(pairs, c, sms) for c in range(1, most + 1)]
    assert times[n - 1] <= times[0] + 1e-12
    if 0.7 * sms <= pairs <= sms:
        assert n == 1
    else:
        assert times[n - 1] <= min(times) * 1.02 + 1e-12
        assert all(t > min(times) * 1.02 for t in times[:n - 1])


def on_an_h200(test):
    """Run ``test`` with the planners seeing an H200's multiprocessors."""
    import functools

    @functools.wraps(test)
    def run(*args, **kwargs):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(split_kv, "multiprocessor_count", lambda device: H200_SMS)
            return test(*args, **kwargs)
    return run


def tile_bytes(plan, head_dim: int, element_size: int = 2) -> int:
    """Shared memory of one verify/sparse program: its K and V stages and the tile."""
    block_n = plan.split.block_n
    return (plan.num_stages * 2 * block_n * head_dim + plan.block_m * head_dim
            + plan.block_m * block_n) * element_size


def check_split(plan, keys: int, pairs: int, sms: int) -> None:
    """A split plan covers every key with no empty chunk, in whole key blocks; a plan of more
    than one chunk has its workspace, one of one chunk none."""
    split = plan.split
    assert split.split_size % split.block_n == 0
    assert split.num_splits * split.split_size >= keys
    assert (split.num_splits - 1) * split.split_size < keys
    if split.num_splits > 1:
        assert plan.partial_out.shape[:2] == (pairs, split.num_splits)
        assert plan.partial_lse.shape == plan.partial_out.shape[:3]
    else:
        assert plan.partial_out is None and plan.partial_lse is None


GQA_SHAPES = [(32, 8, 128), (64, 8, 64), (9, 3, 64), (16, 8, 128), (28, 4, 128), (4, 2, 64)]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(GQA_SHAPES), st.integers(1, 64), st.integers(1, 16),
       st.integers(16, 1 << 17), st.sampled_from(["off", "two rows", "all rows", "sum"]),
       st.sampled_from([2, 4]))
@on_an_h200
def test_every_verify_plan_fills_whole_waves_and_fits_shared_memory(
        shape, batch, q_len, keys, collect, element_size):
    """Any batch, GQA shape, q, context and collect mode: the tile holds every query row of a
    KV head; the plan covers every key; the tiles fit in an H200's shared memory (fp32 caches
    in no more than the bf16 tile of the same plan would take); the tiles swept for whole waves
    run in chunk counts no slower than one chunk, every chunk at least four key blocks long."""
    heads, kv_heads, head_dim = shape
    rows = {"off": (), "two rows": None, "all rows": tuple(range(q_len)),
            "sum": None}[collect]
    plan = plan_verify(batch, heads, kv_heads, head_dim, q_len, keys, device="cpu",
                       collect_rows=rows, collect_sum=collect == "sum",
                       element_size=element_size)
    group = heads // kv_heads
    assert plan.block_m >= max(16, group * q_len)
    assert plan.block_m & (plan.block_m - 1) == 0
    check_split(plan, keys, batch * kv_heads, H200_SMS)
    assert tile_bytes(plan, head_dim, element_size) <= H200_SHARED_MEMORY
    if element_size > 2:
        bf16 = plan_verify(batch, heads, kv_heads, head_dim, q_len, keys, device="cpu",
                           collect_rows=rows, collect_sum=collect == "sum")
        assert tile_bytes(plan, head_dim, element_size) <= tile_bytes(bf16, head_dim, 2)
    mode = "off" if not plan.collect_rows else "sum" if plan.collect_sum else \
        "separate" if plan.collect_separate else "main"
    if (head_dim, plan.block_m, mode) in WAVE_CONFIGS and plan.split.num_splits > 1:
        resident = (WAVE_CONFIGS[(head_dim, plan.block_m, mode)] + (1,))[3]
        pairs, n = batch * kv_heads, plan.split.num_splits
        assert wave_time(pairs, n, H200_SMS * resident) <= \
            wave_time(pairs, 1, H200_SMS * resident) + 1e-12
        assert plan.split.split_size >= 4 * plan.split.block_n


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(GQA_SHAPES), st.integers(1, 64), st.integers(1, 1 << 14),
       st.sampled_from([None, 1.0, 2.0, 4.0]), st.sampled_from([2, 4]))
@on_an_h200
def test_every_sparse_plan_covers_its_lists_and_fits_shared_memory(
        shape, batch, selected, programs_per_sm, element_size):
    heads, kv_heads, head_dim = shape
    plan = plan_sparse(batch, heads, kv_heads, head_dim, selected, device="cpu",
                       programs_per_sm=programs_per_sm, element_size=element_size)
    assert plan.block_m >= max(16, heads // kv_heads)
    check_split(plan, selected, batch * kv_heads, H200_SMS)
    assert tile_bytes(plan, head_dim, element_size) <= H200_SHARED_MEMORY


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(1 << 10, 1 << 17), st.integers(1, 40),
       st.sampled_from([64, 128]))
@on_an_h200
def test_a_callers_launch_parameters_win(batch, keys, splits, block_n):
    """A caller's num_splits cuts the keys into that many equal whole-block chunks (as far as
    there are blocks, trailing empty ones dropped); a caller's key blocks and programs per
    multiprocessor replace the swept ones."""
    plan = plan_verify(batch, 32, 8, 128, 1, keys, device="cpu", num_splits=splits)
    blocks = math.ceil(keys / plan.split.block_n)
    asked = min(splits, blocks)
    assert plan.split.split_size == math.ceil(blocks / asked) * plan.split.block_n
    assert plan.split.num_splits <= asked
    plan = plan_verify(batch, 32, 8, 128, 4, keys, device="cpu", block_n=block_n,
                       programs_per_sm=2)
    assert plan.split.block_n == block_n
    wanted = math.ceil(2 * H200_SMS / (batch * 8))
    assert plan.split.num_splits <= max(wanted, 1)


def test_fp32_caches_get_configs_that_fit_in_shared_memory():
    from specsim.kernels.split_kv import fit_shared_memory

    def need(bm, bn, hd, stages, size):
        return (stages * 2 * bn * hd + bm * hd + bm * bn) * size

    for bm in (16, 32, 64, 128):
        for bn in (64, 128, 256):
            for hd in (64, 128):
                for stages in (2, 3, 4):
                    assert fit_shared_memory(bm, bn, hd, stages, 2) == (bn, stages)
                    got_bn, got_stages = fit_shared_memory(bm, bn, hd, stages, 4)
                    assert got_stages >= 1 and got_bn >= 16
                    assert need(bm, got_bn, hd, got_stages, 4) <= need(bm, bn, hd, stages, 2) \
                        or got_bn == 16


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


@pytest.mark.skipif(GPU, reason="a tool for machines without a GPU: the ptxas Triton bundles "
                    "rejects the PTX it emits for the local driver's CUDA")
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

