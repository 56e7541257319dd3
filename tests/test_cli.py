"""The `specsim` CLI through click's test runner: JSON contracts, tables, bad input."""
import io
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
from click.testing import CliRunner

from specsim.cli.main import cli, main
from specsim.costs import RooflineCostModel
from specsim.specs import load_hardware, load_model
from specsim.traces.format import RequestTrace, make_header, write_trace


def run(args):
    """Invoke through main() (one-line errors) and capture exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def invoke_json(args):
    result = CliRunner().invoke(cli, args + ["--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def small_trace(path, k=4, p=0.8, requests=6, iterations=80, seed=0, policies=("vegas",),
                sparsities=(0.05,)):
    rng = np.random.default_rng(seed)
    recs = []
    for policy in policies:
        for s in sparsities:
            for r in range(requests):
                acc = rng.random((iterations, k)) < p
                m = np.where(acc.all(1), k, np.argmin(acc, axis=1))
                ctx = 4000 + r * 500 + np.cumsum(m + 1)
                recs.append(RequestTrace(f"{policy}{s}{r}", policy, s, ctx, np.full(iterations, k),
                                         m))
    write_trace(path, make_header(source="test"), recs)
    return path


def test_what_if_alpha_json():
    r = invoke_json(["predict", "--alpha", "0.8", "--gamma", "0.1", "--k-max", "16"])
    # α > γ: S grows with k, so k* is the largest k: (0.8·16 + 1)/(16·0.1 + 1) = 13.8/2.6
    assert r["k_star"] == 16
    assert r["speedup_at_k_star"] == pytest.approx(13.8 / 2.6)
    assert [c["k"] for c in r["curve"]] == list(range(1, 17))
    assert r["curve"][3] == {"k": 4, "expected_tokens": pytest.approx(4.2),
                             "speedup": pytest.approx(3.0)}
    r = invoke_json(["predict", "--alpha", "0.05", "--gamma", "0.1"])
    assert r["k_star"] == 1 and not r["longer_drafts_help"]


def test_what_if_rates_json():
    r = invoke_json(["predict", "--accept-rates", "0.9,0.8,0.5", "--gamma", "0.1"])
    # S(1) = 1.9/1.1, S(2) = 2.62/1.2, S(3) = 2.98/1.3 → k* = 3
    assert [c["speedup"] for c in r["curve"]] == pytest.approx([1.9 / 1.1, 2.62 / 1.2, 2.98 / 1.3])
    assert [c["expected_tokens"] for c in r["curve"]] == pytest.approx([1.9, 2.62, 2.98])
    assert r["k_star"] == 3 and r["speedup_at_k_star"] == pytest.approx(2.98 / 1.3)


def test_what_if_table_output():
    result = CliRunner().invoke(cli, ["predict", "--alpha", "0.6", "--gamma", "0.2"])
    assert result.exit_code == 0
    assert "k* = 16" in result.output and "longer drafts help" in result.output


def test_costs_json_by_hand():
    r = invoke_json(["costs", "--model", "qwen3-8b", "--hardware", "h200", "--batch", "4",
                     "--context", "32768", "--k", "7", "--costs", "roofline"])
    spec, hw = load_model("qwen3-8b"), load_hardware("h200")
    plain = RooflineCostModel(spec, hw).plain_step([32768] * 4)
    assert r["plain_step"]["weight_bytes"] == pytest.approx(plain.weight_bytes)
    # KV: 4 · 32768 tokens read (+ 4 written) · 147,456 B
    assert r["plain_step"]["kv_bytes"] == pytest.approx((4 * 32768 + 4) * 147_456)
    assert r["plain_step"]["floor_ms"] == pytest.approx(
        r["plain_step"]["bytes"] / 4.3e12 * 1e3)
    assert r["batch"] == 4 and r["verify"]["ms"] > r["draft_step"]["ms"]
    assert sum(r["iteration_split_ms"].values()) == pytest.approx(r["iteration_ms"])


def test_costs_ragged_contexts_and_table():
    r = invoke_json(["costs", "--context", "1000,9000", "--model", "llama-3.1-8b"])
    assert r["contexts"] == [1000, 9000] and r["batch"] == 2
    result = CliRunner().invoke(cli, ["costs", "--batch", "2", "--context", "4096"])
    assert result.exit_code == 0 and "verify q=9" in result.output and "floor" in result.output


def test_predict_trace_json_contract(tmp_path):
    path = small_trace(tmp_path / "t.jsonl", sparsities=(0.03, 0.1), policies=("vegas", "quest"))
    r = invoke_json(["predict", "--trace", str(path), "--batch", "8", "--bootstrap", "200"])
    assert len(r["groups"]) == 4 and r["batch"] == 8
    for g in r["groups"]:
        speeds = [c["speedup"] for c in g["curve"]]
        assert g["k_star"] == 1 + int(np.argmax(speeds))
        assert g["speedup_at_k_star"] == pytest.approx(max(speeds))
        lo, hi = g["speedup_at_k_star_ci"]
        assert lo <= g["speedup_at_k_star"] <= hi
        assert g["observed_tokens_per_iteration"] == pytest.approx(
            g["curve"][-1]["expected_tokens"])
        assert len(g["contexts"]) == 8
        assert {"draft", "verify", "selection", "other"} == set(g["cost_split_at_k_star"])
        assert all(not c["extrapolated"] for c in g["curve"])
    assert {p["policy"] for p in r["policies"]} == {"vegas", "quest"}
    assert all("three_step" in p for p in r["policies"])
    assert r["best"]["speedup"] == pytest.approx(max(g["speedup_at_k_star"] for g in r["groups"]))
    assert r["model"]["name"] == "qwen3-8b" and r["hardware"]["ceilings"] == "measured"


def test_predict_extrapolation_flagged(tmp_path):
    path = small_trace(tmp_path / "t.jsonl", k=3)
    r = invoke_json(["predict", "--trace", str(path), "--k-max", "6", "--bootstrap", "100"])
    g = r["groups"][0]
    assert [c["extrapolated"] for c in g["curve"]] == [False] * 3 + [True] * 3
    assert [c["replay"] for c in g["curve"]][:3] == ["counterfactual"] * 3


def test_predict_context_override_and_larger_batch_helps(tmp_path):
    path = small_trace(tmp_path / "t.jsonl")
    small = invoke_json(["predict", "--trace", str(path), "--batch", "1", "--context", "2048",
                         "--bootstrap", "100"])
    big = invoke_json(["predict", "--trace", str(path), "--batch", "64", "--context", "32768",
                       "--bootstrap", "100"])
    assert small["groups"][0]["contexts"] == [2048]
    # KV-bound regimes are where sparse drafting pays
    assert big["best"]["speedup"] > small["best"]["speedup"]


def test_predict_default_trace_table():
    result = CliRunner().invoke(cli, ["predict", "--bootstrap", "100"])
    assert result.exit_code == 0, result.output
    # the shipped default is the real SmolLM2 trace, costed on the model it was recorded on
    # (recorded in bf16 on the H200 as one continuous batch, as the default hardware serves it)
    assert "smollm2-135m-greedy-bf16-h200-continuous.jsonl" in result.output
    assert "SYNTHETIC" not in result.output
    lines = result.output.splitlines()
    assert next(x for x in lines if x.startswith("model ")).split()[1] == "smollm2-135m:"
    assert next(x for x in lines if x.startswith("costs ")).split()[1] == "calibrated"
    best = next(x for x in lines if x.startswith("Best:"))
    report = invoke_json(["predict", "--bootstrap", "100"])
    assert f"{report['best']['policy']} at s = {report['best']['s']:g}, k = " \
        f"{report['best']['k']}: {report['best']['speedup']:.2f}×" in best
    # measured costs: a note says Quest's are those of specsim's own page selection
    assert any(x.startswith("(quest: measured") for x in lines)
    roofline = CliRunner().invoke(cli, ["predict", "--bootstrap", "50", "--costs", "roofline"])
    assert roofline.exit_code == 0
    assert not any(x.startswith("(quest:") for x in roofline.output.splitlines())


def test_bad_trace_one_line_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(make_header(source="t")) + "\n"
                    + json.dumps({"type": "request", "id": "a", "policy": "vegas", "s": 0.05,
                                  "context": [10, 12], "k": [2, 2], "m": [1, 3]}) + "\n")
    code, out, err = run(["predict", "--trace", str(path), "--format", "specsim"])
    assert code != 0
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{path}:2" in err and "m[1]" in err and "accepted 3 > drafted k=2" in err


def test_unknown_names_are_bad_data_and_bad_options_bad_usage(tmp_path):
    code, _, err = run(["costs", "--model", "nope"])
    assert code == 1 and "known:" in err and "qwen3-8b" in err
    code, _, err = run(["costs", "--hardware", "tpu"])
    assert code == 1 and "h200" in err
    code, _, err = run(["costs", "--policy", "magic"])
    assert code == 1 and "known: vegas" in err
    code, _, err = run(["predict", "--trace", str(tmp_path / "missing.jsonl")])
    assert code == 1 and "missing.jsonl" in err and "Traceback" not in err
    code, _, err = run(["predict", "--alpha", "0.5"])
    assert code == 2 and "--gamma" in err
    code, _, err = run(["predict", "--accept-rates", "0.5,x", "--gamma", "0.1"])
    assert code == 2 and "comma-separated" in err
    for text in (err,):
        assert text.startswith("specsim: error: ") and text.count("\n") == 1


def test_catalogue_commands():
    models = invoke_json(["models"])
    assert {m["name"] for m in models} >= {"qwen3-8b", "gpt-oss-20b", "smollm2-135m"}
    hw = invoke_json(["hardware"])
    assert hw["h200"]["bandwidth_TBps"] == pytest.approx(4.3)
    assert hw["a40"]["ceilings"] == "datasheet"


def test_cpu_paths_do_not_import_gpu_or_heavy_modules():
    code = ("import sys; import specsim.cli.main, specsim.predict, specsim.costs, "
            "specsim.traces.importers; from specsim.cli.main import main; "
            "main(['predict', '--alpha', '0.5', '--gamma', '0.1', '--json']); "
            "bad = [m for m in ('torch', 'triton', 'simpy', 'plotly') if m in sys.modules]; "
            "sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_batch_that_does_not_fit_is_flagged(tmp_path):
    path = small_trace(tmp_path / "t.jsonl")
    r = invoke_json(["predict", "--trace", str(path), "--batch", "64", "--context", "131072",
                     "--bootstrap", "50"])
    assert any("does not fit" in n for n in r["notes"])
    r = invoke_json(["predict", "--trace", str(path), "--batch", "2", "--context", "8192",
                     "--bootstrap", "50"])
    assert not any("does not fit" in n for n in r["notes"])


def _option_help(command, name):
    return next(p for p in command.params if p.name == name).help


def test_every_trace_command_states_and_uses_the_shared_defaults():
    """Each command's help names the default it really uses: the shared trace (review: its
    own, the trace its shipped proxy check was measured like), the trace's model, the shared
    hardware; and predict without arguments reads that trace and costs that model."""
    from specsim.cli import defaults
    from specsim.cli.dashboard_cmd import dashboard_cmd
    from specsim.cli.review_cmd import review_cmd
    from specsim.cli.simulate_cmds import simulate_cmd, tune_cmd
    from specsim.cli.validate_cmd import plan_cmd

    predict = cli.commands["predict"]
    for command in (predict, dashboard_cmd, simulate_cmd, tune_cmd, plan_cmd):
        assert defaults.TRACE in _option_help(command, "trace_path"), command.name
    assert defaults.REVIEW_TRACE in _option_help(review_cmd, "trace_path")
    for command in (predict, dashboard_cmd, simulate_cmd, tune_cmd, review_cmd):
        params = {p.name: p for p in command.params}
        assert params["model"].default is None, command.name       # the trace's model
        assert defaults.FALLBACK_MODEL in params["model"].help
        assert params["hardware"].default == defaults.HARDWARE
    costs_model = next(p for p in cli.commands["costs"].params if p.name == "model")
    assert costs_model.default == defaults.FALLBACK_MODEL
    # the top-level help names what `specsim predict` costs by default
    top = CliRunner().invoke(cli, ["--help"]).output
    r = invoke_json(["predict", "--bootstrap", "50"])
    assert r["trace"].endswith(defaults.TRACE.rsplit("/", 1)[1])
    assert r["model"]["name"] == r["trace_model"] == "smollm2-135m"
    assert "SmolLM2-135M" in top.split("specsim predict", 1)[1].split("\n")[0]


def test_model_for_a_trace():
    from specsim.cli import defaults
    assert defaults.model_for("llama-3.1-8b", {"model": "smollm2-135m"}) == \
        ("llama-3.1-8b", "--model")
    assert defaults.model_for(None, {"model": "SmolLM2-135M"})[0] == "smollm2-135m"
    for header in ({"model": "no-such-model"}, {}):
        name, why = defaults.model_for(None, header)
        assert name == defaults.FALLBACK_MODEL and why.startswith("default")


def _fixed_k_trace(path, k, prompts, seed=0):
    rng = np.random.default_rng(seed)
    records = []
    for j in range(prompts):
        m = rng.integers(0, k + 1, 20)
        records.append(RequestTrace(f"vegas-{j}", "vegas", 0.05,
                                    2000 + np.concatenate([[0], np.cumsum(m + 1)[:-1]]),
                                    np.full(20, k), m, prompt_id=f"p{j}"))
    write_trace(path, make_header(source="test", model="smollm2-135m"), records)
    return path


@pytest.mark.parametrize("k", [1, 3, 12])
def test_acceptance_table_shows_the_positions_the_trace_recorded(tmp_path, k):
    trace = _fixed_k_trace(tmp_path / "t.jsonl", k, 6)
    code, out, err = run(["predict", "--trace", str(trace), "--bootstrap", "50"])
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("policy") and "k_rec" in line)
    shown = min(k, 8)
    assert header.split()[-1] == f"P_{shown}"
    assert ("p_1 … p_%d" % shown if shown > 1 else "p_1") in header
    assert f"p_{shown + 1}" not in header
    row = next(line for line in out.splitlines() if line.startswith("vegas"))
    rates = row.split()[7:7 + shown]
    assert len(rates) == shown and all(0 <= float(x) <= 1 for x in rates)


def test_header_states_the_context_lengths_assumed(tmp_path):
    trace = _fixed_k_trace(tmp_path / "t.jsonl", 3, 6)
    code, out, _ = run(["predict", "--trace", str(trace), "--bootstrap", "50"])
    line = next(x for x in out.splitlines() if x.startswith("context"))
    report = invoke_json(["predict", "--trace", str(trace), "--bootstrap", "50"])
    contexts = report["groups"][0]["contexts"]
    assert f"{min(contexts)}–{max(contexts)} tokens per sequence" in line
    assert "trace quantiles" in line
    code, out, _ = run(["predict", "--trace", str(trace), "--bootstrap", "50",
                        "--context", "8192"])
    assert "context   8192 tokens per sequence (--context)" in out


@pytest.mark.parametrize("fraction, prompts", [(0.3, 10), (0.5, 6), (0.25, 8), (0.1, 4)])
def test_holdout_holds_out_the_fraction_of_the_prompts(tmp_path, fraction, prompts):
    trace = _fixed_k_trace(tmp_path / "t.jsonl", 3, prompts)
    report = invoke_json(["predict", "--trace", str(trace), "--bootstrap", "50",
                          "--holdout", str(fraction)])
    held = report["holdout"]["evaluation_requests"]
    assert held == min(max(round(fraction * prompts), 1), prompts - 1)
    assert held + report["holdout"]["tuning_requests"] == prompts


def test_no_negative_zero_is_printed():
    from specsim.cli.main import _percent
    from specsim.cli.terminal import without_negative_zero
    for value in (-0.0, -1e-9, -0.0004, 0.0, 1e-9):
        assert _percent(value) == "0.0%" and _percent(value, signed=True) == "0.0%"
    assert _percent(-0.012, signed=True) == "-1.2%" and _percent(0.012, signed=True) == "+1.2%"
    assert without_negative_zero("gap (−0.0%), s=-0.00, [-0.0, -0.05] run-0 x-0.0") == \
        "gap (0.0%), s=0.00, [0.0, -0.05] run-0 x-0.0"


def test_table_cells_and_lines_escape_control_characters():
    from specsim.cli.main import _table
    from specsim.cli.terminal import error_line, printable
    evil = "a\x1b[31mb\u202ec\rd"
    table = _table(["name", "n"], [[evil, 1]])
    assert "\x1b" not in table and "\u202e" not in table and "\r" not in table
    assert "a\\x1b[31mb\\u202ec\\rd" in table
    assert printable("one\ntwo\tthree") == "one\ntwo\tthree"
    assert error_line("bad\nvalue\x07") == "specsim: error: bad\\nvalue\\x07"
    assert len(error_line("x" * 5000)) < 1100


def test_shipped_files_are_found_by_their_repository_names_from_any_folder(tmp_path,
                                                                           monkeypatch):
    """The help texts' examples work outside the checkout: calibrate --check and --compose
    take shipped files by their repository names, a shipped plan given by its full path finds
    its own measurements, and a missing config path is named as a missing file."""
    from click.testing import CliRunner

    from specsim.cli.main import cli
    from specsim.shipped import shipped_path

    monkeypatch.chdir(tmp_path)
    run = CliRunner().invoke
    got = run(cli, ["calibrate", "--check", "models/calibrations/h200/qwen3-8b.json",
                    "--compose", "models/operators/h200.json"])
    assert got.exit_code == 0, got.output
    assert "fitted on the calibrations of llama-3.1-8b, qwen3-4b, smollm2-135m" in got.output
    plan = str(shipped_path("models/validation/h200-qwen3-8b-plan.json"))
    got = run(cli, ["validate", "report", "--plan", plan])
    assert got.exit_code == 0 and "qwen3-8b, batch 4, context 32768" in got.output
    # any shipped plan, named as in VALIDATION.md from another folder, finds its measurements
    got = run(cli, ["validate", "report", "--plan",
                    "models/validation/h200-qwen3-30b-a3b-ops-long-plan.json"])
    assert got.exit_code == 0, got.output
    assert "qwen3-30b-a3b, batch 2, context 131072" in got.output
    got = run(cli, ["predict", "--model", "nope.json"])
    assert "model config nope.json: no such file" in str(got.exception)
