"""Another GPU's operator table scaled to a GPU without one: times follow the ratio of each
operator's floor on the two GPUs above a fixed per-kernel latency, waves are re-filled for the
target's multiprocessors, and every answer says it is scaled and unvalidated."""
import dataclasses
import json

import pytest
from hypothesis import given, strategies as st

from specsim.costs import resolve_cost_source
from specsim.costs.operator_file import read_operator_table
from specsim.costs.scaled import (PRIOR_UNCERTAINTY, kernel_latency_ms, scaled_table,
                                  target_ceilings, wave_fill)
from specsim.errors import SpecsimError
from specsim.shipped import shipped_path
from specsim.specs import load_hardware, load_model
from test_operators import synthetic_table

H200 = load_hardware("h200")


def twin(table, **over):
    """A hardware spec whose measured ceilings are the table's probe, changed by ``over``."""
    fields = dict(measured_bandwidth=table.probe["copy_bandwidth_Bps"],
                  measured_bf16_flops=table.probe["bf16_matmul_flops"], multiprocessors=132)
    return dataclasses.replace(H200, **{**fields, **over})


@pytest.fixture(scope="module")
def table():
    t = synthetic_table()
    t.provenance["multiprocessors"] = 132
    return t


def test_scaling_to_the_same_gpu_changes_nothing(table):
    scaled, notes = scaled_table(table, H200, twin(table))
    for a, b in zip(table.points, scaled.points):
        assert b.samples_ms == pytest.approx(a.samples_ms, rel=1e-12)
    assert f"prior uncertainty +/-{PRIOR_UNCERTAINTY:.0%}" in notes[0]


def test_half_the_bandwidth_doubles_memory_time_above_the_kernel_latency(table):
    slow = twin(table, measured_bandwidth=table.probe["copy_bandwidth_Bps"] / 2)
    scaled, _ = scaled_table(table, H200, slow)
    latency = kernel_latency_ms(table)
    assert latency > 0
    for a, b in zip(table.points, scaled.points):
        t, t2 = a.samples_ms[0], b.samples_ms[0]
        if a.op in ("elementwise", "kv_append", "selection"):
            fixed = min(latency, min(a.samples_ms))
            assert t2 == pytest.approx(fixed + 2 * (t - fixed))
        elif a.op == "graph":                       # host time: unscaled
            assert t2 == t
        elif a.op == "gemm":                        # between unchanged (compute) and doubled
            assert t <= t2 * (1 + 1e-12) and t2 <= 2 * t
        else:
            assert t2 > t
    assert scaled.probe["copy_bandwidth_Bps"] == slow.measured_bandwidth


def test_fewer_multiprocessors_change_only_attention_by_their_wave_fill(table):
    fewer = twin(table, multiprocessors=100)
    scaled, _ = scaled_table(table, H200, fewer)
    for a, b in zip(table.points, scaled.points):
        if a.op in ("verify", "sparse"):
            keys = a.at.get("context") or a.at.get("selected")
            p = int(a.at["batch_kv_heads"])
            ratio = wave_fill(p, 132, keys) / wave_fill(p, 100, keys)
            fixed = min(kernel_latency_ms(table), min(a.samples_ms))
            assert b.samples_ms[0] == pytest.approx(fixed + (a.samples_ms[0] - fixed) * ratio)
        else:
            assert b.samples_ms == pytest.approx(a.samples_ms)


@given(st.integers(1, 5000), st.integers(1, 200), st.integers(1, 2**20))
def test_wave_fill_is_a_fraction_at_least_that_of_one_chunk(programs, sms, keys):
    fill = wave_fill(programs, sms, keys)
    one_chunk = programs / (-(-programs // sms) * sms)
    assert one_chunk - 1e-12 <= fill <= 1.0
    if programs % sms == 0:
        assert fill == 1.0


def test_a_datasheet_only_target_gets_the_sources_achieved_fraction():
    table = read_operator_table(str(shipped_path("models/operators/h200.json")))
    a100 = load_hardware("a100-80gb")
    bw, mm, how = target_ceilings(H200, table.probe, a100)
    assert bw / a100.memory_bandwidth == pytest.approx(
        table.probe["copy_bandwidth_Bps"] / H200.memory_bandwidth)
    assert mm / a100.bf16_flops == pytest.approx(
        table.probe["bf16_matmul_flops"] / H200.bf16_flops)
    assert "datasheet" in how


def test_a_gpu_without_a_table_is_priced_from_the_h200s_scaled_and_says_so():
    model, a100 = load_model("llama-3.2-3b"), load_hardware("a100-80gb")
    got = resolve_cost_source(model, a100)
    assert got.kind == "scaled-operators" and got.note.startswith("SCALED")
    assert "no operator measured on this GPU" in got.note and "prior uncertainty" in got.note
    assert resolve_cost_source(model, a100, costs="operators").kind == "scaled-operators"
    assert resolve_cost_source(model, H200).kind == "operators"
    # slower memory, slower steps than the H200's, but never below the A100's own floor
    here = resolve_cost_source(model, H200).cost_model.plain_step([32768] * 4).seconds
    there = got.cost_model.plain_step([32768] * 4)
    roof = resolve_cost_source(model, a100, costs="roofline").cost_model.plain_step(
        [32768] * 4)
    assert there.seconds > here and there.seconds > roof.seconds
    assert any("scaled to a100-80gb" in n for n in there.notes)


def test_a_bad_multiprocessor_count_is_refused_in_one_line(tmp_path):
    doc = json.loads(shipped_path("models/hardware/a40.json").read_text())
    for bad in (0, -3, 2.5, True, "84", 10**6):
        doc["multiprocessors"] = bad
        path = tmp_path / "gpu.json"
        path.write_text(json.dumps(doc, indent=1))
        with pytest.raises(SpecsimError, match="multiprocessors.*integer") as err:
            load_hardware(str(path))
        assert "\n" not in str(err.value)
