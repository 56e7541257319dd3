"""Drafters: each draft step equals its composition by hand on a synthetic operator table and
on the roofline; the survival counterfactual; drafter-costed predictions."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.costs.operators import OperatorCostModel
from specsim.costs.roofline import RooflineCostModel
from specsim.drafters import (DrafterCosts, draft_cost, head_of, parse_drafter,
                              recorded_drafter, same_source, survival_by_k,
                              survival_from_counts, survival_tokens)
from specsim.errors import SpecsimError
from specsim.specs import load_hardware, load_model
from test_operators import (SMALL, append_ms, by_hand_head, by_hand_layers, gemm_ms,
                            synthetic_table, verify_ms)

HW = load_hardware("h200")
BATCH, CONTEXT = 4, 4096


@pytest.fixture
def ops():
    return OperatorCostModel(synthetic_table(), SMALL, HW)


def _head_file(tmp_path, **extra):
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 1024,
           "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
           "intermediate_size": 2048, "num_hidden_layers": 1, "vocab_size": 4096, **extra}
    path = tmp_path / "head.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_eagle_step_is_its_operators_by_hand(ops, tmp_path):
    """One layer of SMALL's shape over its own KV of the full context, the fc (2·hidden →
    hidden) and the LM head: every operator on the synthetic grid."""
    drafter = parse_drafter(f"eagle:{_head_file(tmp_path)}")
    got = draft_cost(drafter, ops, [CONTEXT] * BATCH)
    expected = (by_hand_layers(BATCH, None) + verify_ms(1, "off", BATCH * 2, CONTEXT)
                + append_ms(BATCH * 2, False) + by_hand_head(BATCH)
                + gemm_ms(1024, 2048, BATCH))
    assert got.seconds * 1e3 == pytest.approx(expected, rel=1e-9)
    assert any("priced by operators" in n for n in got.notes)


def test_eagle3_adds_the_wide_fc_and_qkv_half(ops, tmp_path):
    one = draft_cost(parse_drafter(f"eagle:{_head_file(tmp_path)}"), ops, [CONTEXT] * BATCH)
    three = draft_cost(parse_drafter(f"eagle:{_head_file(tmp_path, draft_vocab_size=4096)}"),
                       ops, [CONTEXT] * BATCH)
    head = same_source(ops, head_of(parse_drafter("eagle"), SMALL).spec)
    extra = (head.gemm(BATCH, 1024, 3072)[0] - head.gemm(BATCH, 1024, 2048)[0]
             + head.gemm(BATCH, 1536, 1024)[0])
    assert three.seconds == pytest.approx(one.seconds + extra, rel=1e-9)


def test_mtp_and_medusa_by_hand(ops):
    mtp = draft_cost(parse_drafter("mtp"), ops, [CONTEXT] * BATCH)
    expected = (by_hand_layers(BATCH, None) + verify_ms(1, "off", BATCH * 2, CONTEXT)
                + append_ms(BATCH * 2, False) + by_hand_head(BATCH)
                + gemm_ms(1024, 2048, BATCH))
    assert mtp.seconds * 1e3 == pytest.approx(expected, rel=1e-9)
    medusa = draft_cost(parse_drafter("medusa"), ops, [CONTEXT] * BATCH)
    assert medusa.seconds * 1e3 == pytest.approx(
        gemm_ms(1024, 1024, BATCH) + gemm_ms(4096, 1024, BATCH), rel=1e-9)


def test_eagle_step_on_the_roofline_by_hand():
    spec = load_model("llama-3.1-8b")
    roof = RooflineCostModel(spec, HW)
    ctx = [CONTEXT] * BATCH
    got = draft_cost(parse_drafter("eagle"), roof, ctx)    # the shipped EAGLE-3 head
    head = head_of(parse_drafter("eagle"), spec)
    assert head.spec.vocab_size == 32000 and head.fc_inputs == 3 and head.wide_qkv
    base = RooflineCostModel(head.spec, HW).plain_step(ctx)
    h = 4096
    gemms = [(h, 3 * h), ((32 + 16) * 128, h)]
    weight = base.weight_bytes + sum(n * k for n, k in gemms) * 2
    flops = base.flops + sum(2.0 * BATCH * n * k for n, k in gemms)
    expected = max((weight + base.kv_bytes + base.other_bytes) / HW.bandwidth,
                   flops / HW.flops) + base.overhead_s
    assert got.seconds == pytest.approx(expected, rel=1e-12)
    assert any("priced by roofline" in n for n in got.notes)


def test_the_lm_head_dominates_an_eagle_step_for_a_big_vocabulary():
    """An EAGLE head of Qwen2.5-7B's shape (no shipped head: its full 152,064 × 3,584 LM
    head) at batch 1, short context: the LM head is more than half of the step's bytes."""
    spec = load_model("qwen2.5-7b")
    head = head_of(parse_drafter("eagle"), spec)
    step = draft_cost(parse_drafter("eagle"), RooflineCostModel(spec, HW), [512])
    assert head.spec.vocab_size == spec.vocab_size
    assert head.spec.vocab_size * head.spec.hidden_size * 2 > 0.5 * step.bytes
    # EAGLE-3's 32K draft vocabulary shrinks it (Llama-3.1-8B's shipped head)
    llama = RooflineCostModel(load_model("llama-3.1-8b"), HW)
    assert draft_cost(parse_drafter("eagle"), llama, [512]).seconds < \
        draft_cost(parse_drafter("mtp"), llama, [512]).seconds


def test_draft_model_cost_is_its_plain_step(ops):
    ctx = [CONTEXT] * BATCH
    roof = RooflineCostModel(load_model("qwen3-8b"), HW)
    small = load_model("qwen3-4b")
    got = draft_cost(parse_drafter("draft-model:qwen3-4b"), roof, ctx)
    assert got.seconds == RooflineCostModel(small, HW).plain_step(ctx).seconds
    got = draft_cost(parse_drafter("draft-model:smollm2-135m"), ops, ctx)
    assert got.seconds == OperatorCostModel(ops.table, load_model("smollm2-135m"),
                                            HW).plain_step(ctx).seconds


def test_ngram_draft_costs_nothing_and_verify_every_iteration(ops):
    costs = DrafterCosts(ops, parse_drafter("ngram"))
    it = costs.iteration([CONTEXT] * BATCH, 3)
    assert it.draft_step.seconds == 0.0 and it.draft.seconds == 0.0
    assert it.selection.seconds == 0.0
    assert it.verify.seconds == ops.policy_verify([CONTEXT] * BATCH, 4, "full").seconds
    assert any("every iteration" in n for n in it.verify.notes)


def test_tree_verify_is_a_verify_of_the_tree_tokens(ops):
    costs = DrafterCosts(ops, parse_drafter("medusa", tree_tokens=5))
    it = costs.iteration([CONTEXT] * BATCH, 2)
    assert it.verify.seconds == ops.policy_verify([CONTEXT] * BATCH, 5, "full").seconds
    assert any("tree verify" in n for n in it.verify.notes)


def test_drafter_names():
    assert parse_drafter("eagle:qwen3-8b-eagle3").label == "eagle:qwen3-8b-eagle3"
    for bad in ("bogus", "draft-model", "ngram:x"):
        with pytest.raises(SpecsimError):
            parse_drafter(bad)
    assert recorded_drafter("vegas").kind == "sparse-self"
    assert recorded_drafter("unknown", {"drafter": "pld"}).kind == "ngram"
    assert recorded_drafter("hydra").kind == "medusa"
    assert recorded_drafter("unknown") is None


# ---- the per-depth survival counterfactual --------------------------------------------------
def test_survival_counterfactual_by_hand():
    m = [0, 1, 1, 2, 3, 3]            # recorded at k_rec = 3
    P = survival_from_counts(m, 3)
    assert P.tolist() == pytest.approx([5 / 6, 3 / 6, 2 / 6])
    # at k = 2 each iteration emits min(m, 2) + 1: (1 + 2 + 2 + 3 + 3 + 3) / 6
    assert survival_tokens(P, 2) == pytest.approx(14 / 6)
    assert survival_tokens(P, 3) == pytest.approx(np.mean(np.array(m) + 1))
    assert survival_by_k(P)[1].tolist() == pytest.approx([5 / 6, 3 / 6, 0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=1, max_size=40))
def test_survival_tokens_grow_with_k_and_stay_below_k_plus_1(m):
    P = survival_from_counts(m, 8)
    tokens = [survival_tokens(P, k) for k in range(1, 9)]
    assert all(b >= a - 1e-12 for a, b in zip(tokens, tokens[1:]))
    assert all(t <= k + 1 + 1e-12 for k, t in zip(range(1, 9), tokens))


# ---- Spec-Bench EAGLE: predicted with the eagle drafter, beside the file's own timing ------
def _predict_json(*args):
    from click.testing import CliRunner

    from specsim.cli.main import cli
    result = CliRunner().invoke(cli, ["predict", "--bootstrap", "50", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output[result.output.index("{"):])


FIX = "tests/fixtures/"


def test_specbench_eagle_predicts_with_the_eagle_drafter_and_its_measured_speedup():
    out = _predict_json("--trace", FIX + "specbench.jsonl", "--model", "llama-3.1-8b",
                        "--costs", "roofline", "--batch", "1",
                        "--vanilla", FIX + "specbench_vanilla.jsonl", "--recorded-on", "h200")
    group = out["groups"][0]
    assert group["costed_as"]["drafter"] == "eagle"
    assert group["costed_as"]["drafter_origin"] == "trace"
    assert group["costed_as"]["draft_priced_by"] == "roofline"
    assert group["costed_as"]["replay"] == "per-depth survival"
    assert any("drafter eagle (recorded in the trace)" in n for n in out["notes"])
    measured = out["measured"]
    eagle_tps = (10 + 8 + 11 + 7) / (0.41 + 0.33 + 0.45 + 0.21)
    vanilla_tps = 36 / (0.95 + 0.76 + 1.04 + 0.67)
    assert measured["tokens_per_s"] == pytest.approx(eagle_tps)
    assert measured["speedup"] == pytest.approx(eagle_tps / vanilla_tps)
    assert measured["comparable"] is True
    # the per-depth survival: E[m+1](k) grows with k, at most k + 1
    tokens = [p["expected_tokens"] for p in group["curve"]]
    assert all(b >= a for a, b in zip(tokens, tokens[1:]))
    assert all(t <= k + 1 for k, t in enumerate(tokens, 1))


def test_specbench_measured_is_not_compared_on_other_hardware():
    out = _predict_json("--trace", FIX + "specbench.jsonl", "--model", "llama-3.1-8b",
                        "--costs", "roofline", "--recorded-on", "a100-80gb")
    assert out["measured"]["comparable"] is False
    assert "not compared" in out["measured"]["note"]


def test_drafter_option_prices_an_opaque_trace_and_tree(tmp_path):
    out = _predict_json("--trace", FIX + "specbench.jsonl", "--model", "qwen3-8b",
                        "--costs", "roofline", "--drafter", "eagle:qwen3-8b-eagle3",
                        "--tree-tokens", "8")
    costed = out["groups"][0]["costed_as"]
    assert costed["drafter"] == "eagle:qwen3-8b-eagle3" and costed["tree_tokens"] == 8
    assert costed["replay"] == "recorded tree only"
    assert any("no counterfactual to another tree" in n for n in out["notes"])


def test_a_drafter_given_for_a_sparse_trace_is_refused_in_one_line(capsys):
    """The default trace records sparse self-speculation in every group: its acceptance is not
    an EAGLE head's, so --drafter eagle is refused rather than ignored."""
    from specsim.cli.main import main

    assert main(["predict", "--drafter", "eagle", "--model", "qwen3-8b"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("specsim: error: --drafter eagle: every group of this trace "
                              "records sparse self-speculation")


def test_a_drafters_memory_is_its_weights_and_kv_beside_the_target():
    """A draft model adds its own weights and KV cache; a head its weights and one layer's
    KV; n-gram lookup nothing; and a batch that fits the target alone but not with a draft
    model is flagged, naming the draft model."""
    from specsim.drafters import drafter_memory_bytes, head_of
    from specsim.specs import load_model

    target = load_model("qwen3-8b")
    ctx = [32768] * 8
    extra, what = drafter_memory_bytes(parse_drafter("draft-model:qwen3-4b"), target, ctx)
    assert extra == pytest.approx(load_model("qwen3-4b").memory_bytes(ctx))
    assert "draft model qwen3-4b" in what
    head = head_of(parse_drafter("eagle"), target)
    extra, _ = drafter_memory_bytes(parse_drafter("eagle"), target, ctx)
    assert extra == pytest.approx(head.spec.memory_bytes(ctx)) and 0 < extra < \
        target.memory_bytes(ctx) / 10
    assert drafter_memory_bytes(parse_drafter("ngram"), target, ctx) == (0.0, "")


def test_predict_flags_a_batch_the_draft_model_does_not_leave_room_for():
    from click.testing import CliRunner

    from specsim.cli.main import cli
    args = ["predict", "--trace", "tests/fixtures/vllm_metrics.prom", "--model", "qwen3-8b",
            "--batch", "10", "--context", "65536", "--bootstrap", "50", "--json"]
    alone = json.loads(CliRunner().invoke(cli, args + ["--drafter", "eagle"]).output)
    assert not any("does not fit" in n for n in alone["notes"])
    drafted = json.loads(CliRunner().invoke(cli, args + ["--drafter",
                                                         "draft-model:qwen3-4b"]).output)
    assert any("does not fit" in n and "draft model qwen3-4b" in n for n in drafted["notes"])


def test_a_drafter_no_group_would_use_is_refused_in_one_line():
    """The default trace records sparse self-speculation in every group: --drafter eagle would
    price nothing of it, so it is refused; --drafter sparse-self is accepted."""
    from click.testing import CliRunner

    from specsim.cli.main import cli
    r = CliRunner().invoke(cli, ["predict", "--drafter", "eagle", "--bootstrap", "50"])
    assert r.exit_code != 0
    assert "every group of this trace records sparse self-speculation" in str(r.exception)
    r = CliRunner().invoke(cli, ["predict", "--drafter", "sparse-self", "--bootstrap", "50"])
    assert r.exit_code == 0, r.output
