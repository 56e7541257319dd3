"""`specsim costs` prices a cell with the cost source predict uses: the same plain step and
iteration time as predict's report for that cell, its source named, the roofline's bytes and
FLOPs beside the chosen source's times, and bad input refused in one line."""
import io
import json
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
from click.testing import CliRunner

from specsim.cli import defaults
from specsim.cli.main import cli, main
from specsim.costs import RooflineCostModel, resolve_cost_source
from specsim.policies import SELECTION_POLICIES
from specsim.shipped import display_name
from specsim.specs import load_hardware, load_model
from specsim.traces.format import RequestTrace, make_header, write_trace

CALIBRATED = ("qwen3-8b", "qwen3-4b", "llama-3.1-8b", "smollm2-135m")
UNCALIBRATED = "llama-3.2-3b"      # no calibration of its own shipped
K_RECORDED = 4
S = 0.05


def invoke_json(args):
    result = CliRunner().invoke(cli, args + ["--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def run(args):
    """Through main(): exit code, stdout, stderr as a user sees them."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    """Every sparse policy at s = 0.05, drafts of k = 4, a few requests each."""
    rng = np.random.default_rng(3)
    records = []
    for policy in SELECTION_POLICIES:
        for r in range(3):
            acc = rng.random((40, K_RECORDED)) < 0.7
            m = np.where(acc.all(1), K_RECORDED, np.argmin(acc, axis=1))
            records.append(RequestTrace(f"{policy}-{r}", policy, S, 2000 + np.cumsum(m + 1),
                                        np.full(40, K_RECORDED), m))
    path = tmp_path_factory.mktemp("trace") / "all-policies.jsonl"
    write_trace(path, make_header(source="test"), records)
    return str(path)


def in_ms(seconds):
    """Seconds as the reports' milliseconds, to the nanosecond."""
    return round(seconds * 1e3, 6)


def predict_cell(trace, model, batch, context, tp=1, costs="auto", hardware="h200"):
    r = invoke_json(["predict", "--trace", trace, "--model", model, "--hardware", hardware,
                     "--batch", str(batch), "--context", str(context), "--tp", str(tp),
                     "--costs", costs, "--bootstrap", "50"])
    return r, {g["policy"]: g for g in r["groups"]}


def costs_cell(model, batch, context, k, policy, tp=1, costs="auto", hardware="h200"):
    return invoke_json(["costs", "--model", model, "--hardware", hardware,
                        "--batch", str(batch), "--context", str(context), "--k", str(k),
                        "--policy", policy, "--sparsity", str(S), "--tp", str(tp),
                        "--costs", costs])


def expected_source(model, hardware="h200", tp=1, costs="auto"):
    """The source JSON for what the resolver picks."""
    src = resolve_cost_source(load_model(model), load_hardware(hardware), tp=tp, costs=costs)
    return {"kind": src.kind, "note": src.note,
            "path": display_name(src.path) if src.path else None, "fallback": src.fallback,
            "validated": src.validated}


@pytest.mark.parametrize("model, hardware, batch, context, tp, choice", [
    *[(m, "h200", 4, 32768, 1, "auto") for m in CALIBRATED],
    ("smollm2-135m", "h200", 32, 4096, 1, "auto"),
    (UNCALIBRATED, "h200", 8, 65536, 1, "auto"),
    (UNCALIBRATED, "a40", 2, 8192, 1, "auto"),
    ("qwen3-8b", "h200", 4, 32768, 1, "roofline"),
    ("qwen3-8b", "h200", 4, 32768, 2, "auto"),     # a calibration is of one GPU
    (UNCALIBRATED, "h200", 8, 65536, 1, "roofline"),
])
def test_plain_step_and_iteration_time_equal_predicts(trace_path, model, hardware, batch,
                                                      context, tp, choice):
    report, groups = predict_cell(trace_path, model, batch, context, tp, choice, hardware)
    source = expected_source(model, hardware, tp, choice)
    if model in CALIBRATED and tp == 1 and choice == "auto":
        assert source["kind"] == "calibration"
    if choice == "roofline":
        assert source["kind"] == "roofline"
    for policy in SELECTION_POLICIES:
        group = groups[policy]
        for k in (1, K_RECORDED):
            r = costs_cell(model, batch, context, k, policy, tp, choice, hardware)
            assert r["contexts"] == group["contexts"] == [context] * batch
            assert r["plain_step"]["ms"] == pytest.approx(group["plain_step_ms"], rel=1e-9)
            assert r["iteration_ms"] == pytest.approx(group["curve"][k - 1]["iteration_ms"],
                                                      rel=1e-9)
            assert r["iteration_split_ms"] == pytest.approx(
                group["curve"][k - 1]["split_ms"], rel=1e-9)
            assert r["source"] == source and r["source"]["note"] == report["costs"]


def test_the_source_is_named_in_json_and_in_the_table():
    calibrated = costs_cell("qwen3-8b", 4, 32768, 8, "vegas")
    assert calibrated["source"] == expected_source("qwen3-8b")
    assert calibrated["source"]["kind"] == "calibration"
    assert calibrated["source"]["path"] == "models/calibrations/h200/qwen3-8b.json"
    assert calibrated["source"]["fallback"] is None
    assert calibrated["source"]["path"] in calibrated["source"]["note"]
    # the roofline prices no part of a measured time: its launch terms are left out
    assert "overhead_ms" not in calibrated["plain_step"]
    # a calibration is of one GPU: at tp 2 another source prices, saying why
    split = costs_cell("qwen3-8b", 4, 32768, 8, "vegas", tp=2)
    assert split["source"] == expected_source("qwen3-8b", tp=2)
    assert split["source"]["kind"] != "calibration" and split["source"]["fallback"]
    forced = costs_cell("qwen3-8b", 4, 32768, 8, "vegas", costs="roofline")
    assert forced["source"] == {"kind": "roofline", "note": "roofline cost model", "path": None,
                                "fallback": None,
                                "validated": expected_source("qwen3-8b",
                                                             costs="roofline")["validated"]}
    assert forced["source"]["validated"].startswith("no validation run")
    assert "overhead_ms" in forced["plain_step"]

    table = CliRunner().invoke(cli, ["costs", "--model", "qwen3-8b", "--batch", "4",
                                     "--context", "32768"]).output.splitlines()
    assert f"costs     {calibrated['source']['note']}" in table
    assert f"trust     {calibrated['source']['validated']}" in table
    plain = next(x for x in table if x.startswith("plain step (T_ar)"))
    assert plain.split()[3] == f"{calibrated['plain_step']['ms']:.3f}"
    assert any(x.startswith("ms: the calibration's, measured on the GPU") for x in table)
    assert any("the roofline's count" in x for x in table)
    assert any(x.startswith(f"T(k=8, s=0.05) = {calibrated['iteration_ms']:.3f} ms")
               for x in table)
    roofline_table = CliRunner().invoke(cli, ["costs", "--costs", "roofline"]).output
    assert "costs     roofline cost model\n" in roofline_table
    assert "ms: the roofline's." in roofline_table


def test_forced_roofline_gives_the_roofline_numbers():
    spec, hw = load_model("qwen3-8b"), load_hardware("h200")
    contexts = [1000, 9000, 33000]
    roofline = RooflineCostModel(spec, hw)
    r = invoke_json(["costs", "--model", "qwen3-8b", "--context", "1000,9000,33000",
                     "--k", "6", "--policy", "quest", "--costs", "roofline"])
    plain = roofline.plain_step(contexts)
    it = roofline.iteration(contexts, 6, S, "quest")
    assert r["plain_step"]["ms"] == pytest.approx(in_ms(plain.seconds), rel=1e-9)
    assert r["iteration_ms"] == pytest.approx(in_ms(it.seconds), rel=1e-9)
    assert r["draft_step"]["ms"] == pytest.approx(in_ms(it.draft_step.seconds), rel=1e-9)
    assert r["verify"]["ms"] == pytest.approx(in_ms(it.verify.seconds), rel=1e-9)
    assert r["selection"]["ms"] == pytest.approx(in_ms(it.selection.seconds), rel=1e-9)
    assert r["plain_step"]["overhead_ms"] == pytest.approx(plain.overhead_s * 1e3)
    assert r["gamma"] == pytest.approx(it.draft_step.seconds / it.verify.seconds)
    # the calibration prices the same cell otherwise, over the same roofline byte count
    auto = invoke_json(["costs", "--model", "qwen3-8b", "--context", "1000,9000,33000",
                        "--k", "6", "--policy", "quest"])
    assert auto["plain_step"]["ms"] != pytest.approx(r["plain_step"]["ms"], rel=1e-3)
    for op in ("plain_step", "draft_step", "verify", "selection"):
        assert auto[op]["bytes"] == r[op]["bytes"] and auto[op]["flops"] == r[op]["flops"]


def test_bytes_floor_and_fraction_of_the_floor_by_hand():
    r = costs_cell("qwen3-8b", 4, 32768, 7, "vegas")
    plain = r["plain_step"]
    # KV: 4 · 32768 tokens read (+ 4 written) · 147,456 B per token
    assert plain["kv_bytes"] == pytest.approx((4 * 32768 + 4) * 147_456)
    assert plain["bytes"] == pytest.approx(plain["weight_bytes"] + plain["kv_bytes"]
                                           + plain["other_bytes"])
    for op in ("plain_step", "draft_step", "verify", "selection"):
        c = r[op]
        assert c["floor_ms"] == pytest.approx(c["bytes"] / 4.3e12 * 1e3)
        # ms is rounded to the nanosecond, the fraction is not
        assert c["floor_fraction"] == pytest.approx(c["floor_ms"] / c["ms"],
                                                    rel=1e-6 / c["ms"] + 1e-9)
    # measured on the GPU, a plain step at batch 4, 32K runs above its floor
    assert 0.5 < plain["floor_fraction"] < 1
    assert sum(r["iteration_split_ms"].values()) == pytest.approx(r["iteration_ms"])
    assert r["iteration_ms"] == pytest.approx(
        7 * r["draft_step"]["ms"] + r["verify"]["ms"] + r["selection"]["ms"]
        + r["iteration_split_ms"]["other"], rel=1e-6)


def test_help_states_the_defaults():
    result = CliRunner().invoke(cli, ["costs", "--help"], terminal_width=200)
    text = " ".join(result.output.split())
    assert defaults.COSTS_HELP in text and "--costs TEXT" in text
    assert "[default: auto]" in text
    assert f"[default: {defaults.CONTEXT}]" in text and f"[default: {defaults.POLICY}]" in text
    assert "Default: 1, or as many as --context lists." in text


@pytest.mark.parametrize("args, says", [
    (["--context", "nan"], "whole numbers"),
    (["--context", "4096.5"], "whole numbers"),
    (["--context", "0"], "at least 1 token"),
    (["--context", "1000,-5"], "at least 1 token"),
    (["--context", ","], "at least 1 token"),
    (["--batch", "-4"], "--batch"),
    (["--batch", "0"], "--batch"),
    (["--batch", "3", "--context", "100,200"], "disagrees with the 2 context lengths"),
    (["--k", "0"], "--k"),
    (["--tp", "0"], "--tp"),
    (["--sparsity", "1.5"], "--sparsity"),
    (["--sparsity", "nan"], "sparsity"),
    (["--costs", "bogus"], "--costs must be"),
    (["--model", UNCALIBRATED, "--costs", "calibrated"], "calibration"),
    (["--policy", "magic"], "known: vegas"),
])
def test_bad_input_is_one_line(args, says):
    code, out, err = run(["costs"] + args)
    assert code != 0 and out == ""
    assert says in err and "Traceback" not in err
    # one error line (after click's usage hint where click refuses the value)
    errors = [x for x in err.splitlines() if x.startswith(("Error:", "specsim: error:"))]
    assert len(errors) == 1 and says in errors[0]
    assert set(err.splitlines()) - set(errors) <= {
        "", "Usage: specsim costs [OPTIONS]", "Try 'specsim costs --help' for help."}
