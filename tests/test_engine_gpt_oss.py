"""gpt-oss in the engine: YaRN rotary frequencies, attention sinks, alternating sliding-window
and full layers, the biased router and experts with the clamped SwiGLU.

- Each piece equals a by-definition computation written here, token by token (the YaRN
  frequencies found by bisection, not by the closed form the model uses).
- Plain greedy decoding continues each sequence exactly as recomputing it from scratch does
  (the decode path's window and sinks equal the prefill's).
- Self-speculative decoding reproduces plain greedy decoding for every policy, through the
  torch path and through the Triton kernels (interpreter).
- Hugging Face checkpoint names load; MXFP4 checkpoints are refused in one line.
"""
import json
import math

import pytest
import torch

from specsim.engine import attention, build_model, plain_decode, speculative_decode
from specsim.engine.model import (ModelArgs, load_weights, rope_attention_factor,
                                  rope_frequencies, timing_model)
from specsim.errors import SpecsimError
from specsim.policies import Policy
from specsim.shipped import shipped_path

WINDOW = 8
TINY_GPT_OSS = dict(
    model_type="gpt_oss", vocab_size=256, hidden_size=64, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=32,
    num_local_experts=4, experts_per_token=2, num_experts_per_tok=2,
    layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=WINDOW,
    attention_bias=True, max_position_embeddings=4096, rope_theta=150000.0,
    rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                      original_max_position_embeddings=64, truncate=False),
    swiglu_limit=7.0, tie_word_embeddings=False, rms_norm_eps=1e-5)


def gpt_oss_model(config=TINY_GPT_OSS, seed=3):
    """Random weights, the sinks large enough to matter (N(0, 2²))."""
    model = build_model(config, seed=seed, std=0.1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.mul_(20.0)
    return model


@pytest.fixture(scope="module")
def tiny():
    return gpt_oss_model()


def prompts_of(lengths, vocab=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


# --------------------------------------------------------------------------------------------
# by definition
# --------------------------------------------------------------------------------------------


def yarn_by_definition(head_dim, base, factor, original, beta_fast, beta_slow, truncate):
    """Frequency i (θ_i = base^(−2i/D)) turns ``original·θ_i / 2π`` times over the original
    context. Kept where that is above beta_fast turns, divided by ``factor`` below beta_slow,
    ramped linearly in i between the (continuous) indices where it equals them, found by
    bisection."""
    def turns(i):
        return original * base ** (-2 * i / head_dim) / (2 * math.pi)

    def index_where(beta):
        low, high = -4.0 * head_dim, 4.0 * head_dim     # turns fall as i grows
        for _ in range(200):
            middle = (low + high) / 2
            low, high = (middle, high) if turns(middle) > beta else (low, middle)
        return low

    low, high = index_where(beta_fast), index_where(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    freqs = []
    for i in range(head_dim // 2):
        theta = base ** (-2 * i / head_dim)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        freqs.append(theta * (1 - ramp) + theta / factor * ramp)
    return torch.tensor(freqs, dtype=torch.float64)


@pytest.mark.parametrize("truncate", [False, True])
def test_yarn_frequencies_and_attention_factor_by_definition(truncate):
    config = json.loads(shipped_path("models/gpt-oss-20b/config.json").read_text())
    config["rope_scaling"] = dict(config["rope_scaling"], truncate=truncate)
    args = ModelArgs.from_config(config)
    want = yarn_by_definition(64, 150000.0, 32.0, 4096, 32.0, 1.0, truncate)
    torch.testing.assert_close(rope_frequencies(args), want, rtol=1e-9, atol=0)
    assert rope_attention_factor(args) == pytest.approx(0.1 * math.log(32.0) + 1.0)
    # highest frequency kept, lowest interpolated by the factor
    assert rope_frequencies(args)[0] == 1.0
    assert rope_frequencies(args)[-1] == pytest.approx(150000.0 ** (-62 / 64) / 32.0)


def rms(x, weight, eps):
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def layer_by_definition(layer, args: ModelArgs, h: torch.Tensor, window) -> torch.Tensor:
    """One decoder layer over h [T, hidden] at positions 0..T−1, one token and head at a
    time: YaRN rope, attention over keys n ≤ t (n > t − W in a window layer) whose softmax
    also holds the head's sink, the biased router's top experts with softmax weights, each
    expert's clamped SwiGLU with biases."""
    attn, moe = layer.self_attn, layer.mlp
    t_len, heads, groups, d = h.shape[0], args.num_heads, args.num_kv_heads, args.head_dim
    scaling = args.rope_scaling
    freqs = yarn_by_definition(d, args.rope_theta, scaling["factor"],
                               scaling["original_max_position_embeddings"],
                               scaling["beta_fast"], scaling["beta_slow"], scaling["truncate"])
    mscale = 0.1 * math.log(scaling["factor"]) + 1.0

    def rope(x, p):
        cos = (torch.cos(p * freqs) * mscale).float()
        sin = (torch.sin(p * freqs) * mscale).float()
        x1, x2 = x[: d // 2], x[d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin])

    x = rms(h, layer.input_layernorm.weight, args.rms_norm_eps)
    q = (x @ attn.q_proj.weight.T + attn.q_proj.bias).view(t_len, heads, d)
    k = (x @ attn.k_proj.weight.T + attn.k_proj.bias).view(t_len, groups, d)
    v = (x @ attn.v_proj.weight.T + attn.v_proj.bias).view(t_len, groups, d)
    out = torch.zeros(t_len, heads, d)
    for t in range(t_len):
        for head in range(heads):
            g = head // (heads // groups)
            keys = [n for n in range(t + 1) if window is None or n > t - window]
            logits = torch.stack([rope(q[t, head], t) @ rope(k[n, g], n) / math.sqrt(d)
                                  for n in keys] + [attn.sinks[head]])
            weights = torch.softmax(logits, 0)[:-1]           # the sink: denominator only
            out[t, head] = sum(w * v[n, g] for w, n in zip(weights, keys))
    h = h + out.flatten(1) @ attn.o_proj.weight.T + attn.o_proj.bias
    x = rms(h, layer.post_attention_layernorm.weight, args.rms_norm_eps)
    experts = moe.experts
    mlp = torch.zeros_like(h)
    for t in range(t_len):
        logits = x[t] @ moe.router.weight.T + moe.router.bias
        top = torch.topk(logits, args.experts_per_token)
        for w, e in zip(torch.softmax(top.values, 0), top.indices):
            gate_up = x[t] @ experts.gate_up_proj[e] + experts.gate_up_proj_bias[e]
            gate = gate_up[0::2].clamp(max=7.0)               # interleaved: gate, up, gate, …
            up = gate_up[1::2].clamp(-7.0, 7.0)
            glu = gate * torch.sigmoid(1.702 * gate)
            mlp[t] += w * (((up + 1) * glu) @ experts.down_proj[e] + experts.down_proj_bias[e])
    return h + mlp


@pytest.mark.parametrize("one_chunk_a_call", [False, True])
def test_each_layer_equals_its_definition(monkeypatch, one_chunk_a_call):
    """Window and full layers through the engine's prefill attention (window layers also one
    chunk of rows per SDPA call), against the per-token definition; the expert weights are
    scaled up so that the SwiGLU's clamps bite."""
    if one_chunk_a_call:
        monkeypatch.setattr(attention, "WINDOW_BLOCK_ELEMENTS", 1)
    model = gpt_oss_model(seed=4)
    args = model.args
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.mul_(10.0)
    t_len = 19
    positions = torch.arange(t_len)[None]
    cos_sin = model.rope[positions]
    cos, sin = cos_sin[:, :, None, 0], cos_sin[:, :, None, 1]
    h = torch.randn(1, t_len, args.hidden_size, generator=torch.Generator().manual_seed(5))
    sinks = model.attention_sinks()
    clamped = 0
    for i, layer in enumerate(model.model.layers):
        window = args.window(i)
        assert window == (WINDOW if i % 2 == 0 else None)

        def attend(_, q, k, v):
            return attention.prefill_attention(q, k, v, window=window, sinks=sinks[i])

        got = layer(h, cos, sin, i, attend)[0]
        want = layer_by_definition(layer, args, h[0], window)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        x = rms(got, layer.post_attention_layernorm.weight, args.rms_norm_eps)
        clamped += int((x @ layer.mlp.experts.gate_up_proj[0]).abs().max() > 7.0)
        h = got[None]
    assert clamped


def test_plain_decoding_continues_as_recomputing_from_scratch(tiny):
    """The decode path (one verify row per step over the cache, window layers masked to
    their window far past it) gives the logits of a fresh prefill of the whole sequence."""
    prompts = prompts_of((23, 40))
    result = plain_decode(tiny, prompts, 12)
    sinks = tiny.attention_sinks()
    for prompt, tokens in zip(prompts, result.tokens):
        sequence = torch.tensor(prompt + tokens)[None]

        def attend(layer, q, k, v):
            return attention.prefill_attention(q, k, v, window=tiny.args.window(layer),
                                               sinks=sinks[layer])

        logits = tiny(sequence, torch.arange(sequence.shape[1])[None], attend)[0]
        greedy = logits[len(prompt) - 1:-1].argmax(-1).tolist()
        assert greedy == tokens


# --------------------------------------------------------------------------------------------
# lossless self-speculation
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ragged():
    return prompts_of((300, 341))


@pytest.fixture(scope="module")
def plain_ragged(tiny, ragged):
    return plain_decode(tiny, ragged, 24)


@pytest.mark.parametrize("policy", ["vegas", "sparsespec", "streamingllm", "quest",
                                    "last-token"])
def test_self_speculation_on_gpt_oss_is_lossless(tiny, ragged, plain_ragged, policy):
    result = speculative_decode(tiny, ragged, 24, policy=policy, k=4, s=0.3)
    assert result.tokens == plain_ragged.tokens
    assert sum(m for t in result.traces for m in t.m.tolist()) > 0


SMALL = {
    "vegas": Policy("vegas", min_selected=8, recent=4, collected_rows=2,
                    budget_includes_recent=False),
    "sparsespec": Policy("sparsespec", sink=2, recent=4, per_kv_head=True, collected_rows=16),
    "quest": Policy("quest", page_size=16, per_kv_head=True, rescore_every_draft=True),
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the interpreter")
@pytest.mark.parametrize("policy", sorted(SMALL))
def test_self_speculation_through_the_kernels_is_lossless(policy):
    """The kernels' sinks and window options as the engine calls them on a GPU (verify with a
    window and q = 1 drafts of window layers, sparse drafts with sinks, SparseSpec-L's mass
    from the lse with the sink), run by Triton's interpreter at head_dim 64."""
    config = dict(TINY_GPT_OSS, head_dim=64, num_attention_heads=2, num_key_value_heads=1,
                  vocab_size=128, num_hidden_layers=2,
                  layer_types=["sliding_attention", "full_attention"])
    model = gpt_oss_model(config, seed=6)
    prompts = prompts_of((40, 53), vocab=128)
    expected = plain_decode(model, prompts, 8).tokens
    result = speculative_decode(model, prompts, 8, policy=SMALL[policy], k=3, s=0.3,
                                use_triton=True)
    assert result.tokens == expected


# --------------------------------------------------------------------------------------------
# configs and checkpoints
# --------------------------------------------------------------------------------------------


def test_the_shipped_config_reads_as_gpt_oss_and_builds_reduced():
    config = json.loads(shipped_path("models/gpt-oss-20b/config.json").read_text())
    args = ModelArgs.from_config(config)
    assert args.layer_windows == (128, None) * 12 and args.full_layers == tuple(range(1, 24, 2))
    assert (args.num_experts, args.experts_per_token, args.moe_intermediate_size) == (32, 4, 2880)
    assert args.qkv_bias and args.o_bias and args.attention_sinks and args.expert_bias
    assert args.swiglu_limit == 7.0 and args.norm_topk_prob and args.head_dim == 64
    small = dict(config, num_hidden_layers=2, hidden_size=64, intermediate_size=32,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=300,
                 num_local_experts=4)
    model = build_model(small)
    assert model.args.layer_windows == (128, None)
    model.fuse_projections()
    prompts = prompts_of((20,), vocab=300)
    assert len(plain_decode(model, prompts, 3).tokens[0]) == 3
    assert timing_model("gpt-oss-20b").args.model_type == "gpt_oss"


def test_qwen2_sliding_windows_follow_max_window_layers():
    """HF's rule: with use_sliding_window, layers from max_window_layers on slide."""
    qwen2 = dict(model_type="qwen2", vocab_size=256, hidden_size=64, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                 use_sliding_window=True, sliding_window=16, max_window_layers=2)
    assert ModelArgs.from_config(qwen2).layer_windows == (None, None, 16, 16)
    assert ModelArgs.from_config(dict(qwen2, use_sliding_window=False)).layer_windows == \
        (None,) * 4
    model = build_model(qwen2, seed=1, std=0.1)
    prompts = prompts_of((290, 300))
    plain = plain_decode(model, prompts, 12)
    assert speculative_decode(model, prompts, 12, policy="vegas", k=3, s=0.3).tokens == \
        plain.tokens


def test_hugging_face_checkpoint_names_load(tiny, tmp_path):
    """A checkpoint with HF's gpt-oss names (sinks, router bias, stacked experts with their
    biases, o_proj bias) loads into another model, which then computes the same."""
    from safetensors.torch import save_file

    state = {name: p.detach().clone().contiguous() for name, p in tiny.named_parameters()}
    for name in ("model.layers.0.self_attn.sinks", "model.layers.1.mlp.router.bias",
                 "model.layers.2.mlp.experts.gate_up_proj_bias",
                 "model.layers.3.mlp.experts.down_proj_bias",
                 "model.layers.0.self_attn.o_proj.bias"):
        assert name in state
    save_file(state, str(tmp_path / "model.safetensors"))
    other = build_model(TINY_GPT_OSS, seed=11, std=0.1)
    load_weights(other, tmp_path)
    for name, p in other.named_parameters():
        assert torch.equal(p, state[name]), name
    prompts = prompts_of((30,))
    assert plain_decode(other, prompts, 6).tokens == plain_decode(tiny, prompts, 6).tokens


def test_mxfp4_checkpoints_are_refused_in_one_line(tiny, tmp_path):
    from safetensors.torch import save_file

    state = {name: p.detach().clone().contiguous() for name, p in tiny.named_parameters()
             if not name.endswith("experts.gate_up_proj")}
    state["model.layers.0.mlp.experts.gate_up_proj_blocks"] = torch.zeros(4, 64, 2, 16,
                                                                          dtype=torch.uint8)
    state["model.layers.0.mlp.experts.gate_up_proj_scales"] = torch.zeros(4, 64, 2,
                                                                          dtype=torch.uint8)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(SpecsimError, match="MXFP4") as error:
        load_weights(build_model(TINY_GPT_OSS, seed=11, std=0.1), tmp_path)
    assert "\n" not in str(error.value)
