"""Dashboard figure data against the analytical model and predict, the page's data contract,
the validation readers and the `specsim dashboard` command (no browser: see
test_dashboard_browser.py)."""
import itertools
import json
import re
from dataclasses import replace

import numpy as np
import plotly.graph_objects as go
import pytest
from click.testing import CliRunner

from specsim import analytical
from specsim.cli.dashboard_cmd import dashboard_cmd
from specsim.costs import RooflineCostModel
from specsim.costs.calibration_file import Calibration, Measurement
from specsim.dashboards import data as D
from specsim.dashboards import figures as F
from specsim.dashboards import validation
from specsim.dashboards.page import (Control, Page, Section, Slot, compact, page_data,
                                     unpack_page_data)
from specsim.dashboards.validation import (ReadContext, ValidationPoint, load_validation,
                                           register_reader, validation_data)
from specsim.errors import SpecsimError
from specsim.predict import PredictOptions, predict_trace
from specsim.report import CI, CostSplit, CurvePoint
from repo import REPO_ROOT
from specsim.specs import load_hardware, load_model
from specsim.traces.format import RequestTrace, make_header, read_trace, write_trace

SHIPPED = REPO_ROOT / "traces" / "synthetic-sparse-selfspec.jsonl"


#: The tests of the module's built report and regime map and of the page (conftest's
#: ``sparse_dashboard``, which the browser test reads too) run on one pytest-xdist worker,
#: which builds each once.
ON_THE_FIXTURES = pytest.mark.xdist_group("dashboard")


@pytest.fixture(scope="module")
def trace():
    return read_trace(SHIPPED)


@pytest.fixture(scope="module")
def model():
    return load_model("qwen3-8b")


@pytest.fixture(scope="module")
def h200():
    return load_hardware("h200")


@pytest.fixture(scope="module")
def costs(model, h200):
    return RooflineCostModel(model, h200)


@pytest.fixture(scope="module")
def report(trace, costs):
    return predict_trace(trace, costs, PredictOptions(batch=32, n_boot=200))


# --------------------------------------------------------------------------------------------
# (k, s) heatmap
# --------------------------------------------------------------------------------------------


@ON_THE_FIXTURES
def test_heatmap_maximum_is_the_analytical_optimum(report):
    for policy in report.policy_names:
        d = D.heatmap_data(report, policy)
        grid = np.array(d["speedup"])                       # [i_s][i_k]
        i_s, i_k = np.unravel_index(np.argmax(grid), grid.shape)
        entry = report.policy(policy)
        assert (d["ks"][i_k], d["ss"][i_s]) == (entry.k_star, entry.s_star)
        assert grid.max() == pytest.approx(entry.speedup)
        # and the same argmax as analytical.best_k_s on the [i_k, i_s] grid
        k_star, s_star, best = analytical.best_k_s(grid.T, d["ks"], d["ss"])
        assert (k_star, s_star) == (d["k_star"], d["s_star"])
        assert best == pytest.approx(d["speedup_star"])


@ON_THE_FIXTURES
def test_heatmap_cells_are_predicts_numbers(report):
    d = D.heatmap_data(report, "vegas")
    assert d["ss"] == [0.03, 0.05, 0.07, 0.1] and d["ks"] == list(range(1, 13))
    g = report.group("vegas", 0.05)
    c = g.at(7)
    assert d["speedup"][1][6] == c.speedup
    assert (d["speedup_low"][1][6], d["speedup_high"][1][6]) == c.speedup_ci
    assert d["iteration_ms"][1][6] == c.iteration_ms
    # E[m+1]·T_ar / T(k, s)
    assert d["speedup"][1][6] == pytest.approx(
        c.expected_tokens * g.plain_step_ms / c.iteration_ms, rel=1e-5)


@ON_THE_FIXTURES
def test_heatmap_three_step_path(report):
    for policy in report.policy_names:
        d = D.heatmap_data(report, policy)
        three = d["three_step"]
        k_max = max(d["ks"])
        (k1, s1), (k2, s2), (k3, s3) = three["path"]
        assert k1 == k_max and s2 == s1 and k3 == k2 == three["k"] and s3 == three["s"]
        grid = np.array(d["speedup"])
        # step 2 is the best k at the plateau s, step 3 the best s at that k
        assert d["ks"][int(np.argmax(grid[d["ss"].index(s1)]))] == k2
        assert d["ss"][int(np.argmax(grid[:, k2 - 1]))] == s3
        assert three["speedup"] <= d["speedup_star"] + 1e-12


# --------------------------------------------------------------------------------------------
# speedup vs k, inversion point
# --------------------------------------------------------------------------------------------


@ON_THE_FIXTURES
def test_inversion_point_agrees_with_extend_k_helps(report):
    curves = D.speedup_curves_data(report)
    assert [p["policy"] for p in curves["policies"]] == report.policy_names
    for p in curves["policies"]:
        g = report.group(p["policy"], p["s"])
        tokens, t = np.array(p["expected_tokens"]), np.array(p["iteration_ms"])
        t_ar = g.plain_step_ms
        first = None
        for j in range(len(tokens) - 1):
            survival_next = tokens[j + 1] - tokens[j]              # P_{k+1}
            gamma_prime = (t[j + 1] - t[j]) / t_ar
            if not analytical.extend_k_helps(survival_next, gamma_prime, p["speedup"][j]):
                first = j + 1
                break
        inv = p["inversion"]
        assert (inv and inv["k"]) == first
        if inv:
            assert inv["survival_next"] <= inv["threshold"]
            # with a unimodal curve the inversion is k*
            assert inv["k"] == p["k_star"]
        for k, lo, s, hi in zip(p["ks"], p["low"], p["speedup"], p["high"]):
            assert lo <= s <= hi, (p["policy"], k)


def _point(k, extend_helps, iteration_ms, expected_tokens, speedup):
    return CurvePoint(k, expected_tokens, CI(expected_tokens, expected_tokens), expected_tokens,
                      speedup, CI(speedup, speedup), iteration_ms,
                      CostSplit(0.0, iteration_ms, 0.0, 0.0), False, "counterfactual",
                      extend_helps)


def test_inversion_none_when_every_extension_helps():
    curve = [_point(1, True, 1.1, 1.9, 1.7), _point(2, None, 1.2, 2.7, 2.2)]
    assert D.inversion_point(curve, plain_step_ms=1.0) is None
    curve[0] = replace(curve[0], extend_helps=False)
    inv = D.inversion_point(curve, plain_step_ms=1.0)
    assert inv["k"] == 1 and inv["survival_next"] == pytest.approx(0.8)
    assert inv["relative_step_cost"] == pytest.approx(0.1)
    assert inv["threshold"] == pytest.approx(0.17)


# --------------------------------------------------------------------------------------------
# time breakdown
# --------------------------------------------------------------------------------------------


@ON_THE_FIXTURES
def test_breakdown_sums_to_iteration_time(report):
    d = D.breakdown_data(report)
    assert d["components"] == ["draft", "verify", "selection", "other"]
    speeds = [r["speedup"] for r in d["policies"]]
    assert speeds == sorted(speeds, reverse=True)
    for r in d["policies"]:
        assert sum(r["split_ms"].values()) == pytest.approx(r["iteration_ms"], abs=1e-5)
        assert r["plain_same_tokens_ms"] / r["iteration_ms"] == pytest.approx(r["speedup"],
                                                                            rel=1e-5)
        entry = report.policy(r["policy"])
        assert (r["k"], r["s"]) == (entry.k_star, entry.s_star)


@ON_THE_FIXTURES
def test_breakdown_matches_the_cost_model(report, trace, costs):
    r = next(x for x in D.breakdown_data(report)["policies"] if x["policy"] == "quest")
    g = report.group("quest", r["s"])
    it = costs.iteration(g.contexts, r["k"], r["s"], "quest")
    assert r["iteration_ms"] == pytest.approx(it.seconds * 1e3, abs=1e-5)
    assert r["split_ms"]["selection"] == pytest.approx(it.selection.seconds * 1e3, abs=1e-5)
    assert r["split_ms"]["draft"] == pytest.approx(r["k"] * it.draft_step.seconds * 1e3, abs=1e-5)


# --------------------------------------------------------------------------------------------
# acceptance
# --------------------------------------------------------------------------------------------


@ON_THE_FIXTURES
def test_position_acceptance_is_the_traces(report):
    d = D.position_acceptance_data(report, "sparsespec")
    assert [g["s"] for g in d["groups"]] == [0.03, 0.05, 0.07, 0.1]
    for g in d["groups"]:
        p = np.array(g["p"], float)
        assert np.allclose(np.cumprod(p), g["P"])                # P_i = Π p_j
        assert g["reached"][0] >= g["reached"][-1] > 0


def _trace_with_contexts(path):
    """Two requests: contexts 1000..1009 accept m = 3 of k = 4, contexts 5000..5009 m = 1."""
    recs = [RequestTrace("a", "vegas", 0.05, np.arange(1000, 1010), np.full(10, 4),
                         np.full(10, 3)),
            RequestTrace("b", "vegas", 0.05, np.arange(5000, 5010), np.full(10, 4),
                         np.full(10, 1))]
    write_trace(path, make_header(source="test"), recs)
    return read_trace(path)


def test_context_acceptance_by_hand(tmp_path):
    tr = _trace_with_contexts(tmp_path / "c.jsonl")
    d = D.context_acceptance_data(tr, bins=2, min_support=5)
    assert d["edges"][0] == 1000 and d["edges"][-1] == 5009
    (g,) = d["groups"]
    assert g["iterations"] == [10, 10]
    assert g["tokens"] == [4.0, 2.0]                        # m + 1
    assert g["alpha"] == [0.75, 0.25]                       # Σm / Σk
    assert g["context"] == [1004.5, 5004.5]
    # bins with too few iterations are left out
    d = D.context_acceptance_data(tr, bins=2, min_support=11)
    assert d["groups"][0]["tokens"] == [None, None]


def test_context_acceptance_covers_every_iteration(trace):
    d = D.context_acceptance_data(trace, bins=8)
    assert len(d["edges"]) == 9
    for (key, sub), g in zip(trace.groups().items(), d["groups"]):
        assert (g["policy"], g["s"]) == key
        assert sum(g["iterations"]) == sum(r.iterations for r in sub.requests)
        tokens = sum(r.tokens for r in sub.requests)
        assert sum(n * t for n, t in zip(g["iterations"], g["tokens"])) == pytest.approx(tokens)


# --------------------------------------------------------------------------------------------
# regime map
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def regime(trace, report, costs, model, h200):
    return D.regime_data(trace, report, costs, model, h200, batches=(1, 8, 64, 256),
                         contexts=(1024, 4096, 65536), reference_k=4)


@ON_THE_FIXTURES
def test_regime_cell_equals_predict(regime, trace, costs):
    """Each cell is predict's best for ``--batch b --context c`` (memory-bound, compute-bound
    and in-between cells)."""
    acceptance: dict = {}
    for ib, ic in [(0, 1), (1, 2), (2, 0), (3, 0)]:
        b, c = regime["batches"][ib], regime["contexts"][ic]
        best = predict_trace(trace, costs, PredictOptions(batch=b, context=c, n_boot=50),
                             acceptance).best
        assert regime["speedup"][ib][ic] == pytest.approx(best.speedup, rel=1e-12)
        assert (regime["policy"][ib][ic], regime["s"][ib][ic], regime["k"][ib][ic]) == \
            (best.policy, best.s, best.k)


@ON_THE_FIXTURES
def test_regime_memory_fit_by_hand(regime, model, h200):
    # qwen3-8b: no sliding layers; bf16 weights + b·c·KV bytes per token
    for ib, b in enumerate(regime["batches"]):
        for ic, c in enumerate(regime["contexts"]):
            need = model.param_count() * 2 + b * c * model.kv_bytes_per_token
            assert regime["memory_needed_GB"][ib][ic] == pytest.approx(need / 1e9)
            assert regime["fits"][ib][ic] == (need <= 141e9)
    assert regime["fits"][0][2] and not regime["fits"][3][2]     # 1 × 64K fits, 256 × 64K not
    assert D.memory_needed_bytes(model, [1000, 3000], tp=2) == pytest.approx(
        (model.param_count() * 2 + 4000 * 147_456) / 2)


@ON_THE_FIXTURES
def test_regime_boundary_separates_bounds(regime, costs):
    bound = regime["reference_bound"]
    assert bound[3][0] == "compute" and bound[0][2] == "memory"   # 256 × 1K vs 1 × 64K
    assert bound[3][0] == costs.verify(np.full(256, 1024), 5).bound
    assert regime["boundary"]
    for (x0, y0), (x1, y1) in regime["boundary"]:
        if x0 == x1:   # vertical edge between columns x0 ∓ ½ of row y
            row, left = int(y0 + 0.5), int(x0 - 0.5)
            assert bound[row][left] != bound[row][left + 1]
        else:          # horizontal edge between rows y0 ∓ ½ of column x
            col, below = int(x0 + 0.5), int(y0 - 0.5)
            assert bound[below][col] != bound[below + 1][col]
    # every flip has its edge
    flips = sum(bound[i][j] != bound[i][j + 1] for i in range(4) for j in range(2)) + \
        sum(bound[i][j] != bound[i + 1][j] for i in range(3) for j in range(3))
    assert len(regime["boundary"]) == flips


def test_bound_boundary_by_hand():
    segs = D.bound_boundary([["m", "c"], ["m", "m"]])
    assert sorted(map(str, segs)) == sorted(map(str, [[[0.5, -0.5], [0.5, 0.5]],
                                                      [[0.5, 0.5], [1.5, 0.5]]]))


# --------------------------------------------------------------------------------------------
# validation input
# --------------------------------------------------------------------------------------------


def test_validation_points(tmp_path):
    path = tmp_path / "v.json"
    path.write_text(json.dumps([{"label": "a", "measured_ms": 2.0, "predicted_ms": 2.2},
                                {"label": "b", "measured_ms": 4.0, "predicted_ms": 3.0,
                                 "group": "verify"}]))
    what, points = load_validation(path)
    assert what == "measured vs predicted points" and [p.group for p in points] == ["", "verify"]
    d = validation_data(points)
    assert [p["relative_error"] for p in d["points"]] == pytest.approx([0.1, -0.25])
    assert d["mean_abs_relative_error"] == pytest.approx(0.175)
    assert d["max_abs_relative_error"] == pytest.approx(0.25)
    path.write_text(json.dumps({"points": [{"label": "a", "measured_ms": 1, "predicted_ms": 1}]}))
    assert load_validation(path)[1][0].relative_error == 0


@pytest.mark.parametrize("doc,message", [
    ([{"label": "a", "measured_ms": 1.0}], "point 0: predicted_ms: expected a value, got none"),
    ([{"label": "a", "measured_ms": -1, "predicted_ms": 1}], "measured_ms: expected a positive number"),
    ({"k": 1}, "not a validation file"),
])
def test_validation_bad_input(tmp_path, doc, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecsimError, match=message):
        load_validation(path)
    path.write_text("[{")
    with pytest.raises(SpecsimError, match="bad JSON"):
        load_validation(path)


def test_validation_readers_are_pluggable(tmp_path, monkeypatch):
    monkeypatch.setattr(validation, "_READERS", list(validation._READERS))
    register_reader("calibration-test", lambda doc: isinstance(doc, dict) and "table" in doc,
                    lambda doc, path, ctx: [ValidationPoint(r[0], r[1], r[2])
                                            for r in doc["table"]], "a test table")
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"table": [["verify", 1.0, 1.05]]}))
    what, points = load_validation(path)
    assert what == "a test table" and points[0].relative_error == pytest.approx(0.05)


def test_calibration_file_against_the_roofline(tmp_path, model, h200, costs):
    prov = {"gpu": "NVIDIA H200", "gpu_memory_bytes": 150e9, "driver": "580", "cuda": "12.8",
            "torch": "2.11", "triton": "3.6", "kernel_config_hash": "abc",
            "model_spec_hash": model.spec_hash(), "model": model.name,
            "date": "2026-11-29T00:00:00Z"}
    rows = [Measurement("plain", 8, 16384, 1, None, [12.0, 12.5, 13.0]),
            Measurement("verify", 8, 16384, 5, None, [13.0]),
            Measurement("draft:vegas", 8, 16384, 1, 0.05, [2.0, 2.2]),
            Measurement("selection:quest", 4, 4096, 1, 0.05, [0.3]),
            # loop overheads are residuals, not steps: left out of the points
            Measurement("overhead:plain", 8, 16384, 1, None, [0.2]),
            Measurement("overhead:speculative:vegas", 8, 16384, 3, None, [0.9])]
    path = tmp_path / "calibration.json"
    Calibration(prov, {}, rows).write(str(path))
    with pytest.raises(SpecsimError, match="needs a model and hardware"):
        load_validation(path)
    what, points = load_validation(path, ReadContext(model, h200))
    assert what.startswith("specsim calibration")
    assert [p.group for p in points] == ["plain", "verify", "draft:vegas", "selection:quest"]
    assert [p.measured_ms for p in points] == [12.5, 13.0, 2.1, 0.3]       # medians
    ctx = [16384] * 8
    expected = [costs.plain_step(ctx), costs.verify(ctx, 5), costs.draft_step(ctx, 0.05, "vegas"),
                costs.selection([4096] * 4, 0.05, "quest", 1)]
    assert [p.predicted_ms for p in points] == pytest.approx([c.seconds * 1e3 for c in expected])
    assert points[1].label == "verify b=8 ctx=16K q=5"


def test_validate_report_points(tmp_path):
    """`specsim validate report --json`: every configuration's iteration time measured vs
    predicted, grouped by setup and policy; a report without those fields is refused."""
    doc = {"setups": [{"name": "smollm2", "rows": [
        {"policy": "vegas", "s": 0.03, "k": 2, "iteration_ms_measured": 8.03,
         "iteration_ms_predicted": 8.64},
        {"policy": "quest", "s": 0.1, "k": 8, "iteration_ms_measured": 75.5,
         "iteration_ms_predicted": 77.1}], "excluded": []}]}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    what, points = load_validation(path)
    assert what.startswith("specsim validate")
    assert [(p.label, p.measured_ms, p.predicted_ms, p.group) for p in points] == [
        ("smollm2 vegas s=0.03 k=2", 8.03, 8.64, "smollm2 vegas"),
        ("smollm2 quest s=0.1 k=8", 75.5, 77.1, "smollm2 quest")]
    # a report of two models: the dashboard's model sees only its own setup
    other = {"name": "qwen3-8b", "setup": {"model": "qwen3-8b"}, "excluded": [], "rows": [
        {"policy": "vegas", "s": 0.1, "k": 4, "iteration_ms_measured": 60.0,
         "iteration_ms_predicted": 61.0}]}
    doc["setups"][0]["setup"] = {"model": "smollm2-135m"}
    path.write_text(json.dumps({"setups": doc["setups"] + [other]}))
    for model, labels in (("smollm2-135m", ["smollm2 vegas s=0.03 k=2", "smollm2 quest s=0.1 k=8"]),
                          ("qwen3-8b", ["qwen3-8b vegas s=0.1 k=4"]),
                          ("llama-3.1-8b", ["smollm2 vegas s=0.03 k=2", "smollm2 quest s=0.1 k=8",
                                            "qwen3-8b vegas s=0.1 k=4"])):
        _, points = load_validation(path, ReadContext(model=load_model(model)))
        assert [p.label for p in points] == labels, model
    path.write_text(json.dumps(doc))
    del doc["setups"][0]["rows"][1]["iteration_ms_predicted"]
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecsimError, match="validate report --json"):
        load_validation(path)


# --------------------------------------------------------------------------------------------
# the page
# --------------------------------------------------------------------------------------------


def test_compact_numbers():
    assert compact({"a": [1.23456, 16384.0, 0.0123456, float("nan"), 2.0, True, "x"]}) == \
        {"a": [1.235, 16384, 0.01235, None, 2, True, "x"]}
    assert compact(np.array([1.5, 2.25])) == [1.5, 2.25]


@ON_THE_FIXTURES
def test_the_header_says_how_far_each_cost_source_is_trusted(sparse_dashboard, model):
    from specsim.costs import resolve_cost_source
    costs = [value for name, value in sparse_dashboard.page.facts if name == "costs"]
    assert len(costs) == 2
    for value, hw in zip(costs, ("h200", "a100-80gb")):
        assert value.endswith(f"trust: {resolve_cost_source(model, load_hardware(hw)).validated}")


@ON_THE_FIXTURES
def test_every_control_combination_has_a_figure(sparse_dashboard):
    page = sparse_dashboard.page
    data = page_data(page)
    options = {c.name: [v for v, _ in c.options] for c in page.controls}
    assert {c.name for c in page.controls} == {"hardware", "batch", "context", "policy"}
    assert options["batch"] == ["1", "32"] and options["context"] == ["trace", "16384"]
    for slot in data["slots"]:
        for combo in itertools.product(*(options[d] for d in slot["deps"])):
            assert "|".join(combo) in slot["variants"], (slot["id"], combo)
    for combo in itertools.product(*(options[d] for d in data["headlines"]["deps"])):
        assert "|".join(combo) in data["headlines"]["variants"]
    assert [s["id"] for s in data["slots"]] == ["fig-heatmap", "fig-curves", "fig-breakdown",
                                               "fig-regime", "fig-positions", "fig-context",
                                               "fig-validation", "fig-validation-errors"]


def test_identical_figures_are_stored_once():
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3.14159265, 4]))
    page = Page("t", [], [Control("a", "A", [("1", "1"), ("2", "2")], "1")],
                [Section("s", [Slot("f", ("a",), {"1": fig, "2": go.Figure(fig)})])])
    data = page_data(page)
    assert data["slots"][0]["variants"] == {"1": 0, "2": 0}
    assert data["figures"][0]["data"][0]["y"] == [3.142, 4]


@ON_THE_FIXTURES
def test_every_figure_has_titles_axis_labels_and_hover(sparse_dashboard):
    data = page_data(sparse_dashboard.page)
    for fig in data["figures"]:
        layout = fig["layout"]
        assert layout["title"]["text"]
        axes = [k for k in layout if k.startswith(("xaxis", "yaxis"))]
        assert axes
        for ax in axes:
            if layout[ax].get("visible", True):
                assert layout[ax]["title"]["text"], (layout["title"]["text"], ax)
        for tr in fig["data"]:
            if tr.get("x") == [None]:
                continue   # legend-only entry
            assert tr.get("hovertemplate") or tr.get("hoverinfo") == "skip", \
                (layout["title"]["text"], tr.get("name"))
        go.Figure(fig)     # plotly validates every property


@ON_THE_FIXTURES
def test_page_is_self_contained_and_round_trips(sparse_dashboard):
    html = sparse_dashboard.html()
    tags = re.findall(r"<(?:script|link)\b[^>]*>", html)
    assert tags and not any("src=" in t or "href=" in t for t in tags), tags   # nothing fetched
    assert html.count("<script") == 4      # error hook, plotly.js, data, app
    assert re.search(r"plotly\.js v\d", html[:200_000])          # the library, inline
    assert "SYNTHETIC TRACE" in html
    assert len(html) < 8e6
    assert unpack_page_data(html) == json.loads(json.dumps(page_data(sparse_dashboard.page)))


@ON_THE_FIXTURES
def test_headline_warns_when_the_batch_does_not_fit(sparse_dashboard, model):
    # 32 sequences at 16K: 16.4 GB of weights + 32·16K·144 KiB of KV = 94 GB, more than an
    # A100 80GB holds and less than an H200's 141 GB
    need = D.memory_needed_bytes(model, [16384] * 32)
    assert 80e9 < need < 141e9
    headlines = sparse_dashboard.page.headlines
    assert "does not fit" in headlines["a100-80gb|32|16384"]
    assert "does not fit" not in headlines["h200|32|16384"]
    assert "does not fit" not in headlines["a100-80gb|1|16384"]


# --------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------


def test_dashboard_command(tmp_path):
    val = tmp_path / "val.json"
    val.write_text(json.dumps([{"label": "verify", "measured_ms": 3.9, "predicted_ms": 3.7}]))
    out = tmp_path / "sub" / "report.html"
    result = CliRunner().invoke(dashboard_cmd, [
        "--compare-hardware", "h200", "--batches", "8", "--contexts", "16384",
        "--bootstrap", "50", "--calibration", str(val), "--out", str(out)])
    assert result.exit_code == 0, (result.output, result.exception)
    # output holds stdout and stderr (the progress lines)
    # the default trace is the real SmolLM2 one: no synthetic warning
    assert "wrote" in result.output and "SYNTHETIC" not in result.output
    assert "predicting on NVIDIA H200" in result.output
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]   # no temporary left
    data = unpack_page_data(out.read_text())
    assert [s["id"] for s in data["slots"]][-2:] == ["fig-validation", "fig-validation-errors"]
    assert set(data["slots"][0]["variants"]) >= {"h200|8|16384|vegas", "h200|32|trace|quest"}


def test_dashboard_shows_the_shipped_validation_by_default(tmp_path):
    """Without --calibration the measured-vs-predicted figures show the shipped validation run
    of the trace's model on the first hardware (SmolLM2 on the H200); --calibration none
    leaves them out; a (model, hardware) with no shipped run has none."""
    from specsim.cli.dashboard_cmd import SHIPPED_VALIDATION
    from specsim.shipped import shipped_file

    for path in SHIPPED_VALIDATION.values():
        assert shipped_file(path), path
    trace = tmp_path / "smollm2.jsonl"      # small, recorded on SmolLM2 as its header says
    write_trace(trace, make_header(source="test", model="smollm2-135m"),
                [RequestTrace(f"r{i}", "vegas", 0.05, np.arange(2000, 2040) + i,
                              np.full(40, 4), np.arange(40) % 5) for i in range(4)])
    fast = ["--trace", str(trace), "--compare-hardware", "h200", "--batches", "8",
            "--contexts", "16384", "--bootstrap", "50"]
    pages = {}
    for name, extra in (("default", []), ("none", ["--calibration", "none"]),
                        ("l40s", ["--hardware", "l40s"])):
        out = tmp_path / f"{name}.html"
        result = CliRunner().invoke(dashboard_cmd, fast + extra + ["--out", str(out)])
        assert result.exit_code == 0, (result.output, result.exception)
        pages[name] = unpack_page_data(out.read_text())
    ids = {name: [s["id"] for s in page["slots"]] for name, page in pages.items()}
    assert ids["default"][-2:] == ["fig-validation", "fig-validation-errors"]
    assert "fig-validation" not in ids["none"] and "fig-validation" not in ids["l40s"]
    shipped = SHIPPED_VALIDATION[("smollm2-135m", "h200")].rsplit("/", 1)[1]
    assert f"Source: {shipped}" in (tmp_path / "default.html").read_text()
    figures = json.dumps(pages["default"]["figures"])
    assert "smollm2 vegas s=0.1 k=15" in figures and "qwen3-8b vegas" not in figures


@pytest.mark.parametrize("args,message", [
    (["--batches", "8,x"], "comma-separated integers"),
    (["--hardware", "nope"], "unknown hardware"),
    (["--policy", "nope"], "unknown selection policy"),
])
def test_dashboard_command_bad_input(tmp_path, args, message):
    result = CliRunner().invoke(
        dashboard_cmd, args + ["--compare-hardware", "h200", "--out", str(tmp_path / "r.html")])
    assert result.exit_code != 0
    assert message in (result.output + str(result.exception))
    assert not (tmp_path / "r.html").exists()


# --------------------------------------------------------------------------------------------
# labels, notes and colours
# --------------------------------------------------------------------------------------------


@ON_THE_FIXTURES
def test_figures_name_the_cost_source_of_their_hardware(sparse_dashboard, model):
    from specsim.costs import resolve_cost_source
    from specsim.dashboards.build import PRICED_BY
    data = page_data(sparse_dashboard.page)
    slots = {s["id"]: s for s in data["slots"]}
    for hw_name in ("h200", "a100-80gb"):
        kind = resolve_cost_source(model, load_hardware(hw_name)).kind
        others = [label for k, label in PRICED_BY.items() if k != kind]
        for slot_id in ("fig-heatmap", "fig-curves", "fig-breakdown", "fig-regime"):
            for key, index in slots[slot_id]["variants"].items():
                if key.split("|")[0] != hw_name:
                    continue
                subtitle = data["figures"][index]["layout"]["title"]["subtitle"]["text"]
                assert PRICED_BY[kind] in subtitle, (slot_id, key, subtitle)
                assert not any(label in subtitle for label in others), (slot_id, key)
    kinds = {resolve_cost_source(model, load_hardware(n)).kind for n in ("h200", "a100-80gb")}
    assert len(kinds) == 2     # one calibrated, one roofline: the labels must differ


def test_validation_figure_names_what_priced_the_predictions(tmp_path):
    doc = {"setups": [{"name": "smollm2", "costs": "calibrated cost model (x.json)", "rows": [
        {"policy": "vegas", "s": 0.03, "k": 2, "iteration_ms_measured": 8.0,
         "iteration_ms_predicted": 8.5}], "excluded": []}]}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    _, points = load_validation(path)
    assert [p.priced_by for p in points] == ["calibrated cost model (x.json)"]
    fig = F.validation_figure(validation.validation_data(points))
    assert "predicted by calibrated cost model (x.json)" in fig.layout.title.subtitle.text
    assert "roofline" not in fig.layout.title.subtitle.text


@ON_THE_FIXTURES
def test_each_settings_notes_are_shown_with_that_setting(sparse_dashboard):
    page = sparse_dashboard.page
    shared = set(page.notes)
    for key, report in sparse_dashboard.reports.items():
        for note in report.notes:
            if "SYNTHETIC" in note or "does not fit" in note:
                continue
            if note in shared:
                assert all(note in r.notes for r in sparse_dashboard.reports.values())
            else:
                assert html_escape(note) in page.headlines[key], (key, note)


def html_escape(text):
    import html
    return html.escape(text)


@pytest.mark.parametrize("seed", range(6))
def test_speedup_colour_bar_spans_the_data_with_white_at_one(seed):
    rng = np.random.default_rng(seed)
    low, high = sorted(rng.uniform(0.2, 4.0, 2))
    values = rng.uniform(low, high, (4, 5)).tolist()
    values[0][0] = None                                  # a cell that does not fit
    got = F.speedup_colours(values)
    flat = [v for row in values for v in row if v is not None]
    assert got["zmin"] == pytest.approx(min(min(flat), 1.0))
    assert got["zmax"] == pytest.approx(max(max(flat), 1.0))
    stops = got["colorscale"]
    positions = [p for p, _ in stops]
    assert positions[0] == 0.0 and positions[-1] == 1.0
    assert all(a < b for a, b in zip(positions, positions[1:]))
    white = [p for p, c in stops if c == "#f7f7f7"]
    assert white == [pytest.approx((1.0 - got["zmin"]) / (got["zmax"] - got["zmin"]))]
    reds = [p for p, c in stops if c == F.SPEEDUP_SCALE[0][1]]
    blues = [p for p, c in stops if c == F.SPEEDUP_SCALE[-1][1]]
    assert bool(reds) == (got["zmin"] < 1.0) and bool(blues) == (got["zmax"] > 1.0)
