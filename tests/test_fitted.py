"""Terms fitted on other models' calibrations: composition residuals and loop overheads are
recovered from calibrations of known structure, price an unseen model as that structure says,
and never come from the priced model's own calibration."""
import dataclasses

import pytest

from specsim.costs import resolve_cost_source
from specsim.costs.calibration_file import Calibration, Measurement
from specsim.costs.composition import composition_error
from specsim.costs.fitted import FittedTerms, fit_terms, fitted_for
from specsim.costs.operator_file import read_operator_table
from specsim.costs.operators import OperatorCostModel
from specsim.shipped import shipped_path
from specsim.specs import load_hardware, load_model
from calibration_tables import provenance
from test_operators import HW, SMALL, synthetic_table

#: The structure the "measured" steps have over the composed ones.
SCALE = {"plain": 1.10, "draft:vegas": 1.05, "selection:vegas": 1.30}
PER_LAYER_S = {"verify:vegas": 20e-6, "verify:streamingllm": 12e-6}


def plain_us(batch):
    return 30 + 2 * batch


def speculative_us(batch, q):
    return 50 + 3 * batch + 4 * q


def model(name, layers):
    return dataclasses.replace(SMALL, name=name, num_layers=layers,
                               layer_types=("full_attention",) * layers)


def calibrated(spec, table) -> Calibration:
    """A calibration of ``spec`` whose steps are the composed operators with the residuals
    above, and whose loop overheads are the lines above."""
    bare = OperatorCostModel(table, spec, HW)
    rows = []
    for batch in (1, 2):
        for context in (1024, 4096):
            ctx = [context] * batch

            def add(op, seconds, q=1, s=None):
                rows.append(Measurement(op, batch, context, q, s, [seconds * 1e3] * 3))

            add("plain", bare.step("plain", ctx).seconds * SCALE["plain"])
            for q in (3, 5):
                for policy, per_layer in PER_LAYER_S.items():
                    op = "verify" if policy == "verify:vegas" else policy
                    add(op, bare.step(policy, ctx, q).seconds + per_layer * spec.num_layers, q)
                add("overhead:speculative:vegas", speculative_us(batch, q) / 1e6, q)
            add("draft:vegas", bare.step("draft:vegas", ctx, s=0.1).seconds
                * SCALE["draft:vegas"], s=0.1)
            add("selection:vegas", bare.step("selection:vegas", ctx, s=0.1, k=4).seconds
                * SCALE["selection:vegas"], q=5, s=0.1)
            add("overhead:plain", plain_us(batch) / 1e6)
    # timed with the verify writes the engine makes now (what ``bare`` composes)
    return Calibration(provenance(model=spec.name, engine={"cache_align": 128,
                                                           "verify_append": "fused"}), {}, rows)


@pytest.fixture(scope="module")
def fitted():
    table = synthetic_table()
    others = [(m, calibrated(m, table)) for m in (model("a", 2), model("b", 6))]
    return table, fit_terms(table, others, HW)


def test_the_fit_recovers_the_residuals_and_overheads(fitted):
    _, terms = fitted
    assert terms.models == ("a", "b")
    for family, f in SCALE.items():
        assert terms.scale[family] == pytest.approx(f, rel=1e-9)
    for family, b in PER_LAYER_S.items():
        assert terms.per_layer_s[family] == pytest.approx(b, rel=1e-6)
    for batch in (1, 3, 8):
        assert terms.loop_overhead("plain", batch) == pytest.approx(plain_us(batch) / 1e6)
        for q in (2, 9):
            assert terms.loop_overhead("speculative:vegas", batch, q) == pytest.approx(
                speculative_us(batch, q) / 1e6)
    assert terms.loop_overhead("speculative:quest", 1, 3) is None   # nothing to fit it on


def test_an_unseen_model_is_priced_as_the_structure_says(fitted):
    """A model of another depth, fitted on two others only, composes to its own calibration
    (whose steps have the same structure) without error, and its loop carries the overheads."""
    table, terms = fitted
    unseen = model("c", 4)
    cm = OperatorCostModel(table, unseen, HW, fitted=terms)
    report = composition_error(calibrated(unseen, table), cm)
    assert report["all"]["mape"] == pytest.approx(0.0, abs=1e-6)
    bare = composition_error(calibrated(unseen, table), OperatorCostModel(table, unseen, HW))
    assert bare["all"]["mape"] > 0.03
    ctx = [2048, 2048]
    step = cm.step("plain", ctx).seconds
    assert cm.plain_step(ctx).seconds == pytest.approx(step + plain_us(2) / 1e6)
    it = cm.iteration(ctx, 4, 0.1, "vegas")
    assert it.overhead_s == pytest.approx(speculative_us(2, 5) / 1e6)
    assert any("composition residual" in n for n in it.verify.notes)


def test_without_fitted_terms_the_loop_overhead_is_the_hardware_constant():
    cm = OperatorCostModel(synthetic_table(), SMALL, HW)
    assert cm.iteration([1024], 2, 0.1, "vegas").overhead_s == HW.overheads.iteration
    assert cm.plain_step([1024]).seconds == cm.step("plain", [1024]).seconds


def test_a_shipped_model_is_never_fitted_on_its_own_calibration():
    table = read_operator_table(str(shipped_path("models/operators/h200.json")))
    h200 = load_hardware("h200")
    for name in ("qwen3-8b", "smollm2-135m"):
        terms = fitted_for(table, load_model(name), h200)
        assert isinstance(terms, FittedTerms)
        assert name not in terms.models and len(terms.models) == 3
        note = resolve_cost_source(load_model(name), h200, costs="operators").note
        assert terms.source in note and f"calibrations of {name}" not in note
    # a table built in memory (no file to key a cache by) is fitted afresh, to the same terms
    import copy
    unnamed = copy.copy(table)
    unnamed.path = None
    assert fitted_for(unnamed, load_model("qwen3-8b"), h200) == \
        fitted_for(table, load_model("qwen3-8b"), h200)
    # a GPU with no calibration fits nothing, and the note says so
    a100 = load_hardware("a100-80gb")
    assert fitted_for(table, load_model("qwen3-8b"), a100) is None


def test_a_per_layer_residual_weighs_each_point_by_its_measured_time_not_its_miss():
    """A verify point the composition happens to hit (miss ~0) counts as much as any other of
    its time: the fit is Σ w²·L·d / Σ w²·L² with w = 1 / measured, d = measured − composed."""
    import numpy as np

    from specsim.costs.fitted import fit_rows

    rows = [(0.010, 0.010 - 40 * 20e-6, 40), (0.020, 0.020 - 40 * 24e-6, 40),
            (0.005, 0.005 - 1e-12, 30)]   # the last: composed on the spot
    terms = fit_rows([("m", {"verify:vegas": rows}, {})])
    measured, composed, layers = (np.array(c, float) for c in zip(*rows))
    w = 1 / measured
    d = measured - composed
    expected = (w**2 * layers * d).sum() / (w**2 * layers**2).sum()
    assert terms.per_layer_s["verify:vegas"] == pytest.approx(expected, rel=1e-9)
    assert 5e-6 < terms.per_layer_s["verify:vegas"] < 20e-6
