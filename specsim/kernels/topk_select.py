"""Top-K positions of score rows as sorted lists: radix select + ordered compaction.

Also Quest's whole selection (page scores, top pages, their positions): ``quest_select_fused``.

What the selection policies need from "top-K" is not a ranking but a *set*, delivered as the
ascending position list the sparse draft kernel reads. ``torch.topk`` followed by sorting the
winners (``selection._finish``) makes several passes over every row and launches many
kernels; ``torch.topk``'s time also jumps with the row length (it changes algorithm), which the
calibration cannot interpolate. This kernel finds the K-th largest key of each row exactly by
radix select — four passes, each a 256-bin histogram of one byte of the keys that still tie
with the threshold (in long rows the candidates left after a pass and the keys above them are
copied aside with their positions once they are few, and the later passes and the write read
them alone) — and then writes the positions above the threshold (and the first ones equal to
it, to make K) in position order, so the list comes out sorted with no sort, one program per
row; or, where rows are few (one per sequence or per KV head) and long, spread over programs
per block of the row, one launch per pass (``_chunked_select``).

Keys: a score's fp32 bits as int32, with the low 31 bits of negative numbers flipped, order as
the floats do (−0 just below +0). Positions that must be kept (the first ``keep_first`` and the
last ``keep_last`` valid ones) get the largest key; positions at or past the row's length are
not candidates. Ties at the threshold go to the lowest positions (``torch.topk`` picks any).
NaN scores rank above +inf (below the kept positions). Rows known to hold no score below +0
(attention mass) may take the bits shifted left by one (``nonnegative``): the first pass's
byte is then the whole exponent, buckets of a factor of 2 rather than 4, and the candidates
left after it fewer, often few enough to spill at once. SparseSpec-L's 1,152 rows
(Qwen3-8B, batch 4, random logits of std 3, s = 0.03) keep 2.8% of a row after the first
pass against 8.2%; mass pass and ranking 2,721 against 3,466 µs at 128K, 726 against 927 at
32K, 211 against 247 at 8K (one H100, CUDA-graph medians, 2026-12-07, the same lists; a
spill of 1/8 of the row instead gets 2,857, 777, 213 without the shift and nothing with it).
How many candidates a first pass leaves depends on the mass: real attention (SmolLM2-135M's
90 rows over a 4K prompt, s = 0.03) leaves a median 1.5% with the float-order key, 0.7%
with the exponent; random logits of std 1 (about the spread random weights give) 5-52%
and 5%.
"""
from __future__ import annotations

import torch

from specsim.kernels._runtime import tl, triton

_FORCED_KEY = 0x7FFFFFFF        # INT32_MAX: above every float's key
#: Quest: rows with more pages than this are scored by a separate, wider launch. One H100,
#: 2026-12-07, ``quest_select_fused`` at 136 pages (2K), 8 KV heads, hd128, split / scored
#: by the ranking program: 7.8 / 9.9 µs at batch 1, 8.3 / 10.1 at 4, 10.5 / 10.5 at 16.
SPLIT_PAGES = 128
#: Rows of more items (tokens, or Quest's pages) than this are ranked by launches over
#: blocks of the row (``_chunked_select``) when they are few (at most ``CHUNKED_ROWS``);
#: None: none are. As ``benchmarks/bench_selection.py`` measures it (every layer's rows at
#: once, batch 4; H200, H100 where said, 2026-12-05, one program per row without the
#: spill of ``SPILL_FROM``), chunked / one program per row /
#: torch.topk: Vegas' 144 summed rows (Qwen3-8B) at 128K 553 / 1,208 / 790 µs, at 32K
#: 162 / 279 / 266, at 8K 73 / 82 / 170 (H100), at 2K 51 / 34 / 119 (H100); Quest's 32 rows
#: (one layer) of 8,192 pages 97 / 130, of 4,096 80 / 86 (H100), of 2,048 56 / 48. The switch
#: lies between the measured 2,048 and 4,096: the engine's rows at a 2K or 32K context are a
#: little over a power of two (its cache padding: 2,176 positions, 2,056 pages), where the
#: chunked path took 33.5 against 20 µs (Vegas, 144 rows of 2,048) and 42.8 against 30.2
#: (Quest, 32 rows of 2,048 pages; H100, CUDA-graph medians, 2026-12-07).
CHUNKED_FROM: int | None = 3072
#: ... and only as long as rows are this few: SparseSpec-L's 1,152 rows of 128K (every
#: layer's KV heads) keep the GPU busy one program per row (6.17 ms against 6.63 chunked,
#: both without the spill).
CHUNKED_ROWS = 512
#: Tokens a chunked program ranks: rows of at least ``CHUNKED_WIDE_FROM`` items take 4,096
#: with 8 warps (Vegas at 128K: 553 against 639 µs for 1,024 with 4), shorter ones 1,024
#: with 4 (Quest's 8,192 pages: 97 against 105).
CHUNKED_WIDE_FROM = 32768
#: One program per row: rows of at least this many items copy the candidates left after a
#: radix pass and the keys above them, with their positions, into a spill of
#: 1/``SPILL_SHARE`` of the row plus the list's capacity, once they fit, and finish the passes
#: and the write there (``_radix_threshold``); None: never. SparseSpec-L's 1,152 rows
#: (Qwen3-8B, batch 4, s = 0.03) ranked after the mass pass from its first histogram, one
#: H100, CUDA-graph medians, 2026-12-07, the same lists in every cell; a spill of the
#: candidates alone, the write reading the row / of 1/16 of the row plus the capacity / of 1/4:
#: at 128K 1,945 / 1,362 / 984 µs with logits of std 1 (flat mass: the first pass leaves
#: more than an eighth of a row), 1,214 / 683 / 683 with std 3; at 32K, std 1, 509 / 355 /
#: 264 (the mass pass alone: 1,516 µs at 128K). A spill takes 8 bytes per key it may hold:
#: about 340 MB for these rows at 128K, beside the mass's 605 MB.
SPILL_FROM: int | None = 8192
SPILL_SHARE = 4
#: One program per row ranks a row of at most this many items in one block of the row rounded
#: up to a power of two, longer rows in blocks of 1,024: a 1,024 block over a short row spends
#: its radix passes on masked lanes. H100, CUDA-graph medians, 2026-12-07 (row block / 1,024):
#: Quest's 32 rows (batch 4, one layer) of 128 pages, scores included, 9.3 / 14.9 µs, of
#: 2,048 (8 warps) 27.2 / 30.2; Vegas' 144 summed rows of 2,048 17.0 / 19.6, SparseSpec-L's
#: 1,152 61.9 / 65.0; rows of 8,192 lose at one block (Vegas 85 / 58 chunked). In the engine
#: (``benchmarks/bench_engine.py --model qwen3-8b --batch 4 --contexts 2048,32768 --phases
#: --policies quest,vegas``, H100, 2026-12-07, against the former 1,024 blocks and switch at
#: 2,048 items): Quest's draft (k = 2) 7.89 against 8.43 ms at 2K, 9.47 against 9.54 at 32K;
#: Vegas' refresh 60 against 67 µs at 2K.
ROW_BLOCK_MAX = 2048
#: Quest's rows of at most this many pages are ranked by one program holding the row's keys
#: in registers, one block of the row rounded up to a power of two (``ONE_BLOCK``: the scores
#: read once rather than once a radix pass and once more to write; the winners' pages listed
#: in the scratch row, then expanded to positions slot by slot), before the chunked path;
#: None: never. The engine's 32K rows (2,049 to 2,056 pages, past ``ROW_BLOCK_MAX``) rank
#: otherwise in three blocks of 1,024. One H100, CUDA-graph medians of
#: ``quest_select_fused`` (scores, ranking and lists; 8 KV heads, hd128, s = 0.05),
#: 2026-12-07, one block / ranked from memory in blocks of at most 1,024: 2,056 pages at
#: batch 1, 4, 16 21.2 / 29.3, 30.0 / 37.7, 73.1 / 81.1 µs (8 warps; 4 warps lose, 16 tie);
#: 136 pages at batch 4 10.0 / 11.5 (4 warps). Held in one block of 4,096 (8 warps), the
#: radix kernel's token rows lose on the same GPU: Vegas' 144 rows of 2,176 40 against 34
#: µs, SparseSpec-L's 1,152 145 against 111.
QUEST_ONE_BLOCK_MAX: int | None = 4096
#: Quest writes the positions of this many pages a step ([pages, page size] in registers),
#: whatever block it ranks them in.
QUEST_WRITE_PAGES = 1024


@triton.jit
def _key_of(Score, row_off, pos, valid, length, keep_first, keep_last,
            NONNEG: tl.constexpr = False):
    s = tl.load(Score + row_off + pos, mask=valid, other=0.0).to(tl.float32)
    return key_bits(s, pos, length, keep_first, keep_last, NONNEG)


@triton.jit
def key_bits(s, pos, length, keep_first, keep_last, NONNEG: tl.constexpr = False):
    """The radix key of fp32 scores ``s`` at positions ``pos`` of a row of ``length``
    (module doc): their bits in float order, the kept positions' the largest. ``NONNEG``
    (no score below +0): the bits shifted left by one, their sign flipped to keep the
    order as int32, so the top byte is the exponent."""
    bits = s.to(tl.int32, bitcast=True)
    if NONNEG:
        key = (bits << 1) ^ -2147483648
    else:
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    forced = (pos < keep_first) | (pos >= length - keep_last)
    return tl.where(forced, 0x7FFFFFFF, key)


@triton.jit
def _row_histogram(Score, row_off, length, keep_first, keep_last, prefix, p: tl.constexpr,
                   BLOCK: tl.constexpr, NONNEG: tl.constexpr):
    """Pass ``p``'s histogram over a whole row's keys that are still candidates."""
    hist = tl.zeros([256], tl.int32)
    for start in range(0, length, BLOCK):
        pos = start + tl.arange(0, BLOCK)
        valid = pos < length
        key = _key_of(Score, row_off, pos, valid, length, keep_first, keep_last, NONNEG)
        digit, match = _digit(key, valid, prefix, p)
        hist += tl.histogram(digit, 256, mask=match)
    return hist


@triton.jit
def _spill_histogram(Spill, spill_off, count, prefix, p: tl.constexpr, BLOCK: tl.constexpr):
    """Pass ``p``'s histogram over the ``count`` keys spilled from the row."""
    hist = tl.zeros([256], tl.int32)
    for start in range(0, count, BLOCK):
        slot = start + tl.arange(0, BLOCK)
        valid = slot < count
        key = tl.load(Spill + spill_off + slot, mask=valid, other=0)
        digit, match = _digit(key, valid, prefix, p)
        hist += tl.histogram(digit, 256, mask=match)
    return hist


@triton.jit
def _spill(Score, row_off, length, keep_first, keep_last, prefix, p: tl.constexpr, Spill,
           spill_off, spill_cap, BLOCK: tl.constexpr, NONNEG: tl.constexpr):
    """Copy the keys that are candidates of pass ``p`` (their higher bytes equal the
    threshold's so far) or above them (certain winners), with their positions, into the
    row's spill, in position order; returns how many. Never more than ``spill_cap``: a first
    histogram that is not the row's own could promise fewer keys than the row holds."""
    count = tl.zeros([], tl.int32)
    shift = 32 - 8 * p
    for start in range(0, length, BLOCK):
        pos = start + tl.arange(0, BLOCK)
        valid = pos < length
        key = _key_of(Score, row_off, pos, valid, length, keep_first, keep_last, NONNEG)
        keep = valid & ((key >> shift) >= (prefix >> shift))
        slot = count + tl.cumsum(keep.to(tl.int32), 0) - 1
        room = keep & (slot < spill_cap)
        tl.store(Spill + spill_off + slot, key, mask=room)
        tl.store(Spill + spill_off + spill_cap + slot, pos, mask=room)
        count += tl.sum(keep.to(tl.int32), 0)
    return tl.minimum(count, spill_cap)


@triton.jit
def _radix_threshold(Score, row_off, length, want, keep_first, keep_last, Spill, spill_off,
                     spill_cap, First, first_off, BLOCK: tl.constexpr, SPILL: tl.constexpr,
                     FIRST: tl.constexpr, NONNEG: tl.constexpr = False):
    """The ``want``-th largest key of a row's first ``length`` scores (radix select, one byte
    per pass, most significant first), how many keys equal to it are among the top, and how
    many keys the row spilled (0: none).

    ``FIRST``: the first pass's histogram is read from ``First + first_off`` (256 counts,
    made by the kernel that wrote the scores) rather than made from the row.

    ``SPILL``: once the candidates left after a pass and the keys above them (the winners
    known so far) fit the row's spill (``spill_cap`` keys at ``Spill + spill_off``, their
    positions ``spill_cap`` further), they are copied there in position order (``_spill``),
    the later passes read them alone, and so does the winners' write: two to four reads of
    the row instead of five (one to three with ``FIRST``), and the 256-bin histograms (the
    costly part of a pass) over a few keys.
    ``NONNEG``: ``key_bits``' keys of scores none of which is below +0."""
    remaining = want
    prefix = tl.zeros([], tl.int32)           # the threshold's bytes chosen so far
    count = tl.zeros([], tl.int32)            # keys in the spill
    spilled = tl.zeros([], tl.int32)
    for p in tl.static_range(4):
        if FIRST and p == 0:
            hist = tl.load(First + first_off + tl.arange(0, 256))
        elif SPILL:
            if spilled != 0:
                hist = _spill_histogram(Spill, spill_off, count, prefix, p, BLOCK)
            else:
                hist = _row_histogram(Score, row_off, length, keep_first, keep_last, prefix,
                                      p, BLOCK, NONNEG)
        else:
            hist = _row_histogram(Score, row_off, length, keep_first, keep_last, prefix, p,
                                  BLOCK, NONNEG)
        prefix, remaining, left = _decide(hist, p, prefix, remaining)
        if SPILL and p < 3:
            if (spilled == 0) & (want - remaining + left <= spill_cap):
                count = _spill(Score, row_off, length, keep_first, keep_last, prefix, p + 1,
                               Spill, spill_off, spill_cap, BLOCK, NONNEG)
                spilled = 1
                tl.debug_barrier()            # the spill's keys, seen by every thread
    return prefix, remaining, count


@triton.jit
def _block_threshold(key, valid, want):
    """``_radix_threshold`` over one block of keys held in registers: the row read once, not
    once a pass."""
    remaining = want
    prefix = tl.zeros([], tl.int32)
    for p in tl.static_range(4):
        digit, match = _digit(key, valid, prefix, p)
        prefix, remaining, _ = _decide(tl.histogram(digit, 256, mask=match), p, prefix,
                                       remaining)
    return prefix, remaining


@triton.jit
def _decide(hist, p: tl.constexpr, prefix, remaining):
    """After pass ``p``'s histogram of one byte of the candidates' keys: the threshold's byte
    (the largest digit d whose count of candidates with digit ≥ d reaches what is still
    wanted) added to ``prefix``, what is still wanted among the keys equal to it, and how
    many keys are left candidates (those with the threshold's byte)."""
    bins = tl.arange(0, 256)
    total = tl.sum(hist, 0)
    at_least = total - tl.cumsum(hist, 0) + hist
    d = tl.max(tl.where(at_least >= remaining, bins, -1), 0)
    remaining = remaining - tl.sum(tl.where(bins > d, hist, 0), 0)
    left = tl.sum(tl.where(bins == d, hist, 0), 0)
    if p == 0:
        prefix = (d ^ 0x80) << 24
    else:
        prefix = prefix | (d << (24 - 8 * p))
    return prefix, remaining, left


@triton.jit
def _digit(key, valid, prefix, p: tl.constexpr):
    """Pass ``p``'s byte of each key (the sign-flipped top byte first) and which keys are
    still candidates (their higher bytes equal the threshold's so far)."""
    shift = 24 - 8 * p
    if p == 0:
        match = valid
        digit = ((key >> 24) & 0xFF) ^ 0x80
    else:
        match = valid & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
        digit = (key >> shift) & 0xFF
    return digit, match


@triton.jit
def _winners(key, valid, threshold, ties, tied, taken, want):
    """One block of a row in position order: which positions are among the top (above the
    threshold, or equal to it while ties remain), their ranks, and the running counts of
    winners and of threshold-equal keys. Never more than ``want`` winners, whatever the
    threshold (one from a first histogram that is not the row's own may be too low)."""
    eq = valid & (key == threshold)
    eq_rank = tied + tl.cumsum(eq.to(tl.int32), 0) - 1
    take = (valid & (key > threshold)) | (eq & (eq_rank < ties))
    rank = taken + tl.cumsum(take.to(tl.int32), 0) - 1
    take = take & (rank < want)
    return take, rank, taken + tl.sum(take.to(tl.int32), 0), tied + tl.sum(eq.to(tl.int32), 0)


@triton.jit
def _zero_from(Out, out_off, first, capacity, OUT_BLOCK: tl.constexpr):
    """Zero a list's slots ``first .. capacity`` (the padding past its count)."""
    for start in range(0, capacity, OUT_BLOCK):
        slot = start + tl.arange(0, OUT_BLOCK)
        tl.store(Out + out_off + slot, tl.zeros([OUT_BLOCK], tl.int32),
                 mask=(slot >= first) & (slot < capacity))


def _out_block(capacity: int) -> int:
    """Slots zeroed per step of ``_zero_from``."""
    return min(1024, triton.next_power_of_2(max(capacity, 16)))


@triton.jit
def _row_want(Lengths, Counts, row, rows_per_seq, counts_div, n, PAGE: tl.constexpr):
    """A row's length in tokens (at most its ``n`` items of ``PAGE`` tokens), its items, how
    many items it keeps (``Counts``: tokens, ``counts_div`` rows per count) and the tokens
    its list holds (the newest page cut at the length)."""
    length = tl.minimum(tl.load(Lengths + row // rows_per_seq), n * PAGE)
    items = (length + PAGE - 1) // PAGE
    want = tl.minimum((tl.load(Counts + row // counts_div).to(tl.int32) + PAGE - 1) // PAGE,
                      items)
    tokens = tl.where(want > 0, (want - 1) * PAGE + length - (items - 1) * PAGE, 0)
    return items, want, tokens


@triton.jit
def _radix_select_kernel(Score, Lengths, Counts, Out, CountsOut, Spill, First, n, stride_row,
                         stride_out, capacity, rows_per_seq, keep_first, keep_last, spill_cap,
                         BLOCK: tl.constexpr, OUT_BLOCK: tl.constexpr, SPILL: tl.constexpr,
                         FIRST: tl.constexpr, NONNEG: tl.constexpr):
    row = tl.program_id(0)
    row_off = row.to(tl.int64) * stride_row
    length, want, _ = _row_want(Lengths, Counts, row, rows_per_seq, 1, n, 1)
    spill_off = row.to(tl.int64) * 2 * spill_cap
    threshold, ties, spilled = _radix_threshold(Score, row_off, length, want, keep_first,
                                                keep_last, Spill, spill_off, spill_cap, First,
                                                row.to(tl.int64) * 256, BLOCK, SPILL, FIRST,
                                                NONNEG)
    # ---- ordered compaction: winners in position order, from the spill where it holds them
    taken = tl.zeros([], tl.int32)
    tied = tl.zeros([], tl.int32)
    out_off = row.to(tl.int64) * stride_out
    if spilled > 0:
        for start in range(0, spilled, BLOCK):
            slot = start + tl.arange(0, BLOCK)
            valid = slot < spilled
            key = tl.load(Spill + spill_off + slot, mask=valid, other=0)
            pos = tl.load(Spill + spill_off + spill_cap + slot, mask=valid, other=0)
            take, rank, taken, tied = _winners(key, valid, threshold, ties, tied, taken, want)
            tl.store(Out + out_off + rank, pos, mask=take)
    else:
        for start in range(0, length, BLOCK):
            pos = start + tl.arange(0, BLOCK)
            valid = pos < length
            key = _key_of(Score, row_off, pos, valid, length, keep_first, keep_last, NONNEG)
            take, rank, taken, tied = _winners(key, valid, threshold, ties, tied, taken, want)
            tl.store(Out + out_off + rank, pos.to(tl.int32), mask=take)
    _zero_from(Out, out_off, taken, capacity, OUT_BLOCK)
    tl.store(CountsOut + row, want)


# ---- the same selection with each row spread over many programs: one launch per radix
# pass (each program adds its block's byte histogram to its row's, and replays the
# decisions of the passes before from their histograms), one that counts each block's
# winners, one that writes them at their ranks. Rows are few (a sequence, or one per KV
# head) and long, so one program per row leaves most of the GPU idle.

@triton.jit
def _replay(Hist, row, rows, want, PASSES: tl.constexpr):
    """The threshold's bytes and what is still wanted after ``PASSES`` passes, from those
    passes' histograms of the row (``Hist`` [4, rows, 256])."""
    bins = tl.arange(0, 256)
    remaining = want
    prefix = tl.zeros([], tl.int32)
    for p in tl.static_range(PASSES):
        hist = tl.load(Hist + (p * rows + row) * 256 + bins)
        prefix, remaining, _ = _decide(hist, p, prefix, remaining)
    return prefix, remaining


@triton.jit
def _chunk_pass_kernel(Score, Lengths, Counts, Hist, n, stride_row, rows, rows_per_seq,
                       counts_div, keep_first, keep_last,
                       PASS: tl.constexpr, PAGE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    start = tl.program_id(1) * BLOCK
    items, want, _ = _row_want(Lengths, Counts, row, rows_per_seq, counts_div, n, PAGE)
    if (start < items) & (want > 0):
        prefix, remaining = _replay(Hist, row, rows, want, PASS)
        pos = start + tl.arange(0, BLOCK)
        valid = pos < items
        key = _key_of(Score, row.to(tl.int64) * stride_row, pos, valid, items, keep_first,
                      keep_last)
        digit, match = _digit(key, valid, prefix, PASS)
        hist = tl.histogram(digit, 256, mask=match)
        tl.atomic_add(Hist + (PASS * rows + row) * 256 + tl.arange(0, 256), hist,
                      mask=hist > 0)


@triton.jit
def _chunk_block(Score, Lengths, Counts, Hist, row, start, n, stride_row, rows, rows_per_seq,
                 counts_div, keep_first, keep_last, PAGE: tl.constexpr, BLOCK: tl.constexpr):
    """One block of a row after the four passes: its positions, keys, validity, the row's
    threshold, ties to take, items wanted and tokens listed."""
    items, want, tokens = _row_want(Lengths, Counts, row, rows_per_seq, counts_div, n, PAGE)
    threshold, ties = _replay(Hist, row, rows, want, 4)
    pos = start + tl.arange(0, BLOCK)
    valid = pos < items
    key = _key_of(Score, row.to(tl.int64) * stride_row, pos, valid, items, keep_first,
                  keep_last)
    return pos, key, valid, threshold, ties, want, tokens


@triton.jit
def _chunk_count_kernel(Score, Lengths, Counts, Hist, Tally, n, stride_row, rows,
                        rows_per_seq, counts_div, keep_first, keep_last, chunks,
                        PAGE: tl.constexpr, BLOCK: tl.constexpr):
    """Each block's keys above the threshold and equal to it (``Tally`` [rows, chunks, 2])."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    pos, key, valid, threshold, _, _, _ = _chunk_block(
        Score, Lengths, Counts, Hist, row, chunk * BLOCK, n, stride_row, rows, rows_per_seq,
        counts_div, keep_first, keep_last, PAGE, BLOCK)
    at = Tally + (row * chunks + chunk) * 2
    tl.store(at, tl.sum((valid & (key > threshold)).to(tl.int32), 0))
    tl.store(at + 1, tl.sum((valid & (key == threshold)).to(tl.int32), 0))


@triton.jit
def _chunk_write_kernel(Score, Lengths, Counts, Hist, Tally, Out, CountsOut, n, stride_row,
                        stride_out, capacity, rows, rows_per_seq, counts_div, keep_first,
                        keep_last, chunks, PAGE: tl.constexpr, BLOCK: tl.constexpr,
                        CHUNKS: tl.constexpr, OUT_BLOCK: tl.constexpr):
    """The block's winners at their ranks (the blocks before it: their tallies), as
    positions (pages: each page's ``PAGE`` positions, the newest cut at the length), and the
    list's padding in this block's share of the slots."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    pos, key, valid, threshold, ties, want, tokens = _chunk_block(
        Score, Lengths, Counts, Hist, row, chunk * BLOCK, n, stride_row, rows, rows_per_seq,
        counts_div, keep_first, keep_last, PAGE, BLOCK)
    before = tl.arange(0, CHUNKS)
    tally = Tally + (row * chunks + before) * 2
    above = tl.sum(tl.load(tally, mask=before < chunk, other=0), 0)
    tied = tl.sum(tl.load(tally + 1, mask=before < chunk, other=0), 0)
    take, rank, _, _ = _winners(key, valid, threshold, ties, tied,
                                above + tl.minimum(tied, ties), want)
    out_off = row.to(tl.int64) * stride_out
    if PAGE == 1:
        tl.store(Out + out_off + rank, pos.to(tl.int32), mask=take)
    else:
        within = tl.arange(0, PAGE)
        slot = rank[:, None] * PAGE + within[None, :]
        tl.store(Out + out_off + slot, (pos[:, None] * PAGE + within[None, :]).to(tl.int32),
                 mask=take[:, None] & (slot < tokens))
    share = BLOCK * PAGE
    for first in range(chunk * share, tl.minimum((chunk + 1) * share, capacity), OUT_BLOCK):
        # its own name: compiled Triton keeps one shape per name (``slot`` is 2-D above)
        pad = first + tl.arange(0, OUT_BLOCK)
        tl.store(Out + out_off + pad, tl.zeros([OUT_BLOCK], tl.int32),
                 mask=(pad >= tokens) & (pad < capacity))
    if chunk == 0:
        tl.store(CountsOut + row, tokens)


def _chunked_select(flat: torch.Tensor, lengths: torch.Tensor, counts: torch.Tensor,
                    out: torch.Tensor, counts_out: torch.Tensor, rows_per_seq: int,
                    counts_div: int, keep_first: int, keep_last: int, *, page: int = 1,
                    block: int, num_warps: int) -> None:
    """Each row of ``flat`` [rows, n] (scores of n tokens, or of n pages of ``page`` tokens)
    ranked by programs over (row, block): its list into ``out`` [rows, capacity], its token
    count into ``counts_out`` [rows]."""
    rows, n = flat.shape
    chunks = triton.cdiv(n, block)
    hist = torch.zeros(4, rows, 256, dtype=torch.int32, device=flat.device)
    tally = torch.empty(rows, chunks, 2, dtype=torch.int32, device=flat.device)
    common = (n, flat.stride(0), rows, rows_per_seq, counts_div, keep_first, keep_last)
    for p in range(4):
        _chunk_pass_kernel[(rows, chunks)](flat, lengths, counts, hist, *common, PASS=p,
                                           PAGE=page, BLOCK=block, num_warps=num_warps)
    _chunk_count_kernel[(rows, chunks)](flat, lengths, counts, hist, tally, *common, chunks,
                                        PAGE=page, BLOCK=block, num_warps=num_warps)
    capacity = out.shape[1]
    _chunk_write_kernel[(rows, chunks)](
        flat, lengths, counts, hist, tally, out, counts_out, n, flat.stride(0), out.stride(0),
        capacity, *common[2:], chunks, PAGE=page, BLOCK=block,
        CHUNKS=triton.next_power_of_2(chunks), OUT_BLOCK=_out_block(min(capacity, block * page)),
        num_warps=num_warps)


@triton.jit
def _page_scores(Q, PMin, PMax, Scratch, b, g, row_off, p0, pages, stride_qb, stride_qh,
                 stride_pb, stride_pg, stride_pp,
                 GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_P: tl.constexpr):
    """Scores of pages p0 .. p0 + BLOCK_P of KV head g of sequence b into the scratch row:
    the max over the head's query heads of Σ_d max(q_d·min_d, q_d·max_d)."""
    dims = tl.arange(0, HEAD_DIM)
    page = p0 + tl.arange(0, BLOCK_P)
    ok = page < pages
    off = b * stride_pb + g * stride_pg + page[:, None] * stride_pp + dims[None, :]
    low = tl.load(PMin + off, mask=ok[:, None], other=0.0).to(tl.float32)
    high = tl.load(PMax + off, mask=ok[:, None], other=0.0).to(tl.float32)
    score = tl.full([BLOCK_P], float("-inf"), tl.float32)
    for h in tl.static_range(GROUP):
        q = tl.load(Q + b * stride_qb + (g * GROUP + h) * stride_qh + dims).to(tl.float32)
        bound = tl.sum(tl.maximum(q[None, :] * low, q[None, :] * high), 1)
        score = tl.maximum(score, bound)
    tl.store(Scratch + row_off + page, score, mask=ok)


@triton.jit
def _quest_scores_kernel(Q, PMin, PMax, Lengths, Scratch, stride_qb, stride_qh, stride_pb,
                         stride_pg, stride_pp, stride_scratch,
                         NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                         HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_P: tl.constexpr):
    """The page scores alone, one program per (sequence, KV head, block of pages): with many
    pages one program per row reads its bounds serially and is latency-bound (2,048 pages at
    hd128: ~150 µs for 34 MB)."""
    pid = tl.program_id(0)
    b = (pid // NUM_KV_HEADS).to(tl.int64)
    g = (pid % NUM_KV_HEADS).to(tl.int64)
    p0 = tl.program_id(1) * BLOCK_P
    pages = (tl.load(Lengths + b) + PAGE - 1) // PAGE
    if p0 < pages:
        _page_scores(Q, PMin, PMax, Scratch, b, g, pid.to(tl.int64) * stride_scratch, p0,
                     pages, stride_qb, stride_qh, stride_pb, stride_pg, stride_pp,
                     GROUP, HEAD_DIM, BLOCK_P)


@triton.jit
def _quest_select_kernel(Q, PMin, PMax, Lengths, Budget, Scratch, Out, Counts, capacity,
                         n, stride_qb, stride_qh, stride_pb, stride_pg, stride_pp, stride_out,
                         stride_scratch,
                         NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                         HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_P: tl.constexpr,
                         BLOCK: tl.constexpr, WRITE_BLOCK: tl.constexpr,
                         OUT_BLOCK: tl.constexpr, SCORE: tl.constexpr,
                         ONE_BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // NUM_KV_HEADS).to(tl.int64)
    g = (pid % NUM_KV_HEADS).to(tl.int64)
    # the policy's budget (tokens, ``selection.selected_counts``), in whole pages
    pages, want, tokens = _row_want(Lengths, Budget, pid, NUM_KV_HEADS, NUM_KV_HEADS, n, PAGE)
    row_off = pid.to(tl.int64) * stride_scratch
    if SCORE:   # the page scores here (few pages); else _quest_scores_kernel wrote them
        for p0 in range(0, pages, BLOCK_P):
            _page_scores(Q, PMin, PMax, Scratch, b, g, row_off, p0, pages, stride_qb,
                         stride_qh, stride_pb, stride_pg, stride_pp, GROUP, HEAD_DIM, BLOCK_P)
    tl.debug_barrier()
    out_off = pid.to(tl.int64) * stride_out
    if ONE_BLOCK:   # the row's keys in registers: ranked, then the winners' pages listed
        page = tl.arange(0, BLOCK)
        valid = page < pages
        key = _key_of(Scratch, row_off, page, valid, pages, 0, 1)
        threshold, ties = _block_threshold(key, valid, want)
        take, rank, _, _ = _winners(key, valid, threshold, ties, 0, 0, want)
        tl.debug_barrier()   # every key read before the scratch row holds the list instead
        tl.store(Scratch + row_off + rank, page.to(tl.float32), mask=take)
        tl.debug_barrier()
        for first in range(0, capacity, OUT_BLOCK):   # each slot: its page's position
            slot = first + tl.arange(0, OUT_BLOCK)
            listed = slot < tokens
            chosen = tl.load(Scratch + row_off + slot // PAGE, mask=listed, other=0.0)
            position = chosen.to(tl.int32) * PAGE + slot % PAGE
            tl.store(Out + out_off + slot, tl.where(listed, position, 0),
                     mask=slot < capacity)
    else:
        # ---- the top pages (the newest always), their positions in order
        threshold, ties, _ = _radix_threshold(Scratch, row_off, pages, want, 0, 1, Scratch, 0,
                                              0, Scratch, 0, BLOCK, False, False)
        taken = tl.zeros([], tl.int32)
        tied = tl.zeros([], tl.int32)
        within = tl.arange(0, PAGE)
        for start in range(0, pages, WRITE_BLOCK):   # [WRITE_BLOCK, PAGE] positions a step
            page = start + tl.arange(0, WRITE_BLOCK)
            valid = page < pages
            key = _key_of(Scratch, row_off, page, valid, pages, 0, 1)
            take, rank, taken, tied = _winners(key, valid, threshold, ties, tied, taken, want)
            slot = rank[:, None] * PAGE + within[None, :]
            position = page[:, None] * PAGE + within[None, :]
            tl.store(Out + out_off + slot, position.to(tl.int32),
                     mask=take[:, None] & (slot < tokens))
        _zero_from(Out, out_off, tokens, capacity, OUT_BLOCK)
    tl.store(Counts + pid, tokens)


def chunked_path(rows: int, items: int, chunked: bool | None = None) -> bool:
    """Whether ``rows`` rows of ``items`` each are ranked over blocks of each row
    (``_chunked_select``) rather than one program per row: ``chunked`` where given, else by
    ``CHUNKED_FROM`` and ``CHUNKED_ROWS``."""
    if chunked is not None:
        return chunked
    return CHUNKED_FROM is not None and items > CHUNKED_FROM and rows <= CHUNKED_ROWS


def check_histogram(histogram: torch.Tensor, rows: int, name: str) -> None:
    """Raise ValueError unless ``histogram`` holds the first radix pass of ``rows`` rows as
    ``first_byte_histogram``'s counts are added into it: contiguous int32 [rows, 256]."""
    if (histogram.shape != (rows, 256) or not histogram.is_contiguous()
            or histogram.dtype != torch.int32):
        raise ValueError(f"{name} must be contiguous int32 [{rows}, 256]")


def _spill_capacity(items: int, capacity: int) -> int:
    """Keys a row of ``items`` may spill in one program per row (``SPILL_FROM``): a
    ``SPILL_SHARE`` of the row besides the ``capacity`` of its list (the winners above the
    candidates spill with them)."""
    if SPILL_FROM is None or items < SPILL_FROM:
        return 0
    return min(items, -(-items // SPILL_SHARE) + capacity)


def _chunk_shape(items: int, block: int | None, num_warps: int | None) -> tuple[int, int]:
    """A chunked program's block and warps (``CHUNKED_WIDE_FROM``), unless given."""
    wide = items >= CHUNKED_WIDE_FROM
    return block or (4096 if wide else 1024), num_warps or (8 if wide else 4)


def _row_shape(items: int, block: int | None, num_warps: int | None,
               wide_warps: int = 4) -> tuple[int, int]:
    """One program per row's block and warps, unless given: a row of at most
    ``ROW_BLOCK_MAX`` items in one block (the row rounded up to a power of two, at least 16),
    with ``wide_warps`` for a block over 1,024; longer rows in blocks of 1,024 with 4."""
    if block is None:
        block = max(16, triton.next_power_of_2(items)) if items <= ROW_BLOCK_MAX else 1024
    return block, num_warps or (wide_warps if block > 1024 else 4)


def radix_top_positions(score: torch.Tensor, lengths: torch.Tensor, counts: torch.Tensor,
                        capacity: int, keep_first: int = 0, keep_last: int = 0, *,
                        block: int | None = None, num_warps: int | None = None,
                        chunked: bool | None = None, spill: int | None = None,
                        first_histogram: torch.Tensor | None = None,
                        nonnegative: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's top ``counts`` positions of ``score`` [..., n] (fp32/fp16/bf16), ascending,
    as int32 [..., capacity] padded with 0, and the counts (int32). ``lengths`` [batch]: the
    leading dimension of ``score`` is the batch, rows past it share their sequence's length
    (e.g. one row per KV head). The first ``keep_first`` and last ``keep_last`` valid positions
    are always in; positions ≥ length never. ``counts`` [...] (or [batch]) are clamped to the
    length and must not exceed ``capacity``.

    The same sets as ``selection._finish(selection._top_positions(...), counts, ranked=True)``
    up to ties (here: the lowest positions), in one launch, or (``chunked``; default: few
    rows longer than ``CHUNKED_FROM``) in six over (row, block of ``block``) programs.
    ``block`` and ``num_warps`` default to ``_row_shape``'s in one program per row, to
    ``_chunk_shape``'s when chunked. ``spill``: keys per row that one program per row may
    copy its last candidates and the winners above them into, with their positions
    (``_radix_threshold``); 0: none; default ``_spill_capacity``. ``first_histogram``: int32
    [rows, 256], each row's histogram of its keys' top byte as the first radix pass makes it
    (``first_byte_histogram``), made by the kernel that wrote the scores; one program per row
    then skips that pass (the chunked path makes its own); another histogram gives other
    lists, never a write past the spill or the list. ``nonnegative``: no valid score is
    below +0 (NaN and −0 neither), and one program per row ranks by the keys whose first byte
    is the exponent (module doc; the chunked path by the usual ones: the same lists)."""
    n = score.shape[-1]
    lead = score.shape[:-1]
    batch = lengths.shape[0]
    rows = score.numel() // n
    if rows % batch:
        raise ValueError(f"{rows} score rows are not a multiple of the batch {batch}")
    counts = counts.to(torch.int32)
    if counts.shape != lead:
        counts = counts.reshape(batch, *([1] * (len(lead) - 1))).expand(lead)
    counts = counts.contiguous().reshape(rows)
    flat = score.reshape(rows, n)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    out = torch.empty(rows, capacity, dtype=torch.int32, device=score.device)
    lengths = lengths.to(torch.int32).contiguous()
    listed = torch.empty(rows, dtype=torch.int32, device=score.device)
    if chunked_path(rows, n, chunked):
        block, num_warps = _chunk_shape(n, block, num_warps)
        _chunked_select(flat, lengths, counts, out, listed, rows // batch, 1, keep_first,
                        keep_last, block=block, num_warps=num_warps)
    else:
        block, num_warps = _row_shape(n, block, num_warps)
        spill = _spill_capacity(n, capacity) if spill is None else spill
        # keys, then their positions; without a spill the kernel never reads its pointer:
        # ``out`` stands in for it
        spilled = torch.empty(rows * 2 * spill, dtype=torch.int32, device=score.device) \
            if spill else out
        first = first_histogram is not None
        if first:
            check_histogram(first_histogram, rows, "first_histogram")
        _radix_select_kernel[(rows,)](
            flat, lengths, counts, out, listed, spilled, first_histogram if first else out, n,
            flat.stride(0), out.stride(0), capacity, rows // batch, keep_first, keep_last, spill,
            BLOCK=block, OUT_BLOCK=_out_block(capacity), SPILL=spill > 0, FIRST=first,
            NONNEG=nonnegative, num_warps=num_warps)
    return out.view(*lead, capacity), listed.view(lead)


def quest_select_fused(q: torch.Tensor, page_min: torch.Tensor, page_max: torch.Tensor,
                       lengths: torch.Tensor, budget: torch.Tensor, *, max_context: int,
                       page_size: int, capacity: int, block_pages: int | None = None,
                       block: int | None = None, split: bool | None = None,
                       num_warps: int | None = None, chunked: bool | None = None,
                       one_block: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quest's selection in one or two launches per call: page scores from the draft query ``q``
    [batch, heads, head_dim] and the page bounds [batch, kv_heads, ≥ pages, head_dim], the
    top ``ceil(budget / page)`` pages (the newest always; ``budget`` [batch]: tokens, as
    ``selection.selected_counts`` gives them) by radix select, written as their
    positions in ascending order, the newest page cut at the length; int32 [batch, kv_heads,
    capacity] padded with 0, and the counts [batch, kv_heads]. The same lists as
    ``selection.quest_select`` (which makes ~25 launches for it), up to ties.

    ``split`` (default: when a row has more than ``SPLIT_PAGES`` pages): score the pages in a
    first launch over (row, block of pages) programs, then rank and write in a second, one
    program per row, or (``chunked``; default: few rows of more than ``CHUNKED_FROM`` pages)
    by ``_chunked_select`` over (row, block of ``block`` pages); else one launch, each row's
    program scoring its own pages. ``one_block`` (default: rows of at most
    ``QUEST_ONE_BLOCK_MAX`` pages unless ``chunked``, before the chunked path's default):
    one program per row ranks the row's keys held in registers (``block``, at least the
    row's pages, defaults to the pages rounded up to a power of two); ``chunked=True`` with
    it asked for too: chunked.

    CUDA-graph capturable: every input is already on the device (a copy from the host at each
    call is what a capturing stream refuses)."""
    batch, heads, head_dim = q.shape
    kv_heads = page_min.shape[1]
    pages = -(-max_context // page_size)
    # a [pages × head_dim] tile of each bound in registers: ~4K elements each
    block_pages = block_pages or max(16, 4096 // head_dim)
    if page_min.stride(-1) != 1 or page_max.stride() != page_min.stride():
        raise ValueError("page bounds must share one layout with a contiguous last dimension")
    q = q if q.stride(-1) == 1 else q.contiguous()
    scratch = torch.empty(batch * kv_heads, max(pages, 1), dtype=torch.float32,
                          device=q.device)
    out = torch.empty(batch * kv_heads, capacity, dtype=torch.int32, device=q.device)
    counts = torch.empty(batch * kv_heads, dtype=torch.int32, device=q.device)
    lengths = lengths.to(torch.int32).contiguous()
    split = pages > SPLIT_PAGES if split is None else split
    if one_block is None:
        one_block = not chunked and QUEST_ONE_BLOCK_MAX is not None \
            and pages <= QUEST_ONE_BLOCK_MAX
    if one_block:
        block = block or max(16, triton.next_power_of_2(pages))
        if block < pages:
            raise ValueError(f"one_block needs a block of at least the row's {pages} pages")
    layout = (q.stride(0), q.stride(1), page_min.stride(0), page_min.stride(1),
              page_min.stride(2))
    if split:
        _quest_scores_kernel[(batch * kv_heads, triton.cdiv(pages, block_pages))](
            q, page_min, page_max, lengths, scratch, *layout, scratch.stride(0),
            NUM_KV_HEADS=kv_heads, GROUP=heads // kv_heads, HEAD_DIM=head_dim,
            PAGE=page_size, BLOCK_P=block_pages, num_warps=4)
        if chunked_path(batch * kv_heads, pages,
                        False if one_block and chunked is None else chunked):
            block, num_warps = _chunk_shape(pages, block, num_warps)
            _chunked_select(scratch, lengths, budget.contiguous(), out, counts, kv_heads,
                            kv_heads, 0, 1, page=page_size, block=block, num_warps=num_warps)
            return out.view(batch, kv_heads, capacity), counts.view(batch, kv_heads)
    block, num_warps = _row_shape(pages, block, num_warps, wide_warps=8)
    _quest_select_kernel[(batch * kv_heads,)](
        q, page_min, page_max, lengths, budget.contiguous(), scratch, out, counts, capacity,
        scratch.shape[1], *layout, out.stride(0), scratch.stride(0),
        NUM_KV_HEADS=kv_heads, GROUP=heads // kv_heads, HEAD_DIM=head_dim, PAGE=page_size,
        BLOCK_P=block_pages, BLOCK=block, WRITE_BLOCK=min(block, QUEST_WRITE_PAGES),
        OUT_BLOCK=_out_block(capacity), SCORE=not split, ONE_BLOCK=one_block,
        num_warps=num_warps)
    return out.view(batch, kv_heads, capacity), counts.view(batch, kv_heads)


@triton.jit
def first_byte_histogram(key, valid):
    """The first radix pass's 256-bin histogram of ``key`` (``key_bits``) where ``valid``."""
    digit, match = _digit(key, valid, 0, 0)
    return tl.histogram(digit, 256, mask=match)


__all__ = ["check_histogram", "first_byte_histogram", "key_bits", "quest_select_fused",
           "radix_top_positions"]
