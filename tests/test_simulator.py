"""The serving simulator: closed forms, conservation, memory, determinism, bad input, tuning."""
import datetime as dt
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim import analytical as A
from specsim.costs.base import Cost, IterationCost
from specsim.errors import SpecsimError, TraceError
from specsim.simulator import SimConfig, Simulation, all_at_once, from_file, poisson
from specsim.simulator.acceptance_source import (FittedSource, ReplaySource, draw_from_survival)
from specsim.simulator.fastpath import replay_single_sequence
from specsim.simulator.tuning import SweepSpec, summarise, sweep
from specsim.specs import load_hardware, load_model
from specsim.traces.format import RequestTrace, Trace, make_header, write_trace

MODEL = load_model("qwen3-8b")
H200 = load_hardware("h200")


class FlatCosts:
    """A cost model whose times do not depend on the context or batch: closed forms apply."""

    name = "flat"

    def __init__(self, draft=1.0, verify=4.0, selection=0.5, overhead=0.25, plain=3.0,
                 prefill=2.0):
        self.d, self.v, self.sel, self.o, self.p, self.pre = (draft, verify, selection,
                                                              overhead, plain, prefill)

    def plain_step(self, contexts):
        return Cost(self.p)

    def draft_step(self, contexts, s, policy):
        return Cost(self.d)

    def verify(self, contexts, q):
        return Cost(self.v)

    def selection(self, contexts, s, policy, k):
        return Cost(self.sel)

    def iteration(self, contexts, k, s, policy):
        return IterationCost(k, Cost(self.d), Cost(self.v), Cost(self.sel), self.o)

    def prefill(self, prompts):
        return Cost(self.pre)


def const_trace(m, k, iterations=50, requests=1, policy="vegas", s=0.05, entropy=False):
    recs = []
    for r in range(requests):
        ent = [np.where(np.arange(k) < m, 0.3, 2.5) for _ in range(iterations)] if entropy \
            else None
        recs.append(RequestTrace(f"r{r}", policy, s, 1000 + np.arange(iterations) * (m + 1),
                                 np.full(iterations, k), np.full(iterations, m), entropy=ent))
    return Trace(make_header(source="test"), recs)


def simulate(arrivals, costs, source, **cfg):
    config = SimConfig(cfg.pop("policy", "vegas"), cfg.pop("s", 0.05), **cfg)
    return Simulation(arrivals, costs, MODEL, source, config, H200.memory_bytes).run()


def test_one_request_fixed_acceptance_equals_the_analytical_model():
    # k = 4, every iteration accepts m = 3: 4 tokens per iteration, T = 4·1 + 4 + 0.5 + 0.25
    costs = FlatCosts()
    trace = const_trace(m=3, k=4)
    out = 1 + 4 * 40                       # first token from prefill, then 40 iterations
    res = simulate(all_at_once(1, 1000, out), costs, ReplaySource(trace, 4), k=4)
    s = res.summary
    t_iter = A.iteration_time(4, 1.0, 4.0, 0.5, 0.25)
    assert s["iterations"] == 40 and s["tokens_per_iteration"] == 4.0
    assert s["makespan_s"] == pytest.approx(2.0 + 40 * t_iter)
    decode_rate = 160 / (s["makespan_s"] - 2.0)
    # simulated decode speedup over plain decoding = E[m+1]·T_ar / T(k)
    assert decode_rate * costs.p == pytest.approx(A.speedup(4.0, costs.p, t_iter))
    assert s["time_split_s"]["draft"] == pytest.approx(40 * 4.0)
    assert s["wasted_draft_fraction"] == pytest.approx(0.25)


def test_plain_mode_emits_one_token_per_step():
    costs = FlatCosts()
    res = simulate(all_at_once(3, 500, 11), costs, ReplaySource(const_trace(2, 4), 4), k=1,
                   k_policy="plain")
    assert res.summary["tokens_per_iteration"] == 1.0
    assert res.summary["makespan_s"] == pytest.approx(2.0 + 10 * costs.p)


@settings(max_examples=25, deadline=None, database=None)
@given(st.data())
def test_every_owed_token_is_emitted_once_within_the_limits(data):
    """Whatever the arrivals, batching mode, k and recorded acceptance: every output token is
    emitted exactly once (by the prefill or an iteration), no request finishes before its first
    token or is admitted before it arrives, and the batch and memory limits hold."""
    k_rec = data.draw(st.integers(1, 6), label="k_rec")
    recorded = data.draw(st.lists(st.lists(st.integers(0, k_rec), min_size=1, max_size=30),
                                  min_size=1, max_size=4), label="recorded m")
    trace = Trace(make_header(source="t"), [
        RequestTrace(f"r{i}", "vegas", 0.05, 1000 + np.cumsum(np.add(m, 1)),
                     np.full(len(m), k_rec), np.asarray(m)) for i, m in enumerate(recorded)])
    n = data.draw(st.integers(1, 12), label="requests")
    prompts = data.draw(st.lists(st.integers(1, 4000), min_size=n, max_size=n), label="prompts")
    outputs = data.draw(st.lists(st.integers(1, 60), min_size=n, max_size=n), label="outputs")
    arrivals = poisson(n, data.draw(st.floats(0.1, 100.0), label="rate"), np.array(prompts),
                       np.array(outputs), seed=data.draw(st.integers(0, 100), label="seed"))
    mode = data.draw(st.sampled_from(["continuous", "static", "fixed slots"]), label="mode")
    max_batch = data.draw(st.integers(1, 8), label="max_batch")
    budget = MODEL.kv_bytes_resident(4000 + 60) * data.draw(st.floats(1.5, 10.0), label="slots")
    res = simulate(arrivals, FlatCosts(), ReplaySource(trace, k_rec),
                   k=data.draw(st.integers(1, k_rec), label="k"), max_batch=max_batch,
                   memory_budget=budget, static_batch=mode == "static",
                   fixed_slots=mode == "fixed slots")
    st_, req = res.steps, res.requests
    assert int(st_["emitted"].sum()) == sum(outputs) == res.summary["output_tokens"]
    assert np.all(np.isfinite(req["finish"]))
    assert np.all(req["finish"] >= req["first_token"])
    assert np.all(req["first_token"] >= req["admit"])
    assert np.all(req["admit"] >= req["arrival"])
    assert st_["batch"].max() <= max_batch
    assert st_["memory"].max() <= res.summary["memory_budget_bytes"]


class CountingCosts(FlatCosts):
    """Flat costs that remember how many sequences each iteration was priced for."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def iteration(self, contexts, k, s, policy):
        self.sizes.append(len(contexts))
        return super().iteration(contexts, k, s, policy)


def test_static_batch_waits_for_the_slowest_and_prices_finished_slots():
    # m = 3 at k = 4: 4 tokens per iteration; outputs 1 + 4·n → n iterations
    arrivals = all_at_once(4, 1000, np.array([1 + 4 * 3, 1 + 4 * 6, 1 + 4 * 2, 1 + 4 * 2]))
    trace = const_trace(m=3, k=4, requests=4)
    static_costs, cont_costs = CountingCosts(), CountingCosts()
    static = simulate(arrivals, static_costs, ReplaySource(trace, 4), k=4, max_batch=2,
                      static_batch=True)
    cont = simulate(arrivals, cont_costs, ReplaySource(trace, 4), k=4, max_batch=2)
    # static: batch {0, 1} runs 6 iterations (all priced for 2), then {2, 3} runs 2
    assert static_costs.sizes == [2] * 6 + [2] * 2
    assert list(static.steps["batch"][static.steps["is_iteration"]]) == [2] * 3 + [1] * 3 + [2] * 2
    admit = static.requests["admit"]
    assert admit[2] == admit[3] >= static.requests["finish"][1]
    # continuous: request 2 takes request 0's slot as soon as it is done
    assert cont.requests["admit"][2] < cont.requests["finish"][1]
    assert static.summary["makespan_s"] > cont.summary["makespan_s"]
    assert int(static.steps["emitted"].sum()) == int(cont.steps["emitted"].sum()) == sum(
        a.output_tokens for a in arrivals)


def test_fixed_slots_price_finished_sequences_until_their_slot_is_taken():
    """Continuous admission with fixed slots (specsim's engine): request 2 takes request 0's
    slot as soon as it is done, and once the queue is empty a finished sequence's slot is still
    computed until the last one finishes; without fixed slots the batch shrinks."""
    arrivals = all_at_once(3, 1000, np.array([1 + 4 * 3, 1 + 4 * 7, 1 + 4 * 2]))
    trace = const_trace(m=3, k=4, requests=3)
    fixed_costs, free_costs = CountingCosts(), CountingCosts()
    fixed = simulate(arrivals, fixed_costs, ReplaySource(trace, 4), k=4, max_batch=2,
                     fixed_slots=True)
    free = simulate(arrivals, free_costs, ReplaySource(trace, 4), k=4, max_batch=2)
    # request 0: iterations 1-3, request 2: 4-5 in its slot; request 1: 1-7
    assert fixed_costs.sizes == [2] * 7
    assert free_costs.sizes == [2] * 5 + [1] * 2
    assert fixed.requests["admit"][2] < fixed.requests["finish"][1]
    assert list(fixed.steps["batch"][fixed.steps["is_iteration"]]) == [2] * 5 + [1] * 2
    assert fixed.summary["makespan_s"] == pytest.approx(free.summary["makespan_s"])  # flat


def test_replay_follows_each_requests_own_prompt():
    """Arrivals that name their prompt replay that prompt's record (a slow prompt stays slow
    wherever it lands in the queue); without names request j follows record j mod R."""
    fast = const_trace(m=4, k=4, requests=1).requests[0]
    slow = const_trace(m=0, k=4, requests=1).requests[0]
    fast.prompt_id, slow.prompt_id = "fast", "slow"
    trace = Trace(make_header(source="test"), [fast, slow])
    names = ["slow", "slow", "fast", "slow", "fast"]
    arrivals = all_at_once(5, 1000, 21, prompt_ids=names)
    res = simulate(arrivals, FlatCosts(), ReplaySource(trace, 4), k=4, max_batch=2)
    # 21 tokens: 1 from the prefill, then 20 at 1 per iteration (slow) or 5 (fast)
    assert res.requests["iterations"].tolist() == [20 if n == "slow" else 4 for n in names]
    plain = simulate(all_at_once(5, 1000, 21), FlatCosts(), ReplaySource(trace, 4), k=4,
                     max_batch=2)
    assert plain.requests["iterations"].tolist() == [4, 20, 4, 20, 4]
    with pytest.raises(SpecsimError, match="prompt ids"):
        all_at_once(3, 1000, 21, prompt_ids=["a"])


def test_memory_budget_is_never_exceeded_and_admission_waits():
    per_request = MODEL.kv_bytes_resident(4000 + 200)
    arrivals = all_at_once(30, 4000, 200)
    trace = const_trace(2, 4)
    res = simulate(arrivals, FlatCosts(), ReplaySource(trace, 4), k=4, max_batch=64,
                   memory_budget=per_request * 5.5)
    assert res.steps["memory"].max() <= res.summary["memory_budget_bytes"]
    assert res.steps["batch"].max() <= 5                     # memory, not max_batch, binds
    assert res.summary["queueing_s"]["p90"] > 0
    with pytest.raises(SpecsimError, match="needs .* GB"):
        simulate(all_at_once(1, 100_000, 10), FlatCosts(), ReplaySource(trace, 4), k=4,
                 memory_budget=per_request)


def test_deterministic_with_a_seed():
    trace = Trace(make_header(source="t"), [
        RequestTrace("a", "vegas", 0.05, np.arange(1000, 1300), np.full(300, 8),
                     np.random.default_rng(0).integers(0, 9, 300))])
    arrivals = poisson(50, 20.0, 3000, 120, seed=1)
    costs = __import__("specsim.costs", fromlist=["RooflineCostModel"]).RooflineCostModel(
        MODEL, H200)
    runs = [simulate(arrivals, costs, FittedSource(trace, 8), k=8, seed=seed).summary
            for seed in (5, 5, 6)]
    assert runs[0] == runs[1]
    assert runs[0]["throughput_tokens_per_s"] != runs[2]["throughput_tokens_per_s"]


def test_replay_is_counterfactual_and_fitted_is_unbiased():
    trace = const_trace(m=5, k=8, requests=3)
    replay = ReplaySource(trace, 8)
    assert replay.by_tokens          # one fixed k: followed token by token (6 per iteration)
    m, flagged = replay.draw(np.zeros(4, int), np.arange(4) * 6, np.array([2, 5, 6, 8]),
                             np.full(4, 1000), np.random.default_rng(0))
    assert m.tolist() == [2, 5, 5, 5] and not flagged.any()
    # two tokens into a recorded iteration, three predicted tokens remain in the run
    m, _ = replay.draw(np.zeros(2, int), np.full(2, 2), np.array([2, 8]), np.full(2, 1000),
                       np.random.default_rng(0))
    assert m.tolist() == [2, 3]
    # survival draw: P(m ≥ i) = P_i
    P = A.survival_from_conditional(np.full(6, 0.8))
    u = np.random.default_rng(1).random(200_000)
    m = draw_from_survival(P, np.full(u.size, 6), u)
    assert m.mean() + 1 == pytest.approx(A.expected_tokens_iid(0.8, 6), rel=0.01)
    assert draw_from_survival([1.0, 1.0, 0.0], np.array([3, 1]), np.array([0.5, 0.5])).tolist() \
        == [2, 1]


def test_replay_follows_the_recorded_answer_token_by_token():
    """At k < k_rec a simulated request runs the token-by-token replay of its record: the
    iterations of specsim.traces.acceptance.replay_tokens, one for one (a variable-k record
    falls back to iteration by iteration)."""
    from specsim.traces.acceptance import replay_tokens, token_acceptance
    rng = np.random.default_rng(3)
    m = np.where(rng.random(120) < 0.5, rng.integers(0, 3, 120), rng.integers(5, 9, 120))
    rec = RequestTrace("r0", "vegas", 0.05, 1000 + np.cumsum(m + 1), np.full(120, 8), m)
    trace = Trace(make_header(source="t"), [rec])
    n_tokens = int(np.sum(m + 1))
    for k in (2, 5):
        want = replay_tokens(token_acceptance(rec), k)
        res = simulate(all_at_once(1, 1000, 1 + n_tokens), FlatCosts(), ReplaySource(trace, 8),
                       k=k)
        assert res.summary["iterations"] == want.size
    varied = RequestTrace("r1", "vegas", 0.05, rec.context, np.where(m > 6, 8, 7), m)
    assert not ReplaySource(Trace(make_header(source="t"), [varied]), 8).by_tokens


def test_fitted_source_draws_the_run_at_each_k():
    """Unbinned (a short trace), the fitted source samples m at k from the token-by-token
    replay's survivals at that k, not from the per-iteration curve min(m, k) gives."""
    from specsim.traces.acceptance import estimate_acceptance
    rng = np.random.default_rng(3)
    recs = []
    for j in range(20):
        m = np.where(rng.random(120) < 0.5, rng.integers(0, 3, 120), rng.integers(5, 9, 120))
        recs.append(RequestTrace(f"r{j}", "vegas", 0.05, 1000 + np.cumsum(m + 1),
                                 np.full(120, 8), m))
    trace = Trace(make_header(source="t"), recs)
    est = estimate_acceptance(trace)
    per_iteration = A.expected_tokens_from_survival(est.survival)
    src = FittedSource(trace, 8)
    assert not src.edges.size
    for k in (3, 4):
        m, flagged = src.draw(None, None, np.full(200_000, k), np.full(200_000, 1000),
                              np.random.default_rng(k))
        assert m.mean() + 1 == pytest.approx(est.expected_tokens[k - 1], rel=0.01)
        assert abs(m.mean() + 1 - per_iteration[k]) > 0.03 * per_iteration[k]
        assert not flagged.any()


def test_replay_beyond_recorded_k_is_flagged():
    trace = const_trace(m=4, k=4, requests=2)          # every draft accepted at k_rec = 4
    src = ReplaySource(trace, 8)
    m, flagged = src.draw(np.zeros(3, int), np.zeros(3, int), np.array([4, 6, 8]),
                          np.full(3, 1000), np.random.default_rng(0))
    assert flagged.tolist() == [False, True, True] and m[0] == 4 and np.all(m[1:] >= 4)


def test_oracle_bounds_fixed_and_adaptive_runs_with_entropies():
    rng = np.random.default_rng(2)
    recs = []
    for r in range(6):
        m = rng.integers(0, 9, 200)
        ent = [np.where(np.arange(8) < mi, 0.3, 2.5) + rng.normal(0, 0.05, 8) for mi in m]
        recs.append(RequestTrace(f"r{r}", "vegas", 0.05, np.arange(2000, 2200),
                                 np.full(200, 8), m, entropy=[np.abs(e) for e in ent]))
    trace = Trace(make_header(source="t"), recs)
    from specsim.costs import RooflineCostModel
    costs = RooflineCostModel(MODEL, H200)
    arrivals = all_at_once(32, 8000, 150)
    fixed = simulate(arrivals, costs, ReplaySource(trace, 8), k=8).summary
    oracle = simulate(arrivals, costs, ReplaySource(trace, 8), k=8, k_policy="oracle").summary
    adaptive = simulate(arrivals, costs, ReplaySource(trace, 8), k=8,
                        k_policy="adaptive").summary
    assert oracle["throughput_tokens_per_s"] >= fixed["throughput_tokens_per_s"]
    assert adaptive["wasted_draft_fraction"] < fixed["wasted_draft_fraction"]
    with pytest.raises(SpecsimError, match="entropies"):
        simulate(arrivals, costs, FittedSource(trace, 8), k=8, k_policy="adaptive")


def test_chrome_trace_export(tmp_path):
    res = simulate(all_at_once(4, 500, 20), FlatCosts(), ReplaySource(const_trace(2, 4), 4), k=4)
    path = tmp_path / "trace.json"
    res.write_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    names = {e["name"] for e in spans}
    assert {"prefill", "draft", "verify", "selection", "other"} <= names
    assert all(e["dur"] >= 0 and "ts" in e for e in spans)
    draft = next(e for e in spans if e["name"] == "draft")
    assert draft["dur"] == pytest.approx(4 * 1.0 * 1e6)     # 4 draft steps of 1 s, in µs
    json.dumps(res.to_json())                                # JSON-ready summary


def test_azure_arrival_file_worked_example(tmp_path):
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,4808,10\n"
                     "2023-11-16 18:15:50.9951690,3180,8\n")
    arr = from_file(str(azure))
    assert [a.prompt_tokens for a in arr] == [4808, 3180]
    assert [a.output_tokens for a in arr] == [10, 8]
    # 7-digit fractions are cut to Python's 6: 50.995169 - 46.680590
    assert arr[0].time == 0.0 and arr[1].time == pytest.approx(4.314579, abs=1e-6)


@pytest.mark.parametrize("text, line, field", [
    ("TIMESTAMP,ContextTokens\n1,2\n", 2, "GeneratedTokens"),          # no output column
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,abc,3\n", 2, "ContextTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,-3\n", 2, "GeneratedTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,2.5\n", 2, "GeneratedTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n5,10,3\n\n1,10,3\n", 4, "TIMESTAMP"),  # order
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,3\n", 2, "TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nnan,10,3\n", 2, "TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", None, None),          # no requests
    ('{"time": 1, "prompt_tokens": 3, \n', 1, None),                   # bad JSON
    ('{"time": 1, "prompt_len": true, "output_tokens": 3}\n', 1, "prompt_len"),
])
def test_bad_arrival_rows_name_file_line_and_column(tmp_path, text, line, field):
    path = tmp_path / "arrivals.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as exc:
        from_file(str(path))
    assert (exc.value.path, exc.value.line, exc.value.field) == (str(path), line, field)
    with pytest.raises(TraceError, match="no such file"):
        from_file(str(tmp_path / "missing.csv"))


PROPERTY = settings(max_examples=40, deadline=None, database=None)

#: (seconds after the first request, prompt tokens, output tokens) per request, in time order
arrival_rows = st.lists(st.tuples(st.floats(0, 1e5, allow_subnormal=False),
                                  st.integers(1, 10**6), st.integers(1, 10**5)),
                        min_size=1, max_size=20).map(sorted)


def arrival_file(rows, form: str, start: float = 1.7e9) -> str:
    if form == "jsonl":
        return "".join(json.dumps({"time": start + t, "prompt_tokens": p, "output_tokens": o})
                       + "\n" for t, p, o in rows)
    stamp = (lambda t: repr(start + t)) if form == "seconds" else (
        lambda t: (dt.datetime.fromtimestamp(start, dt.timezone.utc)
                   + dt.timedelta(seconds=t)).isoformat())
    return "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"{stamp(t)},{p},{o}\n" for t, p, o in rows)


@PROPERTY
@given(arrival_rows, st.sampled_from(["jsonl", "seconds", "iso"]),
       st.sampled_from([0.5, 1.0, 3.0]))
def test_arrival_files_read_back_what_was_written(rows, form, time_scale):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "arrivals"
        path.write_text(arrival_file(rows, form))
        arrivals = from_file(str(path), time_scale=time_scale)
    assert [(a.prompt_tokens, a.output_tokens) for a in arrivals] == [(p, o) for _, p, o in rows]
    assert [a.request_id for a in arrivals] == list(range(len(rows)))
    # times relative to the first request, stretched by time_scale (an ISO date keeps µs)
    first = rows[0][0]
    assert [a.time for a in arrivals] == pytest.approx(
        [(t - first) * time_scale for t, _, _ in rows], abs=2e-6 * time_scale + 1e-9)


@settings(max_examples=150, deadline=None, database=None)
@given(arrival_rows, st.sampled_from(["jsonl", "seconds", "iso"]), st.data())
def test_corrupted_arrival_files_are_arrivals_or_one_line_naming_the_problem(rows, form, data):
    text = arrival_file(rows, form).encode()
    at = data.draw(st.integers(0, len(text)))
    edit = data.draw(st.sampled_from([b"", b",", b"\n", b'"', b"-", b"x", b"\xff", b"{",
                                      b"9" * 30]))
    cut = data.draw(st.integers(0, 12))
    text = text[:at] + edit + text[at + cut:]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "arrivals"
        path.write_bytes(text)
        try:
            arrivals = from_file(str(path))
        except TraceError as exc:
            message = str(exc)
            assert "\n" not in message and message.startswith(str(path))
            assert exc.line is None or 1 <= exc.line <= max(1, len(text.splitlines()))
            return
    assert arrivals and arrivals[0].time == 0.0
    assert all(a.prompt_tokens >= 1 and a.output_tokens >= 1 for a in arrivals)
    assert all(b.time >= a.time - 1e-9 for a, b in zip(arrivals, arrivals[1:]))


def test_fast_path_closed_form_and_statistics():
    costs = FlatCosts()
    P = np.array([1.0, 1.0, 0.0, 0.0])
    r = replay_single_sequence(P, 4, 1000, 1000, costs, 0.05, "vegas")
    assert r["tokens_per_iteration"] == 3.0
    t_iter = A.iteration_time(4, 1.0, 4.0, 0.5, 0.25)
    assert r["speedup"] == pytest.approx(A.speedup(3.0, costs.p, t_iter))
    P = A.survival_from_conditional(np.full(8, 0.7))
    r = replay_single_sequence(P, 8, 200_000, 1000, costs, 0.05, "vegas", seed=3)
    assert r["tokens_per_iteration"] == pytest.approx(A.expected_tokens_iid(0.7, 8), rel=0.01)
    with pytest.raises(ValueError):
        replay_single_sequence(P, 9, 10, 1000, costs, 0.05, "vegas")


def _sweep_trace(tmp_path):
    rng = np.random.default_rng(4)
    recs = []
    for policy in ("vegas", "quest"):
        for s, p in ((0.05, 0.7), (0.1, 0.85)):
            for r in range(4):
                acc = rng.random((120, 8)) < p
                m = np.where(acc.all(1), 8, np.argmin(acc, axis=1))
                recs.append(RequestTrace(f"{policy}{s}{r}", policy, s,
                                         6000 + np.cumsum(m + 1), np.full(120, 8), m,
                                         prompt_id=f"p{r}"))
    path = tmp_path / "sweep.jsonl"
    write_trace(path, make_header(source="t"), recs)
    return str(path)


def test_sweep_parallel_equals_serial_and_summary(tmp_path):
    path = _sweep_trace(tmp_path)
    spec = SweepSpec(path, "qwen3-8b", "h200", 1, ("all", 40, None, 100), 32)
    serial = sweep(spec, ["vegas", "quest"], [2, 4, 6], workers=1)
    parallel = sweep(spec, ["vegas", "quest"], [2, 4, 6], workers=2)
    key = lambda r: (r["policy"], r["s"], r["k"])  # noqa: E731
    assert sorted(map(key, serial["rows"])) == sorted(map(key, parallel["rows"]))
    for a, b in zip(sorted(serial["rows"], key=key), sorted(parallel["rows"], key=key)):
        assert a["throughput"] == pytest.approx(b["throughput"])
    report = summarise(serial)
    best = max(serial["rows"], key=lambda r: r["throughput"])
    assert report["best"]["throughput"] == best["throughput"]
    assert report["runner_up"]["throughput"] <= best["throughput"]
    for p in report["policies"]:
        assert "three_step" in p and p["three_step"]["speedup"] <= p["speedup"] + 1e-12
    with pytest.raises(SpecsimError, match="no 'streamingllm'"):
        sweep(spec, ["streamingllm"], [2], workers=1)


def test_sweep_workers_read_the_trace_once_in_the_parent(tmp_path, monkeypatch):
    """Forked workers inherit what the parent read: the trace is read once, by the parent,
    however many workers simulate it (each read is logged by the process that made it)."""
    import os

    from specsim.simulator import tuning
    from specsim.traces import importers
    if "fork" not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip("workers are spawned here: each reads the trace once")
    path, log = _sweep_trace(tmp_path), tmp_path / "reads.log"
    real = importers.load_trace

    def logged(*args, **kwargs):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(importers, "load_trace", logged)
    tuning._CACHE.clear()
    spec = SweepSpec(path, "qwen3-8b", "h200", 1, ("all", 40, None, 100), 32)
    swept = tuning.sweep(spec, ["vegas", "quest"], [2, 4, 6], workers=2)
    assert swept["workers"] == 2 and len(swept["rows"]) == 12
    assert log.read_text().split() == [str(os.getpid())]


def test_simulate_and_tune_commands(tmp_path):
    from specsim.cli.main import cli
    path = _sweep_trace(tmp_path)
    r = CliRunner().invoke(cli, ["simulate", "--trace", path, "--arrivals", "poisson:5:20",
                                 "--output-tokens", "60", "--k", "4", "--sparsity", "0.1",
                                 "--json", "--chrome-trace", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["summary"]["requests"] == 20 and doc["speedup"] > 0
    assert (tmp_path / "c.json").exists()
    r = CliRunner().invoke(cli, ["tune", "--trace", path, "--arrivals", "all:20",
                                 "--output-tokens", "60", "--k", "2,4", "--workers", "1",
                                 "--holdout", "0.5", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{"):])
    assert {p["policy"] for p in doc["policies"]} == {"vegas", "quest"}
    assert all("analytical" in p for p in doc["policies"])
    assert {p["policy"] for p in doc["holdout"]["policies"]} == {"vegas", "quest"}
    assert all(p["optimism"] >= 0 for p in doc["holdout"]["policies"])
    r = CliRunner().invoke(cli, ["simulate", "--trace", path, "--policy", "streamingllm"])
    assert r.exit_code != 0 and "no 'streamingllm'" in str(r.exception or r.output)
