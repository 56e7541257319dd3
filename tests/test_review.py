"""`specsim review` on small hand-checkable inputs made here.

- (1) the proxy answer: overlap by layer, distance and context, accepted drafts per iteration
  of both rules with a paired bootstrap over prompts, and the falsifier, on a proxy file whose
  sums are chosen by hand; the per-sequence summary of proxy records; bad proxy files.
- (2)–(4) on a trace whose acceptance is deterministic per prompt, with a cost model where a
  plain step and a verify pass cost 1 and a draft step 0.1: every speedup is
  ``E[m+1] / (1 + 0.1·k)`` and can be written down.
- The command: tables, ``--json``, ``--simulate``, defaults and one-line errors.
"""
import json
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from specsim import predict as P
from specsim import review as R
from specsim.cli.review_cmd import review_cmd
from specsim.costs.base import Cost, IterationCost
from specsim.errors import SpecsimError
from specsim.traces.format import RequestTrace, Trace, make_header, write_trace

# --------------------------------------------------------------------------------------------
# (1) the proxy check
# --------------------------------------------------------------------------------------------


def summary(layer_sums, count, shared, pair, full, ctx_sum, ctx_count):
    return {"entries": count, "trivial": 0, "count": count, "layer_overlap_sum": layer_sums,
            "band_shared": shared, "band_pair": pair, "band_all": full,
            "context_overlap_sum": ctx_sum, "context_count": ctx_count}


def run(rule, prompt, accepted, iterations, overlap_sum=(5.0, 3.0), k=4, s=0.05):
    """10 checks × 2 layers; layer 0 overlaps 50 %, layer 1 30 % (as given); bands of 100
    all-rows picks each, C2Q keeps 80 / 40; all checks in context bin 1 (2048–3071)."""
    return {"rule": rule, "k": k, "s": s, "prompt": prompt, "iterations": iterations,
            "accepted": accepted,
            "proxy": summary(list(overlap_sum), 10, [80, 40], [90, 110], [100, 100],
                             [0.0, sum(overlap_sum), 0.0], [0, 20, 0])}


def proxy_file(runs, **extra):
    return {"specsim_proxy": 1, "model": "tiny", "num_layers": 2, "recent": 32,
            "distance_bands": [128], "context_bins": [2048, 3072], "runs": runs, **extra}


FALSIFIED = proxy_file([
    # prompt a: C2Q accepts 20 drafts in 10 iterations, all rows 30; prompt b: 10 vs 20
    run("vegas", "a", 20, 10), run("vegas-all", "a", 30, 10),
    run("vegas", "b", 10, 10), run("vegas-all", "b", 20, 10)])


def test_proxy_answer_by_hand():
    answer = R.proxy_answer(FALSIFIED, n_boot=400, seed=1)
    # overlap: (5 + 3) per run over 10 checks × 2 layers = 40 %
    assert answer["overlap"]["mean"] == pytest.approx(0.4)
    assert answer["overlap"]["ci"] == pytest.approx([0.4, 0.4])
    assert [x["overlap"] for x in answer["by_layer"]] == pytest.approx([0.5, 0.3])
    # E[m]: C2Q (20 + 10) / 20 = 1.5, all rows (30 + 20) / 20 = 2.5: deficit 1 − 1.5/2.5 = 40 %
    acc = answer["accepted"]
    assert acc["accepted_c2q"] == pytest.approx(1.5) and acc["accepted_all"] == pytest.approx(2.5)
    assert acc["deficit"] == pytest.approx(0.4)
    # E[m+1]: 2.5 vs 3.5
    assert acc["tokens_deficit"] == pytest.approx(1 - 2.5 / 3.5)
    # bootstrap over two prompts: {a, a} 1 − 2/3, {b, b} 1 − 1/2, {a, b} 40 %
    low, high = acc["deficit_ci"]
    assert 1 / 3 - 1e-9 <= low <= 0.4 <= high <= 0.5 + 1e-9
    # distance bands: recall 80 / 100 and 40 / 100; C2Q puts 90 of 200 picks in the first
    bands = answer["by_distance"]
    assert [b["distance"] for b in bands] == ["33–128", ">128"]
    assert [b["recall"] for b in bands] == pytest.approx([0.8, 0.4])
    assert [b["share_of_c2q_picks"] for b in bands] == pytest.approx([0.45, 0.55])
    assert [b["share_of_all_rows_picks"] for b in bands] == pytest.approx([0.5, 0.5])
    assert answer["by_context"] == [{"context": "2048–3071", "overlap": pytest.approx(0.4),
                                     "layer_entries": 80}]
    f = answer["falsifier"]
    assert f["falsified"] and f["configs_falsified"] == [(4, 0.05)]
    assert answer["by_config"][0]["deficit"] == pytest.approx(0.4)


def test_proxy_answer_not_falsified_when_overlap_high_or_deficit_small():
    high = proxy_file([run(r, p, 20, 10, overlap_sum=(9.0, 9.0)) for r in R.RULES
                       for p in "ab"])
    answer = R.proxy_answer(high, n_boot=200)
    assert answer["overlap"]["mean"] == pytest.approx(0.9)
    assert answer["accepted"]["deficit"] == pytest.approx(0.0)
    assert not answer["falsifier"]["falsified"]
    assert "not falsified" in answer["falsifier"]["verdict"]
    # low overlap alone does not falsify
    low = proxy_file([run(r, p, 20, 10) for r in R.RULES for p in "ab"])
    verdict = R.proxy_answer(low, n_boot=200)["falsifier"]
    assert not verdict["falsified"] and "overlap is low" in verdict["verdict"]


def test_proxy_answer_pairs_prompts_and_configs():
    runs = FALSIFIED["runs"] + [run("vegas", "c", 5, 10)]          # c: no all-rows partner
    runs += [run(rule, "a", 10, 10, k=8, s=0.1) for rule in R.RULES]
    answer = R.proxy_answer(proxy_file(runs), n_boot=200)
    assert answer["prompts"] == ["a", "b"] and answer["ks"] == [4, 8]
    assert [(c["k"], c["s"], c["prompts"]) for c in answer["by_config"]] == [(4, 0.05, 2),
                                                                           (8, 0.1, 1)]
    # pooled: C2Q (30 + 10) / 30, all rows (50 + 10) / 30
    assert answer["accepted"]["deficit"] == pytest.approx(1 - 40 / 60)


def test_proxy_run_summary_from_records():
    # two sequences, 2 layers, bands (128,) → 2 bands; context bins (2048,) → 2 bins
    records = SimpleNamespace(
        bands=(128,), sequence=[0, 0, 1, 0], context=[1000, 3000, 3000, 3001],
        budget=[256, 256, 256, 400], eligible=[968, 2968, 2968, 400],
        overlap=[np.array([0.5, 0.7]), np.array([0.9, 0.1]), np.array([1.0, 1.0]),
                 np.array([1.0, 1.0])],
        shared=[np.array([[1, 2], [3, 4]])] * 4, pair_picks=[np.array([[2, 2], [4, 4]])] * 4,
        all_picks=[np.array([[5, 5], [5, 5]])] * 4)
    out = R.proxy_run_summary(records, 0, num_layers=2, bins=(2048,))
    assert out["entries"] == 3 and out["trivial"] == 1 and out["count"] == 2
    assert out["layer_overlap_sum"] == pytest.approx([1.4, 0.8])
    assert out["band_shared"] == [8, 12] and out["band_pair"] == [12, 12]
    assert out["band_all"] == [20, 20]
    assert out["context_overlap_sum"] == pytest.approx([1.2, 1.0])
    assert out["context_count"] == [2, 2]


def test_read_proxy_errors(tmp_path):
    with pytest.raises(SpecsimError, match="no such proxy-check file"):
        R.read_proxy(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SpecsimError, match="not JSON"):
        R.read_proxy(bad)
    bad.write_text(json.dumps({"specsim_proxy": 7}))
    with pytest.raises(SpecsimError, match="specsim_proxy: expected 1"):
        R.read_proxy(bad)
    bad.write_text(json.dumps({k: v for k, v in FALSIFIED.items() if k != "recent"}))
    with pytest.raises(SpecsimError, match="recent: expected a value, got none"):
        R.read_proxy(bad)
    bad.write_text(json.dumps(proxy_file([{**run("vegas", "a", 1, 1), "rule": "quest"}])))
    with pytest.raises(SpecsimError, match=r"runs\[0\].rule is 'quest'"):
        R.read_proxy(bad)
    bad.write_text(json.dumps(proxy_file([run("vegas", "a", 1, 1)])))
    with pytest.raises(SpecsimError, match="both vegas and vegas-all"):
        R.proxy_answer(R.read_proxy(bad))


# --------------------------------------------------------------------------------------------
# (2)–(4) on a deterministic trace with hand-checkable costs
# --------------------------------------------------------------------------------------------


class UnitCosts:
    """T_ar = C_v = 1, C_d = 0.1, no selection or overhead: T(k) = 1 + 0.1·k."""

    name = "unit"

    def plain_step(self, contexts):
        return Cost(1.0)

    def iteration(self, contexts, k, s, policy):
        return IterationCost(int(k), Cost(0.1), Cost(1.0), Cost(0.0), 0.0)


K_REC, ITERATIONS, PROMPTS = 4, 10, [f"p{i}" for i in range(8)]


def request(policy, s, prompt, m):
    return RequestTrace(f"{prompt}|{policy}|k{K_REC}|s{s:g}", policy, s,
                        np.arange(ITERATIONS) * 10 + 1000, np.full(ITERATIONS, K_REC),
                        np.full(ITERATIONS, m))


def review_trace_records(prompt_ids=False):
    """vegas: every draft accepted at s = 0.1 (m = 4), two at s = 0.05 (m = 2);
    quest and sparsespec: half the prompts accept everything, half nothing (opposite halves)."""
    records = []
    for i, prompt in enumerate(PROMPTS):
        records += [request("vegas", 0.1, prompt, 4), request("vegas", 0.05, prompt, 2)]
        for s in (0.05, 0.1):
            records.append(request("quest", s, prompt, 4 if i % 2 else 0))
            records.append(request("sparsespec", s, prompt, 0 if i % 2 else 4))
    if prompt_ids:
        for r in records:
            r.prompt_id = r.id.split("|")[0]
    return records


@pytest.fixture(scope="module")
def reviewed():
    trace = Trace(make_header(source="test"), review_trace_records())
    opts = P.PredictOptions(batch=1, n_boot=400, seed=0)
    return R.review_trace(trace, UnitCosts(), opts, holdout=0.5, holdout_seed=3)


def test_every_policy_at_its_own_optimum_on_one_grid(reviewed):
    tuning = reviewed["tuning"]
    assert tuning["grid"] == {"k": "1..4", "s": [0.05, 0.1], "same_for_every_policy": True}
    by = {p["policy"]: p for p in tuning["policies"]}
    # vegas s = 0.1: E[m+1] = k + 1, speedup (k + 1)/(1 + 0.1k), best at k = 4: 5 / 1.4
    assert (by["vegas"]["k_star"], by["vegas"]["s_star"]) == (4, 0.1)
    assert by["vegas"]["speedup"] == pytest.approx(5 / 1.4)
    assert by["vegas"]["speedup_ci"] == pytest.approx([5 / 1.4, 5 / 1.4])
    # quest / sparsespec: P_i = ½ for i ≤ 4, E[m+1] = 1 + k/2: best at k = 4: 3 / 1.4
    for policy in ("quest", "sparsespec"):
        assert by[policy]["k_star"] == 4 and by[policy]["speedup"] == pytest.approx(3 / 1.4)
        low, high = by[policy]["speedup_ci"]
        assert low < 3 / 1.4 < high
    # vegas at s = 0.05 alone: m = 2 → best k = 2: 3 / 1.2 — Vegas' 3-step lands on the joint
    assert by["vegas"]["three_step"]["speedup"] == pytest.approx(5 / 1.4)
    assert reviewed["notes"][0].startswith("the trace's requests carry no prompt_id")
    assert reviewed["bootstrap_paired_by_prompt"] and reviewed["prompts"] == 8


def test_holdout_tuning_and_optimism(reviewed):
    held = reviewed["holdout"]
    # whole prompts (6 requests each) land on one side
    assert held["tuning_requests"] + held["evaluation_requests"] == 6 * 8
    assert held["tuning_requests"] % 6 == 0
    by = {p["policy"]: p for p in held["policies"]}
    vegas = by["vegas"]
    assert vegas["tuned"] == {"k": 4, "s": 0.1} and vegas["optimism"] == pytest.approx(0)
    assert vegas["speedup_on_evaluation_part"] == pytest.approx(5 / 1.4)
    for p in held["policies"]:
        assert p["optimism"] >= -1e-12     # tuning on the test part never looks worse


def test_paired_comparisons_say_what_is_distinguishable(reviewed):
    pairs = {(c["a"], c["b"]): c for c in reviewed["comparison"]}
    assert set(pairs) == {("vegas", "quest"), ("vegas", "sparsespec"), ("quest", "sparsespec")}
    better = pairs[("vegas", "quest")]
    assert better["distinguishable"] and better["share_a_wins"] > 0.99  # ties: all-good resamples
    assert better["difference"] == pytest.approx(2 / 1.4)
    assert better["difference_ci"][0] > 0
    # quest and sparsespec: same point speedup, opposite halves of the prompts (paired)
    same = pairs[("quest", "sparsespec")]
    assert same["difference"] == pytest.approx(0.0) and not same["distinguishable"]
    low, high = same["difference_ci"]
    assert low < 0 < high


def test_infer_prompt_ids_only_from_engine_ids():
    trace = Trace(make_header(source="t"), review_trace_records())
    assert R.infer_prompt_ids(trace) is not None
    assert {r.prompt_id for r in trace.requests} == set(PROMPTS)
    other = Trace(make_header(source="t"), [RequestTrace("x", "vegas", 0.1, np.array([5]),
                                                         np.array([2]), np.array([1]))])
    assert R.infer_prompt_ids(other) is None and other.requests[0].prompt_id is None


# --------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("review")
    trace = folder / "trace.jsonl"
    write_trace(trace, make_header(source="test", model="qwen3-8b"),
                review_trace_records(prompt_ids=True))
    proxy = folder / "proxy.json"
    proxy.write_text(json.dumps(FALSIFIED))
    return str(trace), str(proxy)


def invoke(args):
    return CliRunner().invoke(review_cmd, args)


def test_command_tables_and_json(files):
    trace, proxy = files
    args = ["--trace", trace, "--proxy", proxy, "--costs", "roofline", "--bootstrap", "100"]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    for heading in ("(1) Is Collect-2-Query", "(2) Symmetric tuning", "(3) No tuning on the test",
                    "(4) Error bars", "falsified: low overlap"):
        assert heading in result.output
    assert "qwen3-8b (the trace's model)" in result.output
    result = invoke(args + ["--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["proxy"]["falsifier"]["falsified"] is True
    assert {p["policy"] for p in report["tuning"]["policies"]} == {"vegas", "quest",
                                                                    "sparsespec"}
    assert report["holdout"]["holdout_fraction"] == 0.5 and report["comparison"]


def test_command_without_proxy_and_with_simulation(files):
    trace, _ = files
    result = invoke(["--trace", trace, "--costs", "roofline", "--bootstrap", "50",
                     "--simulate", "--arrivals", "all:8",
                     "--output-tokens", "20", "--workers", "1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["proxy"] is None
    sim = report["simulated"]
    assert sim["grid"] == {"k": [1, 2, 3, 4], "s": [0.05, 0.1]}   # auto: the analytical grid
    assert {p["policy"] for p in sim["policies"]} == {"vegas", "quest", "sparsespec"}
    assert {p["policy"] for p in sim["holdout"]["policies"]} == {"vegas", "quest", "sparsespec"}
    text = invoke(["--trace", trace, "--costs", "roofline", "--bootstrap", "50"]).output
    assert "not measured: run scripts/review_proxy.py" in text


def test_command_defaults_read_the_shipped_trace_and_proxy_check():
    """Without --trace and --proxy: the shipped fp32 SmolLM2 trace, costed for its own model,
    and the shipped proxy check, measured on that model."""
    from specsim.cli import defaults

    result = invoke(["--bootstrap", "50", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["trace"].endswith(defaults.REVIEW_TRACE.rsplit("/", 1)[1])
    assert (report["model"], report["model_source"]) == ("smollm2-135m", "the trace's model")
    assert report["proxy"]["source"].endswith(defaults.REVIEW_PROXY.rsplit("/", 1)[1])
    assert report["proxy"]["model"] == "smollm2-135m"


def test_command_errors(files, tmp_path):
    trace, proxy = files
    result = invoke(["--trace", trace, "--proxy", str(tmp_path / "nope.json")])
    assert isinstance(result.exception, SpecsimError)
    assert "no such proxy-check file" in str(result.exception)
    result = invoke(["--trace", str(tmp_path / "none.jsonl")])
    assert isinstance(result.exception, SpecsimError) and "none.jsonl" in str(result.exception)
    result = invoke(["--trace", trace, "--holdout", "1.5"])
    assert result.exit_code == 2 and "--holdout" in result.output
    result = invoke(["--trace", trace, "--costs", "nonsense"])
    assert isinstance(result.exception, SpecsimError) and "--costs" in str(result.exception)
    result = invoke(["--trace", trace, "--costs", "roofline", "--simulate", "--sim-k", "a,b"])
    assert result.exit_code == 2 and "--sim-k" in result.output
