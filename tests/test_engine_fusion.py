"""Fused q|k|v and gate|up projections and compiled layers compute what the plain model does."""
import pytest
import torch
import torch.nn.functional as F

from specsim.engine import build_model, plain_decode

CONFIGS = {
    "qwen3": dict(model_type="qwen3", head_dim=32),                       # q/k-norm
    "qwen2": dict(model_type="qwen2"),                                    # qkv bias
    "llama": dict(model_type="llama", tie_word_embeddings=True,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 1024}),
}


def config(name):
    base = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=256, max_position_embeddings=4096,
                rope_theta=1e6, tie_word_embeddings=False)
    return {**base, **CONFIGS[name]}


def causal(layer, q, k, v):
    group = q.shape[2] // k.shape[2]
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(group, 2).transpose(1, 2),
        v.repeat_interleave(group, 2).transpose(1, 2), is_causal=True).transpose(1, 2)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_projections_give_the_same_logits(name):
    model = build_model(config(name), weights="random", seed=3)
    tokens = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(40)[None].expand(2, -1)
    before = model(tokens, positions, causal)
    model.fuse_projections()
    after = model(tokens, positions, causal)
    assert not hasattr(model.model.layers[0].self_attn, "q_proj")
    assert hasattr(model.model.layers[0].mlp, "gate_up_proj")
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_compiled_and_fused_model_decodes_the_same_tokens():
    model = build_model(config("qwen3"), weights="random", seed=1)
    prompts = [list(range(1, 120)), list(range(7, 90))]
    expected = plain_decode(model, prompts, 8).tokens
    model.fuse_projections()
    model.compile_layers()
    assert plain_decode(model, prompts, 8).tokens == expected


def test_compiled_layers_keep_more_shape_variants_than_dynamos_default():
    """A process running many engines meets more compiled variants of a layer half than
    dynamo keeps by default (8), past which it ran the rest eagerly."""
    import torch._dynamo

    from specsim.engine.model import RECOMPILE_LIMIT

    before = torch._dynamo.config.recompile_limit
    try:
        torch._dynamo.config.recompile_limit = 8
        model = build_model(config("qwen3"), weights="random", seed=1)
        model.compile_layers()
        assert torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT > 8
    finally:
        torch._dynamo.config.recompile_limit = before
