"""predict's report: held-out tuning, paired policy comparisons, contexts of the workload,
finite answers, the acceptance cache, and the report's JSON form."""
import json
from dataclasses import replace

import numpy as np
import pytest

from specsim import predict as P
from specsim.costs import RooflineCostModel
from specsim.specs import load_hardware, load_model
from specsim.traces.format import HistogramTrace, RequestTrace, Trace, make_header

COSTS = RooflineCostModel(load_model("qwen3-8b"), load_hardware("h200"))


def trace(rates: dict, prompts=30, iterations=60, k=6, seed=0, prompt_ids=True):
    """rates: {(policy, s): conditional acceptance p}."""
    rng = np.random.default_rng(seed)
    recs = []
    for (policy, s), p in rates.items():
        for j in range(prompts):
            acc = rng.random((iterations, k)) < p
            m = np.where(acc.all(1), k, np.argmin(acc, axis=1))
            recs.append(RequestTrace(f"{policy}-{s}-{j}", policy, s, 3000 + j * 100
                                     + np.cumsum(m + 1), np.full(iterations, k), m,
                                     prompt_id=f"p{j}" if prompt_ids else None))
    return Trace(make_header(source="test"), recs)


def test_split_is_by_prompt_and_complete():
    t = trace({("vegas", 0.05): 0.8, ("quest", 0.05): 0.8})
    tune, evaluate = P.split_trace(t, 0.3, seed=1)
    assert len(tune.requests) + len(evaluate.requests) == len(t.requests)
    eval_prompts = {r.prompt_id for r in evaluate.requests}
    assert not eval_prompts & {r.prompt_id for r in tune.requests}
    # the same prompt lands on the same side under every policy
    for policy in ("vegas", "quest"):
        assert {r.prompt_id for r in evaluate.requests if r.policy == policy} == eval_prompts
    assert 2 <= len(eval_prompts) <= 18
    assert P.split_trace(t, 0.3, seed=1)[1].requests == evaluate.requests   # deterministic
    with pytest.raises(ValueError, match="fraction"):
        P.split_trace(t, 1.0)
    with pytest.raises(ValueError, match="histograms"):
        P.split_trace(Trace(t.header, t.requests, [HistogramTrace("h", "vegas", 0.05, 2,
                                                                  np.array([1, 1, 1]))]), 0.3)


def test_holdout_report_evaluates_the_tuned_choice_on_unseen_prompts():
    t = trace({("vegas", 0.03): 0.6, ("vegas", 0.07): 0.8, ("vegas", 0.1): 0.82})
    opts = P.PredictOptions(batch=32, n_boot=100)
    report = P.holdout_report(t, COSTS, opts, 0.5, seed=3)
    row = report.best
    tune, evaluate = P.split_trace(t, 0.5, seed=3)
    assert (report.tuning_requests, report.evaluation_requests) == (len(tune.requests),
                                                                    len(evaluate.requests))
    # the (k, s) tuned on the tuning part is that part's optimum
    tuned = P.predict_trace(tune, COSTS, opts).policy("vegas")
    assert (row.tuned.k, row.tuned.s) == (tuned.k_star, tuned.s_star)
    on_eval = P.predict_trace(evaluate, COSTS, opts)
    point = on_eval.group("vegas", row.tuned.s).at(row.tuned.k)
    assert row.speedup_on_evaluation_part == pytest.approx(point.speedup)
    assert row.speedup_ci == point.speedup_ci
    assert row.optimism >= 0.0
    assert row.optimism == pytest.approx(row.tuned_on_evaluation.speedup
                                         - row.speedup_on_evaluation_part)


def test_paired_comparison_separates_different_policies_and_not_equal_ones():
    t = trace({("vegas", 0.05): 0.85, ("quest", 0.05): 0.6, ("sparsespec", 0.05): 0.6})
    r = P.predict_trace(t, COSTS, P.PredictOptions(batch=32, n_boot=300))
    assert r.bootstrap_paired_by_prompt
    pairs = {(c.a, c.b): c for c in r.policy_comparison}
    assert pairs[("vegas", "quest")].distinguishable
    assert pairs[("vegas", "quest")].share_a_wins > 0.99
    same = pairs.get(("quest", "sparsespec")) or pairs[("sparsespec", "quest")]
    assert not same.distinguishable
    unpaired = P.predict_trace(trace({("vegas", 0.05): 0.8}, prompt_ids=False), COSTS,
                               P.PredictOptions(n_boot=50))
    assert not unpaired.bootstrap_paired_by_prompt and unpaired.policy_comparison == []
    assert unpaired.best.distinguishable_from_runner_up is None      # one group only


def test_groups_share_one_workload_of_ragged_contexts():
    t = trace({("vegas", 0.05): 0.9, ("quest", 0.05): 0.3})
    r = P.predict_trace(t, COSTS, P.PredictOptions(batch=8, n_boot=50))
    contexts = [tuple(g.contexts) for g in r.groups]
    assert contexts[0] == contexts[1] and len(set(contexts[0])) > 1
    assert r.groups[0].plain_step_ms == r.groups[1].plain_step_ms
    assert P.batch_contexts(np.arange(1, 101), 4).tolist() == [13, 38, 63, 88]


def test_policy_comparison_counts_exact_ties_as_half_a_win():
    t = trace({("vegas", 0.05): 0.8}, prompts=4, iterations=10, k=2)
    opts = P.PredictOptions(n_boot=50)
    contexts, source = P.workload_contexts(t, opts, [])
    group = P.predict_group(t, COSTS, opts, [], contexts, source)
    boot = np.array([[1.0, 1.2], [1.1, 1.3], [0.9, 1.25], [1.0, 1.2]])
    same = [replace(group, policy=name, speedup_at_k_star=1.2, k_star=2,
                    bootstrap_speedups=boot) for name in ("a", "b")]
    (pair,) = P.compare_policies(same)
    assert pair.share_a_wins == 0.5 and not pair.distinguishable
    better = replace(same[1], policy="c", speedup_at_k_star=1.3, bootstrap_speedups=boot + 0.05)
    (pair,) = P.compare_policies([same[0], better])
    assert (pair.a, pair.share_a_wins) == ("c", 1.0) and pair.distinguishable


def test_finite_answers_emit_fewer_tokens_per_iteration():
    """--output-tokens N: the speedup uses the tokens a finite answer emits per iteration
    (its last iteration's surplus drafts are not output); long answers tend to unbounded."""
    data = trace({("vegas", 0.05): 0.8}, prompts=8, iterations=40)
    base = P.predict_trace(data, COSTS, P.PredictOptions(batch=4, n_boot=50))
    short = P.predict_trace(data, COSTS, P.PredictOptions(batch=4, n_boot=50, output_tokens=32))
    long = P.predict_trace(data, COSTS, P.PredictOptions(batch=4, n_boot=50,
                                                         output_tokens=20000))
    for b, sh, lo in zip(base.groups[0].curve, short.groups[0].curve, long.groups[0].curve):
        assert sh.emitted_tokens <= b.expected_tokens + 1e-12
        assert sh.speedup <= b.speedup + 1e-12
        assert lo.speedup == pytest.approx(b.speedup, rel=2e-3)
    assert short.groups[0].curve[-1].emitted_tokens < base.groups[0].curve[-1].expected_tokens
    with pytest.raises(ValueError, match="output tokens"):
        P.predict_trace(data, COSTS, P.PredictOptions(output_tokens=1))


def test_acceptance_cache_replays_each_group_once_and_changes_nothing(monkeypatch):
    """A dashboard prices one trace on many settings: with a shared cache each group's replay,
    bootstrap and extrapolation check are computed once, and every report equals the one
    computed without the cache (other batch, context and cost model included)."""
    t = trace({("vegas", 0.05): 0.85, ("quest", 0.05): 0.6})
    l40s = RooflineCostModel(load_model("qwen3-8b"), load_hardware("l40s"))
    settings = [(COSTS, P.PredictOptions(batch=8, n_boot=80)),
                (COSTS, P.PredictOptions(batch=32, context=16384, n_boot=80)),
                (l40s, P.PredictOptions(batch=4, n_boot=80))]
    plain = [P.predict_trace(t, c, o) for c, o in settings]
    calls = []
    real = P.estimate_acceptance
    monkeypatch.setattr(P, "estimate_acceptance", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    cache: dict = {}
    cached = [P.predict_trace(t, c, o, cache) for c, o in settings]
    assert len(calls) == 2 and len(cache) == 2               # one per group, not per setting
    for a, b in zip(plain, cached):
        assert a == b            # every field, bootstrap CIs and the extrapolation check included
    # another bootstrap size is another entry, not a stale one
    P.predict_trace(t, COSTS, P.PredictOptions(batch=8, n_boot=40), cache)
    assert len(cache) == 4


def test_json_form_carries_the_schema_version_and_every_field():
    """``to_json()`` is ``--json``: the schema version first, then every field of the report
    as plain JSON values (CIs as [low, high], no bootstrap replicates), round-tripping."""
    t = trace({("vegas", 0.03): 0.7, ("vegas", 0.07): 0.8, ("quest", 0.05): 0.6})
    r = P.predict_trace(t, COSTS, P.PredictOptions(batch=4, n_boot=50))
    doc = json.loads(json.dumps(r.to_json()))
    assert next(iter(doc)) == "schema_version" and doc["schema_version"] == 1
    group = doc["groups"][0]
    assert "bootstrap_speedups" not in group
    assert group["speedup_at_k_star_ci"] == list(r.groups[0].speedup_at_k_star_ci)
    assert group["curve"][0]["split_ms"] == r.groups[0].curve[0].split_ms.as_dict()
    # optional parts appear only when present: a 3-step needs two s values, holdout --holdout
    by_policy = {p["policy"]: p for p in doc["policies"]}
    assert "three_step" in by_policy["vegas"] and "three_step" not in by_policy["quest"]
    assert "holdout" not in doc and "model" not in doc
    assert doc["best"]["k"] == r.best.k and doc["notes"] == r.notes


def test_predict_notes_what_it_assumed_about_the_trace_and_the_costs(tmp_path):
    """A trace recorded on another model, its import's assumptions and a calibration of
    another GPU each leave a note (in --json too)."""
    import json as _json

    from click.testing import CliRunner

    from specsim.cli.main import cli
    from specsim.shipped import shipped_path

    def notes(*args):
        got = CliRunner().invoke(cli, ["predict", "--bootstrap", "50", "--json", *args])
        assert got.exit_code == 0, got.output
        doc = _json.loads(got.stdout)
        return doc["notes"] + [doc["costs"]]

    other = notes("--model", "qwen3-8b")
    assert any("recorded on 'smollm2-135m' and is costed as qwen3-8b" in n for n in other)
    assert not any("recorded on" in n for n in notes())
    gpu = notes("--hardware", "a100-80gb", "--costs",
                str(shipped_path("models/calibrations/h200/smollm2-135m.json")))
    assert any("measured on NVIDIA H200, used to price NVIDIA A100" in n for n in gpu)
    specbench = tmp_path / "answers.jsonl"
    specbench.write_text(_json.dumps({"question_id": 1, "model_id": "m", "choices": [
        {"index": 0, "accept_lengths": [1, 3, 2, 4]}]}) + "\n")
    imported = notes("--trace", str(specbench), "--policy", "vegas", "--sparsity", "0.05")
    assert any(n.startswith("import: ") and "k" in n for n in imported)
