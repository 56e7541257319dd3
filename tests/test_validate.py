"""specsim validate: the plan's predictions, the CPU run of its measurement loop, the report's
metrics (MAPE, worst, Pearson r, regret) against hand-computed values, bad files rejected."""
import json
import re

import numpy as np
import pytest

from specsim import validate as V
from specsim.validate import planning as validate_plan
from specsim.validate import reporting as validate_report
from specsim.errors import SpecsimError

TRACE = "traces/smollm2-135m-greedy.jsonl"


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A user catalogue (``SPECSIM_MODELS``) holding the shipped hardware and ``tiny``: a
    2-layer Llama of SmolLM2's attention layout (head_dim 64, 2 query heads per KV head) small
    enough that the engine's CPU runs take seconds. Its name."""
    import shutil

    from specsim.shipped import shipped_root

    root = tmp_path / "catalogue"
    shutil.copytree(shipped_root("models") / "hardware", root / "hardware")
    config = json.loads((shipped_root("models") / "smollm2-135m" / "config.json").read_text())
    config.update(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=256, num_hidden_layers=2, vocab_size=1024)
    (root / "tiny").mkdir()
    (root / "tiny" / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("SPECSIM_MODELS", str(root))
    return "tiny"


def fake(rows_pred, rows_meas, mode="forced", plain=(100.0, 90.0)):
    cfgs = [{"policy": p, "s": s, "k": k, "predict": v, "tokens_per_iteration_predicted": 2.0}
            for (p, s, k), v in rows_pred.items()]
    setup = {"name": "x", "model": "smollm2-135m", "mode": mode, "batch": 2,
             "policies": [], "ks": [], "ss": [], "context": 1024, "iterations": 8,
             "max_new_tokens": 64}
    plan = {V.FORMAT_KEY: 1, "created": "t", "setups": [
        {"setup": setup, "costs": "c", "plain": {"predict": plain[0]}, "configs": cfgs}]}
    got = {V.MEASURED_KEY: 1, "setups": [{"name": "x", "plain_tokens_per_second": plain[1],
                                          "configs": [{"policy": p, "s": s, "k": k,
                                                       "tokens_per_second": v,
                                                       "tokens_per_iteration": 2.5}
                                                      for (p, s, k), v in rows_meas.items()]}]}
    return plan, got


def test_report_metrics_by_hand():
    pred = {("vegas", 0.1, 2): 110.0, ("vegas", 0.1, 4): 90.0, ("vegas", 0.1, 8): 60.0,
            ("quest", 0.1, 2): 50.0, ("vegas", 0.1, 16): 999.0}
    meas = {("vegas", 0.1, 2): 100.0, ("vegas", 0.1, 4): 120.0, ("vegas", 0.1, 8): 60.0,
            ("quest", 0.1, 2): 40.0, ("vegas", 0.1, 16): 10.0}
    rep = V.report(*fake(pred, meas))
    item = rep["setups"][0]
    vegas = item["per_policy"]["vegas"]["predict"]
    err = np.array([0.1, -0.25, 0.0])
    assert vegas["mape"] == pytest.approx(np.abs(err).mean())
    assert vegas["worst"] == pytest.approx(0.25) and vegas["bias"] == pytest.approx(err.mean())
    assert vegas["pearson_r"] == pytest.approx(np.corrcoef([110, 90, 60], [100, 120, 60])[0, 1])
    # predicted best k=2 measured 100, the best measured is 120
    assert vegas["regret"] == pytest.approx(100 / 120)
    assert vegas["predicted_best"] == {"policy": "vegas", "s": 0.1, "k": 2}
    # the cost side alone: batch · tokens/iteration / throughput, predicted (2.0 tokens) over
    # measured (2.5 tokens)
    it = [(2 * 2.0 / p) / (2 * 2.5 / m) - 1 for p, m in ((110, 100), (90, 120), (60, 60))]
    assert item["per_policy"]["vegas"]["iteration_time"]["mape"] == pytest.approx(
        np.mean(np.abs(it)))
    assert item["per_policy"]["vegas"]["iteration_time"]["bias"] == pytest.approx(np.mean(it))
    # k = 16 (q = 17) runs the eager fallback: listed apart, not in the metrics
    assert [r["k"] for r in item["excluded"]] == [16] and item["all"]["configs"] == 4
    assert "Excluded" in V.markdown(rep, {"gpu": "G", "torch": "T"})


def test_acceptance_side_errors_for_free_running():
    pred = {("vegas", 0.1, 2): 100.0, ("vegas", 0.1, 4): 100.0}
    plan, got = fake(pred, pred, mode="free")
    for cfg, mode in zip(plan["setups"][0]["configs"], ("replay", "fitted")):
        cfg["acceptance_mode"], cfg["simulate"] = mode, 100.0
    acc = V.report(plan, got)["setups"][0]["acceptance"]
    assert acc["replay"]["mape"] == pytest.approx(abs(2.0 / 2.5 - 1))
    assert acc["fitted"]["bias"] == pytest.approx(2.0 / 2.5 - 1)


def test_predict_meets_the_steady_window_and_simulate_the_whole_run():
    """predict prices a full batch in steady state, simulate the static batch with its tail:
    each is scored against its own measured window."""
    pred = {("vegas", 0.1, 2): 100.0, ("vegas", 0.1, 4): 120.0, ("vegas", 0.1, 8): 90.0}
    plan, got = fake(pred, {key: 110.0 for key in pred}, mode="free")
    whole = {("vegas", 0.1, 2): 80.0, ("vegas", 0.1, 4): 70.0, ("vegas", 0.1, 8): 50.0}
    sims = {("vegas", 0.1, 2): 88.0, ("vegas", 0.1, 4): 63.0, ("vegas", 0.1, 8): 50.0}
    for cfg, row in zip(plan["setups"][0]["configs"], got["setups"][0]["configs"]):
        key = (cfg["policy"], cfg["s"], cfg["k"])
        cfg["simulate"], cfg["acceptance_mode"] = sims[key], "replay"
        row["tokens_per_second_whole_run"] = whole[key]
    item = V.report(plan, got)["setups"][0]
    sm = item["per_policy"]["vegas"]
    assert sm["predict"]["mape"] == pytest.approx(np.mean([10 / 110, 10 / 110, 20 / 110]))
    assert sm["simulate"]["mape"] == pytest.approx(np.mean([0.1, 0.1, 0.0]))
    assert sm["simulate"]["regret"] == pytest.approx(1.0)          # k = 2 best of the whole run
    assert sm["predict"]["regret"] == pytest.approx(1.0)           # steady window: all tie
    # measurements without a whole-run figure for plain decoding: the window's stands in
    assert item["plain"]["measured_whole_run"] == item["plain"]["measured"]
    assert "whole run" in V.markdown(V.report(plan, got), {"gpu": "G", "torch": "T"})


def test_plan_then_cpu_measurement_round_trip(tmp_path, tiny):
    """Forced setup on the CPU (random weights, short context): the plan's forced k/m is what
    the engine replays, so measured tokens per iteration equal the predicted ones."""
    setups = [V.Setup("t", tiny, "forced", 2, ["streamingllm"], [2], [0.1],
                      context=256, iterations=3)]
    plan = V.build_plan(setups, TRACE, progress=False)
    cfg = plan["setups"][0]["configs"][0]
    assert cfg["predict"] > 0 and len(cfg["forced"]) == 2
    assert all(max(f["m"]) <= 2 and len(f["m"]) == len(cfg["forced"][0]["m"])
               for f in cfg["forced"])
    path = tmp_path / "plan.json"
    V.write_json(str(path), plan)
    got = V.measure(V.read_json(str(path), V.FORMAT_KEY), repeats=1, progress=False,
                    device="cpu")
    row = got["setups"][0]["configs"][0]
    assert row["tokens_per_iteration"] == pytest.approx(cfg["tokens_per_iteration_predicted"])
    assert row["tokens_per_second"] > 0 and got["setups"][0]["plain_tokens_per_second"] > 0
    # forced sequences all run the same iterations: the steady window is the whole loop
    assert row["steady_iterations"] == row["iterations"] == len(cfg["forced"][0]["m"])
    assert row["tokens_per_second_whole_run"] > 0
    # the machine's copy bandwidth, to compare runs on different starts of a machine
    assert got["probe"]["copy_bandwidth_Bps"] > 0
    assert "copy bandwidth" in V.markdown(V.report(plan, got), got)
    # the plan's phase split adds up to its prediction; the report sets the measured one
    # beside it, the measured phases adding up to the loop's time per iteration
    split = cfg["split_predicted_ms"]
    assert set(split) == set(V.PHASES)
    tokens = sum(sum(m + 1 for m in f["m"]) for f in cfg["forced"])
    assert tokens / (len(cfg["forced"][0]["m"]) * sum(split.values()) / 1e3) == \
        pytest.approx(cfg["predict"])
    rep_row = V.report(plan, got)["setups"][0]["rows"][0]
    measured = rep_row["split_measured_ms"]
    # the loop's own clock (the call's fixed costs outside the loop left out), as the
    # calibration's loop overhead is measured; a run without it spreads the whole call
    loop_ms = 1e3 * row["loop_s"] / row["iterations"]
    assert 0 < row["loop_s"] <= row["wall_s"] - row["split_s"].get("prefill", 0.0)
    assert sum(measured.values()) == pytest.approx(loop_ms)
    old = dict(row)
    old.pop("loop_s")
    whole = 1e3 * (row["wall_s"] - row["split_s"].get("prefill", 0.0)) / row["iterations"]
    assert sum(validate_report._measured_split(old).values()) == pytest.approx(whole)
    assert measured["draft"] == pytest.approx(1e3 * row["split_s"]["draft"] / row["iterations"])
    # one prompt of the setup's context prefilled for real, beside the plan's price of it
    assert plan["setups"][0]["prefill"]["tokens"] == 256
    assert len(got["setups"][0]["prefill_s"]) == 1 and got["setups"][0]["prefill_s"][0] > 0
    item = V.report(plan, got)["setups"][0]
    assert item["prefill"]["error"] == pytest.approx(
        plan["setups"][0]["prefill"]["predict_s"] / got["setups"][0]["prefill_s"][0] - 1)
    assert "Prefill of one 256-token prompt: measured" in V.markdown(V.report(plan, got), got)


def test_bad_files_are_rejected(tmp_path):
    (tmp_path / "p.json").write_text('{"x": 1}')
    with pytest.raises(SpecsimError, match="not a specsim validation file"):
        V.read_json(str(tmp_path / "p.json"), V.FORMAT_KEY)
    (tmp_path / "t.json").write_text('{"specsim_validation_plan": 1, "setu')
    with pytest.raises(SpecsimError, match="truncated"):
        V.read_json(str(tmp_path / "t.json"), V.FORMAT_KEY)
    with pytest.raises(SpecsimError, match="no such validation file"):
        V.read_json(str(tmp_path / "none.json"), V.FORMAT_KEY)


def test_validate_report_command(tmp_path):
    from click.testing import CliRunner

    from specsim.cli.main import cli
    plan, got = fake({("vegas", 0.1, 2): 110.0, ("vegas", 0.1, 4): 90.0},
                     {("vegas", 0.1, 2): 100.0, ("vegas", 0.1, 4): 120.0})
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "m.json").write_text(json.dumps(got))
    r = CliRunner().invoke(cli, ["validate", "report", "--plan", str(tmp_path / "plan.json"),
                                 "--measured", str(tmp_path / "m.json"), "--markdown",
                                 str(tmp_path / "v.md")])
    assert r.exit_code == 0, r.output
    # the tables printed are the Markdown written, with predict's error columns
    assert (tmp_path / "v.md").read_text().strip() == r.output.strip()
    head = next(x for x in r.output.splitlines() if x.startswith("| policy |"))
    assert [c.strip() for c in head.split("|")[3:7]] == [
        "predict MAPE", "predict worst", "predict r", "predict regret"]
    r = CliRunner().invoke(cli, ["validate"])
    assert r.exit_code == 0 and "specsim validate plan" in r.output
    # an existing plan is a record: not overwritten without --force (checked before any work)
    before = (tmp_path / "plan.json").read_text()
    r = CliRunner().invoke(cli, ["validate", "plan", "--no-free", "--out",
                                 str(tmp_path / "plan.json")])
    assert r.exit_code == 2 and "--force" in r.output
    assert (tmp_path / "plan.json").read_text() == before
    got["plan_created"] = "t"
    for i, cfg in enumerate(got["setups"][0]["configs"]):
        part = dict(got, setups=[dict(got["setups"][0], configs=[cfg])])
        (tmp_path / f"part{i}.json").write_text(json.dumps(part))
    r = CliRunner().invoke(cli, ["validate", "merge", str(tmp_path / "part0.json"),
                                 str(tmp_path / "part1.json"), "--out", str(tmp_path / "m2.json")])
    assert r.exit_code == 0 and "2 configurations" in r.output, r.output
    merged = json.loads((tmp_path / "m2.json").read_text())
    assert merged["setups"][0]["configs"] == got["setups"][0]["configs"]


def test_free_setup_runs_its_prompts_as_a_continuous_batch(tmp_path, tiny):
    """A free setup with five prompts for two slots: the plan simulates that continuous batch
    (not one static batch) and prices full batches of the prompts in slot order; the CPU run
    (random weights from a safetensors folder) queues the prompts, so the steady window lasts
    until the queue is empty."""
    import torch
    from safetensors.torch import save_file

    from specsim.engine import build_model
    from specsim.shipped import catalog_dir
    config = json.loads((catalog_dir() / tiny / "config.json").read_text())
    model = build_model(config, weights="random", seed=3)
    state = model.state_dict()
    state.pop("lm_head.weight")       # tied to the embedding
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    del model
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 1000, n).tolist() for n in (300, 260, 330, 280)]
    prompts.append(list(prompts[1]))      # a repeated prompt: its prefill is shared
    setup = V.Setup("f", tiny, "free", 2, ["streamingllm"], [2], [0.1],
                    max_new_tokens=8, prompts=prompts, weights=str(tmp_path))
    plan = V.build_plan([setup], TRACE, progress=False)
    entry = plan["setups"][0]
    cfg = entry["configs"][0]
    # 7 iteration tokens per answer: the last iteration's surplus drafts are not emitted
    assert 1.0 < cfg["emitted_per_iteration_predicted"] < cfg["tokens_per_iteration_predicted"]
    static = validate_plan._simulate(TRACE, tiny, "h200", 5, [len(p) for p in prompts], 8,
                         "streamingllm", 0.1, 2)
    continuous = validate_plan._simulate(TRACE, tiny, "h200", 2, [len(p) for p in prompts], 8,
                             "streamingllm", 0.1, 2)
    assert cfg["simulate"] == pytest.approx(continuous["decode_throughput"])
    assert continuous["mean_batch"] < static["mean_batch"] == pytest.approx(5.0)
    assert [list(c) for c in validate_plan._full_batches(setup)] == [[304, 264], [334, 284]]
    got = V.measure(plan, repeats=1, progress=False, device="cpu")
    row = got["setups"][0]["configs"][0]
    assert 0 < row["steady_iterations"] < row["iterations"]
    assert len(row["request_iterations"]) == 5 == len(row["request_tokens_per_iteration"])
    assert max(row["request_iterations"]) <= row["iterations"]
    assert row["tokens_per_second"] > 0 and row["tokens_per_second_whole_run"] > 0
    assert 1.0 <= row["tokens_per_iteration"] <= 3.0
    assert row["emitted_per_iteration_whole_run"] <= row["tokens_per_iteration_whole_run"]
    slow = row["slowest_iterations"]          # [seconds, index, active], longest first
    assert len(slow) == 3 and slow[0][0] >= slow[1][0] >= slow[2][0] > 0
    assert all(0 <= i < row["iterations"] and 1 <= a <= 2 for _, i, a in slow)
    assert V.slowest_steps([(0.1, 2, 3), (0.5, 1, 1), (0.2, 2, 2)], 2) == [[0.5, 1, 1],
                                                                          [0.2, 2, 2]]
    with torch.inference_mode():
        rep = V.report(plan, got)
    assert rep["setups"][0]["setup"]["requests"] == 5
    assert "5 prompts as a continuous batch" in V.markdown(rep, got)


def test_plan_parts_and_merged_measurements():
    pred = {("vegas", 0.1, 2): 110.0, ("quest", 0.1, 2): 90.0, ("quest", 0.1, 4): 80.0}
    plan, got = fake(pred, pred)
    part = V.select(plan, "x", "quest")
    assert [c["policy"] for c in part["setups"][0]["configs"]] == ["quest", "quest"]
    assert V.select(plan, "other")["setups"] == []
    got["plan_created"] = "t"
    a = dict(got, setups=[dict(got["setups"][0], configs=got["setups"][0]["configs"][:1])])
    b = dict(got, setups=[dict(got["setups"][0], configs=got["setups"][0]["configs"][1:])])
    merged = V.merge_measured([dict(a, probe={"copy_bandwidth_Bps": 4e12}), b, b])
    assert merged["setups"][0]["configs"] == got["setups"][0]["configs"]
    # each setup keeps the probe of the machine start that measured it
    assert merged["setups"][0]["probe"] == {"copy_bandwidth_Bps": 4e12}
    assert V.report(plan, merged)["setups"][0]["all"]["configs"] == 3
    with pytest.raises(SpecsimError, match="different plans"):
        V.merge_measured([a, dict(b, plan_created="u")])


def test_steady_state_uses_every_answers_tokens_per_iteration():
    """The steady window of a finite queue over-weights answers' beginnings: predict is scored
    on the window's iteration time with the tokens per iteration of all answers; the cost
    side on the window alone; the acceptance side on all answers."""
    pred = {("vegas", 0.1, 2): 100.0, ("vegas", 0.1, 4): 130.0}
    plan, got = fake(pred, {("vegas", 0.1, 2): 100.0, ("vegas", 0.1, 4): 110.0}, mode="free")
    for cfg in plan["setups"][0]["configs"]:
        cfg["acceptance_mode"], cfg["simulate"] = "replay", 90.0
    rows = got["setups"][0]["configs"]
    rows[1]["tokens_per_iteration_whole_run"] = 3.0          # window 2.5
    item = V.report(plan, got)["setups"][0]
    r = {row["k"]: row for row in item["rows"]}
    assert r[4]["measured"] == pytest.approx(110.0 * 3.0 / 2.5) and r[4]["measured_window"] == 110
    # with the emitted figure (last iterations cut at the answer's length) that one counts
    rows[1]["emitted_per_iteration_whole_run"] = 2.8
    plan["setups"][0]["configs"][1]["emitted_per_iteration_predicted"] = 1.9
    again = {row["k"]: row for row in V.report(plan, got)["setups"][0]["rows"]}
    assert again[4]["measured"] == pytest.approx(110.0 * 2.8 / 2.5)
    assert again[4]["iteration_ms_predicted"] == pytest.approx(1e3 * 2 * 1.9 / 130)
    del rows[1]["emitted_per_iteration_whole_run"]
    del plan["setups"][0]["configs"][1]["emitted_per_iteration_predicted"]
    assert r[2]["measured"] == pytest.approx(100.0)          # no whole-run figure: the window
    sm = item["per_policy"]["vegas"]
    assert sm["predict"]["mape"] == pytest.approx(np.mean([0.0, abs(130 / 132 - 1)]))
    # cost side: 2 · 2.0 / 130 predicted vs 2 · 2.5 / 110 measured (the window's)
    assert r[4]["iteration_ms_measured"] == pytest.approx(1e3 * 2 * 2.5 / 110)
    assert item["acceptance"]["replay"]["worst"] == pytest.approx(abs(2.0 / 3.0 - 1))


def _prompt_file(path, names):
    from specsim.engine.record import write_prompt_ids
    write_prompt_ids(str(path), names, [[len(n)] * 3 + [i] for i, n in enumerate(names)], "test")
    return str(path)


def test_free_setup_decodes_the_prompts_the_trace_recorded(tmp_path):
    """The free-running setup cycles only the prompt-id file's prompts whose acceptance the
    trace holds (its predictions come from those records), over as many requests as asked; the
    plan names the file and its sha256 instead of copying the token ids, and a setup read
    back from the plan has the same tokens (as has a plan that holds the token ids itself)."""
    import json

    from specsim.cli.validate_cmd import default_setups

    names = ["p0", "p1", "p10", "p100", "p1000"]
    path = _prompt_file(tmp_path / "ids.json", names)
    keep = {"p1", "p100"}
    setups = default_setups(["vegas"], [2], [2], [0.1], 4, 1024, "/w", path, 10, keep)
    free = setups[1]
    assert free.batch == 4 and len(free.prompts) == 10
    assert free.prompt_ids == ["p1", "p100"] * 5                 # file order, cycled
    assert all(p == [len(i)] * 3 + [names.index(i)] for p, i in zip(free.prompts, free.prompt_ids))
    record = json.loads(json.dumps(free.to_json()))
    assert record["prompts"] == [] and record["prompts_file"] == path
    assert V.Setup(**record).prompts == free.prompts
    assert V.Setup(**dict(record, prompts_file=None, prompts=free.prompts)).prompts == \
        free.prompts                                   # a plan holding its token ids itself
    with pytest.raises(SpecsimError, match="none of the prompts"):
        default_setups(["vegas"], [2], [2], [0.1], 4, 1024, "/w", path, 10, {"nope"})
    _prompt_file(tmp_path / "ids.json", names[::-1])     # not the file the plan was made with
    with pytest.raises(SpecsimError, match="not the file the plan was made with"):
        V.Setup(**record)
    with pytest.raises(SpecsimError, match="no prompt p7"):
        V.Setup(**dict(record, prompt_ids=["p7"], prompts_sha256=None))
    with pytest.raises(SpecsimError, match="not found"):
        V.Setup(**dict(record, prompts_file=str(tmp_path / "gone.json")))


def test_prompt_sets_and_a_trace_of_the_extended_set(tmp_path):
    """The extended set is the default 12 followed by 36 more, all distinct, and the shipped
    prompt-id file holds them in that order; a trace that recorded extended prompts gets them
    in the free setup; no trace ids: the default 12."""
    import specsim.engine.prompts as P
    from specsim.cli.validate_cmd import default_setups
    from specsim.engine.record import read_prompt_ids

    default, extended = P.default_specs(), P.default_specs("extended")
    assert [s.id for s in extended[:12]] == [s.id for s in default] and len(default) == 12
    assert len(extended) == 48 == len({s.id for s in extended})
    assert all(s.end > s.start for s in extended)
    with pytest.raises(SpecsimError, match="unknown prompt set"):
        P.default_specs("nope")
    shipped = "traces/smollm2-prompt-ids-extended.json"
    assert read_prompt_ids(V.repo_file(shipped)[0])[0] == [s.id for s in extended]
    path = _prompt_file(tmp_path / "ids.json", [s.id for s in extended])
    keep = {extended[0].id, extended[20].id, extended[47].id}
    free = default_setups(["vegas"], [2], [2], [0.1], 4, 1024, "/w", path, 6, keep)[1]
    assert set(free.prompt_ids) == keep
    free = default_setups(["vegas"], [2], [2], [0.1], 4, 1024, "/w", path, 24, None)[1]
    assert set(free.prompt_ids) == {s.id for s in default}
    # the shipped file is named relative to the repository, wherever the plan is made from
    free = default_setups(["vegas"], [2], [2], [0.1], 4, 1024, "/w", shipped, 4, None)[1]
    assert free.prompts_file == shipped and len(free.prompts[0]) > 1000


def test_cost_side_by_phase_in_the_report():
    """Per policy, mean ms per iteration by phase, measured (phase totals over iterations;
    'other' takes what no phase covered) vs predicted, in the JSON and the Markdown."""
    pred = {("vegas", 0.1, 2): 100.0, ("vegas", 0.1, 4): 130.0}
    plan, got = fake(pred, {("vegas", 0.1, 2): 100.0, ("vegas", 0.1, 4): 110.0}, mode="free")
    for n, (cfg, row) in enumerate(zip(plan["setups"][0]["configs"],
                                       got["setups"][0]["configs"])):
        cfg["split_predicted_ms"] = {"draft": 4.0 + n, "verify": 3.0, "selection": 0.5,
                                     "other": 1.8}
        row["iterations"] = 10
        row["split_s"] = {"prefill": 0.5, "draft": 0.04 + 0.01 * n, "verify": 0.03,
                          "selection": 0.005, "other": 0.008}
        row["wall_s"] = 0.5 + 0.04 + 0.01 * n + 0.03 + 0.005 + 0.010   # 2 ms not in a phase
    item = V.report(plan, got)["setups"][0]
    ph = item["per_policy"]["vegas"]["phases"]
    assert ph["draft"]["measured"] == pytest.approx(4.5) and ph["draft"]["predicted"] == 4.5
    assert ph["other"]["measured"] == pytest.approx(1.0) and ph["other"]["predicted"] == 1.8
    assert ph["selection"]["measured"] == pytest.approx(0.5)
    text = V.markdown(V.report(plan, got), got)
    assert "Cost side by phase" in text and "| vegas | 4.50 / 4.50 | 3.00 / 3.00 |" in text
    # plans and measurements without the split: no phase table
    for cfg in plan["setups"][0]["configs"]:
        del cfg["split_predicted_ms"]
    assert V.report(plan, got)["setups"][0]["per_policy"]["vegas"]["phases"] is None
    assert "Cost side by phase" not in V.markdown(V.report(plan, got), got)


def test_report_counts_the_answers_that_decoded_as_the_trace_recorded(tmp_path):
    """A free-running run's answers are compared with the plan's trace at the recorded k: an
    answer with the recorded iterations and tokens per iteration decoded the recorded text
    (bf16 near-ties can send it elsewhere); configurations at other k are not compared."""
    from click.testing import CliRunner

    from specsim.cli.main import cli
    from specsim.traces.format import RequestTrace, Trace, make_header, write_trace
    recs = [RequestTrace(f"{p}|vegas", "vegas", 0.1, np.array([100, 103, 105]),
                         np.full(3, 4), np.array(m), prompt_id=p)
            for p, m in (("a", [2, 1, 4]), ("b", [0, 0, 3]))]
    trace = tmp_path / "t.jsonl"
    write_trace(str(trace), make_header(source="test"), recs)
    plan, got = fake({("vegas", 0.1, 4): 100.0, ("vegas", 0.1, 2): 90.0},
                     {("vegas", 0.1, 4): 100.0, ("vegas", 0.1, 2): 95.0}, mode="free")
    plan["setups"][0]["setup"]["prompt_ids"] = ["a", "b", "a"]
    plan["trace"], plan["trace_sha256"] = str(trace), V.file_sha(str(trace))
    at_k4, at_k2 = got["setups"][0]["configs"]
    # a: 3 iterations of 10/3 tokens as recorded (twice); b: another text (3 iterations too,
    # but 2.5 tokens each where the record has 2)
    at_k4.update(request_iterations=[3, 3, 3], request_tokens_per_iteration=[10 / 3, 2.5, 10 / 3])
    at_k2.update(request_iterations=[5, 4, 5], request_tokens_per_iteration=[2.0, 2.0, 2.0])
    rep = V.report(plan, got, Trace(make_header(source="test"), recs))
    agree = rep["setups"][0]["trace_agreement"]
    assert agree == {"configs": 1, "requests": 3, "matching_mean": 2.0, "matching_min": 2,
                     "prompts_never_matching": ["b"]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "m.json").write_text(json.dumps(got))
    r = CliRunner().invoke(cli, ["validate", "report", "--plan", str(tmp_path / "plan.json"),
                                 "--measured", str(tmp_path / "m.json")])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("Answers decoded exactly"))
    assert re.findall(r"\d+\.\d+|\d+", line.split(":", 1)[1])[:3] == ["2.0", "3", "2"]
    assert line.endswith("never: b.")
    trace.write_text(trace.read_text() + "\n")        # another trace than the plan's: not used
    r = CliRunner().invoke(cli, ["validate", "report", "--plan", str(tmp_path / "plan.json"),
                                 "--measured", str(tmp_path / "m.json")])
    assert r.exit_code == 0 and "not the trace the plan was made with" in r.output
    assert "decoded exactly" not in r.output


def test_long_prompt_set_fills_the_context_and_keeps_the_other_sets():
    """The 8K set cuts each extended-set file to LONG_TOKENS, moved back where it would run past
    the file's end, and skips files too short for it; the default and extended sets' excerpts
    (the shipped traces' prompts) are not moved by that."""
    import hashlib

    import specsim.engine.prompts as P
    from specsim.cli.engine_cmds import trace_cmd

    extended, long = P.default_specs("extended"), P.default_specs("long")
    want = int(P.LONG_TOKENS * P.BYTES_PER_TOKEN)
    size = {s.id: P.module_file(s.module).stat().st_size for s in extended}
    assert [s.id for s in long] == [f"{s.id}-8k" for s in extended if size[s.id] >= want]
    assert len(long) >= 36
    where = {pid: w for pid, _, w, _, _ in P.LONG_SET}
    moved = 0
    for spec in long:
        full = size[spec.id[:-len("-8k")]]
        assert spec.end <= full and spec.end - spec.start >= want - 400     # whole lines
        assert spec.sha256 == hashlib.sha256(P.excerpt(spec)).hexdigest()
        moved += spec.start < int(full * where[spec.id]) - 200
    assert moved > 0                    # some excerpts had to start earlier to fit their file
    table = {pid: (w, t) for pid, _, w, t, _ in P.DEFAULT_SET + P.EXTRA_SET}
    for spec in extended:              # not fitted: the recorded sets' byte ranges stand
        w, t = table[spec.id]
        assert spec == P.resolve(spec.module, w, t, spec.task, spec.id)
    with pytest.raises(SpecsimError, match="shorter than"):
        P.resolve("textwrap", 0.1, P.LONG_TOKENS, "test", "x", fit=True)
    choices = next(p for p in trace_cmd.params if p.name == "prompt_set").type.choices
    assert sorted(choices) == sorted(P.PROMPT_SETS)


def test_smollm2_table_script_builds_its_setups_and_speedups():
    """benchmarks/bench_smollm2_table.py (BENCHMARKS.md's SmolLM2 8K table): one free setup
    per batch size cycling the prompts (twice the slots by default), and speedups over the
    same setup's plain rate."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_smollm2_table.py"
    spec = importlib.util.spec_from_file_location("smollm2_table", path)
    T = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(T)
    prompts = [("a", [1] * 5), ("b", [2] * 7), ("c", [3] * 6)]
    b2, b4 = T.table_setups(prompts, [2, 4], None, "vegas", [2, 4], [0.05], 128, "/w")
    assert (b2.batch, len(b2.prompts), b4.batch, len(b4.prompts)) == (2, 4, 4, 8)
    assert b4.prompt_ids == ["a", "b", "c", "a", "b", "c", "a", "b"]
    assert b4.prompts[4] == [2] * 7 and b4.mode == "free" and b4.weights == "/w"
    assert len(T.table_setups(prompts, [4], 2, "vegas", [2], [0.1], 8, "/w")[0].prompts) == 4
    measured = {"setups": [{"name": "smollm2-b2", "plain_tokens_per_second": 100.0,
                            "plain_tokens_per_second_whole_run": 80.0, "configs": [
                                {"policy": "vegas", "s": 0.05, "k": k, "tokens_per_second": t,
                                 "tokens_per_second_whole_run": w,
                                 "tokens_per_iteration_whole_run": k + 0.5}
                                for k, t, w in ((2, 150.0, 100.0), (4, 130.0, 120.0))]}]}
    rows = T.speedup_rows(measured)
    assert [r["speedup"] for r in rows] == [1.5, 1.3]
    assert [r["speedup_whole_run"] for r in rows] == [1.25, 1.5]
    text = T.markdown(rows)
    assert "| 2 | 1.50× (2.50) |" in text and "best: k = 2, s = 0.05: 1.50× (whole run 1.25×)" \
        in text


def test_plan_command_names_the_shipped_prompts_and_trace(tmp_path, monkeypatch):
    """`specsim validate plan` needs no tokenizer: the free setup reads the shipped
    prompt-id file, and the plan names it and the trace relative to the repository (as the
    GPU machine's copy of the tree has them), from any working directory."""
    import json

    from click.testing import CliRunner

    from specsim.cli.main import cli

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["validate", "plan", "--policies", "vegas", "--s", "0.05",
                                      "--k-free", "2", "--k-forced", "2", "--requests-free",
                                      "32", "--out", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())
    assert plan["trace"] == "traces/smollm2-135m-greedy-bf16-h200-continuous.jsonl"
    free = plan["setups"][1]["setup"]
    assert free["prompts_file"] == "traces/smollm2-prompt-ids-extended.json"
    assert free["prompts"] == [] and len(free["prompt_ids"]) == 32
    assert out.stat().st_size < 100_000           # the token ids stay in the prompt-id file
    assert V.Setup(**free).prompts[0][:1] and plan["setups"][1]["configs"][0]["predict"] > 0
    for entry, model in zip(plan["setups"], ("qwen3-8b", "smollm2-135m")):  # the costs' file
        assert entry["calibration"] == f"models/calibrations/h200/{model}.json"
        assert entry["calibration_sha256"] == V.file_sha(V.repo_file(entry["calibration"])[0])


def test_report_finds_the_shipped_run_and_its_trace_from_any_directory(tmp_path, monkeypatch):
    """`validate report --plan models/validation/RUN-plan.json` works from any folder: the
    shipped plan, its own measurements (no --measured needed) and the trace the plan names
    are found in the shipped data, so the answers are compared with the trace's records."""
    from click.testing import CliRunner

    from specsim.cli.main import cli
    monkeypatch.chdir(tmp_path)
    plan = "models/validation/h200-smollm2-135m-plan.json"
    r = CliRunner().invoke(cli, ["validate", "report", "--plan", plan, "--json"])
    assert r.exit_code == 0, r.output
    named = CliRunner().invoke(cli, ["validate", "report", "--plan", plan, "--json", "--measured",
                                     "models/validation/h200-smollm2-135m-measured.json"])
    assert json.loads(r.stdout) == json.loads(named.stdout)
    free = next(s for s in json.loads(r.stdout)["setups"] if s["setup"]["mode"] == "free")
    assert free["trace_agreement"]["configs"] > 0
    missing = CliRunner().invoke(cli, ["validate", "report"])
    assert missing.exit_code != 0
    assert "validation-plan.json" in str(missing.exception) and plan in str(missing.exception)
