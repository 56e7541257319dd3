"""Radix-select top-K (specsim.kernels.topk_select) against a float64 numpy reference: fresh
random scores every run, outputs poisoned first, ragged lengths (1, not a multiple of the
block, the whole row), lists of one position and of the whole context, ties, negative scores
and ±0, kept first/last positions. Runs in Triton's interpreter on the CPU (fp32/fp16 inputs)."""
import numpy as np
import pytest
import seeding
import torch
from hypothesis import given
from hypothesis import strategies as st

from specsim.kernels._runtime import INTERPRETED, tl, triton
from specsim.kernels.topk_select import _radix_threshold, _winners, radix_top_positions

DEVICE = "cpu" if INTERPRETED else "cuda"


def reference(score, lengths, counts, capacity, keep_first, keep_last):
    """Each row's winners by (kept first, score descending, position ascending), ascending; the
    kept positions tie among themselves (the lowest win when there are more than the count)."""
    score = score.double().cpu().numpy()
    lead, n = score.shape[:-1], score.shape[-1]
    rows = score.reshape(-1, n)
    per = rows.shape[0] // lengths.shape[0]
    counts = np.broadcast_to(counts.cpu().numpy().reshape(
        counts.shape + (1,) * (len(lead) - counts.dim())), lead).reshape(-1)
    out = np.zeros((rows.shape[0], capacity), np.int64)
    got = np.zeros(rows.shape[0], np.int64)
    for r, row in enumerate(rows):
        length = min(int(lengths[r // per]), n)
        pos = np.arange(length)
        kept = (pos < keep_first) | (pos >= length - keep_last)
        key = np.where(kept, np.inf, row[:length])
        # last key is primary; +0 ranks above −0 (as their bits do)
        order = np.lexsort((pos, np.signbit(key), -key))
        k = min(int(counts[r]), length)
        out[r, :k] = np.sort(order[:k])
        got[r] = k
    return out.reshape(*lead, capacity), got.reshape(lead)


def poisoned(fn):
    real = torch.empty

    def empty(*a, **kw):
        t = real(*a, **kw)
        return t.fill_(-7) if t.dtype == torch.int32 else t
    torch.empty = empty
    try:
        return fn()
    finally:
        torch.empty = real


def keys_of(scores, nonnegative=False):
    """The radix keys of a numpy fp32 array: its bits in float order (``nonnegative``:
    shifted left by one, the sign bit flipped)."""
    bits = scores.view(np.int32)
    if nonnegative:
        return ((bits.view(np.uint32) << 1) ^ 0x80000000).view(np.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def first_histogram(score, lengths, keep_first, keep_last, nonnegative=False):
    """Each row's first radix pass from numpy: the top byte (sign flipped) of its
    ``keys_of``, kept positions the largest; int32 [rows, 256]."""
    n = score.shape[-1]
    rows = score.float().cpu().numpy().reshape(-1, n)
    per = rows.shape[0] // lengths.shape[0]
    out = np.zeros((rows.shape[0], 256), np.int32)
    for r, row in enumerate(rows):
        length = min(int(lengths[r // per]), n)
        key = keys_of(row[:length], nonnegative)
        pos = np.arange(length)
        key = np.where((pos < keep_first) | (pos >= length - keep_last), 0x7FFFFFFF, key)
        out[r] = np.bincount(((key >> 24) & 0xFF) ^ 0x80, minlength=256)
    return torch.from_numpy(out).to(score.device)


#: (chunked, spill, first pass given) of every way of ranking: programs per block of a row;
#: one program per row without a spill, with one of a single key (candidates spill only
#: once one is left, if ever), of a few, and of the whole row (the candidates after the
#: first pass spill); the first pass's histogram made elsewhere, with no spill, a few keys'
#: and the whole row's (then the candidates spill right after the pass read from memory)
WAYS = ((True, None, False), (False, 0, False), (False, 1, False), (False, 7, False),
        (False, 1 << 20, False), (False, 0, True), (False, 7, True), (False, 1 << 20, True))


def check(score, lengths, counts, capacity, keep_first=0, keep_last=0, block=256,
          nonnegative=False):
    """Every way of ranking (``WAYS``; programs per block of ``block`` of a row, several
    blocks per row here) gives the reference's lists and counts; ``nonnegative`` (no score
    below +0) asked for in every way."""
    ref, ref_cnt = reference(score, lengths, counts, capacity, keep_first, keep_last)
    hist = first_histogram(score, lengths, keep_first, keep_last, nonnegative)
    for chunked, spill, first in WAYS:
        spill = min(spill, score.shape[-1]) if spill else spill
        idx, cnt = poisoned(lambda: radix_top_positions(
            score, lengths, counts, capacity, keep_first, keep_last, block=block,
            chunked=chunked, spill=spill, first_histogram=hist if first else None,
            nonnegative=nonnegative))
        assert idx.dtype == torch.int32 and idx.shape == ref.shape
        assert np.array_equal(cnt.cpu().numpy(), ref_cnt), (chunked, spill, first)
        assert np.array_equal(idx.cpu().numpy(), ref), (chunked, spill, first, idx, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_ragged_rows_per_kv_head(dtype):
    g = seeding.generator(0)
    n = 700
    score = torch.randn(3, 2, n, generator=g).to(dtype).to(DEVICE)
    lengths = torch.tensor([1, 333, 700], device=DEVICE)           # 333: not a block multiple
    counts = torch.tensor([[1, 1], [40, 17], [700, 64]], device=DEVICE)
    check(score, lengths, counts, capacity=700, keep_first=4, keep_last=16)


def test_one_list_per_sequence_and_whole_rows():
    g = seeding.generator(0)
    score = torch.randn(4, 520, generator=g, dtype=torch.float64).float().to(DEVICE)
    lengths = torch.tensor([520, 519, 2, 257], device=DEVICE)
    counts = torch.tensor([520, 30, 5, 1], device=DEVICE)             # 5 > length 2: clamped
    check(score, lengths, counts, capacity=520, keep_last=3)
    check(score, lengths, counts[:, None].expand(-1, 1)[:, 0], capacity=520, block=1024)


def test_nonnegative_keys_rank_like_the_float_order():
    """Scores none of which is below +0 (attention mass: a wide spread of exponents, +0,
    ties, the largest finite float, subnormals) ranked by the exponent-first keys: the
    reference's lists in every way."""
    g = seeding.generator(0)
    n = 600
    score = torch.exp(torch.randn(2, 3, n, generator=g, dtype=torch.float64) * 8).float()
    score[0, 0, :40] = 0.0
    score[0, 1, 100:300] = 1.5                                        # ties across the row
    score[1, 0, 7] = torch.finfo(torch.float32).max
    score[1, 2, :64] = torch.finfo(torch.float32).tiny / 4             # subnormal
    lengths = torch.tensor([600, 437])
    counts = torch.tensor([[50, 120, 1], [600, 9, 70]])
    check(score.to(DEVICE), lengths.to(DEVICE), counts.to(DEVICE), capacity=600,
          keep_first=3, keep_last=5, block=128, nonnegative=True)


def test_ties_signs_and_zero():
    """Integer-valued scores (many ties at the threshold: the lowest positions win), all
    negative rows, −0 and +0, and kept positions beyond the budget's share."""
    g = seeding.generator(0)
    n = 300
    score = torch.randint(-3, 3, (2, 3, n), generator=g).float()
    score[1] = -score[1].abs() - 1.0                                   # all negative
    score[0, 0, :50] = -0.0
    score[0, 0, 50:100] = 0.0
    lengths = torch.tensor([300, 299])
    counts = torch.tensor([[120, 7, 299], [20, 21, 8]])
    check(score.to(DEVICE), lengths.to(DEVICE), counts.to(DEVICE), capacity=300,
          keep_first=2, keep_last=6, block=128)


@triton.jit
def _threshold_of_row(Score, First, Spill, Out, length, want, spill_cap, BLOCK: tl.constexpr,
                      FIRST: tl.constexpr):
    """``_radix_threshold`` of one row with a spill (``FIRST``: the first pass read from
    ``First``): its threshold, ties and count of spilled keys, written to ``Out``."""
    threshold, ties, count = _radix_threshold(Score, 0, length, want, 0, 0, Spill, 0,
                                              spill_cap, First, 0, BLOCK, True, FIRST)
    tl.store(Out, threshold)
    tl.store(Out + 1, ties)
    tl.store(Out + 2, count)


@pytest.mark.parametrize("cap", [1, 150, 400, 1000])
def test_the_spill_holds_every_winner_in_position_order(cap):
    """What a row spills (``_radix_threshold``): nothing, or at most ``cap`` keys with their
    positions, ascending, every one above every key left in the row (the winners above the
    last candidates with them); the threshold is the ``want``-th largest key either way."""
    g = seeding.generator(0)
    n, want = 1000, 60
    score = torch.randn(n, generator=g) * 4
    score[200:260] = 1.25                                 # ties at the threshold's bytes
    key = keys_of(score.numpy())
    spill = torch.full((2 * cap,), -7, dtype=torch.int32)
    out = torch.zeros(3, dtype=torch.int32)
    score = score.to(DEVICE)
    _threshold_of_row[(1,)](score, score, spill := spill.to(DEVICE), out := out.to(DEVICE), n,
                            want, cap, BLOCK=128, FIRST=False)
    threshold, ties, count = out.cpu().tolist()
    top = np.sort(key)[::-1][:want]
    assert threshold == top[-1] and ties == int((top == threshold).sum())
    assert 0 <= count <= cap and (count > 0) == (cap >= 150)
    if count:
        keys, pos = spill.cpu().numpy()[:count], spill.cpu().numpy()[cap:cap + count]
        assert np.all(np.diff(pos) > 0) and np.array_equal(keys, key[pos])
        assert keys.min() > np.delete(key, pos).max() and keys.min() <= threshold


@pytest.mark.parametrize("spill", [0, 1 << 20])
def test_a_given_first_histogram_is_read(spill):
    """One program per row ranks by the first pass it is given: the true one gives the
    reference's lists; one of the scores + 8 (every key a bucket higher) moves every list
    that holds more than the 20 kept positions, and only those."""
    g = seeding.generator(0)
    score = torch.randn(2, 3, 700, generator=g).to(DEVICE)
    lengths = torch.tensor([700, 500], device=DEVICE)
    counts = torch.tensor([[40, 90, 3], [64, 64, 12]], device=DEVICE)
    ref, _ = reference(score, lengths, counts, 700, 4, 16)
    for shift in (0.0, 8.0):
        idx, _ = radix_top_positions(score, lengths, counts, 700, 4, 16, block=256,
                                     chunked=False, spill=min(spill, 700),
                                     first_histogram=first_histogram(score + shift, lengths,
                                                                     4, 16))
        same = [np.array_equal(a, b) for a, b in zip(idx.cpu().numpy().reshape(6, -1),
                                                     ref.reshape(6, -1))]
        assert same == [bool(shift == 0 or c <= 20) for c in counts.flatten().tolist()]


def test_matches_the_torch_topk_path_of_vegas():
    """Same sets as the torch path the engine runs today (random scores: no ties)."""
    from specsim.kernels.selection import _finish, _top_positions
    g = seeding.generator(0)
    score = torch.randn(3, 900, generator=g).to(DEVICE)
    lengths = torch.tensor([900, 455, 600], device=DEVICE)
    counts = torch.tensor([300, 300, 256], device=DEVICE)
    chosen = _top_positions(score, lengths, 0, 64, 300)
    want, want_counts = _finish(chosen, counts, ranked=True)
    got, got_counts = radix_top_positions(score, lengths, counts, 300, 0, 64)
    assert torch.equal(got_counts, want_counts)
    for r in range(3):
        k = int(want_counts[r])
        assert torch.equal(got[r, :k], want[r, :k]) and not got[r, k:].any()


@pytest.mark.skipif(INTERPRETED, reason="realistic shapes: on a GPU")
def test_realistic_shapes_on_the_gpu():
    """SparseSpec-L on Qwen3-8B shapes (batch 4, 8 KV heads, 32K, s = 0.07) and Vegas on one
    list per sequence at 128K: the same sets as the torch path."""
    from specsim.kernels.selection import _finish, _top_positions
    for lead, n, s in (((4, 8), 32768, 0.07), ((4,), 131072, 0.03)):
        score = torch.randn(*lead, n, device=DEVICE)
        lengths = torch.tensor([n, n - 1000, n // 2 + 3, 4097], device=DEVICE)
        counts = torch.ceil(lengths.double() * s).long()
        capacity = int(np.ceil(n * s))
        chosen = _top_positions(score, lengths, 4, 64, capacity)
        want, want_counts = _finish(chosen, counts.view(-1, *([1] * (len(lead) - 1)))
                                    .expand(lead), ranked=True)
        got, got_counts = radix_top_positions(score, lengths, counts, capacity, 4, 64)
        assert torch.equal(got_counts, want_counts)
        mask = torch.arange(capacity, device=DEVICE) < want_counts[..., None]
        assert torch.equal(torch.where(mask, got, 0), torch.where(mask, want, 0))
        assert not torch.where(mask, 0, got).any()


@pytest.mark.skipif(INTERPRETED, reason="realistic shapes: on a GPU")
@pytest.mark.parametrize("split,one_block,warps", [(False, False, None), (True, False, None),
                                                   (True, None, None), (False, True, 8),
                                                   (True, True, 4), (True, True, 16)])
def test_fused_quest_at_qwen3_8b_shapes_on_the_gpu(split, one_block, warps):
    """Quest on Qwen3-8B shapes (batch 4, 32 / 8 heads, hd128, 32K: 2,048 pages; bf16 page
    bounds, as the cache keeps them): the torch path's lists, both ways of scoring, ranked
    from memory in blocks (as rows past ``QUEST_ONE_BLOCK_MAX`` are), by default, and in
    registers (one block of the row's 2,048 pages) at 4 to 16 warps."""
    from specsim.kernels.selection import quest_select, selected_counts
    from specsim.kernels.topk_select import quest_select_fused
    from specsim.policies import get_policy
    n, page = 32768, 16
    lengths = torch.tensor([n, n - 1000, n // 2 + 3, 4097], device=DEVICE)
    low = torch.randn(4, 8, n // page + 1, 128, device=DEVICE).bfloat16()
    high = (low.float() + torch.rand(low.shape, device=DEVICE)).bfloat16()
    q = torch.randn(4, 32, 128, device=DEVICE).bfloat16()
    for s in (0.03, 0.1):
        want, want_counts = quest_select(q.float(), low.float(), high.float(), lengths, s,
                                         max_context=n, ranking="topk")
        got, got_counts = quest_select_fused(
            q, low, high, lengths, selected_counts(get_policy("quest"), lengths, s),
            max_context=n, page_size=page, capacity=want.shape[-1], split=split,
            one_block=one_block, num_warps=warps, chunked=False)
        assert torch.equal(got_counts, want_counts.to(torch.int32))
        # both score in fp32 but sum in other orders (~1e-5 apart): with 2,048 pages a row's
        # K-th and (K+1)-th can be that close, so the page sets must agree up to such pages
        scores = page_scores(q, low, high)
        for b in range(4):
            for g in range(8):
                count = int(want_counts[b, g])
                mine = set((got[b, g, :count].long() // page).tolist())
                theirs = set((want[b, g, :count].long() // page).tolist())
                row = scores[b, g]
                threshold = min(float(row[p]) for p in theirs)
                for p in mine ^ theirs:
                    assert abs(float(row[p]) - threshold) < 1e-3, (b, g, p)
                # within each list, positions ascend and each chosen page is whole (but the
                # newest, cut at the length)
                lst = got[b, g, :count].long()
                assert bool((lst[1:] > lst[:-1]).all())


@pytest.mark.parametrize("dtype,group,head_dim,split,chunked,block,write,one_block", [
    (dtype, group, head_dim, split, False, 16, None, False)
    for dtype, group, head_dim in ((torch.float32, 2, 16), (torch.float16, 4, 64),
                                   (torch.float32, 1, 8))
    for split in (False, True)] + [(torch.float16, 4, 64, True, True, 16, None, False),
                                   (torch.float32, 2, 16, False, False, None, None, False),
                                   (torch.float32, 2, 16, True, False, 32, 8, False),
                                   (torch.float16, 4, 64, False, False, None, None, True),
                                   (torch.float32, 2, 16, True, False, 128, None, True)])
def test_fused_quest_selection_matches_the_torch_path(dtype, group, head_dim, split, chunked,
                                                      block, write, one_block, monkeypatch):
    """Quest in one kernel (page scores, top pages with the newest kept, their positions cut
    at the length) gives the torch path's lists and counts: ragged lengths (1, a page, a page
    + 1, not a page multiple, the whole buffer), s from one page to every page; the pages
    scored by the ranking program itself or by a separate launch over blocks of pages
    (``split``: many pages), then ranked by one program per row or by launches over blocks
    of pages (``chunked``), here in blocks of 16, so that several blocks and a partial one
    occur; also in the default block (the whole row) and with the positions written in
    steps of fewer pages than the ranking's block; and ranked in registers (``one_block``:
    the row's block, or a wider one), its winners' pages expanded to positions slot by
    slot."""
    from specsim.kernels import topk_select
    from specsim.kernels.selection import quest_select, selected_counts
    from specsim.kernels.topk_select import quest_select_fused
    from specsim.policies import get_policy
    if write:
        monkeypatch.setattr(topk_select, "QUEST_WRITE_PAGES", write)
    g = seeding.generator(0)
    kv, page, max_context = 2, 16, 1003
    pages = -(-max_context // page)
    lengths = torch.tensor([1, 16, 17, 300, 1003], dtype=torch.int32)
    low = torch.randn(len(lengths), kv, pages + 1, head_dim, generator=g)
    high = low + torch.rand(low.shape, generator=g)
    q = torch.randn(len(lengths), kv * group, head_dim, generator=g)
    low, high, q = (x.to(dtype).to(DEVICE) for x in (low, high, q))
    for s in (0.01, 0.1, 0.37, 1.0):
        # the kernel scores in fp32 from the stored values: so does the reference (the torch
        # path on fp16 inputs rounds its scores to fp16, which reorders near-ties)
        want, want_counts = quest_select(q.float(), low.float(), high.float(),
                                         lengths.to(DEVICE), s, max_context=max_context,
                                         ranking="topk")
        capacity = want.shape[-1]
        budget = selected_counts(get_policy("quest"), lengths.to(DEVICE), s)
        got, got_counts = poisoned(lambda: quest_select_fused(
            q, low, high, lengths.to(DEVICE), budget, max_context=max_context,
            page_size=page, capacity=capacity, split=split, block_pages=16, block=block,
            chunked=chunked, one_block=one_block))
        assert torch.equal(got_counts, want_counts.to(torch.int32)), s
        assert torch.equal(got, want), (s, page_differences(got, want, got_counts,
                                                            page_scores(q, low, high), page))


@pytest.mark.parametrize("most,pages,expected", [(None, 63, False), (64, 63, True),
                                                  (62, 63, False)])
def test_quest_rows_rank_in_one_block_up_to_their_bound(most, pages, expected, monkeypatch):
    """By default a row ranks in registers where it has at most ``QUEST_ONE_BLOCK_MAX`` pages
    (None: never), before the chunked path would take it (few rows, longer than
    ``CHUNKED_FROM``), unless chunked is asked for; asked for, with a block narrower than the
    row, it refuses in one line."""
    from specsim.kernels import topk_select
    from specsim.kernels.topk_select import quest_select_fused
    monkeypatch.setattr(topk_select, "QUEST_ONE_BLOCK_MAX", most)
    monkeypatch.setattr(topk_select, "CHUNKED_FROM", 16)          # 2 rows of 63: chunked
    seen = []

    class Spy:                  # records the launch's ONE_BLOCK, then launches the kernel
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(kwargs["ONE_BLOCK"])
                return kernel[grid](*args, **kwargs)
            return launch
    kernel = topk_select._quest_select_kernel
    monkeypatch.setattr(topk_select, "_quest_select_kernel", Spy())
    q = torch.randn(1, 2, 8, device=DEVICE)
    low = torch.randn(1, 2, pages, 8, device=DEVICE)
    lengths = torch.tensor([pages * 16], dtype=torch.int32, device=DEVICE)
    budget = torch.tensor([160], device=DEVICE)
    args = (q, low, low + 1, lengths, budget)
    shape = dict(max_context=pages * 16, page_size=16, capacity=160)
    got = quest_select_fused(*args, **shape, split=True)
    assert seen == ([True] if expected else [])                 # else chunked: no launch
    quest_select_fused(*args, **shape, split=True, chunked=True)
    assert len(seen) == (1 if expected else 0)
    want = quest_select_fused(*args, **shape, split=True, chunked=False, one_block=False)
    assert seen[-1] is False and all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(ValueError, match="one_block needs a block of at least the row's 63"):
        quest_select_fused(*args, **shape, one_block=True, block=32)


def page_scores(q, low, high):
    """Quest's page scores in float64: per (sequence, KV head, page), the max over the head's
    query heads of Σ_d max(q_d·min_d, q_d·max_d)."""
    batch, kv = low.shape[:2]
    qg = q.double().view(batch, kv, q.shape[1] // kv, 1, -1)
    return torch.maximum(qg * low.double()[:, :, None], qg * high.double()[:, :, None]) \
        .sum(-1).amax(2)


def page_differences(got, want, counts, scores, page):
    """Where two lists of Quest's positions differ: per (sequence, KV head), the pages only
    one list has, with their ``scores`` (a near-tie, or a wrong pick)."""
    out = []
    for b, g in (got != want).any(-1).nonzero().tolist():
        count = int(counts[b, g])
        mine, theirs = ({int(p) // page for p in x[b, g, :count]} for x in (got, want))
        out.append(f"({b}, {g}): kernel only " + ", ".join(
            f"page {p} {float(scores[b, g, p]):.9g}" for p in sorted(mine - theirs))
            + "; reference only " + ", ".join(
            f"page {p} {float(scores[b, g, p]):.9g}" for p in sorted(theirs - mine)))
    return out


@pytest.mark.parametrize("ranking", ["topk", "radix"])
def test_quest_selection_builds_no_tensor_from_host_data(ranking, monkeypatch):
    """The engine captures Quest's draft step (its selection included) in a CUDA graph, and a
    capturing stream refuses host-to-device copies: the selection must take every input from
    the device."""
    from specsim.kernels.selection import quest_select
    lengths = torch.tensor([5, 40], dtype=torch.int32, device=DEVICE)
    low = torch.randn(2, 2, 4, 16, device=DEVICE)
    high, q = low + 1, torch.randn(2, 4, 16, device=DEVICE)

    def refuse(*args, **kwargs):
        raise AssertionError("torch.tensor from host data in a capturable path")

    monkeypatch.setattr(torch, "tensor", refuse)
    chosen, counts = quest_select(q, low, high, lengths, 0.5, max_context=64, ranking=ranking)
    assert counts.tolist() == [[5, 5], [24, 24]]   # the newest page is cut at the length


def test_best_ranking_resolves_per_policy_as_the_table_says(monkeypatch):
    """ranking="best" (the default) resolves per policy as ``BEST_RANKING`` says, on CUDA
    (or no device named); off CUDA to torch.topk for all (the kernel would run
    interpreted); an explicit ranking wins; the radix kernel runs where it resolves to it."""
    import specsim.kernels.selection as S
    import specsim.policies as P
    from specsim.policies import RANKED_POLICIES
    assert set(P.BEST_RANKING) <= set(RANKED_POLICIES)
    assert set(P.BEST_RANKING.values()) <= set(S.RANKINGS) - {"best"}
    monkeypatch.setattr(P, "BEST_RANKING", {"sparsespec": "radix", "quest": "radix"})
    policies = ("vegas", "last-token", "sparsespec", "quest")
    assert [S.ranking_for(p) for p in policies] == ["topk", "topk", "radix", "radix"]
    assert [S.ranking_for(p, device="cuda") for p in policies] == \
        ["topk", "topk", "radix", "radix"]
    assert [S.ranking_for(p, device="cpu") for p in policies] == ["topk"] * 4
    assert S.ranking_for("quest", "topk") == "topk"
    assert S.ranking_for("sparsespec", "radix", device="cpu") == "radix"
    calls = []
    real = S.radix_top_positions
    monkeypatch.setattr(S, "radix_top_positions",
                        lambda *a, **kw: calls.append("radix") or real(*a, **kw))
    g = seeding.generator(0)
    lengths = torch.tensor([700, 300], device=DEVICE)
    logits = torch.randn(2, 4, 2, 700, generator=g).to(DEVICE)
    S.vegas_select(logits, lengths, 0.1)
    assert calls == []                                      # Vegas: torch.topk
    picked = S.sparsespec_select(logits, lengths, 0.1, 2)
    assert calls == (["radix"] if torch.device(DEVICE).type == "cuda" else [])
    picked_radix = S.sparsespec_select(logits, lengths, 0.1, 2, ranking="radix")
    assert calls[-1:] == ["radix"]
    want = S.sparsespec_select(logits, lengths, 0.1, 2, ranking="topk")
    for got, got_radix, ref in zip(picked, picked_radix, want):   # the same lists either way
        assert torch.equal(got, ref) and torch.equal(got_radix, ref)


@given(st.integers(1, 1 << 18), st.sampled_from([None, 64, 4096]),
       st.sampled_from([None, 2, 16]), st.sampled_from([4, 8]))
def test_one_program_ranks_a_short_row_in_one_block(items, block, warps, wide_warps):
    """One program per row takes a row of at most ``ROW_BLOCK_MAX`` items in a single block,
    a power of two that covers it without doubling it (16 at least), a longer row in blocks
    of 1,024 with 4 warps; the wide warps only for a block over 1,024; what is given wins."""
    import specsim.kernels.topk_select as T
    got_block, got_warps = T._row_shape(items, block, warps, wide_warps)
    if block is None:
        if items <= T.ROW_BLOCK_MAX:
            assert got_block >= items and (got_block < 2 * items or got_block == 16)
            assert got_block & (got_block - 1) == 0 and got_block >= 16
        else:
            assert got_block == 1024
    else:
        assert got_block == block
    assert got_warps == (warps or (wide_warps if got_block > 1024 else 4))


def test_chunked_ranking_is_for_few_long_rows():
    """One program per row unless rows are longer than ``CHUNKED_FROM`` items and at most
    ``CHUNKED_ROWS`` of them (many rows already fill the GPU); an explicit choice wins; rows
    of ``CHUNKED_WIDE_FROM`` items or more take wider programs."""
    import specsim.kernels.topk_select as T
    assert T.CHUNKED_FROM is not None
    long, few = T.CHUNKED_FROM + 1, T.CHUNKED_ROWS
    assert T.chunked_path(few, long, None)
    assert not T.chunked_path(few + 1, long, None)
    assert not T.chunked_path(few, T.CHUNKED_FROM, None)
    assert T.chunked_path(few + 1, 16, True) and not T.chunked_path(1, long, False)
    narrow, wide = T._chunk_shape(T.CHUNKED_WIDE_FROM - 1, None, None), \
        T._chunk_shape(T.CHUNKED_WIDE_FROM, None, None)
    assert wide[0] > narrow[0] and wide[1] >= narrow[1]
    assert T._chunk_shape(T.CHUNKED_WIDE_FROM, 256, 2) == (256, 2)


@given(st.integers(1, 1 << 20), st.integers(0, 1 << 16))
def test_a_long_row_may_spill_its_share_and_its_list(items, capacity):
    """The default spill (``_spill_capacity``): none below ``SPILL_FROM`` items; else room for
    the row's ``SPILL_SHARE``-th part of candidates besides every winner of its list, never more
    than the row."""
    import specsim.kernels.topk_select as T
    capacity = min(capacity, items)
    got = T._spill_capacity(items, capacity)
    if T.SPILL_FROM is None or items < T.SPILL_FROM:
        assert got == 0
    else:
        assert got == items or got >= capacity + items / T.SPILL_SHARE
        assert capacity <= got <= items


def test_a_false_first_histogram_never_writes_past_the_spill():
    """A first histogram that puts ``want + 1`` keys in the lowest bucket (the row holds
    many more above it) makes the row spill at once; the spill stops at its capacity and
    says so, and the memory after it is untouched."""
    g = seeding.generator(0)
    n, want, cap = 1000, 60, 100
    guard = 2 * n                  # room for what an unbounded spill would write
    score = torch.randn(n, generator=g) * 4
    false = torch.zeros(256, dtype=torch.int32)
    false[0] = want + 1
    spill = torch.full((2 * cap + guard,), -7, dtype=torch.int32).to(DEVICE)
    out = torch.zeros(3, dtype=torch.int32).to(DEVICE)
    _threshold_of_row[(1,)](score.to(DEVICE), false.to(DEVICE), spill, out, n, want, cap,
                            BLOCK=128, FIRST=True)
    assert out[2].item() == cap
    assert torch.all(spill[2 * cap:].cpu() == -7)


@triton.jit
def _winners_of_block(Key, Take, Rank, threshold, ties, tied, taken, want,
                      BLOCK: tl.constexpr):
    lane = tl.arange(0, BLOCK)
    take, rank, _, _ = _winners(tl.load(Key + lane), lane < BLOCK, threshold, ties, tied,
                                taken, want)
    tl.store(Take + lane, take.to(tl.int32))
    tl.store(Rank + lane, rank)


@pytest.mark.parametrize("threshold,taken,want", [(-1000, 0, 5), (-1000, 3, 5), (0, 0, 0),
                                                  (40, 2, 9)])
def test_a_block_never_takes_more_winners_than_wanted(threshold, taken, want):
    """``_winners`` over one block of keys 0..63 in position order: the keys above the
    threshold (none tie: no key equals it, or no ties remain), the lowest positions first,
    ranked from ``taken``, and never past ``want`` in all, even when the threshold is below
    every key."""
    key = torch.arange(64, dtype=torch.int32)
    take, rank = torch.zeros(64, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)
    _winners_of_block[(1,)](key.to(DEVICE), take := take.to(DEVICE), rank := rank.to(DEVICE),
                            threshold, 0, 0, taken, want, BLOCK=64)
    above = (key > threshold).numpy()
    expect = above & (np.cumsum(above) + taken - 1 < want)
    assert np.array_equal(take.cpu().numpy().astype(bool), expect)
    assert np.array_equal(rank.cpu().numpy()[expect], taken + np.arange(expect.sum()))
