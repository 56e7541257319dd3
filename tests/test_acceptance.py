"""Acceptance from traces: per-position counts, counterfactual replay, extrapolation, bootstrap."""
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seeding import seed as run_seed
from specsim import analytical as A
from specsim.traces.acceptance import (count_acceptance, estimate_acceptance, extrapolation_error,
                                       predicted_runs, replay_expected_tokens, replay_histogram,
                                       replay_tokens, token_acceptance,
                                       token_replay_expected_tokens)
from specsim.analytical import MAX_K
from specsim.traces.format import HistogramTrace, RequestTrace, Trace, make_header


def trace_of(*records):
    t = Trace(make_header(source="test"))
    for r in records:
        (t.requests if isinstance(r, RequestTrace) else t.histograms).append(r)
    return t


def request(rid, k, m, context=None):
    k, m = np.asarray(k), np.asarray(m)
    context = np.asarray(context if context is not None else 1000 + np.arange(k.size))
    return RequestTrace(rid, "vegas", 0.05, context, k, m)


def geometric_trace(p, k, requests, iterations, rng, rid="r"):
    recs = []
    for r in range(requests):
        accepted = rng.random((iterations, k)) < p
        m = np.where(accepted.all(1), k, np.argmin(accepted, axis=1))
        recs.append(request(f"{rid}{r}", np.full(iterations, k), m))
    return trace_of(*recs)


def test_position_counts_worked_example():
    # k = 3, m = 0, 2, 3: position 1 reached 3× accepted 2×; position 2 reached 2× accepted 2×;
    # position 3 reached 2× accepted 1×  →  p = [2/3, 1, 1/2], P = [2/3, 2/3, 1/3]
    est = estimate_acceptance(trace_of(request("a", [3, 3, 3], [0, 2, 3])), min_support=1)
    assert est.reached == pytest.approx([3, 2, 2])
    assert est.conditional == pytest.approx([2 / 3, 1.0, 0.5])
    assert est.survival == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    # E[m+1] at k = 3 is the recorded mean of m + 1 = (1 + 3 + 4)/3
    assert est.expected_tokens[-1] == pytest.approx(8 / 3)
    assert est.observed_tokens_per_iteration == pytest.approx(8 / 3)
    assert est.observed_alpha == pytest.approx(5 / 9)


def test_survival_forms_reproduce_both_replays():
    rng = np.random.default_rng(1)
    t = geometric_trace(0.7, 8, requests=20, iterations=500, rng=rng)
    est = estimate_acceptance(t)
    per_iteration = A.expected_tokens_from_survival(est.survival)
    for k in range(1, 9):
        # the pooled curve is the per-iteration replay min(m, k); the per-k curves the
        # token-by-token one — exactly, each
        assert per_iteration[k] == pytest.approx(replay_expected_tokens(t, k))
        assert est.expected_tokens[k - 1] == pytest.approx(token_replay_expected_tokens(t, k))
        assert est.survival_at(k).sum() + 1 == pytest.approx(est.expected_tokens[k - 1])
        assert not est.extrapolated[k - 1]
        # i.i.d. acceptance has no clusters: the two replays agree but for sampling noise and
        # the bonus tokens counted as predicted (0.7^8 of the iterations: +0.8% at k = 3)
        assert est.expected_tokens[k - 1] == pytest.approx(per_iteration[k], rel=0.02)
    # at the recorded k both are the recorded mean of m + 1
    assert est.expected_tokens[7] == pytest.approx(est.observed_tokens_per_iteration)


def test_token_sequence_of_a_request_worked_example():
    # k = 2, m = 2, 0, 1: tokens ✓✓(bonus) ✗ ✓✗
    r = request("a", [2, 2, 2], [2, 0, 1])
    assert token_acceptance(r).tolist() == [1, 1, -1, 0, 1, 0]
    assert predicted_runs(token_acceptance(r)).tolist() == [3, 2, 1, 0, 1, 0]
    assert predicted_runs(np.array([1, 1, -1], np.int8)).tolist() == [3, 2, 1]   # to the end
    # at k = 1 the bonus counts as predicted: ✓|✓|(bonus)✗… → m = 1, 1, 1 (6 tokens, 3 its)
    assert replay_tokens(token_acceptance(r), 1).tolist() == [1, 1, 1]
    # at the recorded k the recorded iterations come back
    assert replay_tokens(token_acceptance(r), 2).tolist() == [2, 0, 1]
    assert token_acceptance(request("b", [2, 1, 2], [2, 1, 0])) is None   # variable k


def _clustered(rng, n, easy=0.95, hard=0.25, switch=0.08):
    """A token sequence whose draft predictability comes in runs (easy and hard stretches)."""
    state, out = True, np.empty(n, bool)
    for t in range(n):
        if rng.random() < switch:
            state = not state
        out[t] = rng.random() < (easy if state else hard)
    return out


def _record(predicted, k):
    """The iterations of a run at draft length k over a known token sequence (True: the draft
    predicts the token)."""
    ms, t, bonus = [], 0, []
    while t < predicted.size:
        m = 0
        while m < k and t + m < predicted.size and predicted[t + m]:
            m += 1
        ms.append(m)
        if m == k and t + m < predicted.size:
            bonus.append(t + m)
        t += m + 1
    return np.asarray(ms), bonus


def test_token_replay_is_exact_where_acceptance_comes_in_clusters():
    """A run at k < k_rec over the same answer accepts what the sequence predicts: the
    token-by-token replay of a k_rec recording gets it exactly, while min(m, k) — every
    replayed iteration starting right after a recorded rejection, in the hard stretches —
    under-counts it."""
    rng = np.random.default_rng(7)
    k_rec, recs, truth = 10, [], {k: [0, 0] for k in range(1, 11)}
    for j in range(30):
        # the answer ends in a few unpredictable tokens: its recorded iterations end with it
        seq = np.concatenate([_clustered(rng, 400), np.zeros(k_rec + 1, bool)])
        _, bonus = _record(seq, k_rec)
        seq[bonus] = True       # never drafted at k_rec: make the truth what replay assumes
        m, _ = _record(seq, k_rec)
        recs.append(request(f"r{j}", np.full(m.size, k_rec), m))
        for k in truth:
            mk, _ = _record(seq, k)
            truth[k][0] += int(np.sum(mk + 1))
            truth[k][1] += mk.size
    t = trace_of(*recs)
    est = estimate_acceptance(t)
    per_iteration = A.expected_tokens_from_survival(est.survival)
    for k in range(1, 11):
        assert est.expected_tokens[k - 1] == pytest.approx(truth[k][0] / truth[k][1])
    assert per_iteration[2] < 0.95 * truth[2][0] / truth[2][1]       # min(m, k)'s bias, > 5%


def test_variable_k_iterations_only_reach_their_positions():
    # an adaptive-k trace: iteration 2 drafted only 1 token, so it never reaches position 2
    est = estimate_acceptance(trace_of(request("a", [2, 1, 2], [2, 1, 0])), min_support=1)
    assert est.reached == pytest.approx([3, 1])
    assert est.conditional == pytest.approx([2 / 3, 1.0])


def test_histogram_equals_the_same_iterations_as_a_request():
    m = [0, 0, 1, 2, 2, 2, 3, 4, 4, 4]
    as_request = estimate_acceptance(trace_of(request("a", [4] * 10, m)), min_support=1)
    hist = HistogramTrace("h", "vegas", 0.05, 4, np.bincount(m, minlength=5))
    as_hist = estimate_acceptance(trace_of(hist), min_support=1)
    assert as_hist.survival == pytest.approx(as_request.survival)
    assert as_hist.counts.unit == "iteration" and as_request.counts.unit == "request"
    assert as_hist.counts.multiplicity.sum() == 10
    assert replay_expected_tokens(trace_of(hist), 2) == pytest.approx(
        np.mean(np.minimum(m, 2) + 1))
    # no token sequence in a histogram: its per-k curves are the per-iteration replay
    for k in range(1, 5):
        assert as_hist.survival_at(k) == pytest.approx(as_hist.survival[:k])


def test_variable_k_requests_keep_the_per_iteration_replay():
    est = estimate_acceptance(trace_of(request("a", [3, 1, 3, 2, 3], [3, 1, 0, 2, 1])),
                              min_support=1)
    for k in range(1, 4):
        assert est.survival_at(k) == pytest.approx(est.survival[:k])


def test_extrapolation_is_flagged_and_fits_a_geometric_chain():
    rng = np.random.default_rng(2)
    t = geometric_trace(0.8, 4, requests=10, iterations=400, rng=rng)
    est = estimate_acceptance(t, k_max=10)
    assert est.extrapolated.tolist() == [False] * 4 + [True] * 6
    # beyond k_rec the fitted rates stay near the true 0.8
    p_fit = A.conditional_from_survival(est.survival)[4:]
    assert np.all(np.abs(p_fit - 0.8) < 0.04)
    truth = A.expected_tokens_iid(0.8, 10)
    assert est.expected_tokens[-1] == pytest.approx(truth, rel=0.05)


def test_extrapolation_error_is_measured_against_replay():
    rng = np.random.default_rng(3)
    t = geometric_trace(0.75, 8, requests=10, iterations=300, rng=rng)
    check = extrapolation_error(t, 4)
    assert check["k"] == [5, 6, 7, 8]
    assert check["max_abs_relative_error"] < 0.03
    for k, replayed in zip(check["k"], check["replayed"]):
        assert replayed == pytest.approx(replay_expected_tokens(t, k))
    # a chain whose acceptance collapses after position 4 is badly extrapolated, and says so
    recs = []
    for r in range(10):
        accepted = rng.random((300, 8)) < np.array([0.9] * 4 + [0.2] * 4)
        m = np.where(accepted.all(1), 8, np.argmin(accepted, axis=1))
        recs.append(request(f"c{r}", np.full(300, 8), m))
    assert extrapolation_error(trace_of(*recs), 4)["max_abs_relative_error"] > 0.1


def test_low_support_positions_are_not_trusted():
    rng = np.random.default_rng(4)
    t = geometric_trace(0.3, 8, requests=2, iterations=100, rng=rng)
    est = estimate_acceptance(t)
    # positions reached by fewer than 20 iterations are fitted, not taken as measured
    assert est.observed < 8
    assert est.reached[est.observed - 1] >= 20 and est.reached[est.observed] < 20


def test_bootstrap_covers_the_truth_and_narrows_with_more_requests():
    p, k = 0.7, 6
    truth = A.expected_tokens_iid(p, k)
    widths, covered = [], 0
    for seed, requests in [(10, 8), (11, 8), (12, 8), (13, 64)]:
        rng = np.random.default_rng(seed)
        est = estimate_acceptance(geometric_trace(p, k, requests, 60, rng))
        boot = A.expected_tokens_from_survival(est.bootstrap_survival(400, rng))[:, k]
        iv = A.percentile_interval(boot)
        covered += iv.contains(truth)
        widths.append(iv.high - iv.low)
    assert covered >= 3
    assert widths[-1] < 0.6 * np.mean(widths[:3])


def test_counts_keep_contexts_and_totals():
    c = count_acceptance(trace_of(request("a", [2, 2], [1, 2], context=[500, 502]),
                                  HistogramTrace("h", "vegas", 0.05, 2, np.array([1, 0, 1]),
                                                 context=800.0)))
    assert c.iterations == 4 and c.tokens == 2 + 3 + 1 + 3 and c.drafted == 8
    assert 500 in c.contexts and 800 in c.contexts


def test_few_aggregate_histograms_resample_iterations_many_resample_requests():
    two = [HistogramTrace(f"h{i}", "vegas", 0.05, 2, np.array([3, 2, 5])) for i in range(2)]
    c = count_acceptance(trace_of(*two))
    assert c.unit == "iteration" and c.multiplicity.sum() == 20
    many = [HistogramTrace(f"h{i}", "vegas", 0.05, 2, np.array([3, 2, 5])) for i in range(12)]
    c = count_acceptance(trace_of(*many))
    assert c.unit == "request" and c.multiplicity.tolist() == [1.0] * 12
    # same pooled estimate either way
    assert estimate_acceptance(trace_of(*two), min_support=1).survival == pytest.approx(
        estimate_acceptance(trace_of(*many), min_support=1).survival)


# --------------------------------------------------------------------------------------------
# properties of the counterfactual replays
# --------------------------------------------------------------------------------------------

PROPERTY = settings(max_examples=60, deadline=None, database=None)

#: one or more requests recorded at one fixed k_rec: (k_rec, [accepted drafts per iteration])
fixed_k_requests = st.integers(1, 8).flatmap(lambda k: st.tuples(st.just(k), st.lists(
    st.lists(st.integers(0, k), min_size=1, max_size=40), min_size=1, max_size=4)))


def recorded(k_rec, requests):
    return trace_of(*(request(f"r{j}", [k_rec] * len(m), m) for j, m in enumerate(requests)))


@PROPERTY
@given(fixed_k_requests)
def test_shorter_drafts_never_accept_more(recording):
    """Both replays: shrinking k never raises the tokens an iteration emits, and at k_rec
    each gives back the recorded mean of m + 1."""
    k_rec, requests = recording
    t = recorded(k_rec, requests)
    per_iteration = [replay_expected_tokens(t, k) for k in range(1, k_rec + 1)]
    by_tokens = [token_replay_expected_tokens(t, k) for k in range(1, k_rec + 1)]
    for curve in (per_iteration, by_tokens):
        assert all(a <= b + 1e-12 for a, b in zip(curve, curve[1:]))
        assert curve[-1] == pytest.approx(np.mean([x + 1 for m in requests for x in m]))


@PROPERTY
@given(fixed_k_requests, st.data())
def test_token_replay_emits_the_recorded_answer(recording, data):
    """At any k ≤ k_rec the replayed iterations emit the recorded answer (the last one may run
    one token past its end, where the answer ends in accepted drafts: the run of predicted
    tokens counts to the end), each accepts at most k, and at k_rec they are the recorded
    iterations."""
    k_rec, requests = recording
    k = data.draw(st.integers(1, k_rec))
    for m in requests:
        r = request("r", [k_rec] * len(m), m)
        sequence = token_acceptance(r)
        assert sequence.size == r.tokens
        replayed = replay_tokens(sequence, k)
        assert r.tokens <= int(np.sum(replayed + 1)) <= r.tokens + 1
        assert int(np.sum(replayed[:-1] + 1)) < r.tokens
        assert replayed.min() >= 0 and replayed.max() <= k
        assert replay_tokens(sequence, k_rec).tolist() == list(m)


@PROPERTY
@given(fixed_k_requests)
def test_estimated_curve_is_the_token_replay(recording):
    """Within the recorded k the estimate's E[m+1](k) is the direct token-by-token replay."""
    k_rec, requests = recording
    t = recorded(k_rec, requests)
    est = estimate_acceptance(t, min_support=1)
    for k in range(1, k_rec + 1):
        assert est.expected_tokens[k - 1] == pytest.approx(token_replay_expected_tokens(t, k))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(0, 12), min_size=1, max_size=60),
       st.integers(1, 14))
def test_replay_histogram_counts_the_iterations_of_the_token_replay(k_rec, ms, k):
    m = np.minimum(np.asarray(ms), k_rec)
    r = RequestTrace("x", "p", 0.1, np.arange(1, m.size + 1), np.full(m.size, k_rec), m)
    predicted = token_acceptance(r)
    assert np.array_equal(replay_histogram(predicted, k),
                          np.bincount(replay_tokens(predicted, k), minlength=k + 1))


@pytest.mark.parametrize("block", [1, 5, 64])
def test_replay_histograms_taken_a_block_at_a_time_count_the_same(monkeypatch, block):
    """However few segments a block holds, the counts are the token replay's."""
    import specsim.traces.acceptance as acceptance
    rng = np.random.default_rng(run_seed(11))
    m = np.minimum(rng.geometric(0.3, 300) - 1, 6)
    r = RequestTrace("x", "p", 0.1, np.arange(1, m.size + 1), np.full(m.size, 6), m)
    predicted = token_acceptance(r)
    monkeypatch.setattr(acceptance, "REPLAY_BLOCK", block)
    counts = acceptance.replay_histograms(predicted, 9)
    for k in range(1, 10):
        assert np.array_equal(counts[k - 1, :k + 1],
                              np.bincount(replay_tokens(predicted, k), minlength=k + 1))
        assert not counts[k - 1, k + 1:].any()


def test_a_long_request_at_max_k_is_counted_in_linear_time():
    n = 200_000
    rng = np.random.default_rng(run_seed(7))
    k = np.full(n, MAX_K)
    r = RequestTrace("x", "p", 0.1, np.arange(1, n + 1), k, rng.integers(0, 3, n))
    start = time.perf_counter()
    est = estimate_acceptance(Trace({}, [r]))
    assert time.perf_counter() - start < 10
    assert est.k_max == MAX_K and est.expected_tokens[0] <= 2.0
