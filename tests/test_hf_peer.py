"""The Hugging Face peer of benchmarks/bench_engine.py, on the CPU: with the engine's own
weights, its static-cache greedy decoding gives the engine's tokens (so the peer decodes the
same model as the engine), and a cache filled at random to a context decodes on from there."""
import json
import sys

import pytest
import torch

from repo import REPO_ROOT, run_main

pytest.importorskip("transformers")
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import bench_engine  # noqa: E402
from hf_peer import StaticDecoder, hf_model, time_steps  # noqa: E402

from specsim.engine import build_model, plain_decode  # noqa: E402
from specsim.shipped import catalog_file  # noqa: E402


def tiny(name):
    config = json.loads(catalog_file(f"{name}/config.json").read_text())
    config.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                  bos_token_id=1, eos_token_id=2)
    return config


def bench(capsys, *argv):
    """bench_engine.py run in this process (its imports paid once), as subprocess.run tells it."""
    return run_main(bench_engine.main, capsys, *argv)


@pytest.mark.parametrize("name", ["qwen3-8b", "llama-3.1-8b"])
def test_the_peer_decodes_the_engines_tokens(name):
    config = tiny(name)
    engine_model = build_model(config, dtype=torch.float32, seed=3)
    model, hf_config = hf_model(config, "cpu", torch.float32, engine_model.state_dict())
    prompts = torch.randint(3, 512, (2, 12), generator=torch.Generator().manual_seed(4))
    want = plain_decode(engine_model, prompts.tolist(), 8).tokens
    decoder = StaticDecoder(model, hf_config, 2, 32, graph=False)
    got = [decoder.prefill(prompts)[:, 0].tolist()]
    got += [decoder.step()[:, 0].tolist() for _ in range(7)]
    assert [list(t) for t in zip(*got)] == [list(t) for t in want]


def test_a_randomly_filled_cache_decodes_on_from_its_context():
    config = tiny("qwen3-8b")
    model, hf_config = hf_model(config, "cpu", torch.float32)
    decoder = StaticDecoder(model, hf_config, 3, 64, graph=False)
    decoder.fill(40)
    assert decoder.cache_position.item() == 40
    assert time_steps(decoder, 5) > 0
    assert decoder.cache_position.item() == 45 and decoder.position[:, 0].tolist() == [45] * 3
    assert decoder.cache.layers[0].keys[:, :, 40:45].abs().sum() > 0     # written by the steps
    assert decoder.cache.layers[0].keys[:, :, 45:].abs().sum() == 0


def test_bench_engine_times_the_peer_beside_the_engine(tmp_path, capsys):
    """bench_engine.py --peer hf on the CPU (SmolLM2's shapes, a 64-token context, batches 1
    and 2): per cell one row for the engine's plain step and one for the peer's, each with its
    floor, and the Markdown table of them, printed again by --table from the output alone."""
    out = tmp_path / "bench.json"
    done = bench(capsys, "--model", "smollm2-135m", "--batch", "1,2", "--contexts", "64",
                 "--new-tokens", "2", "--device", "cpu", "--peer", "hf", "--out", out)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["mode"]) for r in rows] == [(1, "plain"), (1, "hf-plain"),
                                                       (2, "plain"), (2, "hf-plain")]
    assert all(r["step_seconds"] > 0 and r["floor_seconds"] > 0 for r in rows)
    assert "engine/hf step" in done.stdout
    table = [line for line in done.stdout.splitlines() if line.startswith("| smollm2-135m |")]
    assert [line.split("|")[2:4] for line in table] == [[" 1 ", " 64 "], [" 2 ", " 64 "]]
    for line, (eng, hf) in zip(table, [rows[:2], rows[2:]]):
        assert line.split("|")[-2].strip() == f"{eng['step_seconds'] / hf['step_seconds']:.2f}"
    again = bench(capsys, "--table", out)
    assert again.returncode == 0 and [line for line in again.stdout.splitlines()
                                      if line.startswith("| smollm2-135m |")] == table


def test_bench_engine_splits_each_policy_by_phase_against_its_floors(tmp_path, capsys):
    """bench_engine.py --phases on the CPU: for each policy asked, a row per phase with its time,
    bytes and floor (the draft's weights streamed and its selected rows gathered, verify
    streamed), and the phases' shares of the iteration summing to the whole."""
    out = tmp_path / "bench.json"
    done = bench(capsys, "--model", "smollm2-135m", "--batch", "1", "--contexts", "128",
                 "--new-tokens", "2", "--device", "cpu", "--phases", "--ks", "2", "--ss", "0.1",
                 "--policies", "vegas,quest", "--iterations", "2", "--out", out)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    rows = [r for r in doc["rows"] if r["mode"] == "phase"]
    for policy in ("vegas", "quest"):
        mine = {r["phase"]: r for r in rows if r["policy"] == policy}
        assert {"draft", "verify", "other"} <= set(mine), mine.keys()
        assert all(mine[p]["floor_seconds"] > 0 and mine[p]["bytes"] > 0
                   for p in ("draft", "verify"))
        # verify streams its bytes; a draft's floor gathers part of its bytes instead
        verify, draft = mine["verify"], mine["draft"]
        assert verify["floor_seconds"] == pytest.approx(verify["bytes"] / doc["copy_bandwidth"])
        rates = sorted((doc["copy_bandwidth"], draft["gather_bandwidth"]))
        assert draft["bytes"] / rates[1] <= draft["floor_seconds"] * (1 + 1e-9)
        assert draft["floor_seconds"] <= draft["bytes"] / rates[0] * (1 + 1e-9)
        assert sum(r["share"] for r in mine.values() if r["share"] is not None) == \
            pytest.approx(1.0, abs=0.02)
        assert 0 < mine["host"]["seconds"]          # the loop's own CPU time an iteration
        # its cell of the phase table: the draft's and verify's fractions of their floors,
        # the selection's share of the iteration
        lines = done.stdout.splitlines()
        header = next(x for x in lines if x.startswith("| model | batch | context | vegas"))
        line = next(x for x in lines[lines.index(header):]
                    if x.startswith("| smollm2-135m | 1 | 128 |"))
        cell = dict(zip((c.strip() for c in header.split("|")),
                        (c.strip() for c in line.split("|"))))[policy]
        selection = mine.get("selection")
        share = f"{selection['share']:.1%}" if selection and selection["seconds"] else "–"
        assert cell == (f"{draft['floor_seconds'] / draft['seconds']:.0%} / "
                        f"{verify['floor_seconds'] / verify['seconds']:.0%} / {share}")
    assert "floor/time" in done.stdout


def test_bench_engine_resumes_its_output_and_never_overwrites_it(tmp_path, capsys):
    """bench_engine.py --out: an existing file is refused without --resume (one line, the file
    untouched), and with other settings or other cell arguments; --resume keeps the cells it
    holds, row for row, and measures only the others; an older output (no cells or arguments
    recorded) counts the cells of its rows, and resumes only where its retired settings ran
    as the engine runs now; no phase table is printed when no phases ran."""
    from specsim.settings import RETIRED

    out = tmp_path / "bench.json"

    def run(*extra, new_tokens="2"):
        return bench(capsys, "--model", "smollm2-135m", "--contexts", "64", "--new-tokens",
                     new_tokens, "--device", "cpu", "--out", out, *extra)

    first = run("--batch", "1")
    assert first.returncode == 0, first.stderr[-2000:]
    before = out.read_text()
    assert json.loads(before)["cells_done"] == [[1, 64]]
    assert "| model | batch | context |  |" not in first.stdout
    refused = run("--batch", "1,2")
    assert refused.returncode == 2 and "exists: --resume" in refused.stderr.splitlines()[-1]
    other = run("--batch", "1,2", "--resume", "--setting", "c2q=rows")
    assert other.returncode == 2 and "not smollm2-135m with" in other.stderr
    longer = run("--batch", "1,2", "--resume", new_tokens="3")
    assert longer.returncode == 2 and "measured with --new-tokens 2" in longer.stderr
    assert out.read_text() == before
    more = run("--batch", "1,2", "--resume")
    assert more.returncode == 0, more.stderr[-2000:]
    assert "1 cells already measured" in more.stdout
    doc = json.loads(out.read_text())
    assert doc["cells_done"] == [[1, 64], [2, 64]] and doc["batches"] == [1, 2]
    assert doc["rows"][0] == json.loads(before)["rows"][0]          # kept, not re-measured
    assert [(r["batch"], r["mode"]) for r in doc["rows"]] == [(1, "plain"), (2, "plain")]
    # an older output: no engine record, cells or arguments; its settings name the retired
    # verify_append (as the engine runs now: resumes; torch, or not named: another engine)
    older = {k: v for k, v in doc.items() if k not in ("engine", "cells_done", "arguments")}
    for named, code in (({"verify_append": RETIRED["verify_append"][0]}, 0),
                        ({"verify_append": "torch"}, 2), ({}, 2)):
        out.write_text(json.dumps({**older, "settings": {**doc["settings"], **named}}))
        done = run("--batch", "1,2", "--resume")
        assert done.returncode == code, done.stderr[-2000:]
        if code == 0:
            assert "2 cells already measured" in done.stdout


def test_the_gather_floors_kernel_sums_exactly_the_picked_rows(monkeypatch):
    """The gather probe's Triton kernel (interpreted on the CPU): each program's row is the sum
    of the rows its indices pick, the last program masked where the indices run out."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import bench_engine

    gen = torch.Generator().manual_seed(0)
    src = torch.randn(300, 16, generator=gen).to(torch.float16)
    idx = torch.randperm(300, generator=gen)[:37].sort().values
    block, iters = 4, 2
    programs = -(-idx.numel() // (block * iters))
    out = torch.empty(programs, 16)
    bench_engine._gather_sum_kernel()[(programs,)](src, idx, out, idx.numel(), 16, block, iters)
    want = torch.stack([src[chunk].float().sum(0) for chunk in idx.split(block * iters)])
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4)


def test_a_later_run_replaces_the_rows_it_measured_again():
    """--table over two outputs: the second run's phases of a policy at a cell replace the
    first run's (a note, such as a skip, included), its plain step replaces the first's, and
    what it did not measure (the peer) stays from the first. Each policy's cell: its draft's
    and verify's fractions of their floors, its selection's share of the iteration."""
    import bench_engine

    def phase(policy, name, ms):
        return {"batch": 4, "context": 1024, "mode": "phase", "policy": policy, "phase": name,
                "seconds": ms / 1e3, "bytes": 1.0, "floor_seconds": ms / 2e3, "share": ms / 10}

    first = {"model": "m", "rows": [
        {"batch": 4, "context": 1024, "mode": "plain", "step_seconds": 0.010,
         "floor_seconds": 0.008},
        {"batch": 4, "context": 1024, "mode": "hf-plain", "step_seconds": 0.020,
         "floor_seconds": 0.008},
        phase("vegas", "selection", 3.0), phase("quest", "selection", 5.0)]}
    second = {"model": "m", "rows": [
        {"batch": 4, "context": 1024, "mode": "plain", "step_seconds": 0.016,
         "floor_seconds": 0.008},
        phase("vegas", "selection", 1.0), phase("vegas", "draft", 2.0),
        {"batch": 4, "context": 1024, "mode": "phase", "policy": "quest",
         "note": "skipped: out of memory"}]}
    lines = bench_engine.render_tables([first, second]).splitlines()
    plain = [x for x in lines if x.startswith("| m | 4 | 1024 | 16.00 |")]
    assert len(plain) == 1 and plain[0].split("|")[-2].strip() == "0.80"   # 16 ms / the peer's 20
    header = next(x for x in lines if x.startswith("| model | batch | context | vegas"))
    row = next(x for x in lines[lines.index(header):] if x.startswith("| m | 4 | 1024 |"))
    cells = dict(zip(header.split("|")[4:-1], row.split("|")[4:-1]))
    assert {k.strip(): v.strip() for k, v in cells.items()} == {
        "vegas": "50% / – / 10.0%", "quest": "skipped: out of memory"}
