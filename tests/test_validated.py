"""What every answer says of its cost source's validation: read from a summary generated from
the shipped validation reports, which must match them."""
import json

from click.testing import CliRunner

from specsim.cli.main import cli
from specsim.costs import resolve_cost_source
from specsim.costs.validated import build_summary, shipped_summary, validation_note
from specsim.shipped import shipped_path, shipped_root
from specsim.specs import load_hardware, load_model


def test_the_shipped_summary_is_what_the_shipped_reports_say():
    """Regenerate with ``python -m specsim.costs.validated`` after adding a report."""
    assert shipped_summary() == build_summary(shipped_root("models") / "validation")


def entry(kind, model, mape, worst, n, hardware="h200", regret=1.0):
    return {"kind": kind, "model": model, "hardware": hardware, "mode": "forced", "batch": 4,
            "context": 32768, "configurations": n, "mape": mape, "worst": worst,
            "regret": regret, "report": "r.json", "date": "2026-01-01T00:00:00Z"}


def test_the_note_names_this_models_runs_else_the_sources_else_none():
    summary = {"entries": [entry("operators", "a", 0.02, 0.05, 10),
                           entry("operators", "a", 0.04, 0.09, 30, regret=0.97),
                           entry("operators", "b", 0.01, 0.02, 10),
                           entry("calibration", "a", 0.005, 0.01, 40)]}
    own = validation_note("operators", "a", "h200", summary)
    assert "for a at batch 4 x 32K, batch 4 x 32K (runs of 2026-01-01):" in own
    assert "MAPE 3.5% (worst 9.0%) over 40 configurations" in own
    assert "regret >= 0.970" in own
    other = validation_note("operators", "c", "h200", summary)
    assert "validated on h200 for a, b, not for c (runs of 2026-01-01)" in other
    assert "over 50 configurations" in other
    later = dict(entry("operators", "b", 0.01, 0.02, 10), date="2026-01-03T10:00:00Z")
    assert "(runs of 2026-01-01 to 2026-01-03)" in validation_note(
        "operators", "c", "h200", {"entries": summary["entries"] + [later]})
    assert "no validation run" in validation_note("operators", "a", "a100-80gb", summary)
    assert "no validation run" in validation_note("roofline", "a", "h200", summary)


def test_predict_and_costs_print_and_carry_the_note(tmp_path):
    spec, hw = load_model("llama-3.2-3b"), load_hardware("h200")
    source = resolve_cost_source(spec, hw)
    assert source.validated.startswith("validated on h200 for llama-3.2-3b")
    args = ["--model", "llama-3.2-3b", "--batch", "8", "--context", "32768"]
    r = CliRunner().invoke(cli, ["predict", *args, "--bootstrap", "50", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["cost_validation"] == source.validated
    r = CliRunner().invoke(cli, ["costs", *args])
    assert r.exit_code == 0 and f"trust     {source.validated}" in r.output
    table = tmp_path / "mine.json"
    table.write_bytes(shipped_path("models/operators/h200.json").read_bytes())
    mine = resolve_cost_source(spec, hw, costs=str(table))
    assert mine.kind == "operators" and "a file of your own" in mine.validated


def test_simulate_tune_and_costs_carry_the_note_in_json():
    spec, hw = load_model("smollm2-135m"), load_hardware("h200")
    want = resolve_cost_source(spec, hw).validated
    sim = CliRunner().invoke(cli, ["simulate", "--arrivals", "poisson:5:8", "--json"])
    assert sim.exit_code == 0, sim.output
    assert json.loads(sim.stdout)["cost_validation"] == want
    costs = CliRunner().invoke(cli, ["costs", "--model", "smollm2-135m", "--json"])
    assert json.loads(costs.stdout)["cost_validation"] == want
    trace = str(shipped_path("traces/synthetic-sparse-selfspec.jsonl"))
    tune = CliRunner().invoke(cli, ["tune", "--trace", trace, "--arrivals", "poisson:5:8",
                                    "--k", "2", "--workers", "1", "--json"])
    assert tune.exit_code == 0, tune.output
    doc = json.loads(tune.stdout)
    qwen = resolve_cost_source(load_model("qwen3-8b"), hw)
    assert doc["costs"] == qwen.note and doc["cost_validation"] == qwen.validated


def write_run(folder, name, created, kind, model, shapes, mape):
    """A plan and its report in ``folder``, as build_summary reads them."""
    (folder / f"{name}-plan.json").write_text(json.dumps({"hardware": "h200",
                                                           "created": created}))
    setups = [{"setup": {"model": model, "mode": "forced", "batch": b, "context": c},
               "cost_source": {"kind": kind}, "rows": [{"predict": 1.0}] * 3,
               "all": {"predict": {"mape": mape, "worst": 2 * mape, "regret": 1.0}}}
              for b, c in shapes]
    (folder / f"{name}-report.json").write_text(json.dumps({"setups": setups}))


def test_a_models_runs_are_its_latest_plans_for_each_kind_of_source(tmp_path):
    """A later plan (re-priced by a newer table or code) replaces the earlier one's setups for
    that model and kind of source, whatever their shapes; other models and kinds keep theirs."""
    write_run(tmp_path, "a-old", "2026-01-01T00:00:00Z", "operators", "a",
              [(16, 4096), (4, 65536)], 0.2)
    write_run(tmp_path, "a-new", "2026-02-01T00:00:00Z", "operators", "a",
              [(8, 16384), (32, 2048)], 0.05)
    write_run(tmp_path, "a-cal", "2025-12-01T00:00:00Z", "calibration", "a", [(4, 32768)], 0.01)
    write_run(tmp_path, "b", "2025-12-01T00:00:00Z", "operators", "b", [(2, 8192)], 0.03)
    got = {(e["kind"], e["model"], e["batch"]): e["mape"]
           for e in build_summary(tmp_path)["entries"]}
    assert got == {("operators", "a", 8): 0.05, ("operators", "a", 32): 0.05,
                   ("calibration", "a", 4): 0.01, ("operators", "b", 2): 0.03}
    # two plans of one second: told apart by their reports' names, never merged
    write_run(tmp_path, "b-second", "2025-12-01T00:00:00Z", "operators", "b", [(64, 1024)],
              0.04)
    got = {(e["model"], e["batch"]) for e in build_summary(tmp_path)["entries"]
           if e["model"] == "b"}
    assert got == {("b", 64)}
