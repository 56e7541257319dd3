"""KV cache bookkeeping and the selection policies against brute-force definitions.

Runs on the GPU when there is one (fp32 inputs either way, so rankings are tie-free and exact),
else on the CPU with the one Triton kernel here (attention mass) in the interpreter.
"""
import math
import os

import torch

if not torch.cuda.is_available():  # before triton kernels are defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import seeding  # noqa: E402

from specsim.kernels import (KVCache, append_positions, attention_mass,  # noqa: E402
                             attention_mass_reference, page_bounds_reference, picked_row_sum,
                             picked_row_sum_reference, quest_select,
                             selected_counts, sparsespec_select, streamingllm_select,
                             vegas_select)
from specsim.policies import POLICIES, get_policy  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_generator(offset):
    """Fresh inputs every run (``seeding``), distinct per case."""
    return seeding.generator(offset, DEVICE)


def lists_as_sets(indices, counts):
    """Python sets of each list's valid entries, after checking sorted, unique, padded."""
    flat_indices = indices.reshape(-1, indices.shape[-1]).cpu()
    flat_counts = counts.reshape(-1).cpu()
    sets = []
    for row, n in zip(flat_indices, flat_counts):
        valid = row[:int(n)]
        assert torch.all(valid[1:] > valid[:-1]), "not sorted / duplicates"
        assert torch.all(row[int(n):] == 0), "padding not zero"
        sets.append(set(valid.tolist()))
    return sets


def test_selected_counts_match_policy_rule():
    contexts = [1, 2, 15, 16, 17, 255, 256, 300, 4097, 131072]
    lengths = torch.tensor(contexts, dtype=torch.int32, device=DEVICE)
    for policy in POLICIES.values():
        for s in (0.01, 0.07, 0.3, 1.0):
            expected = [policy.selected(c, s) for c in contexts]
            assert selected_counts(policy, lengths, s).tolist() == expected, policy.name


# -- KV cache -------------------------------------------------------------------------------

@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("paged", [True, False])
def test_kv_cache_append_rollback_and_page_bounds(fused, paged):
    """Ragged writes, rollbacks, runs of single-position writes (the draft and plain steps)
    and of equal multi-row writes (verify passes; with ``fused_append`` one kernel writes
    the rows, K and V each read by its own strides, and updates the page bounds
    incrementally) keep the rows and the exact page bounds of the valid positions, across
    page boundaries."""
    batch, kv_heads, max_len, head_dim, page = 3, 2, 90, 8, 16
    generator = make_generator(0)
    cache = KVCache(batch, kv_heads, max_len, head_dim, num_layers=2, dtype=torch.float32,
                    device=DEVICE, page_size=page if paged else None, fused_append=fused)
    shadow_k = torch.zeros(2, batch, kv_heads, max_len, head_dim, device=DEVICE)
    shadow_v = shadow_k.clone()
    shadow_len = [0] * batch

    def step(counts):
        n = max(counts)
        counts_t = torch.tensor(counts, dtype=torch.int32, device=DEVICE)
        cache.extend(counts_t)
        for layer in range(2):
            k_new = torch.randn(batch, kv_heads, n, head_dim, generator=generator, device=DEVICE)
            v_new = torch.randn(batch, kv_heads, n, head_dim, generator=generator, device=DEVICE)
            cache.write(layer, k_new, v_new, counts_t)
            for b, c in enumerate(counts):
                shadow_k[layer, b, :, shadow_len[b]:shadow_len[b] + c] = k_new[b, :, :c]
                shadow_v[layer, b, :, shadow_len[b]:shadow_len[b] + c] = v_new[b, :, :c]
        for b, c in enumerate(counts):
            shadow_len[b] += c

    def singles(steps, n=1):
        for _ in range(steps):
            cache.extend(n)
            for layer in range(2):
                # strided views, as the model hands over its projections: K [b, n, h, d]
                # (its rotated copy), V a slice of the fused q|k|v output's columns
                k_new = torch.randn(batch, n, kv_heads, head_dim, generator=generator,
                                    device=DEVICE).transpose(1, 2)
                qkv = torch.randn(batch, n, 3 * kv_heads, head_dim, generator=generator,
                                  device=DEVICE)
                v_new = qkv[:, :, 2 * kv_heads:].transpose(1, 2)
                cache.write(layer, k_new, v_new)
                for b in range(batch):
                    shadow_k[layer, b, :, shadow_len[b]:shadow_len[b] + n] = k_new[b]
                    shadow_v[layer, b, :, shadow_len[b]:shadow_len[b] + n] = v_new[b]
            for b in range(batch):
                shadow_len[b] += n

    def check():
        assert cache.lengths.tolist() == shadow_len
        for layer in range(2):
            for b, length in enumerate(shadow_len):
                assert torch.equal(cache.k(layer)[b, :, :length], shadow_k[layer, b, :, :length])
                assert torch.equal(cache.v(layer)[b, :, :length], shadow_v[layer, b, :, :length])
            if not paged:
                continue
            low, high = cache.pages(layer)
            ref_low, ref_high = page_bounds_reference(cache.k(layer), cache.lengths, page)
            for b, length in enumerate(shadow_len):
                pages = math.ceil(length / page)
                assert torch.equal(low[b, :, :pages], ref_low[b, :, :pages])
                assert torch.equal(high[b, :, :pages], ref_high[b, :, :pages])

    step([17, 1, 33])   # ragged prefill
    check()
    step([9, 9, 9])     # a verify pass of q = 9
    check()
    rejected = torch.tensor([5, 0, 9], dtype=torch.int32, device=DEVICE)
    cache.rollback(rejected)
    shadow_len = [n - r for n, r in zip(shadow_len, rejected.tolist())]
    check()
    step([16, 3, 20])
    check()
    step([0, 5, 2])     # a sequence with nothing to add
    check()
    cache.rollback(2)
    shadow_len = [n - 2 for n in shadow_len]
    check()
    singles(13)         # lengths 35, 16, 53 → 48, 29, 66: each crosses or starts a page
    check()
    rejected = torch.tensor([4, 13, 1], dtype=torch.int32, device=DEVICE)
    cache.rollback(rejected)
    shadow_len = [n - r for n, r in zip(shadow_len, rejected.tolist())]
    check()
    singles(6)
    check()
    singles(2, n=9)     # verify passes of q = 9: lengths 50, 22, 71 → 68, 40, 89
    check()
    cache.rollback(torch.tensor([7, 2, 0], dtype=torch.int32, device=DEVICE))
    shadow_len = [n - r for n, r in zip(shadow_len, (7, 2, 0))]
    check()
    singles(1, n=1)
    check()


def test_kv_cache_append_one_layer():
    cache = KVCache(2, 1, 8, 4, dtype=torch.float32, device=DEVICE)
    rows = torch.arange(2 * 3 * 4, dtype=torch.float32, device=DEVICE).view(2, 1, 3, 4)
    cache.append(rows, -rows)
    cache.rollback(torch.tensor([1, 2], dtype=torch.int32, device=DEVICE))
    cache.append(rows[:, :, :1] + 100, rows[:, :, :1])
    assert cache.lengths.tolist() == [3, 2]
    assert torch.equal(cache.k()[0, 0, 2], rows[0, 0, 0] + 100)
    assert torch.equal(cache.k()[1, 0, :2], torch.stack([rows[1, 0, 0], rows[1, 0, 0] + 100]))


# -- policies -------------------------------------------------------------------------------

LENGTHS = [1, 40, 300, 1000]
MAX_LEN = 1003


@pytest.mark.parametrize("ranking", ["topk", "radix"])
def test_vegas_select_matches_definition(ranking):
    batch, heads, rows, s = len(LENGTHS), 4, 2, 0.1
    logits = torch.randn(batch, heads, rows, MAX_LEN, generator=make_generator(1),
                         device=DEVICE)
    logits[..., -3:] = float("nan")            # past every length: must be ignored
    lengths = torch.tensor(LENGTHS, dtype=torch.int32, device=DEVICE)
    policy = get_policy("vegas")
    indices, counts = vegas_select(logits, lengths, s, max_context=1000, ranking=ranking)
    for b, (got, length) in enumerate(zip(lists_as_sets(indices, counts), LENGTHS)):
        recent = set(range(max(0, length - policy.recent), length))
        score = logits[b, :, :, :length].mean(dim=(0, 1))
        ranked = [int(n) for n in score.argsort(descending=True) if int(n) not in recent]
        top = max(math.ceil(s * length), policy.min_selected)
        assert got == recent | set(ranked[:top])
        assert len(got) == policy.selected(length, s)


def test_attention_mass_matches_reference():
    batch, heads, kv_heads, window = 3, 4, 2, 3
    lengths = torch.tensor([1, 700, 1000], dtype=torch.int32, device=DEVICE)
    logits = torch.randn(batch, heads, window, 1000, generator=make_generator(2), device=DEVICE)
    lse = torch.randn(batch, heads, window, generator=make_generator(3), device=DEVICE) + 7.0
    mass = attention_mass(logits, lse, lengths, kv_heads)
    ref = attention_mass_reference(logits, lengths, kv_heads, lse)
    for b, length in enumerate(lengths.tolist()):
        torch.testing.assert_close(mass[b, :, :length], ref[b, :, :length], rtol=1e-5,
                                   atol=1e-6)


def test_attention_mass_makes_the_rankings_first_radix_pass():
    """With ``histogram``, each (sequence, KV head) row's first radix pass over the mass it
    wrote (the top byte of its exponent-first keys, the kept first and last positions the
    largest), added up over the row's blocks (1000 positions: several blocks of 256),
    nothing past a length or past the buffer (a length of 1200 over 1000 positions), none
    for an empty row."""
    from test_kernels_topk import first_histogram
    batch, heads, kv_heads, window = 4, 4, 2, 3
    lengths = torch.tensor([0, 1, 700, 1200], dtype=torch.int32, device=DEVICE)
    logits = torch.randn(batch, heads, window, 1000, generator=make_generator(5),
                         device=DEVICE) * 4
    lse = torch.logsumexp(logits, -1)
    hist = torch.zeros(batch * kv_heads, 256, dtype=torch.int32, device=DEVICE)
    mass = attention_mass(logits, lse, lengths, kv_heads, block=256, histogram=hist,
                          keep_first=4, keep_last=16)
    for b, length in enumerate(lengths.tolist()):
        mass[b, :, length:] = 0.0                                    # unset past the length
    want = first_histogram(mass, lengths, 4, 16, nonnegative=True)
    assert torch.equal(hist, want)
    assert hist.sum(1).tolist() == [0, 0, 1, 1, 700, 700, 1000, 1000]


@pytest.mark.parametrize("bad", ["rows", "dtype", "layout"])
def test_a_histogram_of_the_wrong_form_is_refused_by_both_ends(bad):
    """The mass pass and the ranking take the first pass only as contiguous int32 [rows,
    256], each naming its argument: a wrong row count, an int64 buffer, a transposed view."""
    from specsim.kernels.topk_select import radix_top_positions
    lengths = torch.tensor([50, 64], dtype=torch.int32, device=DEVICE)
    logits = torch.randn(2, 4, 3, 64, generator=make_generator(7), device=DEVICE)
    rows = 2 * 2
    hist = {"rows": torch.zeros(rows + 1, 256, dtype=torch.int32),
            "dtype": torch.zeros(rows, 256, dtype=torch.int64),
            "layout": torch.zeros(256, rows, dtype=torch.int32).t()}[bad].to(DEVICE)
    with pytest.raises(ValueError, match=r"^histogram must be contiguous int32 \[4, 256\]$"):
        attention_mass(logits, torch.logsumexp(logits, -1), lengths, 2, histogram=hist)
    with pytest.raises(ValueError,
                       match=r"^first_histogram must be contiguous int32 \[4, 256\]$"):
        radix_top_positions(logits[:, :2, 0], lengths, torch.tensor([5, 5], device=DEVICE),
                            16, chunked=False, first_histogram=hist)


@pytest.mark.parametrize("summer", [picked_row_sum, picked_row_sum_reference])
def test_picked_row_sum_is_each_lists_row_summed_over_heads(summer):
    """Each list's picked row summed over every head (12: not a multiple of the kernel's head
    block), read from a slice of a larger buffer as the engine passes it; a pick past the
    collected rows takes the last; 0 past each length, whatever the buffer holds there."""
    lists, heads, rows, n, max_context = 4, 12, 3, 2500, 2100
    buffer = torch.randn(lists, heads, rows + 2, n, generator=make_generator(30),
                         device=DEVICE).half()
    lengths = torch.tensor([1, 1024, 1025, 2100], dtype=torch.int32, device=DEVICE)
    for b, length in enumerate(lengths.tolist()):
        buffer[b, :, :, length:] = float("nan")           # stale entries past the length
    logits = buffer[:, :, :rows]
    pick = torch.tensor([0, 2, 1, 7], device=DEVICE)
    out = summer(logits, pick, lengths, max_context)
    assert out.shape == (lists, 1, 1, max_context) and out.dtype == torch.float32
    for b, length in enumerate(lengths.tolist()):
        row = min(int(pick[b]), rows - 1)
        want = logits[b, :, row, :length].double().sum(0)
        torch.testing.assert_close(out[b, 0, 0, :length].double(), want, rtol=1e-5, atol=1e-4)
        assert torch.all(out[b, 0, 0, length:] == 0)


def test_last_token_ranks_its_picked_row_as_vegas_ranks_one_row():
    """The summed row ranks as the row itself would: same lists as Vegas on that one row."""
    lists, heads, rows = len(LENGTHS), 4, 3
    logits = torch.randn(lists, heads, rows, MAX_LEN, generator=make_generator(31),
                         device=DEVICE)
    lengths = torch.tensor(LENGTHS, dtype=torch.int32, device=DEVICE)
    pick = torch.tensor([2, 0, 1][:lists] + [1] * max(0, lists - 3), device=DEVICE)
    summed = picked_row_sum(logits, pick, lengths, 1000)
    one_row = torch.stack([logits[b, :, int(pick[b])] for b in range(lists)])[:, :, None]
    got = vegas_select(summed, lengths, 0.1, max_context=1000, ranking="topk")
    want = vegas_select(one_row, lengths, 0.1, max_context=1000, ranking="topk")
    assert lists_as_sets(*got) == lists_as_sets(*want)


@pytest.mark.parametrize("ranking,chunked", [("topk", None), ("radix", None),
                                             ("radix", True)])
def test_sparsespec_select_matches_definition(ranking, chunked):
    """Every ranking: the radix kernel one program per row (its first pass made by the mass
    pass) and over blocks of each row."""
    batch, heads, kv_heads, window, s = len(LENGTHS), 4, 2, 16, 0.2
    logits = torch.randn(batch, heads, window, MAX_LEN, generator=make_generator(4),
                         device=DEVICE) * 3
    lengths = torch.tensor(LENGTHS, dtype=torch.int32, device=DEVICE)
    policy = get_policy("sparsespec")
    indices, counts = sparsespec_select(logits, lengths, s, kv_heads, max_context=1000,
                                        ranking=ranking, chunked=chunked)
    assert indices.shape[:2] == (batch, kv_heads)
    sets = lists_as_sets(indices, counts)
    for b, length in enumerate(LENGTHS):
        weight = torch.softmax(logits[b, :, :, :length].double(), dim=-1)     # [h, w, n]
        budget = policy.selected(length, s)
        for g in range(kv_heads):
            mass = weight[g * 2:(g + 1) * 2].sum(dim=(0, 1))
            forced = set(range(min(policy.sink, length))) | set(
                range(max(0, length - policy.recent), length))
            ranked = [int(n) for n in mass.argsort(descending=True) if int(n) not in forced]
            expected = forced | set(ranked[:max(0, budget - len(forced))])
            assert sets[b * kv_heads + g] == expected


@pytest.mark.parametrize("chunked", [False, True])
def test_sparsespec_hands_the_mass_pass_histogram_to_one_program_per_row(chunked,
                                                                        monkeypatch):
    """One program per row is given the first radix pass of the very mass it ranks (the
    numpy histogram of it); the chunked path, which makes its own, is given none."""
    from test_kernels_topk import first_histogram

    from specsim.kernels import selection
    given_to = []
    real = selection.radix_top_positions

    def spy(score, lengths, counts, capacity, keep_first, keep_last, **kw):
        given_to.append((score.clone(), kw["first_histogram"], keep_first, keep_last))
        return real(score, lengths, counts, capacity, keep_first, keep_last, **kw)
    monkeypatch.setattr(selection, "radix_top_positions", spy)
    logits = torch.randn(len(LENGTHS), 4, 16, MAX_LEN, generator=make_generator(6),
                         device=DEVICE) * 3
    lengths = torch.tensor(LENGTHS, dtype=torch.int32, device=DEVICE)
    sparsespec_select(logits, lengths, 0.2, 2, max_context=1000, ranking="radix",
                      chunked=chunked)
    (mass, hist, keep_first, keep_last), = given_to
    if chunked:
        assert hist is None
    else:
        assert torch.equal(hist, first_histogram(mass, lengths, keep_first, keep_last, True))


@pytest.mark.skipif(DEVICE != "cuda", reason="realistic shapes: on a GPU")
def test_sparsespec_first_pass_from_the_mass_pass_at_qwen3_8b_shapes_on_the_gpu():
    """Qwen3-8B's shapes (32 query / 8 KV heads, 3 rows each, s = 0.03) over 33K positions
    (the spill taken), ragged lengths: one program per row, its first pass made by the mass
    pass's atomics over 33 blocks a row, lists the chunked path's (which makes its own), the
    same counts as torch.topk's; replayed in a CUDA graph, the same again."""
    g = make_generator(9)
    n, kv_heads = 33000, 8
    lengths = torch.tensor([n, n - 999, 16385, 4097, 20000, 1, 32768, 30001],
                           dtype=torch.int32, device=DEVICE)
    logits = (torch.randn(len(lengths), 32, 3, n, generator=g, device=DEVICE) * 3).bfloat16()
    lse = torch.logsumexp(logits.float(), -1)

    def run(chunked, ranking="radix"):
        return sparsespec_select(logits, lengths, 0.03, kv_heads, lse=lse, ranking=ranking,
                                 chunked=chunked)
    fused, chunked, topk = run(False), run(True), run(None, "topk")
    assert torch.equal(fused[1], chunked[1]) and torch.equal(fused[1], topk[1].int())
    assert lists_as_sets(*fused) == lists_as_sets(*chunked)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run(False)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = run(False)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed[0], fused[0]) and torch.equal(replayed[1], fused[1])


def test_streamingllm_select():
    lengths = torch.tensor(LENGTHS, dtype=torch.int32, device=DEVICE)
    policy = get_policy("streamingllm")
    indices, counts = streamingllm_select(lengths, 0.05, max_context=1000)
    for got, length in zip(lists_as_sets(indices, counts), LENGTHS):
        budget = policy.selected(length, 0.05)
        window = budget - min(policy.sink, budget)
        expected = set(range(min(policy.sink, length))) | set(range(length - window, length))
        assert got == expected and len(got) == budget


@pytest.mark.parametrize("s,ranking", [(0.05, "topk"), (0.5, "topk"), (1.0, "topk"),
                                       (0.05, "radix"), (1.0, "radix")])
def test_quest_select_matches_definition(s, ranking):
    batch, heads, kv_heads, head_dim, page = len(LENGTHS), 4, 2, 8, 16
    generator = make_generator(5)
    keys = torch.randn(batch, kv_heads, MAX_LEN, head_dim, generator=generator, device=DEVICE)
    lengths = torch.tensor(LENGTHS, dtype=torch.int32, device=DEVICE)
    low, high = page_bounds_reference(keys, lengths, page)
    q = torch.randn(batch, heads, head_dim, generator=generator, device=DEVICE)
    policy = get_policy("quest")
    indices, counts = quest_select(q, low, high, lengths, s, max_context=1000, ranking=ranking)
    sets = lists_as_sets(indices, counts)
    for b, length in enumerate(LENGTHS):
        pages = math.ceil(length / page)
        keep = min(pages, math.ceil(policy.selected(length, s) / page))
        for g in range(kv_heads):
            qg = q[b, g * 2:(g + 1) * 2]                                        # [heads, d]
            bound = torch.maximum(qg[:, None] * low[b, g, None, :pages],
                                  qg[:, None] * high[b, g, None, :pages]).sum(-1)
            score = bound.amax(0)
            others = [int(p) for p in score[:pages - 1].argsort(descending=True)]
            chosen = set(others[:keep - 1]) | {pages - 1}
            expected = {n for p in chosen for n in range(p * page, min(length, (p + 1) * page))}
            assert sets[b * kv_heads + g] == expected


def test_append_positions():
    indices = torch.zeros(2, 3, 5, dtype=torch.int32, device=DEVICE)
    counts = torch.tensor([[0, 1, 2], [4, 4, 4]], dtype=torch.int32, device=DEVICE)
    append_positions(indices, counts, torch.tensor([7, 9], device=DEVICE))
    assert counts.tolist() == [[1, 2, 3], [5, 5, 5]]
    assert indices[0, :, :].tolist() == [[7, 0, 0, 0, 0], [0, 7, 0, 0, 0], [0, 0, 7, 0, 0]]
    assert indices[1, :, 4].tolist() == [9, 9, 9]
    flat = torch.zeros(1, 3, dtype=torch.int32, device=DEVICE)
    flat_counts = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    append_positions(flat, flat_counts, torch.tensor([5], device=DEVICE))
    assert flat.tolist() == [[0, 5, 0]] and flat_counts.tolist() == [2]
