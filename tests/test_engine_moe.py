"""Routed experts (Qwen3-MoE) in the engine: the grouped layer equals the per-token definition,
routing follows the config, per-expert checkpoints load into the stacked weights, and
self-speculative decoding of an MoE model is lossless."""
import json

import pytest
import torch
import torch.nn.functional as F

from specsim.engine import build_model, plain_decode, speculative_decode
from specsim.engine.model import ModelArgs, MoE, grouped_mm, load_weights
from specsim.errors import SpecsimError
from specsim.shipped import shipped_path

TINY_MOE = dict(model_type="qwen3_moe", vocab_size=256, hidden_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=1,
                mlp_only_layers=[1], max_position_embeddings=2048, rope_theta=10000.0,
                tie_word_embeddings=False)


@pytest.fixture(scope="module")
def tiny_moe():
    return build_model(TINY_MOE, seed=3, std=0.1)


def moe_by_definition(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Σ over each token's top experts of weight · down(silu(gate(x)) · up(x)), token by token."""
    probs = torch.softmax(moe.gate(x).float(), -1)
    out = torch.zeros_like(x)
    inter = moe.experts.down_proj.shape[1]
    for t in range(x.shape[0]):
        weights, experts = torch.topk(probs[t], moe.top)
        if moe.norm_topk:
            weights = weights / weights.sum()
        for w, e in zip(weights, experts):
            gate_up = x[t] @ moe.experts.gate_up_proj[e]
            h = F.silu(gate_up[:inter]) * gate_up[inter:]
            out[t] += w * (h @ moe.experts.down_proj[e])
    return out


def test_the_grouped_layer_equals_the_per_token_definition(tiny_moe):
    moe = tiny_moe.model.layers[0].mlp
    assert isinstance(moe, MoE)
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0))
    got = moe(x)
    want = moe_by_definition(moe, x.reshape(-1, 64)).reshape(x.shape)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_grouped_gemm_and_its_loop_agree_with_empty_groups(monkeypatch):
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(7, 16, generator=g), torch.randn(4, 16, 8, generator=g)
    ends = torch.tensor([2, 2, 6, 7], dtype=torch.int32)        # group 1 has no rows
    want = torch.cat([x[0:2] @ w[0], x[2:6] @ w[2], x[6:7] @ w[3]])
    torch.testing.assert_close(grouped_mm(x, w, ends), want)

    def unavailable(*args, **kwargs):
        raise NotImplementedError("no grouped GEMM here")

    monkeypatch.setattr(torch, "_grouped_mm", unavailable)      # the loop over the groups
    torch.testing.assert_close(grouped_mm(x, w, ends), want)


def test_routing_fields_come_from_the_config():
    args = ModelArgs.from_config(TINY_MOE)
    assert (args.num_experts, args.experts_per_token, args.moe_intermediate_size) == (8, 3, 32)
    assert [args.is_moe_layer(i) for i in range(3)] == [True, False, True]
    stepped = ModelArgs.from_config(dict(TINY_MOE, mlp_only_layers=[], decoder_sparse_step=2))
    assert [stepped.is_moe_layer(i) for i in range(3)] == [False, True, False]
    shipped = json.loads(shipped_path("models/qwen3-30b-a3b/config.json").read_text())
    real = ModelArgs.from_config(shipped)
    assert (real.num_experts, real.experts_per_token, real.qk_norm) == (128, 8, True)
    assert all(real.is_moe_layer(i) for i in range(real.num_layers))
    with pytest.raises(SpecsimError, match="num_experts_per_tok"):
        ModelArgs.from_config(dict(TINY_MOE, num_experts_per_tok=9))


def test_per_expert_checkpoints_load_into_the_stacked_experts(tiny_moe, tmp_path):
    """A checkpoint named as Hugging Face names Qwen3-MoE's experts (one gate, up and down
    matrix per expert) loads into the stacked weights, and the model computes the same."""
    from safetensors.torch import save_file

    tensors = {}
    for name, p in tiny_moe.named_parameters():
        if ".experts." not in name:
            tensors[name] = p.detach().clone()
    for i, layer in enumerate(tiny_moe.model.layers):
        if not isinstance(layer.mlp, MoE):
            continue
        gate_up, down = layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj
        inter = down.shape[1]
        for e in range(gate_up.shape[0]):
            base = f"model.layers.{i}.mlp.experts.{e}"
            tensors[f"{base}.gate_proj.weight"] = gate_up[e, :, :inter].T.contiguous()
            tensors[f"{base}.up_proj.weight"] = gate_up[e, :, inter:].T.contiguous()
            tensors[f"{base}.down_proj.weight"] = down[e].T.contiguous()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    other = build_model(TINY_MOE, seed=9, std=0.1)
    load_weights(other, tmp_path)
    for (name, a), (_, b) in zip(tiny_moe.named_parameters(), other.named_parameters()):
        assert torch.equal(a, b), name
    del tensors["model.layers.2.mlp.experts.5.down_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(SpecsimError, match="lack"):
        load_weights(build_model(TINY_MOE, seed=9, std=0.1), tmp_path)


@pytest.mark.parametrize("policy", ["vegas", "streamingllm", "quest"])
def test_self_speculation_on_an_moe_model_is_lossless(tiny_moe, policy):
    prompts = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (300, 341)]
    plain = plain_decode(tiny_moe, prompts, 24)
    result = speculative_decode(tiny_moe, prompts, 24, policy=policy, k=4, s=0.3)
    assert result.tokens == plain.tokens
