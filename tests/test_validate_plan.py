"""specsim validate plan for any model: the setups asked for (--model, --batch, --context, --ks,
--mode, --costs) and nothing else, each with the cost source that priced it and predictions
equal to that cost model's on those cells; one-line refusals of a grid the GPU run could not
hold; the option parsers; the CPU run of a plan for a config.json model with no calibration;
the report's per-policy MAPE, worst cell and regret, per setup and across setups, by hand."""
import dataclasses
import itertools
import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim import validate as V
from specsim.validate import planning as validate_plan
from specsim.cli import validate_cmd as C
from specsim.cli.main import cli, main
from specsim.costs.source import resolve_cost_source
from specsim.errors import SpecsimError
from specsim.specs import load_hardware, load_model, model_spec_from_config

POLICIES = ["vegas", "sparsespec", "streamingllm", "quest", "last-token"]


def _plan(tmp_path, *args):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["validate", "plan", *args, "--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), result.output


def _forced_requests(cfg, context):
    """The plan's forced sequences as the engine replays them."""
    from specsim.traces.format import RequestTrace
    return [RequestTrace(f["id"], cfg["policy"], cfg["s"], np.full(len(f["k"]), context),
                         np.array(f["k"]), np.array(f["m"])) for f in cfg["forced"]]


def _priced(cost_model, cfg, batch, context):
    """Tokens per second of a forced configuration, from the cost model directly: every
    iteration priced at the sequences' contexts at that point, over the tokens emitted."""
    ms = np.array([f["m"] for f in cfg["forced"]])          # [batch, iterations]
    assert ms.shape[0] == batch
    ctx = np.full(batch, context, dtype=np.int64)
    seconds = 0.0
    for i in range(ms.shape[1]):
        seconds += cost_model.iteration(ctx, cfg["k"], cfg["s"], cfg["policy"]).seconds
        ctx = ctx + ms[:, i] + 1
    return (ms + 1).sum() / seconds


def test_plan_for_llama_3_2_3b_holds_the_requested_setup_priced_by_its_source(tmp_path):
    """`validate plan --model llama-3.2-3b --batch 8 --context 32768`: one forced setup of
    that model, batch and context, every (policy, s, k) of the default grid, the cost source
    the resolver picks recorded with its kind, note and file, and each prediction what that
    cost model gives for the cell."""
    plan, output = _plan(tmp_path, "--model", "llama-3.2-3b", "--batch", "8", "--context",
                         "32768")
    (entry,) = plan["setups"]
    setup = entry["setup"]
    assert (setup["model"], setup["mode"], setup["batch"], setup["context"]) == \
        ("llama-3.2-3b", "forced", 8, 32768)
    assert "model_config" not in setup                     # a catalogue model: by name
    cells = {(c["policy"], c["s"], c["k"]) for c in entry["configs"]}
    assert len(cells) == len(entry["configs"]) == 40
    assert cells == set(itertools.product(POLICIES, [0.03, 0.1], [2, 4, 8, 12]))
    source = resolve_cost_source(load_model("llama-3.2-3b"), load_hardware("h200"), 1, "auto")
    recorded = entry["cost_source"]
    assert (recorded["kind"], recorded["note"], recorded["fallback"]) == \
        (source.kind, source.note, source.fallback)
    assert (recorded["path"] is None) == (source.path is None)
    assert entry["costs"] == source.note and source.note in output
    for cfg in entry["configs"]:
        assert len(cfg["forced"]) == 8
        assert all(max(f["m"]) <= cfg["k"] for f in cfg["forced"])
        assert cfg["predict"] == pytest.approx(_priced(source.cost_model, cfg, 8, 32768),
                                               rel=1e-12)
    steps = entry["plain"]["tokens"] // 8
    plain = steps * 8 / sum(source.cost_model.plain_step(np.full(8, 32768 + i)).seconds
                            for i in range(steps))
    assert entry["plain"]["predict"] == pytest.approx(plain, rel=1e-12)


def test_plan_holds_exactly_the_setups_asked_for(tmp_path):
    """Several batches and contexts: one setup per pair and nothing else (no shipped setup),
    each with only the policies, sparsities and k asked for; --costs roofline prices every
    setup with the roofline and the plan says so."""
    plan, _ = _plan(tmp_path, "--model", "qwen3-4b", "--batch", "2,4", "--context",
                    "4096,8192,4096", "--policies", "quest,vegas,quest", "--s", "0.05",
                    "--ks", "4,2", "--costs", "roofline")
    shapes = [(e["setup"]["batch"], e["setup"]["context"]) for e in plan["setups"]]
    assert shapes == [(2, 4096), (2, 8192), (4, 4096), (4, 8192)]
    assert [e["setup"]["name"] for e in plan["setups"]] == [
        "qwen3-4b-b2-4k", "qwen3-4b-b2-8k", "qwen3-4b-b4-4k", "qwen3-4b-b4-8k"]
    for entry in plan["setups"]:
        assert entry["setup"]["model"] == "qwen3-4b" and entry["setup"]["mode"] == "forced"
        assert [(c["policy"], c["s"], c["k"]) for c in entry["configs"]] == [
            ("quest", 0.05, 2), ("quest", 0.05, 4), ("vegas", 0.05, 2), ("vegas", 0.05, 4)]
        assert entry["cost_source"]["kind"] == "roofline" and entry["calibration"] is None
        roofline = resolve_cost_source(load_model("qwen3-4b"), load_hardware("h200"), 1,
                                       "roofline").cost_model
        b, c = entry["setup"]["batch"], entry["setup"]["context"]
        for cfg in entry["configs"]:
            assert cfg["predict"] == pytest.approx(_priced(roofline, cfg, b, c), rel=1e-12)
    # --shapes: one setup per pair, in the order given, not every batch with every context
    plan, _ = _plan(tmp_path, "--model", "qwen3-4b", "--shapes", "4x8k, 2x4096,4x8192",
                    "--policies", "vegas", "--s", "0.05", "--ks", "2", "--costs", "roofline")
    assert [(e["setup"]["batch"], e["setup"]["context"]) for e in plan["setups"]] == [
        (4, 8192), (2, 4096)]
    # a calibrated model under --costs calibrated: its calibration file, named and hashed
    plan, _ = _plan(tmp_path, "--model", "qwen3-8b", "--context", "8192", "--policies",
                    "vegas", "--s", "0.05", "--ks", "2", "--costs", "calibrated")
    (entry,) = plan["setups"]
    assert entry["cost_source"]["kind"] == "calibration"
    assert entry["cost_source"]["path"] == entry["calibration"] == \
        "models/calibrations/h200/qwen3-8b.json"
    assert entry["calibration_sha256"] == V.file_sha(V.repo_file(entry["calibration"])[0])


def test_a_config_json_model_without_calibration_plans_and_runs_on_the_cpu(tmp_path):
    """--model PATH: the plan carries the config (the GPU machine needs no file) under the
    folder's name, priced from that config; `validate --gpu`'s measurement builds the model
    from the plan's copy and runs it — here on the CPU at llama-3.2-3b's layer shapes (one
    layer, a small vocabulary), a model no calibration covers."""
    from specsim.shipped import catalog_file

    config = json.loads(catalog_file("llama-3.2-3b/config.json").read_text())
    config.update(num_hidden_layers=1, vocab_size=2048)
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    plan, _ = _plan(tmp_path, "--model", str(folder), "--batch", "2", "--context", "256",
                    "--policies", "streamingllm", "--s", "0.1", "--ks", "2")
    (entry,) = plan["setups"]
    assert entry["setup"]["model"] == "my-llama" and entry["setup"]["model_config"] == config
    assert entry["cost_source"]["kind"] != "calibration"
    spec = model_spec_from_config(config, name="my-llama")
    source = resolve_cost_source(spec, load_hardware("h200"), 1, "auto")
    cfg = entry["configs"][0]
    assert cfg["predict"] == pytest.approx(_priced(source.cost_model, cfg, 2, 256), rel=1e-12)
    plan["setups"][0]["setup"]["iterations"] = 3          # a short CPU run of the same grid
    plan["setups"][0]["configs"][0]["forced"] = [
        dict(f, k=f["k"][:3], m=f["m"][:3]) for f in cfg["forced"]]
    folder.joinpath("config.json").unlink()                # the plan's copy is what runs
    got = V.measure(plan, repeats=1, progress=False, device="cpu")
    row = got["setups"][0]["configs"][0]
    assert row["iterations"] == 3 and row["tokens_per_second"] > 0
    assert row["tokens_per_iteration"] == pytest.approx(
        np.mean([np.mean(np.array(f["m"]) + 1) for f in plan["setups"][0]["configs"][0]
                 ["forced"]]))
    rep = V.report(plan, got)
    assert rep["setups"][0]["cost_source"] == entry["cost_source"]
    assert "model_config" not in rep["setups"][0]["setup"]


def test_free_running_setups_of_the_traces_model_use_the_same_costs(tmp_path):
    """--mode free: the trace's own model (SmolLM2-135M for the default trace), one setup per
    batch with --requests-free prompts; the simulator's prediction is priced by the same
    --costs as the analytical one."""
    plan, _ = _plan(tmp_path, "--mode", "free", "--batch", "8", "--policies", "vegas", "--s",
                    "0.05", "--ks", "2", "--requests-free", "16", "--costs", "roofline")
    (entry,) = plan["setups"]
    setup = entry["setup"]
    assert (setup["name"], setup["model"], setup["mode"], setup["batch"]) == \
        ("smollm2-135m-b8-free", "smollm2-135m", "free", 8)
    assert len(setup["prompt_ids"]) == 16 and entry["cost_source"]["kind"] == "roofline"
    (cfg,) = entry["configs"]
    prompts = [len(p) for p in V.Setup(**setup).prompts]
    trace = V.repo_file(C.defaults.TRACE)[0]
    args = (trace, "smollm2-135m", "h200", 8, prompts, setup["max_new_tokens"], "vegas", 0.05,
            2, setup["prompt_ids"])
    assert cfg["simulate"] == validate_plan._simulate(*args, costs="roofline")["decode_throughput"]
    assert cfg["simulate"] != validate_plan._simulate(*args, costs="auto")["decode_throughput"]


def test_without_setup_options_the_plan_holds_the_shipped_setups(tmp_path):
    """No --model, --batch, --context, --ks or --mode: the shipped forced setup (Qwen3-8B,
    batch 4, 32768) and, unless --no-free, the shipped free-running one."""
    plan, _ = _plan(tmp_path, "--no-free", "--policies", "vegas", "--s", "0.05",
                    "--k-forced", "2")
    (entry,) = plan["setups"]
    assert {k: entry["setup"][k] for k in ("name", "model", "mode", "batch", "context")} == \
        {"name": "qwen3-8b", "model": "qwen3-8b", "mode": "forced", "batch": 4,
         "context": 32768}


def _one_line_error(capsys, *args):
    code = main(["validate", "plan", *args, "--out", "/nonexistent-dir/plan.json"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in err and err.startswith("specsim: error: "), err
    return err


@pytest.mark.parametrize("args, says", [
    (["--model", "no-such-model"], "unknown model 'no-such-model'; known: "),
    (["--model", "llama-3.2-3b", "--batch", "8", "--context", "4000000"],
     "batch 8 at context 4000000 does not fit"),
    (["--model", "llama-3.2-3b", "--ks", "2,16"], "k lies in 1..15"),
    (["--model", "llama-3.2-3b", "--ks", "13"], "beyond the k 12 the trace recorded"),
    (["--model", "llama-3.2-3b", "--ks", "0"], "--ks: 0 is below 1"),
    (["--model", "llama-3.2-3b", "--s", "0.2"], "the trace has no vegas s=0.2 group"),
    (["--model", "llama-3.2-3b", "--s", "2"], "--s: 2 is not a fraction in (0, 1]"),
    (["--model", "llama-3.2-3b", "--policies", "vegas,medusa"], "unknown policy 'medusa'"),
    (["--model", "llama-3.2-3b", "--mode", "free"], "llama-3.2-3b runs forced"),
    (["--mode", "free", "--context", "1024"], "--context and --shapes set forced setups'"),
    (["--model", "llama-3.2-3b", "--k-forced", "2"], "--k-forced describes the shipped setups"),
    (["--context", "128"], "--context: 128 is below 256"),
    (["--batch", "four"], "--batch: 'four' is not an integer"),
    (["--shapes", "4x8k", "--batch", "2"], "give it or --batch/--context, not both"),
    (["--shapes", "4*8k"], "--shapes: '4*8k' is not BATCHxCONTEXT"),
    (["--shapes", "4x100"], "--shapes: '4x100': the context is below 256"),
    (["--mode", "free", "--shapes", "4x1024"], "--context and --shapes set forced setups'"),
])
def test_bad_input_is_one_line(capsys, args, says):
    assert says in _one_line_error(capsys, *args)


def test_memory_bounds_the_batch_at_a_context(tmp_path):
    """The largest batch whose weights and KV cache (every slot's prompt, drafts and warm-up)
    fit in the GPU's memory is planned, with a note where the positions run past the model's
    native ones; one more slot is refused, naming both sides."""
    from specsim.traces.importers import load_trace
    groups = load_trace(V.repo_file(C.defaults.TRACE)[0]).groups()
    hw = load_hardware("h200")
    spec = load_model("qwen3-8b")

    def setup(batch):
        return V.Setup("s", "qwen3-8b", "forced", batch, ["vegas"], [8], [0.05],
                       context=131072)

    length = setup(1).cache_length()
    fits = max(b for b in range(1, 64) if spec.memory_bytes([length] * b) <= hw.memory_bytes)
    assert 1 <= fits < 63
    (note,) = V.check_setups([setup(fits)], groups, hw)
    assert f"{length} cache positions are beyond qwen3-8b's {spec.max_context}" in note
    assert V.check_setups([dataclasses.replace(setup(fits), context=8192)], groups, hw) == []
    with pytest.raises(SpecsimError, match=f"batch {fits + 1} at context 131072 does not fit"):
        V.check_setups([setup(fits + 1)], groups, hw)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10**7), min_size=1, max_size=8), st.randoms())
def test_parse_ints_reads_any_spelling_of_a_set(values, rnd):
    """Spaces, repeats, empty items and order do not matter: the sorted set comes back."""
    items = [f"{' ' * rnd.randint(0, 2)}{v}{' ' * rnd.randint(0, 2)}"
             for v in values + rnd.sample(values, rnd.randint(0, len(values)))]
    rnd.shuffle(items)
    text = ",".join(items + [""] * rnd.randint(0, 2))
    assert C.parse_ints(text, "--batch") == sorted(set(values))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10**6), max_size=4),
       st.one_of(st.integers(-10**6, 0).map(str), st.text("ab.xe-", min_size=1)))
def test_parse_ints_refuses_a_bad_item_in_one_line(good, bad):
    """A non-integer or one below the bound is named, with the option, in one line."""
    with pytest.raises(SpecsimError) as err:
        C.parse_ints(",".join([*map(str, good), bad]), "--ks")
    message = str(err.value)
    assert message.startswith("--ks: ") and "\n" not in message and bad.strip() in message


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4096), st.integers(256, 2**22)), min_size=1,
                max_size=6), st.randoms())
def test_parse_shapes_reads_pairs_in_order_once_each(pairs, rnd):
    """BATCHxCONTEXT in either case, a context in k (×1024) where it divides, spaces and
    repeats: the distinct pairs come back in the order first given."""
    def spell(b, c):
        context = f"{c // 1024}{rnd.choice('kK')}" if c % 1024 == 0 and rnd.random() < 0.5 \
            else str(c)
        return f"{' ' * rnd.randint(0, 2)}{b}{rnd.choice('xX')}{context} "
    items = [spell(b, c) for b, c in pairs + rnd.sample(pairs, rnd.randint(0, len(pairs)))]
    assert C.parse_shapes(",".join(items)) == list(dict.fromkeys(pairs))


@settings(max_examples=60, deadline=None)
@given(st.text("0123456789xk,. -", max_size=12))
def test_parse_shapes_reads_or_refuses_in_one_line(text):
    """Any text: pairs of a batch of at least 1 and a context of at least 256, or one line
    naming the option."""
    try:
        got = C.parse_shapes(text)
    except SpecsimError as err:
        assert str(err).startswith("--shapes: ") and "\n" not in str(err)
    else:
        assert got and all(b >= 1 and c >= 256 for b, c in got)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0, exclude_min=True), min_size=1, max_size=6))
def test_parse_sparsities_reads_fractions(values):
    assert C.parse_sparsities(",".join(map(repr, values))) == sorted(set(values))


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.floats(allow_nan=True).filter(lambda v: not 0.0 < v <= 1.0),
                 st.sampled_from(["x", "1/2", "0.1.2"])))
def test_parse_sparsities_refuses_what_is_not_a_fraction(value):
    with pytest.raises(SpecsimError, match="^--s: .*"):
        C.parse_sparsities(f"0.05,{value}")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(POLICIES), min_size=1, max_size=8))
def test_parse_names_keeps_the_order_given_once_each(names):
    assert C.parse_names(" , ".join(names), "--policies") == list(dict.fromkeys(names))


def test_empty_lists_are_refused():
    for parse in (lambda: C.parse_ints(" , ", "--batch"), lambda: C.parse_sparsities(","),
                  lambda: C.parse_names("", "--policies")):
        with pytest.raises(SpecsimError, match="give one or more"):
            parse()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=5), st.integers(1, 512),
       st.lists(st.integers(1, 15), min_size=1, max_size=4))
def test_cache_length_is_what_the_engine_can_reach(prompts, new_tokens, ks):
    """A free setup's slots hold its longest prompt and as many positions as the engine's
    generate can reach past it at the largest k (cache_positions)."""
    from specsim.engine.decode import cache_positions
    setup = V.Setup("f", "smollm2-135m", "free", 2, ["vegas"], ks, [0.05],
                    max_new_tokens=new_tokens, prompts=[[1] * n for n in prompts])
    assert setup.cache_length() == cache_positions(max(prompts), new_tokens, max(ks))


# --------------------------------------------------------------------------------------------
# report: per policy and across setups, by hand
# --------------------------------------------------------------------------------------------


def _pair(setups):
    """A plan and its measurements: ``setups`` maps a name to {(policy, s, k): (predicted,
    measured)} tokens per second (forced, 2 tokens per iteration both sides)."""
    plan = {V.FORMAT_KEY: 1, "created": "t", "setups": []}
    got = {V.MEASURED_KEY: 1, "plan_created": "t", "setups": []}
    for name, cells in setups.items():
        setup = {"name": name, "model": "qwen3-8b", "mode": "forced", "batch": 4,
                 "policies": [], "ks": [], "ss": [], "context": 8192, "iterations": 8,
                 "max_new_tokens": 64}
        plan["setups"].append({"setup": setup, "costs": "roofline cost model",
                               "plain": {"predict": 100.0}, "configs": [
                                   {"policy": p, "s": s, "k": k, "predict": pred,
                                    "tokens_per_iteration_predicted": 2.0}
                                   for (p, s, k), (pred, _) in cells.items()]})
        got["setups"].append({"name": name, "plain_tokens_per_second": 90.0, "configs": [
            {"policy": p, "s": s, "k": k, "tokens_per_second": meas,
             "tokens_per_iteration": 2.0} for (p, s, k), (_, meas) in cells.items()]})
    return plan, got


A = {("vegas", 0.05, 2): (110.0, 100.0), ("vegas", 0.05, 4): (150.0, 120.0),
     ("vegas", 0.1, 4): (80.0, 100.0), ("quest", 0.05, 2): (90.0, 100.0),
     ("quest", 0.05, 4): (108.0, 90.0)}
B = {("vegas", 0.05, 2): (200.0, 200.0), ("vegas", 0.05, 4): (190.0, 210.0),
     ("quest", 0.05, 2): (70.0, 100.0)}


def test_report_per_policy_mape_worst_cell_and_regret_by_hand():
    rep = V.report(*_pair({"a": A}))
    item = rep["setups"][0]
    vegas = item["per_policy"]["vegas"]["predict"]
    # errors 110/100 - 1 = +0.10, 150/120 - 1 = +0.25, 80/100 - 1 = -0.20
    assert vegas["mape"] == pytest.approx((0.10 + 0.25 + 0.20) / 3)
    assert vegas["worst"] == pytest.approx(0.25)
    assert vegas["worst_cell"] == {"policy": "vegas", "s": 0.05, "k": 4,
                                   "error": pytest.approx(0.25)}
    # predicted best (s 0.05, k 4) measured 120, the best measured
    assert vegas["regret"] == pytest.approx(1.0)
    quest = item["per_policy"]["quest"]["predict"]
    assert quest["mape"] == pytest.approx((0.10 + 0.20) / 2)
    assert quest["worst_cell"] == {"policy": "quest", "s": 0.05, "k": 4,
                                   "error": pytest.approx(0.20)}
    assert quest["regret"] == pytest.approx(90 / 100)     # predicted k 4 (108), measured 90
    overall = item["all"]["predict"]                      # the grid (policy, s, k)
    assert overall["mape"] == pytest.approx((0.10 + 0.25 + 0.20 + 0.10 + 0.20) / 5)
    assert overall["worst_cell"] == vegas["worst_cell"]
    assert overall["regret"] == pytest.approx(1.0)       # vegas k 4: 120 of 120
    assert item["cost_source"] == {"kind": "roofline", "note": "roofline cost model",
                                   "path": None, "sha256": None, "fallback": None}


def test_report_across_setups_by_hand():
    """Every setup's cells pooled per policy; the regret is each setup's own, the mean and
    the lowest with its setup."""
    rep = V.report(*_pair({"a": A, "b": B}))
    across = rep["across_setups"]
    assert across["setups"] == 2
    vegas = across["per_policy"]["vegas"]
    assert vegas["configs"] == 5 and vegas["setups"] == 2
    errors = [0.10, 0.25, -0.20, 0.0, 190 / 210 - 1]
    assert vegas["predict"]["mape"] == pytest.approx(np.mean(np.abs(errors)))
    assert vegas["predict"]["worst_cell"] == {"setup": "a", "policy": "vegas", "s": 0.05,
                                              "k": 4, "error": pytest.approx(0.25)}
    # b: predicted best k 2 (200) measured 200 of 210
    assert vegas["predict"]["regret_mean"] == pytest.approx((1.0 + 200 / 210) / 2)
    assert vegas["predict"]["regret_lowest"] == pytest.approx(200 / 210)
    assert vegas["predict"]["regret_lowest_setup"] == "b"
    quest = across["per_policy"]["quest"]["predict"]
    assert quest["worst_cell"] == {"setup": "b", "policy": "quest", "s": 0.05, "k": 2,
                                   "error": pytest.approx(-0.30)}
    overall = across["all"]["predict"]
    assert overall["mape"] == pytest.approx(np.mean(np.abs(
        errors + [-0.10, 0.20, -0.30])))
    # the grid's regret: a's best predicted vegas k 4 (120 of 120); b's vegas k 2 (200 of 210)
    assert overall["regret_lowest"] == pytest.approx(200 / 210)


def test_report_prints_and_carries_the_worst_cells(tmp_path):
    """The printed tables name each policy's worst cell and the across-setups summary;
    --json carries the same numbers."""
    plan, got = _pair({"a": A, "b": B})
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "m.json").write_text(json.dumps(got))
    args = ["validate", "report", "--plan", str(tmp_path / "plan.json"), "--measured",
            str(tmp_path / "m.json")]
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    rows = [line for line in text.output.splitlines() if line.startswith("| vegas |")]
    # MAPE (0.10 + 0.25 + 0.20) / 3, the worst cell, r, regret 1
    assert rows[0].startswith("| vegas | 3 | 18.3% | 25.0% (s=0.05 k=4, +25.0%) | ")
    assert rows[0].endswith(" | 1.000 |")
    overall = next(line for line in text.output.splitlines() if line.startswith("| all |"))
    assert "25.0% (vegas s=0.05 k=4, +25.0%)" in overall
    assert "### Across the 2 setups" in text.output
    assert "25.0% (a s=0.05 k=4, +25.0%)" in rows[-1]
    assert "0.952 (b)" in rows[-1]
    carried = json.loads(CliRunner().invoke(cli, args + ["--json"]).stdout)
    assert carried["setups"][0]["per_policy"]["vegas"]["predict"]["worst_cell"]["k"] == 4
    assert carried["across_setups"] == json.loads(json.dumps(
        V.report(plan, got)["across_setups"]))
