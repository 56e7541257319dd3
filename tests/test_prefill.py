"""Prefill priced as the engine and the chunked schedulers run it: the query-key products of
the causal and masked paths (counted against the engine's own SDPA calls), chunks that sum to
their whole prompt, the operator model's composition from measured or unmeasured attention,
and chunked prefill in the simulator (first tokens when a prompt's last chunk ends)."""
import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specsim.costs.prefill as prefill
from specsim.costs.operator_file import Point
from specsim.costs.operators import OperatorCostModel
from specsim.costs.prefill import attention_elements, chunks
from specsim.costs.roofline import RooflineCostModel
from specsim.errors import SpecsimError
from specsim.specs import load_hardware, load_model
from test_operators import HW, SMALL, synthetic_table


def brute_causal(new, past, window):
    return sum(min(p, window) if window else p for p in range(past + 1, past + new + 1))


@settings(max_examples=80, deadline=None)
@given(new=st.integers(1, 300), past=st.integers(0, 300),
       window=st.one_of(st.none(), st.integers(1, 200)))
def test_causal_products_are_each_rows_visible_keys(new, past, window):
    assert attention_elements(new, past, window) == brute_causal(new, past, window)


@settings(max_examples=40, deadline=None)
@given(parts=st.lists(st.integers(1, 200), min_size=1, max_size=5),
       window=st.one_of(st.none(), st.integers(1, 100)))
def test_chunks_sum_to_their_whole_prompt(parts, window):
    past = np.concatenate([[0], np.cumsum(parts)[:-1]])
    assert sum(attention_elements(n, p, window) for n, p in zip(parts, past)) == \
        attention_elements(sum(parts), 0, window)


@pytest.mark.parametrize("window, sinks, chunk", [(None, True, 1 << 24), (None, True, 300),
                                                  (7, False, 150), (7, True, 1 << 24)])
def test_masked_products_are_what_the_engines_sdpa_calls_compute(monkeypatch, window, sinks,
                                                                 chunk):
    """Every (query row × key) element of the engine's masked prefill SDPA calls, counted,
    is attention_elements(masked=True) (a sink is one more key a row)."""
    from specsim.engine import attention

    monkeypatch.setattr(prefill, "PREFILL_CHUNK_ELEMENTS", chunk)
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counting(q, k, v, **kw):
        seen.append(q.shape[-2] * k.shape[-2])
        return real(q, k, v, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", counting)
    t, heads, groups, dim = 37, 4, 2, 16
    q = torch.randn(1, t, heads, dim)
    k, v = torch.randn(1, t, groups, dim), torch.randn(1, t, groups, dim)
    attention.prefill_attention(q, k, v, window=window,
                                sinks=torch.zeros(heads) if sinks else None)
    assert sum(seen) == attention_elements(t, 0, window, masked=True, sinks=sinks)


def test_prefill_lengths_are_checked():
    with pytest.raises(ValueError, match="≥ 1"):
        chunks([0])
    with pytest.raises(ValueError, match="one cached length"):
        chunks([4, 4], [1])
    new, past = chunks([3, 5])
    assert past.tolist() == [0, 0]


@pytest.mark.parametrize("name", ["qwen3-8b", "gpt-oss-20b"])
def test_roofline_chunks_add_up_to_the_whole_prompts_flops(name):
    rf = RooflineCostModel(load_model(name), load_hardware("h200"))
    whole = rf.prefill([3000])
    parts = rf.prefill([1000, 1000, 1000], [0, 1000, 2000])
    assert parts.flops == pytest.approx(whole.flops)
    # a chunk after cached positions reads their KV
    assert rf.prefill([1000], [2000]).kv_bytes > rf.prefill([1000]).kv_bytes


def moe_free_table(with_attention: bool):
    table = synthetic_table()
    if with_attention:
        for masked in (False, True):
            for group in (2, 8):
                for elements, ms in ((1e6, 0.01), (1e9, 2.0)):
                    table.points.append(Point(
                        "prefill_attention", {"head_dim": SMALL.head_dim, "group": group,
                                              "masked": masked},
                        {"elements": elements}, [ms * (2 if masked else 1)] * 3))
    return table


def test_operator_prefill_attention_is_measured_or_its_flops_with_a_note():
    measured = OperatorCostModel(moe_free_table(True), SMALL, HW)
    parts, notes = measured.prefill_parts(np.array([2000]), np.array([0]))
    elements = SMALL.num_heads * attention_elements(2000)
    w_el = (elements - 1e6) / (1e9 - 1e6)
    w_g = (SMALL.group_size - 2) / (8 - 2)
    per_layer = 1e-3 * (0.01 + w_el * (2.0 - 0.01))       # the same at both groups
    assert 0 <= w_g <= 1
    assert parts["attention"] == pytest.approx(per_layer * SMALL.num_layers)
    bare = OperatorCostModel(moe_free_table(False), SMALL, HW)
    parts, notes = bare.prefill_parts(np.array([2000]), np.array([0]))
    assert parts["attention"] == pytest.approx(
        4 * SMALL.head_dim * elements / bare.matmul_rate * SMALL.num_layers)
    assert any("prefill_attention" in n and "FLOPs" in n for n in notes)
    # the layers' GEMMs run at every new token, the LM head at one row per sequence
    cost = measured.prefill([2000, 500], [0, 100])
    assert cost.seconds > measured.prefill([2000]).seconds


def test_a_sink_model_prices_its_prefill_on_the_masked_path():
    sinks = dataclasses.replace(SMALL, name="sinky", attention_sinks=True)
    plain = OperatorCostModel(moe_free_table(True), SMALL, HW).prefill_parts(
        np.array([2000]), np.array([0]))[0]["attention"]
    masked = OperatorCostModel(moe_free_table(True), sinks, HW).prefill_parts(
        np.array([2000]), np.array([0]))[0]["attention"]
    assert masked > plain


# ---- chunked prefill in the simulator --------------------------------------------------------
class _Costs:
    """A cost model whose prefill is exactly its query-key products and tokens (to read the
    simulator's chunk plan from the time it spent)."""

    name = "test"

    def __init__(self):
        self.calls = []
        self.model = None

    def prefill(self, new, past=None):
        from specsim.costs.base import Cost
        new, past = chunks(new, past)
        self.calls.append((new.tolist(), past.tolist()))
        return Cost(1e-3 * float(new.sum()), 0, 0, 0, 0, 0, 0, "compute")

    def plain_step(self, contexts):
        from specsim.costs.base import Cost
        return Cost(0.01, 0, 0, 0, 0, 0, 0, "memory")


def simulate(arrivals, chunk, max_batch=4):
    from specsim.simulator.arrivals import Arrival
    from specsim.simulator.engine import SimConfig, Simulation

    costs = _Costs()
    model = load_model("qwen3-8b")
    cfg = SimConfig("full", 1.0, k=1, k_policy="plain", max_batch=max_batch,
                    prefill_chunk=chunk)
    arr = [Arrival(str(i), t, p, o) for i, (t, p, o) in enumerate(arrivals)]
    result = Simulation(arr, costs, model, _NoSource(), cfg, 141e9).run()
    return result, costs


class _NoSource:
    kind = "none"
    by_tokens = True

    def start(self, request_id, prompt_id=None):
        return 0


def test_one_prompt_is_prefilled_chunk_by_chunk_then_decodes():
    result, costs = simulate([(0.0, 2500, 3)], chunk=1000)
    assert costs.calls == [([1000], [0]), ([1000], [1000]), ([500], [2000])]
    req = result.requests
    assert req["first_token"][0] == pytest.approx(2.5)          # 2,500 tokens at 1 ms
    assert req["finish"][0] == pytest.approx(2.5 + 2 * 0.01)    # two more plain steps


def test_a_later_prompt_prefills_beside_the_running_decode():
    result, costs = simulate([(0.0, 100, 50), (0.2, 1500, 2)], chunk=1000)
    req = result.requests
    # the second prompt's chunks ride along the first one's plain steps (0.01 s each)
    assert ([1000], [0]) in costs.calls and ([500], [1000]) in costs.calls
    first = req["first_token"][1]
    assert first - 0.2 == pytest.approx(1.5 + 2 * 0.01, abs=0.011)
    assert req["finish"][0] > first    # the first request kept decoding meanwhile
    whole, _ = simulate([(0.0, 100, 50), (0.2, 1500, 2)], chunk=None)
    assert whole.requests["first_token"][1] - 0.2 == pytest.approx(1.5, abs=0.011)


def test_a_bad_chunk_is_refused():
    from specsim.simulator.engine import SimConfig
    with pytest.raises(SpecsimError, match="≥ 1 token"):
        SimConfig("full", 1.0, prefill_chunk=0)
    with pytest.raises(SpecsimError, match="continuous batch"):
        SimConfig("full", 1.0, prefill_chunk=512, static_batch=True)


# ---- measured prefills in a calibration -------------------------------------------------------
def prefill_ms(length, a=2.0, b=0.004, c=3e-8):
    return a + b * length + c * length * (length + 1) / 2


def with_prefills(lengths=(1024, 4096, 16384, 65536)):
    from calibration_tables import synthetic, with_rows
    from specsim.costs.calibration_file import Measurement
    return with_rows(synthetic(contexts=(1024, 4096, 16384), batches=(1, 4)),
                     [Measurement("prefill", 1, L, 1, None, [prefill_ms(L)] * 3)
                      for L in lengths])


def test_a_calibration_prices_prefill_from_its_own_measured_prefills():
    """``a + b·L + c·E(L)`` fitted on the measured lengths prices any prompt, and a chunk
    after cached positions as ``a + b·n + c·E(n, p)``; without measured prefills the GPU's
    operator table (or the roofline) prices it, and the note says which."""
    from calibration_tables import HW, MODEL, synthetic
    from specsim.costs.calibrated import CalibratedCostModel

    cm = CalibratedCostModel(with_prefills(), MODEL, HW)
    for length in (2000, 30000, 100000):
        cost = cm.prefill([length])
        assert cost.seconds == pytest.approx(prefill_ms(length) / 1e3, rel=1e-6)
        assert "measured prefills" in cost.notes[-1]
    assert "extrapolated" in cm.prefill([100000]).notes[-1]
    chunk = cm.prefill([1000], [3000]).seconds
    assert chunk == pytest.approx((2.0 + 0.004 * 1000 + 3e-8 * attention_elements(1000, 3000))
                                  / 1e3, rel=1e-6)
    two = cm.prefill([2000, 3000]).seconds
    assert two == pytest.approx((prefill_ms(2000) + prefill_ms(3000)) / 1e3, rel=1e-6)
    bare = CalibratedCostModel(synthetic(contexts=(1024, 4096), batches=(1,)), MODEL, HW)
    assert "roofline" in bare.prefill([2000]).notes[-1]


def test_measured_prefills_are_checked_held_out_and_composed():
    from calibration_tables import HW, MODEL
    from specsim.costs.calibration_file import Measurement
    from specsim.costs.composition import composed_step
    from specsim.costs.held_out import held_out_check

    cal = with_prefills((1024, 2048, 4096, 8192, 16384, 32768, 65536))
    report = held_out_check(cal, MODEL, HW)
    assert "prefill" in report["per_op"]
    assert report["per_op"]["prefill"]["mape"] < 1e-6      # the structure is the fit's
    ops = OperatorCostModel(moe_free_table(True), SMALL, HW)
    assert composed_step(ops, "prefill", 1, 3000) == pytest.approx(ops.prefill([3000]).seconds)
    from specsim.costs.calibration_file import _measurement
    row = {"op": "prefill", "batch": 1, "context": 10, "samples_ms": [1.0]}
    assert _measurement("f.json", "row 1", row) == Measurement("prefill", 1, 10, 1, None, [1.0])
    with pytest.raises(SpecsimError, match="unknown op"):
        _measurement("f.json", "row 1", dict(row, op="prefill:vegas"))
