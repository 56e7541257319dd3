"""Every formula of specsim.analytical against a hand-computed worked example."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim import analytical as A

PROPERTY = settings(max_examples=100, deadline=None, database=None)
#: conditional acceptance rates of up to 16 positions (0, or at least 1e-3: no underflow)
rates = st.lists(st.just(0.0) | st.floats(1e-3, 1.0), min_size=1, max_size=16)


def test_sparsespec_eq1_worked_example():
    # α = 0.8, k = 4, γ = 0.1: (0.8·4 + 1)/(4·0.1 + 1) = 4.2/1.4 = 3.0
    assert A.sparsespec_speedup(0.8, 4, 0.1) == pytest.approx(3.0)
    # no drafting: S = 1
    assert A.sparsespec_speedup(0.3, 0, 0.5) == pytest.approx(1.0)


def test_sparsespec_eq2_worked_example_and_numerical_derivative():
    # (α − γ)/(kγ + 1)² = 0.7/1.4² = 0.357142857…
    assert A.sparsespec_speedup_slope(0.8, 4, 0.1) == pytest.approx(0.7 / 1.96)
    for alpha, gamma, k in [(0.8, 0.1, 4.0), (0.2, 0.3, 2.5), (0.5, 0.5, 7.0)]:
        h = 1e-6
        numeric = (A.sparsespec_speedup(alpha, k + h, gamma)
                   - A.sparsespec_speedup(alpha, k - h, gamma)) / (2 * h)
        assert A.sparsespec_speedup_slope(alpha, k, gamma) == pytest.approx(numeric, abs=1e-7)
    # the sign is α − γ whatever k
    assert A.sparsespec_speedup_slope(0.2, 10, 0.3) < 0


def test_iid_closed_form():
    # a = 0.5, k = 3: (1 − 0.5⁴)/(1 − 0.5) = 1.875 = 1 + 0.5 + 0.25 + 0.125
    assert A.expected_tokens_iid(0.5, 3) == pytest.approx(1.875)
    assert A.expected_tokens_iid(1.0, 5) == pytest.approx(6.0)
    assert A.expected_tokens_iid(0.0, 5) == pytest.approx(1.0)
    # agrees with the per-position form for constant p
    for a in (0.3, 0.7, 0.95):
        P = A.survival_from_conditional(np.full(9, a))
        assert A.expected_tokens_from_survival(P, 9) == pytest.approx(A.expected_tokens_iid(a, 9))


def test_survival_form_worked_example():
    P = A.survival_from_conditional([0.9, 0.8, 0.5])
    assert P == pytest.approx([0.9, 0.72, 0.36])
    # E[m+1] = 1 + 0.9 + 0.72 + 0.36 = 2.98
    assert A.expected_tokens_from_survival(P, 3) == pytest.approx(2.98)
    assert A.expected_tokens_from_survival(P) == pytest.approx([1.0, 1.9, 2.62, 2.98])
    assert A.conditional_from_survival(P) == pytest.approx([0.9, 0.8, 0.5])
    assert A.alpha_from_survival(P, 3) == pytest.approx((0.9 + 0.72 + 0.36) / 3)
    with pytest.raises(ValueError):
        A.survival_from_conditional([0.5, 1.2])
    with pytest.raises(ValueError):
        A.expected_tokens_from_survival(P, 4)


def test_iteration_time_and_speedup_worked_example():
    # T = 4·2 + 10 + 1 + 0.5 = 19.5 ms;  S = 2.98 · 10 / 19.5
    assert A.iteration_time(4, 2.0, 10.0, 1.0, 0.5) == pytest.approx(19.5)
    assert A.speedup(2.98, 10.0, 19.5) == pytest.approx(29.8 / 19.5)


def test_best_k_and_joint_search():
    assert A.best_k([1.1, 1.5, 1.5, 1.2], [1, 2, 3, 4]) == (2, 1.5)  # tie → smaller k
    grid = np.array([[1.0, 1.2], [1.4, 1.3], [1.1, 1.6]])
    assert A.best_k_s(grid, [1, 2, 3], [0.05, 0.1]) == (3, 0.1, 1.6)
    with pytest.raises(ValueError):
        A.best_k_s(grid, [1, 2], [0.05, 0.1])


def _speedups(P, draft, verify_of_q, plain, selection=0.0, overhead=0.0):
    ks = np.arange(1, len(P) + 1)
    tokens = A.expected_tokens_from_survival(P)[1:]
    t = A.iteration_time(ks, draft, verify_of_q(ks + 1), selection, overhead)
    return tokens, t, A.speedup(tokens, plain, t)


def test_extend_k_criterion_matches_exhaustive_comparison():
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(2000):
        p = rng.uniform(0.2, 1.0, size=10)
        P = A.survival_from_conditional(p)
        draft = rng.uniform(0.05, 0.8)
        slope = rng.uniform(0.0, 0.05)
        plain = rng.uniform(0.5, 2.0)
        tokens, t, S = _speedups(P, draft, lambda q: 1.0 + slope * q, plain,
                                 rng.uniform(0, 0.2), rng.uniform(0, 0.1))
        for j in range(len(P) - 1):
            gamma_prime = (t[j + 1] - t[j]) / plain
            if abs(S[j + 1] - S[j]) < 1e-12:
                continue
            assert A.extend_k_helps(P[j + 1], gamma_prime, S[j]) == (S[j + 1] > S[j])
            checked += 1
    assert checked > 15000


def test_entropy_centres_ema():
    c = A.update_entropy_centres(A.EntropyCentres(1.0, 3.0), [2.0, 4.0], [], beta=0.9)
    assert c.accepted == pytest.approx(0.9 * 1.0 + 0.1 * 3.0)   # 1.2
    assert c.rejected == pytest.approx(3.0)                       # no rejected token: kept
    with pytest.raises(ValueError):
        A.update_entropy_centres(c, [1.0], [1.0], beta=1.5)


def test_entropy_acceptance_estimate_is_a_two_class_softmax():
    centres = A.EntropyCentres(accepted=0.5, rejected=2.0)
    p = A.entropy_acceptance_estimate([0.5, 2.0, 1.25], centres)
    assert p[0] == pytest.approx(1 / (1 + math.exp(-1.5)))   # 0.8176
    assert p[1] == pytest.approx(1 / (1 + math.exp(1.5)))    # 0.1824
    assert p[2] == pytest.approx(0.5)                        # equidistant


def test_adaptive_k_worked_example():
    # p = [0.8176, 0.8176, 0.1824, 0.1824]; C_d = 0.1, C_v = 1:
    # k=1: 1.8176/1.1 = 1.652; k=2: 2.4861/1.2 = 2.072; k=3: 2.6081/1.3 = 2.006; k=4: 1.879
    centres = A.EntropyCentres(accepted=0.5, rejected=2.0)
    H = [0.5, 0.5, 2.0, 2.0]
    assert A.adaptive_k(H, centres, 0.1, 1.0, [1, 2, 3, 4]) == 2
    # cheap drafts make the long draft worth it
    assert A.adaptive_k([0.5] * 4, centres, 0.01, 1.0, [1, 2, 3, 4]) == 4
    # restricted choice set
    assert A.adaptive_k(H, centres, 0.1, 1.0, [1, 3]) == 3
    with pytest.raises(ValueError):
        A.adaptive_k(H[:2], centres, 0.1, 1.0, [1, 2, 3])


def test_vegas_three_step_on_a_hand_built_grid():
    ks, ss = [2, 4, 8], [0.03, 0.05, 0.1]
    tokens = np.array([[2.0, 2.4, 2.5],
                       [2.6, 3.3, 3.4],
                       [3.0, 4.0, 4.05]])   # at k = 8, s = 0.05 is within 2% of the plateau
    speed = np.array([[1.30, 1.40, 1.35],
                      [1.45, 1.60, 1.50],
                      [1.20, 1.55, 1.70]])
    path = A.vegas_three_step(tokens, speed, ks, ss)
    assert path.plateau_s == 0.05            # step 1
    assert path.k_step2 == 4                 # step 2: best k at s = 0.05
    assert path.s_step3 == 0.05              # step 3: best s at k = 4
    assert path.speedup == pytest.approx(1.60)
    assert (path.joint_k, path.joint_s) == (8, 0.1)
    assert path.gap == pytest.approx(1 - 1.60 / 1.70)
    assert path.path == [(8, 0.05), (4, 0.05), (4, 0.05)]


def test_bootstrap_weights_and_interval():
    rng = np.random.default_rng(0)
    w = A.bootstrap_weights([1, 1, 1, 1], 500, rng)
    assert w.shape == (500, 4) and np.all(w.sum(1) == 4)
    w = A.bootstrap_weights([10, 30], 200, rng)       # iterations with multiplicities
    assert np.all(w.sum(1) == 40)
    assert w[:, 1].mean() == pytest.approx(30, rel=0.05)
    iv = A.percentile_interval(np.arange(1001), 0.9)
    assert (iv.low, iv.high) == pytest.approx((50.0, 950.0))
    assert iv.contains(500) and not iv.contains(999)


def test_conditional_rates_from_counts():
    p = A.conditional_rates_from_counts([10, 5, 0], [5, 5, 0])
    assert p[:2] == pytest.approx([0.5, 1.0]) and np.isnan(p[2])


def test_adaptive_k_batched_rows_match_single_calls():
    rng = np.random.default_rng(5)
    centres = A.EntropyCentres(accepted=0.6, rejected=2.2)
    H = rng.gamma(2.0, 0.7, size=(50, 8))
    batched = A.adaptive_k(H, centres, 0.15, 1.0, [1, 2, 4, 6, 8])
    assert batched.shape == (50,)
    assert batched.tolist() == [A.adaptive_k(h, centres, 0.15, 1.0, [1, 2, 4, 6, 8]) for h in H]
    assert len(set(batched.tolist())) > 1


def test_emitted_tokens_per_iteration_of_a_finite_answer():
    """Deterministic acceptance (m + 1 = 5 every iteration): 127 tokens take ceil(127/5) = 26
    iterations; a random one matches a simulation; long answers tend to E[m+1]."""
    from specsim.analytical import emitted_tokens_per_iteration, expected_tokens_from_survival
    assert emitted_tokens_per_iteration([1, 1, 1, 1], 4, 127) == pytest.approx(127 / 26)
    assert emitted_tokens_per_iteration([1, 1, 1, 1], 4, 125) == pytest.approx(5.0)
    P = np.array([0.9, 0.75, 0.6, 0.45, 0.3, 0.2])
    rng = np.random.default_rng(0)
    u = rng.random((200000, 1))
    m = (u < P[None, :]).sum(1)            # P(m ≥ i) = P_i, nested as draw_from_survival
    steps, total, n = [], 0, 0
    for x in m:
        total += x + 1
        n += 1
        if total >= 40:
            steps.append(n)
            total, n = 0, 0
    assert emitted_tokens_per_iteration(P, 6, 40) == pytest.approx(40 / np.mean(steps),
                                                                   rel=0.01)
    assert emitted_tokens_per_iteration(P, 6, 20000) == pytest.approx(
        expected_tokens_from_survival(P, 6), rel=1e-3)
    assert emitted_tokens_per_iteration(P, 3, 40) < emitted_tokens_per_iteration(P, 6, 40)


@PROPERTY
@given(rates)
def test_survival_and_conditional_forms_invert_each_other(p):
    P = A.survival_from_conditional(p)
    assert np.all(np.diff(P) <= 1e-15) and np.all((P >= 0) & (P <= 1))   # never increases
    # the rates come back wherever they are defined (every earlier draft can be accepted)
    defined = np.concatenate(([True], P[:-1] > 0))
    assert A.conditional_from_survival(P)[defined] == pytest.approx(np.asarray(p)[defined])


@PROPERTY
@given(rates)
def test_expected_tokens_grow_with_k_by_at_most_one_per_draft(p):
    P = A.survival_from_conditional(p)
    curve = A.expected_tokens_from_survival(P)
    steps = np.diff(curve)
    assert curve[0] == 1.0 and np.all(steps >= 0) and np.all(steps <= 1 + 1e-12)
    # α = E[m/k] is the mean survival up to k: (E[m+1] − 1)/k
    for k in range(1, len(p) + 1):
        assert A.alpha_from_survival(P, k) == pytest.approx((curve[k] - 1) / k)


@PROPERTY
@given(st.floats(0.0, 1.0), st.floats(0.01, 1.0), st.floats(0.5, 20.0))
def test_drafting_pays_exactly_when_alpha_exceeds_gamma(alpha, gamma, k):
    """Eq. 1 beats plain decoding, and Eq. 2 says a longer draft helps, iff α > γ."""
    if abs(alpha - gamma) < 1e-9:
        return
    assert (A.sparsespec_speedup(alpha, k, gamma) > 1.0) == (alpha > gamma)
    assert (A.sparsespec_speedup_slope(alpha, k, gamma) > 0) == (alpha > gamma)
