"""The calibrated cost model against synthetic tables of known structure: it recovers the
structure inside the measured grid, says where it leaves it, and prices each op as the engine
runs it (ragged batches, per-policy verify passes, loop overheads, refreshes by rows)."""
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration_tables import (BATCHES, CONTEXTS, HW, KV, MODEL, at_every_shape, provenance,
                                synthetic, true_ms, with_overheads, with_rows)
from specsim.costs.calibrated import CalibratedCostModel
from specsim.costs.calibration_file import Calibration, Measurement

SYNTHETIC = CalibratedCostModel(synthetic(), MODEL, HW)


def test_interpolation_inside_the_grid_is_accurate_and_monotone():
    cm = SYNTHETIC
    for b, c in ((3, 3000), (12, 20000), (24, 50000)):
        got = cm.plain_step([c] * b)
        assert got.seconds * 1e3 == pytest.approx(true_ms("plain", b, c), rel=0.03)
        assert not any("outside" in n or "roofline" in n for n in got.notes)
        got = cm.verify([c] * b, 8)
        assert got.seconds * 1e3 == pytest.approx(true_ms("verify", b, c, 8), rel=0.03)
        got = cm.draft_step([c] * b, 0.05, "vegas")
        assert got.seconds * 1e3 == pytest.approx(true_ms("draft:vegas", b, c, s=0.05), rel=0.03)
    times = [cm.plain_step([c] * 8).seconds for c in range(1024, 65536, 997)]
    assert np.all(np.diff(times) >= 0)                         # monotone in bytes


def test_verify_between_measured_q_stays_in_its_kernel_tile():
    """The verify kernel's configuration changes with its tile's row count (the KV head's
    group × q, to a power of two ≥ 16; Llama-3.1-8B: group 4, so q = 5–8 share a 32-row tile):
    here that tile costs 1 ms more. An unmeasured q is
    interpolated between measured q of its own tile, extrapolated from the tile's two nearest,
    held at the tile's only one, and only across tiles when its tile has none — and says
    which."""
    def truth(b, c, q):
        return true_ms("verify", b, c, q) + (1.0 if 16 < 4 * q <= 32 else 0.0)

    def model(qs):
        base = synthetic()
        rows = [m for m in base.measurements if m.op != "verify"] + [
            Measurement("verify", b, c, q, None, [truth(b, c, q)] * 3)
            for b in (1, 2, 4, 8, 16, 32) for c in (1024, 2048, 4096, 8192, 16384, 32768, 65536)
            for q in qs]
        return CalibratedCostModel(Calibration(base.provenance, base.ceilings, rows), MODEL, HW)

    def names(note, q, *used):
        """The note names the measured q it was priced from, and no other."""
        return {int(x) for x in re.findall(r"q=(\d+)", note)} - {q} == set(used)

    ctx = [8192] * 8
    cm = model((1, 2, 3, 4, 6, 8, 12, 16))
    for q, used in ((7, (6, 8)), (5, (6, 8)), (10, (12, 16))):   # 5: extrapolated in its tile
        got = cm.verify(ctx, q)
        assert names(got.notes[-1], q, *used), (q, got.notes)
        assert got.seconds * 1e3 == pytest.approx(truth(8, 8192, q), rel=0.01), q
    assert not any("q=" in n for n in cm.verify(ctx, 8).notes)      # measured: priced as is
    held = model((1, 2, 3, 4, 8, 12, 16)).verify(ctx, 6)
    assert names(held.notes[-1], 6, 8)
    assert held.seconds * 1e3 == pytest.approx(truth(8, 8192, 8), rel=0.01)
    across = model((1, 2, 3, 4, 12, 16)).verify(ctx, 6)
    assert names(across.notes[-1], 6, 4, 12)


def test_ragged_batches_use_their_exact_bytes():
    cm = SYNTHETIC
    ragged = cm.plain_step([2048, 30720])
    uniform = cm.plain_step([16384, 16384])
    # same tokens and same total KV bytes: the same time; a draft's budgets differ though
    assert ragged.seconds == pytest.approx(uniform.seconds)
    assert cm.draft_step([100, 32668], 0.05, "vegas").seconds != pytest.approx(
        cm.draft_step([16384, 16384], 0.05, "vegas").seconds)


def flagged(cost) -> bool:
    """The cost says it left the measurements (a fitted roofline, or the roofline model)."""
    return any("outside the measured grid" in n or "roofline" in n for n in cost.notes)


@given(st.integers(1, 128), st.integers(1, 1 << 19), st.sampled_from([1, 4, 8, 16]))
@settings(max_examples=150, deadline=None)
def test_a_price_beyond_the_measurements_always_says_so(batch, context, q):
    """A plain step or verify pass is flagged exactly where its tokens or KV bytes lie past
    the measured ones (smaller bytes lie between the measured and zero, where K(0) = 0): the
    model never extrapolates silently."""
    most_bytes = max(BATCHES) * max(CONTEXTS) * KV
    for cost, tokens, most_tokens in (
            (SYNTHETIC.plain_step([context] * batch), batch, max(BATCHES)),
            (SYNTHETIC.verify([context] * batch, q), batch * q, max(BATCHES) * q)):
        beyond = tokens > most_tokens or batch * context * KV > most_bytes
        assert flagged(cost) == beyond, (batch, context, q, cost.notes)


def test_beyond_the_grid_the_price_is_a_line_not_a_cliff():
    far = SYNTHETIC.plain_step([262144] * 32)
    assert flagged(far)
    assert far.seconds * 1e3 == pytest.approx(true_ms("plain", 32, 262144), rel=0.15)
    missing = SYNTHETIC.draft_step([4096] * 4, 0.05, "quest")       # no Quest rows at all
    assert flagged(missing)
    assert missing.seconds == SYNTHETIC.roofline.draft_step([4096] * 4, 0.05, "quest").seconds
    prefill = SYNTHETIC.prefill([1000, 2000])
    assert flagged(prefill)
    assert prefill.seconds == SYNTHETIC.roofline.prefill([1000, 2000]).seconds


def test_measured_loop_overheads_enter_plain_steps_and_iterations():
    bare, cal = CalibratedCostModel(synthetic(), MODEL, HW), CalibratedCostModel(
        with_overheads(synthetic()), MODEL, HW)
    ctx = [8192] * 4
    assert cal.plain_step(ctx).seconds - bare.plain_step(ctx).seconds == pytest.approx(48e-6,
                                                                                     rel=1e-3)
    assert "overhead:plain measured" in cal.plain_step(ctx).notes[-1]
    it, it0 = cal.iteration(ctx, 6, 0.05, "vegas"), bare.iteration(ctx, 6, 0.05, "vegas")
    assert it.overhead_s == pytest.approx(110e-6, rel=1e-3)
    assert it0.overhead_s == HW.overheads.iteration          # roofline's constant without one
    assert it.seconds - it0.seconds == pytest.approx(110e-6 - HW.overheads.iteration, rel=1e-3)
    # a residual that comes out negative is clipped at zero, never makes a step cheaper
    neg = CalibratedCostModel(with_overheads(synthetic(), plain_us=lambda b: -30.0), MODEL, HW)
    assert neg.plain_step(ctx).seconds == pytest.approx(bare.plain_step(ctx).seconds)


def test_loop_overhead_measured_at_two_draft_lengths_is_linear_in_k():
    """overhead:speculative:vegas measured at k = 2 and 8 (q = 3, 9): iterations pay the line
    through them at every k — between, at, and beyond (k = 15: extrapolated, noted); a file
    with one k keeps a constant."""
    cal = synthetic()
    rows = list(cal.measurements)
    line = lambda k: 0.8 + 0.06 * k                       # ms: the host's work grows with k
    for b in sorted({m.batch for m in rows}):
        for c in sorted({m.context for m in rows}):
            for k in (2, 8):
                rows.append(Measurement("overhead:speculative:vegas", b, c, k + 1, None,
                                        [line(k)] * 3))
    two = CalibratedCostModel(Calibration(cal.provenance, cal.ceilings, rows), MODEL, HW)
    ctx = [8192] * 4
    for k in (2, 5, 8, 15):
        it = two.iteration(ctx, k, 0.05, "vegas")
        assert it.overhead_s * 1e3 == pytest.approx(line(k), rel=1e-3), k
    assert "extrapolated" not in two.loop_overhead("overhead:speculative:vegas", np.asarray(ctx),
                                               5)[1]
    assert "extrapolated" in two.loop_overhead("overhead:speculative:vegas", np.asarray(ctx), 15)[1]
    one = CalibratedCostModel(Calibration(cal.provenance, cal.ceilings, [
        r for r in rows if not (r.op.startswith("overhead") and r.q == 9)]), MODEL, HW)
    for k in (2, 15):
        assert one.iteration(ctx, k, 0.05, "vegas").overhead_s * 1e3 == pytest.approx(line(2))


def test_per_policy_loop_overhead_wins_over_the_generic_one():
    """Quest's rollback refreshes page bounds: its measured overhead is its own; a policy
    without one pays the policy-agnostic overhead."""
    cal = with_overheads(synthetic())
    rows = list(cal.measurements)
    for b in sorted({m.batch for m in rows}):
        for c in sorted({m.context for m in rows}):
            rows.append(Measurement("overhead:speculative:quest", b, c, 5, None, [0.5] * 3))
    model = CalibratedCostModel(Calibration(cal.provenance, cal.ceilings, rows), MODEL, HW)
    ctx = [8192] * 4
    assert model.iteration(ctx, 6, 0.05, "quest").overhead_s == pytest.approx(0.5e-3, rel=1e-3)
    assert model.iteration(ctx, 6, 0.05, "vegas").overhead_s == pytest.approx(110e-6, rel=1e-3)


def test_sparsities_between_the_measured_ones_are_interpolated():
    """Drafts measured at s = 0.03 and 0.1 only: s = 0.05 is interpolated between the two
    measured grids in the positions it selects (the known structure is linear in selected
    bytes, so it is recovered where the 256-position floor makes it non-linear in s, at 3000),
    and a selection at s = 0.05 is interpolated linearly in s between its two fits; both
    say so."""
    rows = []
    for b in (1, 2, 4, 8, 16):
        for c in (1024, 2048, 4096, 8192, 16384, 32768, 65536):
            rows.append(Measurement("plain", b, c, 1, None, [true_ms("plain", b, c)] * 3))
            for s in (0.03, 0.1):
                rows.append(Measurement("draft:vegas", b, c, 1, s,
                                        [true_ms("draft:vegas", b, c, 1, s)] * 3))
                rows.append(Measurement("selection:vegas", b, c, 1, s, [0.1 + 3 * s] * 3))
    cm = CalibratedCostModel(Calibration(provenance(), {}, rows), MODEL, HW)
    for c in (3000, 20000, 50000):
        got = cm.draft_step([c] * 4, 0.05, "vegas")
        assert got.seconds * 1e3 == pytest.approx(true_ms("draft:vegas", 4, c, 1, 0.05),
                                                  rel=0.002)
        assert "s=0.03" in got.notes[-1] and "s=0.1" in got.notes[-1] and not flagged(got)
    sel = cm.selection([20000] * 4, 0.05, "vegas", 4)
    assert sel.seconds * 1e3 == pytest.approx(0.1 + 3 * 0.05, rel=1e-6)
    assert "s=0.03" in sel.notes[-1] and "s=0.1" in sel.notes[-1] and not flagged(sel)


def test_quest_drafts_are_priced_on_page_metadata_plus_selected_bytes():
    """A Quest draft step reads every page's min/max key (bytes ∝ the context, whatever s) and
    then the selected tokens (∝ s): with both in the known structure, drafts measured at
    s = 0.03 and 0.1 predict s = 0.05 and the measured points themselves."""
    from specsim.policies import get_policy
    pol = get_policy("quest")
    per = MODEL.kv_bytes_per_token_layer() * MODEL.num_layers

    def quest_ms(b, c, s):
        tokens = b * (pol.selected(c, s) + math.ceil(c / pol.page_size))
        return 2.0 + 0.01 * b + tokens * per / 3e12 * 1e3

    rows = []
    for b in (1, 4, 16):
        for c in (4096, 16384, 32768, 65536, 131072):
            rows.append(Measurement("plain", b, c, 1, None, [true_ms("plain", b, c)] * 3))
            for s in (0.03, 0.1):
                rows.append(Measurement("draft:quest", b, c, 1, s, [quest_ms(b, c, s)] * 3))
    cm = CalibratedCostModel(Calibration(provenance(), {}, rows), MODEL, HW)
    for b, c, s in ((4, 32768, 0.1), (4, 32768, 0.03), (4, 50000, 0.05), (16, 20000, 0.07)):
        got = cm.draft_step([c] * b, s, "quest").seconds * 1e3
        assert got == pytest.approx(quest_ms(b, c, s), rel=0.03), (b, c, s)


def quest_verify_rows(cal):
    """Quest's own verify at q = 5, 1.5 ms above the shared one, and its draft steps."""
    return at_every_shape(cal, "verify:quest", 5, None,
                          lambda b, c: true_ms("verify", b, c, 5) + 1.5) + \
        at_every_shape(cal, "draft:quest", 1, 0.05, lambda b, c: true_ms("draft", b, c, 1, 0.05))


def test_a_policys_own_verify_adds_its_measured_difference():
    """Quest's verify (page bounds updated on every K write) measured at q = 5, 1.5 ms above
    the shared verify: Quest's iterations pay it at every k, other policies do not."""
    cal = synthetic()
    model, bare = CalibratedCostModel(with_rows(cal, quest_verify_rows(cal)), MODEL, HW), \
        SYNTHETIC
    ctx = [8192] * 4
    for k in (2, 7, 15):
        quest = model.iteration(ctx, k, 0.05, "quest").verify.seconds
        shared = bare.verify(ctx, k + 1).seconds
        assert quest - shared == pytest.approx(1.5e-3, rel=0.05), k
        assert model.iteration(ctx, k, 0.05, "vegas").verify.seconds == pytest.approx(shared)
    assert "verify:quest" in model.iteration(ctx, 4, 0.05, "quest").verify.notes[-1]


def test_selection_and_quest_pages_are_priced_on_the_longest_sequence():
    """Every refresh ranks each slot's buffer to the length it was sized for (the longest
    sequence: SparseSpec-L's too, whose attention-mass kernel skips past each length but whose
    top-K does not — measured on SmolLM2's ragged batch), and Quest scores the pages of that
    whole buffer: in a ragged batch a short sequence costs as much as the longest there. Every
    draft step is priced on its measured grid at the longest sequence too (its split plan is
    sized for the longest list); its selected bytes (the fit outside the grid) and the loop
    overheads stay per sequence."""
    cal = synthetic()
    rows = list(cal.measurements) + [
        Measurement("draft:quest", b, c, 1, 0.05, [true_ms("draft", b, c, 1, 0.05)] * 3)
        for b in (1, 2, 4, 8, 16, 32) for c in (1024, 2048, 4096, 8192, 16384, 32768, 65536)]
    model = CalibratedCostModel(Calibration(cal.provenance, cal.ceilings, rows), MODEL, HW)
    ragged, longest = [2048, 16384, 4096, 16384], [16384] * 4
    assert model.selection(ragged, 0.05, "vegas", 4).seconds == pytest.approx(
        model.selection(longest, 0.05, "vegas", 4).seconds)
    assert model._op_bytes("selection:sparsespec", np.array(ragged), 0.05) == model._op_bytes(
        "selection:sparsespec", np.array(longest), 0.05)
    assert model._op_bytes("overhead:speculative:vegas", np.array(ragged), None) < \
        model._op_bytes("overhead:speculative:vegas", np.array(longest), None)
    from specsim.policies import get_policy
    per, layers = MODEL.kv_bytes_per_token_layer(), MODEL.num_layers
    quest = get_policy("quest")
    pages = model._op_bytes("draft:quest", np.array(ragged), 0.05) / (per * layers) \
        - quest.selected_array(np.array(ragged), 0.05).sum()
    assert pages == pytest.approx(4 * 16384 / quest.page_size)       # not Σ ceil(L_b / 16)
    # Quest's draft (page scoring over the buffer, not a bandwidth-bound read of its rows) and
    # Vegas' are priced on their measured grids, at the longest sequence
    quest_step = model.draft_step(ragged, 0.05, "quest")
    assert quest_step.seconds == pytest.approx(model.draft_step(longest, 0.05, "quest").seconds)
    assert quest_step.seconds * 1e3 == pytest.approx(true_ms("draft", 4, 16384, 1, 0.05))
    assert "measured grid" in quest_step.notes[-1]
    vegas_step = model.draft_step(ragged, 0.05, "vegas")
    assert "measured grid" in vegas_step.notes[-1]
    assert vegas_step.seconds == pytest.approx(model.draft_step(longest, 0.05, "vegas").seconds)
    assert vegas_step.seconds * 1e3 == pytest.approx(true_ms("draft", 4, 16384, 1, 0.05))
    # past the grid's longest context the fit prices it, in each sequence's own bytes
    beyond = model.draft_step([2048, 100000], 0.05, "vegas")
    assert not flagged(beyond) and "measured grid" not in beyond.notes[-1]
    assert beyond.seconds < model.draft_step([100000] * 2, 0.05, "vegas").seconds
    # the selected part is per sequence: a ragged batch reads less than four longest ones
    assert model._op_bytes("draft:vegas", np.array(ragged), 0.05) < model._op_bytes(
        "draft:vegas", np.array(longest), 0.05)


def collector_rows(cal):
    """last-token's verify on its own engine at q = 3, 9, 13 (+0.1, +0.3, +2.0 ms over the
    shared verify); SparseSpec-L's refresh at 3 and 16 ranked rows (3.0, 5.6 ms)."""
    rows = []
    for q, extra in {3: 0.1, 9: 0.3, 13: 2.0}.items():
        rows += at_every_shape(cal, "verify:last-token", q, None,
                               lambda b, c, q=q, e=extra: true_ms("verify", b, c, q) + e)
    for r, t in {3: 3.0, 16: 5.6}.items():
        rows += at_every_shape(cal, "selection:sparsespec", r, 0.05, lambda b, c, t=t: t)
    return rows


def test_all_row_collectors_verify_and_sparsespec_refresh_depend_on_k():
    """last-token's verify measured at three q: the difference over the shared verify is
    linear between them, held beyond; SparseSpec-L's refresh measured at 3 and 16 ranked rows:
    min(k + 1, 16) rows, linear between."""
    cal = synthetic()
    rows = list(cal.measurements) + collector_rows(cal)
    model = CalibratedCostModel(with_rows(cal, collector_rows(cal)), MODEL, HW)
    bare = SYNTHETIC
    ctx = [8192] * 4
    for k, want in ((2, 0.1), (5, 0.2), (10, 0.3 + 1.7 * 2 / 4), (12, 2.0), (15, 2.0), (1, 0.1)):
        got = model.iteration(ctx, k, 0.05, "last-token").verify.seconds
        assert (got - bare.verify(ctx, k + 1).seconds) * 1e3 == pytest.approx(want, abs=0.02), k
    assert model.iteration(ctx, 8, 0.05, "vegas").verify.seconds == \
        pytest.approx(bare.verify(ctx, 9).seconds)
    # a policy that collects nothing measured below the shared verify is priced below it
    below = rows + [Measurement("verify:streamingllm", b, c, q, None,
                                [true_ms("verify", b, c, q) - 0.7] * 3)
                    for b in sorted({m.batch for m in rows})
                    for c in sorted({m.context for m in rows}) for q in (3, 9, 16)]
    lean = CalibratedCostModel(Calibration(cal.provenance, cal.ceilings, below), MODEL, HW)
    for k in (2, 6, 15):
        got = lean.iteration(ctx, k, 0.05, "streamingllm").verify.seconds
        assert (got - bare.verify(ctx, k + 1).seconds) * 1e3 == pytest.approx(-0.7, abs=0.02)
    for k, want in ((2, 3.0), (8, 3.0 + 2.6 * 6 / 13), (15, 5.6), (30, 5.6)):
        got = model.iteration(ctx, k, 0.05, "sparsespec").selection.seconds * 1e3
        assert got == pytest.approx(want, rel=0.03), k


def test_selection_refresh_is_priced_on_its_measured_grid():
    """A refresh's time is not additive in batch and context (ranking rows of a length that
    changes algorithm: here the per-position rate rises 60% past 8K): the model interpolates
    its measured (batch, context) grid instead — exact at the measured points, linear between
    contexts and between batches, linear in s between two measured sparsities, a ragged Vegas
    batch at its longest context, and outside the grid the fitted fallback, said so."""

    def t_ms(b, c, s):
        return 0.02 + b * c * 1e-7 * (1.6 if c > 8192 else 1.0) * (1 + 2 * s)

    base = synthetic()
    rows = [m for m in base.measurements if not m.op.startswith("selection")]
    for s in (0.03, 0.1):
        for b in (1, 4, 16):
            for c in (2048, 4096, 8192, 16384, 32768):
                rows.append(Measurement("selection:vegas", b, c, 1, s, [t_ms(b, c, s)] * 3))
    model = CalibratedCostModel(Calibration(base.provenance, base.ceilings, rows), MODEL, HW)

    def ms(contexts, s=0.03):
        return model.selection(contexts, s, "vegas", 4).seconds * 1e3

    assert ms([16384] * 4) == pytest.approx(t_ms(4, 16384, 0.03), rel=1e-9)
    assert ms([8192] * 16) == pytest.approx(t_ms(16, 8192, 0.03), rel=1e-9)
    assert ms([12288] * 4) == pytest.approx((t_ms(4, 8192, .03) + t_ms(4, 16384, .03)) / 2)
    assert ms([16384] * 10) == pytest.approx(t_ms(4, 16384, .03) + (t_ms(16, 16384, .03)
                                             - t_ms(4, 16384, .03)) * 6 / 12)
    assert ms([16384] * 4, s=0.05) == pytest.approx(
        t_ms(4, 16384, 0.03) + (t_ms(4, 16384, 0.1) - t_ms(4, 16384, 0.03)) * 2 / 7)
    assert ms([2048, 16384, 4096, 16384]) == pytest.approx(ms([16384] * 4))
    assert flagged(model.selection([16384] * 32, 0.03, "vegas", 4))   # batch 32 > 16
    assert not flagged(model.selection([16384] * 4, 0.03, "vegas", 4))


@pytest.mark.parametrize("c2q", ["rows", "sum"])
def test_the_roofline_beneath_prices_vegas_refresh_as_the_file_ran_it(c2q):
    cal = synthetic(engine={"cache_align": 128, "c2q": c2q})
    assert CalibratedCostModel(cal, MODEL, HW).roofline.c2q == c2q == cal.settings.c2q


def test_a_calibration_of_another_model_carries_its_warning():
    cm = CalibratedCostModel(synthetic(model_spec_hash="0000"), MODEL, HW)
    assert cm.warnings and "0000" in cm.warnings[0]
    assert not SYNTHETIC.warnings

