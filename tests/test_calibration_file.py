"""The calibration file: round trips, one-line errors for any bad input, the engine settings
and provenance it records, and the shipped files."""
import dataclasses
import json

import pytest
from hypothesis import example, given, HealthCheck, settings
from hypothesis import strategies as st

from calibration_tables import MODEL, synthetic
from specsim.costs.calibration_file import (FORMAT_KEY, PROVENANCE_FIELDS, Calibration,
                                            Measurement, collect_provenance, read_calibration)
from specsim.costs.provenance import (current_choices, engine_choices, engine_summary,
                                      provenance_warnings)
from specsim.errors import SpecsimError
from specsim.settings import LEGACY_DEFAULTS, EngineSettings
from specsim.shipped import shipped_path
from specsim.specs import load_model

SHIPPED = ("llama-3.1-8b", "qwen3-4b", "qwen3-8b", "smollm2-135m")


def refused(path, match=None) -> str:
    """read_calibration(path) raises a one-line SpecsimError naming the file; its message."""
    with pytest.raises(SpecsimError) as info:
        read_calibration(str(path))
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    if match:
        assert match in message, message
    return message


measurements = st.builds(
    Measurement,
    op=st.sampled_from(["plain", "verify", "verify:quest", "draft:vegas", "selection:quest",
                        "overhead:plain", "overhead:speculative:vegas"]),
    batch=st.integers(1, 512), context=st.integers(1, 1 << 20), q=st.integers(1, 16),
    s=st.floats(0.001, 1.0),
    samples_ms=st.lists(st.floats(1e-3, 1e4), min_size=1, max_size=5))


@given(st.lists(measurements, min_size=1, max_size=20))
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_written_file_reads_back_the_same(tmp_path, rows):
    path = tmp_path / "cal.json"
    Calibration(synthetic().provenance, {"copy_bandwidth": 1.0}, rows).write(str(path))
    back = read_calibration(str(path))
    assert [(m.op, m.batch, m.context, m.q, m.s) for m in back.measurements] == \
        [(m.op, m.batch, m.context, m.q, m.s) for m in rows]
    for a, b in zip(back.measurements, rows):
        assert a.samples_ms == pytest.approx(b.samples_ms, abs=1e-6)
    assert back.path == str(path) and back.provenance == synthetic().provenance
    row = json.loads(path.read_text())["measurements"][0]
    assert row["p10_ms"] <= row["median_ms"] <= row["p90_ms"]


MUTATIONS = {
    "not this format": (lambda d: d.update(specsim_calibration=7), "expected"),
    "no provenance": (lambda d: d.pop("provenance"), "provenance"),
    "a provenance field missing": (lambda d: d["provenance"].pop("triton"), "triton"),
    "a provenance field of another type": (lambda d: d["provenance"].update(date=5), "date"),
    "engine not an object": (lambda d: d["provenance"].update(engine=[1]), "engine"),
    "an unknown engine setting": (
        lambda d: d["provenance"].update(engine={"settings": {"warp_speed": True}}),
        "warp_speed"),
    "an engine setting out of range": (
        lambda d: d["provenance"].update(engine={"c2q": "diagonal"}), "c2q"),
    "ceilings not an object": (lambda d: d.update(ceilings=[]), "ceilings"),
    "no measurements": (lambda d: d.update(measurements=[]), "measurements"),
    "a row not an object": (lambda d: d["measurements"].append(3), "measurements[" ),
    "a negative sample": (lambda d: d["measurements"][0].update(samples_ms=[-1.0]), "positive"),
    "no samples": (lambda d: d["measurements"][0].update(samples_ms=[]), "samples"),
    "a sample of 1e300 ms": (lambda d: d["measurements"][0].update(samples_ms=[1e300]),
                             "at most 60000"),
    "samples not a list": (lambda d: d["measurements"][0].update(samples_ms="1"), "samples"),
    "an unknown op": (lambda d: d["measurements"][0].update(op="decode"), "decode"),
    "an unknown overhead": (lambda d: d["measurements"][0].update(op="overhead:draft"),
                            "overhead:draft"),
    "a draft without a policy": (lambda d: d["measurements"][0].update(op="draft"), "policy"),
    "an unknown policy": (lambda d: d["measurements"][0].update(op="verify:nonsense"),
                          "nonsense"),
    "a per-policy overhead of an unknown policy": (
        lambda d: d["measurements"][0].update(op="overhead:speculative:nonsense"), "nonsense"),
    "a sparsity out of range": (
        lambda d: d["measurements"][0].update(op="draft:vegas", s=1.5), "sparsity"),
    "a fractional batch": (lambda d: d["measurements"][0].update(batch=2.5), "batch"),
    "a batch of zero": (lambda d: d["measurements"][0].update(batch=0), "batch"),
    "a batch as text": (lambda d: d["measurements"][0].update(batch="4"), "batch"),
    "a batch past int32": (lambda d: d["measurements"][0].update(batch=2**31), "batch"),
    "a q of null": (lambda d: d["measurements"][0].update(q=None), "q"),
    "an infinite context": (lambda d: d["measurements"][0].update(context=float("inf")),
                            "context"),
    "a sparsity as text": (lambda d: d["measurements"][0].update(s="x"), "measurements[0]"),
}


@pytest.mark.parametrize("what", MUTATIONS)
def test_a_bad_file_is_refused_in_one_line_naming_what(tmp_path, what):
    mutate, names = MUTATIONS[what]
    doc = synthetic().to_json()
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    refused(path, names)


def test_a_truncated_missing_or_binary_file_is_refused(tmp_path):
    text = json.dumps(synthetic().to_json())
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    refused(tmp_path / "cut.json", "truncated")
    refused(tmp_path / "none.json", "no such")
    (tmp_path / "bytes.json").write_bytes(b"\xff\xfe\x00garbage")
    refused(tmp_path / "bytes.json")
    refused(tmp_path)                                        # a folder
    (tmp_path / "long.json").write_text("1" * 5000)          # past Python's integer digits
    refused(tmp_path / "long.json")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=10)


@given(st.sampled_from(["doc", "provenance", "engine", "row", "op", "batch", "context", "q",
                        "s", "samples_ms", "sample"]), json_values)
@example("batch", float("inf"))
@example("context", float("nan"))
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_value_anywhere_reads_or_is_refused_in_one_line(tmp_path, where, value):
    """Whatever JSON value stands in any field, reading gives a calibration or a one-line
    SpecsimError naming the file; never another exception."""
    doc = synthetic(contexts=(1024, 4096), batches=(1, 2), qs=(1,)).to_json()
    row = doc["measurements"][0]
    if where == "doc":
        doc = value
    elif where == "provenance":
        doc["provenance"] = value
    elif where == "engine":
        doc["provenance"]["engine"] = value
    elif where == "row":
        doc["measurements"][0] = value
    elif where == "sample":
        row["samples_ms"][0] = value
    else:
        row[where] = value
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(doc))
    try:
        cal = read_calibration(str(path))
    except SpecsimError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
    else:
        assert cal.measurements and all(
            isinstance(m.op, str) and all(isinstance(x, int) and x >= 1
                                          for x in (m.batch, m.context, m.q))
            and all(isinstance(x, float) for x in m.samples_ms) for m in cal.measurements)


@given(st.binary(max_size=200))
@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_bytes_read_or_are_refused_in_one_line(tmp_path, data):
    path = tmp_path / "bytes.json"
    path.write_bytes(data)
    refused(path)


def test_engine_settings_are_read_from_either_record():
    """A file names its engine settings as one object (``settings``) or key by key; a key it
    lacks ran as runs did before the key was recorded."""
    chosen = EngineSettings().replace(c2q="rows", ranking="topk")
    whole = synthetic(engine={"cache_align": 128, "settings": chosen.to_json()})
    flat = synthetic(engine={"cache_align": 128, **chosen.to_json()})
    assert whole.settings == flat.settings == chosen
    assert synthetic(engine={}).settings == EngineSettings.from_provenance({})
    assert synthetic(engine={"c2q": "sum"}).settings.c2q == "sum"
    assert synthetic(engine={}).settings.c2q == "rows"


def test_collected_provenance_makes_a_valid_file(tmp_path):
    prov = collect_provenance(MODEL, "kernels-hash")
    assert set(PROVENANCE_FIELDS) <= set(prov)
    assert prov["model_spec_hash"] == MODEL.spec_hash() and prov["model"] == MODEL.name
    path = tmp_path / "cal.json"
    Calibration(prov, {}, synthetic().measurements).write(str(path))
    assert read_calibration(str(path)).provenance == prov


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_calibrations_time_the_engine_as_it_runs(name):
    """Every shipped file reads and was timed with every engine choice as the
    engine makes it now: changing a default without re-measuring them would price every
    prediction on a path the engine no longer runs."""
    cal = read_calibration(str(shipped_path(f"models/calibrations/h200/{name}.json")))
    assert cal.provenance["model"] == name
    assert engine_choices(cal) == current_choices()
    assert not provenance_warnings(cal, load_model(name))


def alternatives(name: str, now) -> list:
    """The values of choice ``name`` other than ``now``: a setting's other choices, or how
    older runs ran a retired one."""
    field = {f.name: f for f in dataclasses.fields(EngineSettings)}.get(name)
    values = field.metadata["choices"] if field else (LEGACY_DEFAULTS[name],)
    return [v for v in values if v != now]


@pytest.mark.parametrize("name", sorted(n for n, v in current_choices().items()
                                         if alternatives(n, v)))
def test_the_engine_summary_tells_every_choice_apart(name):
    """Two files whose engines differ in one choice are summarised differently, and each
    summary reads the file's own choice."""
    now = current_choices()
    base = synthetic(engine={"cache_align": 128, **now})
    assert engine_choices(base) == now
    for value in alternatives(name, now[name]):
        other = synthetic(engine={"cache_align": 128, **now, name: value})
        assert engine_choices(other) == {**now, name: value}
        assert engine_summary(other) != engine_summary(base), (name, value)


def test_warnings_flag_a_calibration_used_away_from_its_measurement():
    assert not provenance_warnings(synthetic(), MODEL)
    other = synthetic(model_spec_hash="0000")
    (warning,) = provenance_warnings(other, MODEL)
    assert "0000" in warning and MODEL.spec_hash() in warning
    unpadded = synthetic()
    del unpadded.provenance["engine"]
    (warning,) = provenance_warnings(unpadded, MODEL)
    assert "calibrate --gpu" in warning                  # says how to re-measure


def test_format_key_marks_the_file():
    assert synthetic().to_json()[FORMAT_KEY] == 1
