"""The proxy check (Collect-2-Query's top-K against the top-K by all k+1 verify rows) and the
vegas-all policy in the engine.

- ``proxy_overlap`` on hand-built logits whose two top-K sets, overlap and per-distance-band
  counts are known exactly; head and row sums rank like head averages; trivial budgets.
- vegas-all is greedy-lossless on a tiny random model (ragged batch, sparse budgets), and its
  lists are exactly the recent window plus the top-K by all rows of the last verify.
- The proxy check changes nothing in the run it measures, and its records are consistent with
  the trace; it refuses policies it does not apply to.
"""
import numpy as np
import pytest
import torch

from specsim.engine import Engine, build_model, plain_decode, speculative_decode
from specsim.engine.selection import ProxyRecords, proxy_overlap
from specsim.errors import SpecsimError
from specsim.policies import Policy

TINY = dict(model_type="qwen3", vocab_size=256, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
            max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=False)

SMALL = {name: Policy(name, min_selected=8, recent=4, collected_rows=rows,
                      budget_includes_recent=False)
         for name, rows in (("vegas", 2), ("vegas-all", 0))}


# --------------------------------------------------------------------------------------------
# the overlap on hand-built logits
# --------------------------------------------------------------------------------------------


def hand_logits() -> torch.Tensor:
    """One list, q = 3 rows, 10 keys (L = 10, recent = 2: keys 0..7 ranked), two heads that
    each carry half of every value.

    rows 1 + 2 (Collect-2-Query): 0.1 0.2 0.3 0.4 0.5 2.6 2.7 2.8 | 9 9   → top-3 {5, 6, 7}
    row 0:                         5.0 5.1 0   0   0   0   0  -5.0 | 0 0
    all rows:                      5.1 5.3 0.3 0.4 0.5 2.6 2.7 -2.2      → top-3 {0, 1, 6}
    """
    pair = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 2.6, 2.7, 2.8, 9.0, 9.0])
    row0 = torch.tensor([5.0, 5.1, 0, 0, 0, 0, 0, -5.0, 0, 0])
    rows = torch.stack([row0, pair * 0.25, pair * 0.75])             # [q, n]
    return torch.stack([rows / 2, rows / 2])[None]                  # [1, H=2, q, n]


def test_overlap_of_hand_built_rankings():
    stats = proxy_overlap(hand_logits(), torch.tensor([10]), pair=(1, 2), q_len=3,
                          budget=torch.tensor([3]), recent=2, bands=(3, 6))
    # A = {5, 6, 7}, B = {0, 1, 6}: A ∩ B = {6}
    assert stats["overlap"].tolist() == pytest.approx([1 / 3])
    assert stats["budget"].tolist() == [3] and stats["eligible"].tolist() == [8]
    assert stats["trivial"].tolist() == [False]
    # distance d = 10 − n; bands d ≤ 3, 4..6, > 6:  7 → 0;  4, 5, 6 → 1;  0..3 → 2
    assert stats["pair_picks"].tolist() == [[1, 2, 0]]     # 7 (d 3), 6 (d 4), 5 (d 5)
    assert stats["all_picks"].tolist() == [[0, 1, 2]]      # 6 (d 4), 1 (d 9), 0 (d 10)
    assert stats["shared"].tolist() == [[0, 1, 0]]         # 6


def test_overlap_budget_variants_and_batching():
    logits = hand_logits().repeat(4, 1, 1, 1)
    stats = proxy_overlap(logits, torch.tensor([10, 10, 10, 10]), pair=(1, 2), q_len=3,
                          budget=torch.tensor([1, 5, 8, 20]), recent=2, bands=(3, 6))
    # K = 1: {7} vs {1}; K = 5: {3,4,5,6,7} vs {0,1,4,5,6}; K ≥ 8: everything (trivial)
    assert stats["overlap"].tolist() == pytest.approx([0.0, 3 / 5, 1.0, 1.0])
    assert stats["budget"].tolist() == [1, 5, 8, 8]
    assert stats["trivial"].tolist() == [False, False, True, True]
    # the recent window is never counted, even when the budget exceeds the ranked keys
    assert stats["all_picks"].sum(-1).tolist() == [1, 5, 8, 8]


def test_overlap_ignores_keys_past_the_length_and_uses_all_q_rows_only():
    logits = hand_logits()
    extra = torch.zeros(1, 2, 1, 10)                       # a stale 4th row in the buffer
    extra[..., 4:6] = 100.0                                # (counted, it would pick {4, 5})
    logits = torch.cat([logits, extra], dim=2)
    # L = 8: keys 0..5 ranked (recent 2), keys 6 and 7 are in the window now
    stats = proxy_overlap(logits, torch.tensor([8]), pair=(1, 2), q_len=3,
                          budget=torch.tensor([2]), recent=2, bands=(3, 6))
    # rows 1+2 over keys 0..5: top-2 {4, 5}; rows 0..2: top-2 {0, 1}
    assert stats["overlap"].tolist() == [0.0]
    assert stats["eligible"].tolist() == [6]


# --------------------------------------------------------------------------------------------
# vegas-all and the proxy check in the engine
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    return build_model(TINY, seed=1, std=0.1)


@pytest.fixture(scope="module")
def ragged():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (300, 341, 397)]


@pytest.fixture(scope="module")
def plain(tiny, ragged):
    return plain_decode(tiny, ragged, 24).tokens


@pytest.mark.parametrize("policy", ["vegas-all", SMALL["vegas-all"]])
def test_vegas_all_greedy_lossless(tiny, ragged, plain, policy):
    for k, s in ((1, 0.05), (4, 0.1), (7, 0.5)):
        result = speculative_decode(tiny, ragged, 24, policy=policy, k=k, s=s)
        assert result.tokens == plain, (k, s)
        assert result.traces[0].policy == "vegas-all"


def test_vegas_all_lists_are_the_top_k_of_all_rows(tiny, ragged):
    k, s, policy = 5, 0.1, SMALL["vegas-all"]
    engine = Engine(tiny, batch=3, max_len=448, policy=policy, s=s, k_max=k)
    engine.generate(ragged, 16, k=k)
    selection, lengths = engine.selection, engine.cache.lengths.tolist()
    for layer in range(TINY["num_hidden_layers"]):
        for b, length in enumerate(lengths):
            count = int(selection.counts[layer, b])
            chosen = set(selection.indices[layer, b, :count].tolist())
            score = selection.logits[layer, b, :, :k + 1, :length - policy.recent].sum((0, 1))
            budget = policy.selected(length, s) - policy.recent
            top = set(torch.topk(score, budget).indices.tolist())
            recent = set(range(length - policy.recent, length))
            assert chosen == top | recent, (layer, b)


@pytest.mark.parametrize("name", ["vegas", "vegas-all"])
def test_proxy_check_changes_nothing_and_records_every_verify(tiny, ragged, plain, name):
    for k, s in ((3, 0.05), (6, 0.2)):
        off = speculative_decode(tiny, ragged, 24, policy=SMALL[name], k=k, s=s)
        on = speculative_decode(tiny, ragged, 24, policy=SMALL[name], k=k, s=s,
                                proxy_check=True)
        assert off.proxy is None and isinstance(on.proxy, ProxyRecords)
        assert on.tokens == off.tokens == plain
        assert [t.m.tolist() for t in on.traces] == [t.m.tolist() for t in off.traces]
        records = on.proxy
        assert len(records) == sum(t.iterations for t in on.traces)
        for b, trace in enumerate(on.traces):
            mine = [i for i, seq in enumerate(records.sequence) if seq == b]
            assert [records.iteration[i] for i in mine] == list(range(trace.iterations))
            # the selection after iteration i is made at the context of iteration i + 1
            after = [records.context[i] for i in mine]
            assert after[:-1] == trace.context[1:].tolist()
            assert after[-1] == trace.context[-1] + trace.m[-1] + 1
        overlap = np.array(records.overlap)
        assert overlap.shape == (len(records), TINY["num_hidden_layers"])
        assert np.all((overlap >= 0) & (overlap <= 1)) and 0 < overlap.mean() < 1
        shared, picks = np.array(records.shared), np.array(records.all_picks)
        assert np.all(shared <= picks) and np.all(shared <= np.array(records.pair_picks))
        assert np.all(picks.sum(-1) == np.array(records.budget)[:, None])
        assert np.allclose(shared.sum(-1) / np.array(records.budget)[:, None], overlap)
        assert "proxy" in on.timing and "proxy" not in off.timing


def test_full_budget_is_trivial(tiny, ragged):
    result = speculative_decode(tiny, ragged, 8, policy="vegas", k=3, s=0.05,
                                proxy_check=True)   # L < 256 + 32 + … : every key chosen
    short = speculative_decode(tiny, [p[:200] for p in ragged], 8, policy="vegas", k=3,
                               s=0.05, proxy_check=True)
    assert short.proxy.trivial.all()
    assert np.allclose(np.array(short.proxy.overlap), 1.0)
    assert not result.proxy.trivial.any()


def test_proxy_check_only_for_vegas_rules(tiny):
    with pytest.raises(SpecsimError, match="proxy check"):
        Engine(tiny, batch=1, max_len=100, policy="quest", proxy_check=True)


def test_proxy_check_through_triton_kernels():
    """The GPU path's verify kernel writes all rows into the proxy buffer (interpreter)."""
    config = dict(TINY, head_dim=64, num_attention_heads=2, num_key_value_heads=1,
                  vocab_size=128)
    model = build_model(config, seed=2, std=0.1)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (70, 93)]
    expected = plain_decode(model, prompts, 8).tokens
    kernels = speculative_decode(model, prompts, 8, policy=SMALL["vegas"], k=3, s=0.3,
                                 use_triton=True, proxy_check=True)
    torch_path = speculative_decode(model, prompts, 8, policy=SMALL["vegas"], k=3, s=0.3,
                                    proxy_check=True)
    assert kernels.tokens == torch_path.tokens == expected
    assert np.allclose(np.array(kernels.proxy.overlap), np.array(torch_path.proxy.overlap),
                       atol=0.05)


def test_last_token_refresh_ranks_each_sequences_own_row():
    """last-token's refresh takes, per sequence, the collected row of its last accepted token
    (``last_row``) in every layer: the lists equal Vegas' selection over that row alone."""
    import torch

    from specsim.engine import attention
    from specsim.engine.selection import DraftSelection
    from specsim.kernels.selection import vegas_select
    from specsim.policies import get_policy

    layers, batch, heads, kv, n, rows = 3, 4, 4, 2, 700, 5
    backend = attention.AttentionBackend(torch.device("cpu"), num_heads=heads, num_kv_heads=kv,
                                         head_dim=16, batch=batch, max_len=n, use_triton=False)
    sel = DraftSelection("last-token", 0.1, num_layers=layers, batch=batch, num_heads=heads,
                         num_kv_heads=kv, max_len=n, k_max=rows - 1, backend=backend,
                         logits_dtype=torch.float32, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**30, (1,))))
    sel.logits.copy_(torch.randn(sel.logits.shape, generator=g))
    lengths = torch.tensor([700, 650, 400, 699])
    last = torch.tensor([0, 4, 2, 3])
    sel.refresh(lengths, rows, last)
    policy = get_policy("last-token")
    for layer in range(layers):
        for b in range(batch):
            row = sel.logits[layer, b:b + 1, :, last[b]:last[b] + 1]          # [1, H, 1, n]
            want, count = vegas_select(row, lengths[b:b + 1], 0.1, max_context=n, policy=policy)
            got = sel.indices[layer, b]
            assert int(sel.counts[layer, b]) == int(count[0])
            assert torch.equal(got[:int(count[0])], want[0, :int(count[0])])
