"""Model specs read from config.json must reproduce the published model sizes; hardware specs
and catalogue look-ups must behave."""
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.errors import SpecsimError, UnknownNameError
from specsim.specs import (SLIDING_ATTENTION, known_hardware, known_models, load_hardware,
                           load_model, model_spec_from_config)

# Published parameter counts (models/PUBLISHED_SIZES.md gives the sources) and the precision
# to which they are published: (total, tolerance, non-embedding or None).
PUBLISHED = {
    "qwen3-4b": (4.0e9, 0.05e9, 3.6e9),            # model card: 4.0B, non-embedding 3.6B
    "qwen3-8b": (8.2e9, 0.05e9, 6.95e9),           # 8.2B, non-embedding 6.95B
    "qwen3-30b-a3b": (30.5e9, 0.05e9, 29.9e9),     # 30.5B, non-embedding 29.9B
    "gpt-oss-20b": (20.91e9, 0.005e9, None),       # model card (arXiv 2508.10925): 20.91B
    "llama-3.1-8b": (8.03e9, 0.005e9, None),       # 8.03B
    "llama-3.2-3b": (3.21e9, 0.005e9, None),       # 3.21B, tied embeddings
    "qwen2.5-7b": (7.61e9, 0.01e9, 6.53e9),        # 7.61B, non-embedding 6.53B
    "qwen2.5-14b": (14.7e9, 0.1e9, None),          # 14.7B (the card's 13.1B non-emb is off)
    "smollm2-135m": (135e6, 1e6, None),            # 135M
}


def test_catalogue_holds_every_required_model():
    assert set(PUBLISHED) <= set(known_models())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_published(name):
    spec = load_model(name)
    total, tol, non_embedding = PUBLISHED[name]
    assert spec.param_count() == pytest.approx(total, abs=tol)
    if non_embedding is not None:
        assert spec.non_embedding_params() == pytest.approx(non_embedding, abs=0.05e9)
    assert spec.source, "each catalogue config states its source"


def test_exact_counts_against_hub_totals():
    # exact totals the HuggingFace hub reports for the safetensors checkpoints
    assert load_model("qwen3-8b").param_count() == 8_190_735_360
    assert load_model("llama-3.1-8b").param_count() == 8_030_261_248
    assert load_model("qwen2.5-7b").param_count() == 7_615_616_512
    assert load_model("qwen3-4b").param_count() == 4_022_468_096


def test_moe_active_parameters():
    qwen = load_model("qwen3-30b-a3b")
    assert qwen.is_moe and qwen.num_experts == 128 and qwen.experts_per_token == 8
    assert qwen.param_count(active=True) == pytest.approx(3.3e9, abs=0.06e9)   # "3.3B activated"
    oss = load_model("gpt-oss-20b")
    # gpt-oss counts active parameters with the unembedding but without the input embedding
    active = oss.param_count(active=True) - oss.vocab_size * oss.hidden_size
    assert active == pytest.approx(3.61e9, abs=0.005e9)


@pytest.mark.parametrize("name,kv_bytes", [
    # layers · kv_heads · head_dim · 2 (K and V) · 2 bytes (bf16)
    ("qwen3-8b", 36 * 8 * 128 * 2 * 2),        # 147,456 B = 144 KiB
    ("llama-3.1-8b", 32 * 8 * 128 * 2 * 2),    # 131,072 B = 128 KiB
    ("qwen2.5-7b", 28 * 4 * 128 * 2 * 2),      # 57,344 B = 56 KiB
    ("smollm2-135m", 30 * 3 * 64 * 2 * 2),     # 23,040 B
    ("gpt-oss-20b", 24 * 8 * 64 * 2 * 2),
])
def test_kv_bytes_per_token(name, kv_bytes):
    assert load_model(name).kv_bytes_per_token == kv_bytes


def test_gpt_oss_sliding_layers_keep_a_window():
    spec = load_model("gpt-oss-20b")
    assert spec.sliding_layers == 12 and spec.full_layers == 12
    assert spec.sliding_window == 128
    assert spec.layer_types[0] == SLIDING_ATTENTION
    assert spec.attention_sinks and spec.o_bias and spec.qkv_bias


@settings(max_examples=50, deadline=None, database=None)
@given(st.sampled_from(sorted(PUBLISHED)), st.integers(0, 200_000))
def test_resident_kv_holds_every_token_in_full_layers_and_a_window_in_sliding_ones(name, n):
    spec = load_model(name)
    window = spec.sliding_window or n
    want = spec.kv_bytes_per_token_layer() * (spec.full_layers * n
                                              + spec.sliding_layers * min(n, window))
    assert spec.kv_bytes_resident(n) == want
    assert spec.kv_bytes_resident(n + 1) >= spec.kv_bytes_resident(n)


def test_family_features_from_config():
    assert load_model("qwen3-8b").qk_norm and not load_model("qwen3-8b").qkv_bias
    assert load_model("qwen2.5-7b").qkv_bias and not load_model("qwen2.5-7b").o_bias
    assert load_model("llama-3.2-3b").tie_embeddings
    assert load_model("qwen3-4b").head_dim == 128   # not hidden/heads = 80


def test_minimal_config_and_errors(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100}
    spec = model_spec_from_config(cfg, "tiny")
    assert spec.num_kv_heads == 4 and spec.head_dim == 16
    # embeddings 2·100·64, per layer 4·64·64 + 3·64·128 + 2·64, final norm 64
    assert spec.param_count() == 2 * 6400 + 2 * (16384 + 24576 + 128) + 64
    with pytest.raises(SpecsimError, match="lacks 'vocab_size'"):
        model_spec_from_config({k: v for k, v in cfg.items() if k != "vocab_size"}, "tiny")
    with pytest.raises(SpecsimError, match="layer_types"):
        model_spec_from_config({**cfg, "layer_types": ["full_attention"]}, "tiny")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert load_model(str(tmp_path)).param_count() == spec.param_count()
    assert load_model(str(path)).num_layers == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SpecsimError, match="bad JSON"):
        load_model(str(bad))


def test_unknown_names_list_the_known_ones():
    with pytest.raises(UnknownNameError) as exc:
        load_model("qwen9-1t")
    assert "qwen3-8b" in str(exc.value) and "llama-3.1-8b" in str(exc.value)
    with pytest.raises(UnknownNameError) as exc:
        load_hardware("tpu-v9")
    assert "h200" in str(exc.value)


def test_hardware_catalogue_and_measured_override(tmp_path):
    assert {"h100-sxm", "h100-nvl", "h200", "a100-80gb", "a40", "l40s"} <= set(known_hardware())
    h200 = load_hardware("h200")
    assert h200.memory_bandwidth == pytest.approx(4.8e12)
    assert h200.bandwidth == pytest.approx(4.3e12)      # measured ceiling wins
    assert h200.flops == pytest.approx(790e12)
    a100 = load_hardware("a100-80gb")
    assert a100.bandwidth == a100.memory_bandwidth == pytest.approx(2.039e12)
    assert not a100.ceilings_measured
    custom = {"memory_GB": 10, "memory_bandwidth_TBps": 1.0, "bf16_dense_TFLOPs": 100,
              "interconnect_GBps": 50, "measured": {"memory_bandwidth_TBps": 0.9},
              "overheads_s": {"forward": 1e-5}}
    path = tmp_path / "mygpu.json"
    path.write_text(json.dumps(custom))
    hw = load_hardware(str(path))
    assert hw.bandwidth == pytest.approx(0.9e12) and hw.overheads.forward == 1e-5
    path.write_text(json.dumps({"memory_GB": 10}))
    with pytest.raises(SpecsimError,
                       match=r"mygpu.json:1: [A-Za-z_]+: expected a value, got none \(missing\)"):
        load_hardware(str(path))


def test_model_for_trace_defaults_to_the_recorded_model():
    from specsim.specs import model_for_trace
    assert model_for_trace(None, {"model": "smollm2-135m"}) == "smollm2-135m"
    assert model_for_trace(None, {"model": "SmolLM2-135M"}) == "smollm2-135m"
    assert model_for_trace(None, {"model": "my-private-model"}) == "qwen3-8b"
    assert model_for_trace(None, {}) == "qwen3-8b"
    assert model_for_trace("llama-3.1-8b", {"model": "smollm2-135m"}) == "llama-3.1-8b"


def test_shipped_file_finds_repository_files_from_anywhere(tmp_path, monkeypatch):
    from specsim.shipped import shipped_file
    monkeypatch.chdir(tmp_path)
    found = shipped_file("traces/README.md")
    assert found is not None and found.endswith("traces/README.md") and Path(found).is_file()
    assert shipped_file("traces/no-such-trace.jsonl") is None


def test_a_hugging_face_id_is_read_from_the_local_hub_cache(tmp_path, monkeypatch):
    """``org/name`` finds config.json in the hub cache's snapshot that refs/main names (as the
    hub library lays it out); an id not cached is one line saying where it looked."""
    import shutil

    from specsim.errors import SpecsimError
    from specsim.shipped import shipped_path

    repo = tmp_path / "hub" / "models--meta-llama--Llama-3.2-3B-Instruct"
    for snapshot in ("old", "abc123"):
        (repo / "snapshots" / snapshot).mkdir(parents=True)
    shutil.copy(shipped_path("models/llama-3.2-3b/config.json"),
                repo / "snapshots" / "abc123" / "config.json")
    (repo / "snapshots" / "old" / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    spec = load_model("meta-llama/Llama-3.2-3B-Instruct")
    assert spec.name == "llama-3.2-3b-instruct"
    assert spec.spec_hash() == dataclasses.replace(load_model("llama-3.2-3b"),
                                                   name=spec.name).spec_hash()
    with pytest.raises(SpecsimError, match=r"Hugging Face id in the local hub cache \(looked "
                                           r"in .*hub") as err:
        load_model("meta-llama/Llama-3.1-8B")
    assert "\n" not in str(err.value)
