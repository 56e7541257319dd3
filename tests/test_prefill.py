"""Prefill priced as the engine and the chunked schedulers run it: the query-key products of
the engine's causal, sink and window paths (counted against its own SDPA calls, and each path
against the definition), chunks that sum to their whole prompt, the operator model's
composition from measured or unmeasured attention, and chunked prefill in the simulator (first
tokens when a prompt's last chunk ends)."""
import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.costs.operator_file import Point, read_operator_table
from specsim.costs.operators import OperatorCostModel
from specsim.costs.prefill import attention_elements, chunks, ideal_elements, sink_fold_bytes
from specsim.costs.roofline import RooflineCostModel
from specsim.errors import SpecsimError
from specsim.shipped import shipped_root
from specsim.specs import load_hardware, load_model
from test_operators import HW, SMALL, synthetic_table


def brute_causal(new, past, window):
    return sum(min(p, window) if window else p for p in range(past + 1, past + new + 1))


@settings(max_examples=80, deadline=None)
@given(new=st.integers(1, 300), past=st.integers(0, 300),
       window=st.one_of(st.none(), st.integers(1, 200)), sinks=st.booleans())
def test_products_are_each_rows_visible_keys_or_the_window_paths_chunks(new, past, window,
                                                                        sinks):
    assert ideal_elements(new, past, window) == brute_causal(new, past, window)
    got = attention_elements(new, past, window, sinks)
    if window is None or past + new <= window:  # the causal kernel (a sink is folded after it)
        assert got == brute_causal(new, past, None)
    else:                       # chunks of R = max(W, 16) rows, each over R + W − 1 keys
        rows = max(16, window)
        assert got == math.ceil(new / rows) * rows * (rows + window - 1 + sinks)
        assert got >= ideal_elements(new, past, window)


@settings(max_examples=40, deadline=None)
@given(parts=st.lists(st.integers(1, 200), min_size=1, max_size=5),
       window=st.one_of(st.none(), st.integers(1, 100)), sinks=st.booleans())
def test_chunks_sum_to_their_whole_prompt(parts, window, sinks):
    past = np.concatenate([[0], np.cumsum(parts)[:-1]])
    assert sum(ideal_elements(n, p, window) for n, p in zip(parts, past)) == \
        ideal_elements(sum(parts), 0, window)
    assert sum(attention_elements(n, p, None, sinks) for n, p in zip(parts, past)) == \
        attention_elements(sum(parts), 0, None, sinks)


def definition(q, k, v, window, sinks):
    """Prefill attention by its definition: row p attends keys p − W < n ≤ p, a sink per head
    only in the denominator (fp32)."""
    t, heads, dim = q.shape[1:]
    keys = k[0].repeat_interleave(heads // k.shape[2], 1).float()
    values = v[0].repeat_interleave(heads // k.shape[2], 1).float()
    s = torch.einsum("thd,nhd->htn", q[0].float(), keys) / math.sqrt(dim)
    p, n = torch.arange(t)[:, None], torch.arange(t)[None, :]
    s = s.masked_fill(~((n <= p) & ((n > p - window) if window else True)), float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float()[:, None, None].expand(heads, t, 1)], -1)
    weights = torch.softmax(s, -1)[..., :t]
    return torch.einsum("htn,nhd->thd", weights, values)[None]


@pytest.mark.parametrize("t, window, sinks, block", [
    (37, None, True, None), (37, 7, False, None), (37, 7, True, None), (5, 7, True, None),
    (64, 16, True, 1), (100, 3, False, 3), (1, 7, True, None), (53, 20, True, 2),
    (20, 40, True, None), (20, 20, False, None)])
def test_each_path_is_its_definition_and_computes_what_the_cost_models_count(
        monkeypatch, t, window, sinks, block):
    """The engine's prefill paths against the definition (a window path cut into blocks of
    ``block`` chunks too), and every query-key product of their kernels counted (a causal
    call's rows read their keys up to the diagonal, aligned lower-right where it has more
    keys than rows; the sink path's causal kernel with its log-sum-exp) equals
    attention_elements."""
    from specsim.engine import attention      # first: it sets up Triton for this machine
    from torch.nn.attention.bias import CausalBias  # noqa: E402 (imports Triton)
    heads, dim = 4, 16
    if block:
        width = 24 if sinks else dim
        monkeypatch.setattr(attention, "WINDOW_BLOCK_ELEMENTS",
                            block * heads * (max(16, window) + window) * width)
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counting(q, k, v, attn_mask=None, is_causal=False, **kw):
        rows, keys = q.shape[-2], k.shape[-2]
        if is_causal or isinstance(attn_mask, CausalBias):   # row i reads i + 1 + keys − rows
            seen.append(q.shape[0] * (rows * (rows + 1) // 2 + rows * (keys - rows)))
        else:
            seen.append(q.shape[0] * rows * keys)
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    class Counted:          # the engine's F with SDPA counted (CausalBias dispatches on the
        scaled_dot_product_attention = staticmethod(counting)   # real function, left as is)

        def __getattr__(self, name):
            return getattr(torch.nn.functional, name)

    monkeypatch.setattr(attention, "F", Counted())
    real_lse = attention.causal_with_lse

    def counting_lse(q, k, v):
        rows = q.shape[-2]
        seen.append(q.shape[0] * rows * (rows + 1) // 2)
        return real_lse(q, k, v)

    monkeypatch.setattr(attention, "causal_with_lse", counting_lse)
    gen = torch.Generator().manual_seed(t)
    q = torch.randn(1, t, heads, dim, generator=gen)
    k = torch.randn(1, t, 2, dim, generator=gen)
    v = torch.randn(1, t, 2, dim, generator=gen)
    sink = torch.randn(heads, generator=gen) if sinks else None
    got = attention.prefill_attention(q, k, v, window=window, sinks=sink)
    torch.testing.assert_close(got, definition(q, k, v, window, sink), rtol=1e-5, atol=1e-5)
    assert sum(seen) == attention_elements(t, 0, window, sinks)
    if block:
        assert len(seen) == math.ceil(math.ceil(t / max(16, window)) / block)
    if window and window >= t:          # a window no shorter than the prompt: one causal call
        assert len(seen) == 1


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


#: The synthetic table's prefill attention per path: time per product, relative to causal.
PATH_RATE = {"causal": 1.0, "sinks": 1.25, "window": 3.0}


def moe_free_table(with_attention: bool, paths=PATH_RATE):
    table = synthetic_table()
    if with_attention:
        for path in paths:
            for group in (2, 8):
                for elements, ms in ((1e6, 0.01), (1e9, 2.0)):
                    table.points.append(Point(
                        "prefill_attention", {"head_dim": SMALL.head_dim, "group": group,
                                              "path": path},
                        {"elements": elements}, [ms * PATH_RATE[path]] * 3))
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


def attention_of(model, table, prompt=2000):
    parts, notes = OperatorCostModel(table, model, HW).prefill_parts(np.array([prompt]),
                                                                     np.array([0]))
    return parts["attention"], notes


def test_each_layer_prices_its_prefill_on_its_own_path():
    """Full layers of a sink model on the causal kernel and the sink's fold (an element-wise
    pass over the output), window layers on the window kernel at the products their chunks
    compute; a kernel the table lacks priced as the causal one, said. A table's points of the
    sink path as it once ran (its own kernel) are not read."""
    sinky = dataclasses.replace(SMALL, name="sinky", attention_sinks=True)
    windowed = dataclasses.replace(sinky, name="windowed", sliding_window=64,
                                   layer_types=("sliding_attention", "full_attention"))
    table = moe_free_table(True)
    plain, _ = attention_of(SMALL, table)
    sunk, _ = attention_of(sinky, table)
    heads = SMALL.num_heads

    def per_layer(elements, path):
        return 1e-3 * PATH_RATE[path] * (0.01 + (elements - 1e6) / (1e9 - 1e6) * 1.99)

    assert plain == pytest.approx(2 * per_layer(heads * attention_elements(2000), "causal"))
    priced = OperatorCostModel(table, sinky, HW)
    fold = priced._elementwise(sink_fold_bytes(2000, heads, SMALL.head_dim, SMALL.dtype_bytes))[0]
    assert sunk == pytest.approx(2 * per_layer(heads * attention_elements(2000), "causal"))
    parts, _ = priced.prefill_parts(np.array([2000]), np.array([0]))
    assert parts["sink fold"] == pytest.approx(2 * fold) and fold > 0
    assert "sink fold" not in OperatorCostModel(table, SMALL, HW).prefill_parts(
        np.array([2000]), np.array([0]))[0]
    both, _ = attention_of(windowed, table)
    assert both == pytest.approx(
        per_layer(heads * attention_elements(2000), "causal")
        + per_layer(heads * attention_elements(2000, 0, 64, True), "window"))
    lacking, notes = attention_of(windowed, moe_free_table(True, paths=("causal",)))
    assert lacking == pytest.approx(
        per_layer(heads * attention_elements(2000), "causal")
        + per_layer(heads * attention_elements(2000, 0, 64, True), "causal"))
    assert any("path=window not measured: priced as the causal kernel" in n for n in notes)


def test_a_table_of_the_earlier_masked_path_keeps_its_causal_points_only(tmp_path):
    """A table measured when sink and window layers ran one masked path: its causal points
    read as the causal path's, its masked ones not at all, and a sink model says so."""
    doc = json.loads((shipped_root("models") / "operators" / "h200.json").read_text())
    doc["points"] = [p for p in doc["points"] if p["op"] != "prefill_attention"]
    for masked in (False, True):
        doc["points"].append({"op": "prefill_attention",
                              "key": {"head_dim": 64, "group": 8, "masked": masked},
                              "at": {"elements": 1e6}, "samples_ms": [0.5]})
    # the sink path's own kernel, which a full sink layer no longer runs: dropped, unsaid
    doc["points"].append({"op": "prefill_attention",
                          "key": {"head_dim": 64, "group": 8, "path": "sinks"},
                          "at": {"elements": 1e6}, "samples_ms": [0.9]})
    path = tmp_path / "older.json"
    path.write_text(json.dumps(doc))
    table = read_operator_table(str(path))
    prefill_points = [p for p in table.points if p.op == "prefill_attention"]
    assert [p.key for p in prefill_points] == [{"head_dim": 64, "group": 8, "path": "causal"}]
    assert table.retired_prefill_points == 1
    priced = OperatorCostModel(table, load_model("gpt-oss-20b"), HW)
    assert any("timed the engine's earlier masked path" in w for w in priced.warnings)
    for name in ("qwen3-8b", "qwen2.5-7b"):     # Qwen2.5 names a window none of its layers use
        assert not any("masked path" in w
                       for w in OperatorCostModel(table, load_model(name), HW).warnings), name


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
