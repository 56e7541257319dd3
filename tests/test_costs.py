"""Roofline costs against hand-computed bytes, FLOPs and times on a tiny model."""
import pytest

from specsim.costs import RooflineCostModel, decode_floor_s
from specsim.policies import get_policy, selected_tokens
from specsim.specs import HardwareSpec, Overheads, load_hardware, load_model, model_spec_from_config

NO_OVERHEAD = Overheads(forward=0.0, iteration=0.0, selection=0.0, allreduce_latency=0.0)

TINY_CFG = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
            "intermediate_size": 128, "vocab_size": 100}
# KV per token and layer: 2 kv heads · 16 · 2 (K, V) · 2 bytes = 128 B


def tiny(**over):
    return model_spec_from_config({**TINY_CFG, **over}, "tiny")


def hw(bandwidth=1e12, flops=1e15, link=1e11, overheads=NO_OVERHEAD):
    return HardwareSpec("test", bandwidth, flops, 80e9, link, overheads=overheads)


def test_plain_step_bytes_by_hand():
    spec = tiny()
    cm = RooflineCostModel(spec, hw())
    c = cm.plain_step([100, 300])
    # weights: per layer q 64·64 + k,v 2·64·32 + o 64·64 + mlp 3·64·128 + norms 2·64,
    # final norm 64, input embedding rows for 2 tokens, full lm_head 100·64 — 2 bytes each
    per_layer = 4096 + 4096 + 4096 + 24576 + 128
    assert c.weight_bytes == 2 * (2 * per_layer + 64 + 2 * 64 + 100 * 64)
    # KV: (100 + 300) entries read + 2 new tokens written, per layer, 128 B each
    assert c.kv_bytes == (400 + 2) * 2 * 128
    assert c.seconds == pytest.approx(c.bytes / 1e12)
    assert c.bound == "memory"
    assert decode_floor_s(spec, hw(), [100, 300]) == pytest.approx(
        (c.weight_bytes + c.kv_bytes) / 1e12)


def test_verify_reads_kv_once_for_all_query_tokens():
    cm = RooflineCostModel(tiny(), hw())
    v1, v8 = cm.verify([1000], 1), cm.verify([1000], 8)
    # same KV read (GQA-packed, once per KV head); only the appended tokens differ
    assert v8.kv_bytes - v1.kv_bytes == 7 * 2 * 128
    # attention FLOPs: 4 · head_dim · heads · q · (ctx · layers)
    attn = lambda q: 4.0 * 16 * 4 * q * 2000  # noqa: E731
    assert v8.flops - v1.flops == pytest.approx(
        7 * tiny().matmul_flops_per_token() + attn(8) - attn(1))
    with pytest.raises(ValueError):
        cm.verify([1000], 0)


def test_policy_budgets():
    # Vegas: top max(ceil(s·ctx), 256) + 32 recent; capped at the context
    assert selected_tokens("vegas", 10_000, 0.05) == 500 + 32
    assert selected_tokens("vegas", 2_000, 0.05) == 256 + 32
    assert selected_tokens("vegas", 100, 0.05) == 100
    assert selected_tokens("streamingllm", 10_000, 0.05) == 500
    assert selected_tokens("sparsespec", 10_000, 0.05) == 500
    assert selected_tokens("quest", 10_000, 0.051) == 512      # 510 rounded up to 32 pages
    assert selected_tokens("full", 777, 0.05) == 777
    with pytest.raises(Exception, match="known: vegas"):
        get_policy("random")
    with pytest.raises(Exception):
        selected_tokens("vegas", 100, 0.0)


def test_ragged_batch_is_not_its_mean():
    cm = RooflineCostModel(tiny(), hw())
    ragged = cm.draft_step([100, 10_000], 0.05, "vegas")
    mean = cm.draft_step([5_050, 5_050], 0.05, "vegas")
    # ragged: 100 (whole short context) + 532; mean: 2 · (256 + 32) = 576 entries per layer
    assert ragged.kv_bytes == ((100 + 532) + 2) * 2 * 128
    assert mean.kv_bytes == ((288 + 288) + 2) * 2 * 128
    assert ragged.other_bytes - mean.other_bytes == pytest.approx((632 - 576) * 2 * 4)


def test_sliding_window_layers_are_not_sparsified():
    spec = tiny(layer_types=["sliding_attention", "full_attention"], sliding_window=64)
    cm = RooflineCostModel(spec, hw())
    d = cm.draft_step([1000], 0.1, "streamingllm")
    # full layer: ceil(0.1·1000) = 100 entries; sliding layer: its window of 64
    assert d.kv_bytes == (100 + 64 + 2) * 128
    p = cm.plain_step([1000])
    assert p.kv_bytes == (1000 + 64 + 2) * 128
    # a verify of q = 5 rows: the sliding layer reads its rows' last 64 + 5 − 1 keys (as the
    # engine's window verify does), and 5 new rows are written per layer
    v = cm.verify([1000], 5)
    assert v.kv_bytes == (1000 + 68 + 10) * 128
    assert spec.window_keys(50, 5) == 50 and spec.kv_tokens_attended(1000, "sliding_attention",
                                                                     5) == 68


def test_selection_costs_by_policy():
    spec = tiny()
    cm = RooflineCostModel(spec, hw(), c2q="rows")
    assert cm.selection([1000], 0.1, "streamingllm", 4).seconds == 0.0
    vegas = cm.selection([1000], 0.1, "vegas", 4)
    # collected: 2 rows · 4 heads · 1000 keys · 2 layers · 2 B, written then read;
    # scores: 1000 · 2 layers · 4 B, written then read; indices max(100, 256) + 32 = 288
    assert vegas.other_bytes == 2 * (2 * 4 * 1000 * 2 * 2) + 2 * (1000 * 2 * 4) + 288 * 2 * 4
    # the summed row (the default): one row per sequence, 1000 keys · 2 layers · 4 B, zeroed,
    # written and read; the refresh ranks it as it is (no scores of its own)
    summed = RooflineCostModel(spec, hw()).selection([1000], 0.1, "vegas", 4)
    assert summed.other_bytes == 3 * (1000 * 2 * 4) + 288 * 2 * 4
    assert "summed over every head" in summed.notes[0] and "× 4 heads" in vegas.notes[0]
    with pytest.raises(ValueError, match="c2q"):
        RooflineCostModel(spec, hw(), c2q="both")
    # last-token ranks by one row (its last accepted token's), written and read
    last = cm.selection([1000], 0.1, "last-token", 4)
    assert last.other_bytes == 2 * (4 * 1000 * 2 * 2) + 2 * (1000 * 2 * 4) + 288 * 2 * 4
    # the refresh's own bytes: the selection's less what the verify pass writes for it
    assert cm.refresh_bytes([1000], 0.1, "vegas", 4) == vegas.other_bytes - 2 * 4 * 1000 * 2 * 2
    assert RooflineCostModel(spec, hw()).refresh_bytes([1000], 0.1, "vegas", 4) == \
        summed.other_bytes - 2 * (1000 * 2 * 4)
    assert cm.refresh_bytes([1000], 0.1, "last-token", 4) == \
        cm.refresh_bytes([1000], 0.1, "last-token", 8) == last.other_bytes - 4 * 1000 * 2 * 2
    assert cm.refresh_bytes([1000], 0.1, "quest", 4) == 0.0
    assert cm.refresh_bytes([1000], 0.1, "streamingllm", 4) == 0.0
    # only Vegas' refresh reads a summed row: the others are priced the same either way
    for name in ("last-token", "sparsespec", "quest"):
        assert RooflineCostModel(spec, hw()).selection([1000], 0.1, name, 4).other_bytes == \
            cm.selection([1000], 0.1, name, 4).other_bytes
    sparse = cm.selection([1000], 0.1, "sparsespec", 4)   # min(16, k+1) = 5 rows, per KV head
    assert sparse.other_bytes == (2 * (5 * 4 * 1000 * 2 * 2) + 2 * (2 * 1000 * 2 * 4)
                                  + 100 * 2 * 2 * 4)
    assert cm.refresh_bytes([1000], 0.1, "sparsespec", 4) == \
        sparse.other_bytes - 5 * 4 * 1000 * 2 * 2
    quest2, quest4 = (cm.selection([1000], 0.1, "quest", k) for k in (2, 4))
    assert quest4.other_bytes == pytest.approx(2 * quest2.other_bytes)   # every draft step


def test_iteration_time_is_the_sum_of_its_terms():
    over = Overheads(forward=1e-5, iteration=2e-5, selection=3e-6, allreduce_latency=0.0)
    cm = RooflineCostModel(tiny(), hw(overheads=over))
    it = cm.iteration([500, 700], 6, 0.1, "vegas")
    expected = (6 * cm.draft_step([500, 700], 0.1, "vegas").seconds
                + cm.verify([500, 700], 7).seconds
                + cm.selection([500, 700], 0.1, "vegas", 6).seconds + 2e-5)
    assert it.seconds == pytest.approx(expected)
    assert sum(it.split().values()) == pytest.approx(it.seconds)
    assert it.draft_step.overhead_s == 1e-5 and it.draft.seconds == pytest.approx(
        6 * it.draft_step.seconds)


def test_compute_bound_when_flops_dominate():
    cm = RooflineCostModel(tiny(), hw(flops=1e9))
    c = cm.verify([10] * 64, 16)
    assert c.bound == "compute" and c.seconds == pytest.approx(c.flops / 1e9)


def test_tensor_parallel_share_and_allreduce():
    spec = load_model("llama-3.1-8b")
    h200 = load_hardware("h200")
    one = RooflineCostModel(spec, h200, tp=1).plain_step([8192] * 8)
    two = RooflineCostModel(spec, h200, tp=2).plain_step([8192] * 8)
    assert two.weight_bytes == pytest.approx(one.weight_bytes / 2)
    assert two.kv_bytes == pytest.approx(one.kv_bytes / 2)        # 8 KV heads split 4 + 4
    # two all-reduces per layer of 8 tokens · 4096 · 2 B over the link, plus latency each
    msg = 8 * 4096 * 2
    per = 2 * (1 / 2) * msg / h200.interconnect_bandwidth + h200.overheads.allreduce_latency
    assert two.comm_s == pytest.approx(2 * 32 * per)
    assert one.comm_s == 0.0
    # KV heads fewer than GPUs are replicated, not split
    small = load_model("qwen2.5-7b")                              # 4 KV heads
    eight = RooflineCostModel(small, h200, tp=4).plain_step([8192])
    single = RooflineCostModel(small, h200, tp=1).plain_step([8192])
    assert eight.kv_bytes == pytest.approx(single.kv_bytes / 4)
    with pytest.raises(ValueError):
        RooflineCostModel(spec, h200, tp=3)


def test_moe_reads_only_touched_experts():
    spec = load_model("qwen3-30b-a3b")
    one_token = spec.weight_bytes_per_forward(1)
    many = spec.weight_bytes_per_forward(4096)
    # one token touches 8 of 128 experts; thousands touch essentially all of them
    assert one_token < 0.2 * spec.param_count() * 2
    assert many == pytest.approx(spec.param_count() * 2 - (spec.vocab_size - 4096)
                                 * spec.hidden_size * 2, rel=1e-3)


def test_sparse_draft_is_cheaper_only_through_kv():
    spec, h200 = load_model("qwen3-8b"), load_hardware("h200")
    cm = RooflineCostModel(spec, h200)
    plain = cm.plain_step([131_072] * 4)
    draft = cm.draft_step([131_072] * 4, 0.05, "vegas")
    assert draft.weight_bytes == plain.weight_bytes
    assert draft.kv_bytes < 0.06 * plain.kv_bytes
    # at 128K × 4 the KV (~77 GB) dominates the ~16 GB of weights
    assert plain.kv_bytes > 4 * plain.weight_bytes
