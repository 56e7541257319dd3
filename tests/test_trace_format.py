"""specsim trace format v1: round trip, every validation error (file, line, field), atomic write."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.errors import TraceError
from specsim.traces.format import (HistogramTrace, RaggedRows, RequestTrace, Trace, make_header,
                                   read_trace, write_trace)

HEADER = {"specsim_trace": 1, "model": "smollm2-135m", "source": "unit test", "synthetic": False,
          "description": "", "created": "2026-11-29T12:00:00Z"}


def request(**over):
    rec = {"type": "request", "id": "r0", "policy": "vegas", "s": 0.05,
           "context": [4100, 4104, 4112], "k": [4, 8, 8], "m": [3, 7, 0]}
    rec.update(over)
    return rec


def histogram(**over):
    rec = {"type": "histogram", "id": "h0", "policy": "unknown", "s": None, "k": 3,
           "counts": [5, 0, 2, 1], "context": None}
    rec.update(over)
    return rec


def write_lines(tmp_path, *objs, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return p


def fails(path, line, field):
    """read_trace raises a TraceError naming this file, line and field (attributes and text)."""
    with pytest.raises(TraceError) as exc:
        read_trace(path)
    e = exc.value
    assert (e.path, e.line, e.field) == (str(path), line, field)
    text = str(e)
    assert text.startswith(f"{path}:{line}: " + (f"{field}: " if field is not None else ""))
    return e


# --------------------------------------------------------------------------------------------
# round trip
# --------------------------------------------------------------------------------------------


def test_round_trip(tmp_path):
    ent = [np.array([0.1234567, 2.0, 0.0, 1.5]), np.linspace(0, 3, 8), np.zeros(8)]
    acc = [np.array([1.0, 0.5, 0.25, 0.125]), np.full(8, 0.9), np.full(8, 0.3333333)]
    r = RequestTrace("r0", "vegas", 0.05, np.array([4100, 4104, 4112]), np.array([4, 8, 8]),
                     np.array([3, 7, 0]), ent, acc)
    r2 = RequestTrace("r1", "streamingllm", None, np.array([10]), np.array([2]), np.array([2]))
    h = HistogramTrace("h0", "unknown", None, 3, np.array([5, 0, 2, 1]), 2048.5)
    header = make_header(source="unit test", model="smollm2-135m", description="round trip",
                         run=7)
    path = tmp_path / "sub" / "t.jsonl"
    assert write_trace(path, header, [r, h, r2]) == 3
    t = read_trace(path)
    assert t.header == header and t.header["run"] == 7 and t.path == str(path)
    assert [x.id for x in t.requests] == ["r0", "r1"] and [x.id for x in t.histograms] == ["h0"]
    a = t.requests[0]
    assert (a.policy, a.s) == ("vegas", 0.05)
    assert a.context.tolist() == [4100, 4104, 4112]
    assert a.k.tolist() == [4, 8, 8] and a.m.tolist() == [3, 7, 0]
    assert a.iterations == 3 and a.tokens == 13
    # per-draft arrays are rounded to 5 decimals on write
    assert np.allclose(a.entropy[0], [0.12346, 2.0, 0.0, 1.5], atol=0)
    assert all(np.allclose(x, np.round(y, 5)) for x, y in zip(a.entropy, ent))
    assert all(np.allclose(x, np.round(y, 5)) for x, y in zip(a.accept_prob, acc))
    b = t.requests[1]
    assert b.s is None and b.entropy is None and b.accept_prob is None
    hh = t.histograms[0]
    assert (hh.k, hh.counts.tolist(), hh.context, hh.iterations) == (3, [5, 0, 2, 1], 2048.5, 8)
    # reading what was written and writing it again gives the same bytes
    again = tmp_path / "again.jsonl"
    write_trace(again, t.header, [*t.requests, *t.histograms])
    assert sorted(again.read_text().splitlines()[1:]) == sorted(path.read_text().splitlines()[1:])


names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1,
                max_size=12).filter(str.strip)
sparsities = st.none() | st.floats(1e-6, 1.0)
per_draft_values = st.floats(0.0, 1.0)


@st.composite
def request_records(draw, rid):
    k = draw(st.lists(st.integers(1, 8), min_size=1, max_size=12))
    m = [draw(st.integers(0, ki)) for ki in k]
    context = draw(st.lists(st.integers(1, 2**40), min_size=len(k), max_size=len(k)))
    rows = st.none() | st.just([draw(st.lists(per_draft_values, min_size=ki, max_size=ki))
                                for ki in k])
    return RequestTrace(rid, draw(names), draw(sparsities), np.array(context), np.array(k),
                        np.array(m), draw(rows), draw(rows), draw(st.none() | names))


@st.composite
def histogram_records(draw, rid):
    k = draw(st.integers(1, 8))
    counts = draw(st.lists(st.integers(0, 2**40), min_size=k + 1, max_size=k + 1)
                  .filter(lambda c: sum(c) > 0))
    return HistogramTrace(rid, draw(names), draw(sparsities), k, np.array(counts),
                          draw(st.none() | st.floats(1.0, 1e6)))


@st.composite
def traces(draw):
    kinds = draw(st.lists(st.booleans(), min_size=1, max_size=6))
    return [draw(request_records(f"r{i}") if is_request else histogram_records(f"r{i}"))
            for i, is_request in enumerate(kinds)]


@settings(max_examples=60, deadline=None, database=None)
@given(traces())
def test_what_write_writes_read_returns(records):
    """Every record comes back: ids, policies, s, arrays exact; per-draft values to 5
    decimals; requests and histograms each in the order written."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.jsonl"
        header = make_header(source="property", model="m")
        assert write_trace(path, header, records) == len(records)
        back = read_trace(path)
    assert back.header == header
    written = [r.to_json() for r in records]
    assert [r.to_json() for r in back.requests] == [w for w in written
                                                    if w["type"] == "request"]
    assert [h.to_json() for h in back.histograms] == [w for w in written
                                                      if w["type"] == "histogram"]
    for r in back.requests:
        original = next(x for x in records if x.id == r.id)
        for got, want in ((r.entropy, original.entropy), (r.accept_prob, original.accept_prob)):
            assert (got is None) == (want is None)
            if want is not None:
                assert all(np.allclose(g, w, atol=5e-6, rtol=0) for g, w in zip(got, want))


def test_groups_split_by_policy_and_s():
    t = Trace(HEADER, [RequestTrace("a", "vegas", 0.1, np.array([5]), np.array([1]),
                                    np.array([1])),
                       RequestTrace("b", "vegas", None, np.array([5]), np.array([1]),
                                    np.array([0]))],
              [HistogramTrace("c", "vegas", 0.1, 1, np.array([1, 1]))])
    g = t.groups()
    assert list(g) == [("vegas", None), ("vegas", 0.1)]
    assert [r.id for r in g[("vegas", 0.1)].requests] == ["a"]
    assert [h.id for h in g[("vegas", 0.1)].histograms] == ["c"]


def test_blank_lines_are_skipped_and_line_numbers_stay_true(tmp_path):
    p = write_lines(tmp_path, HEADER, "", request(), "   ", request(id="r1", m=[9, 0, 0]))
    fails(p, 5, "m[0]")


# --------------------------------------------------------------------------------------------
# header errors
# --------------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="no such file") as exc:
        read_trace(tmp_path / "none.jsonl")
    assert exc.value.path == str(tmp_path / "none.jsonl")


def test_empty_file(tmp_path):
    p = write_lines(tmp_path, "")
    e = fails(p, 1, None)
    assert "empty" in str(e)


def test_missing_header(tmp_path):
    p = write_lines(tmp_path, request())
    e = fails(p, 1, "specsim_trace")
    assert "not a specsim trace" in str(e)


def test_unknown_version(tmp_path):
    p = write_lines(tmp_path, {**HEADER, "specsim_trace": 2}, request())
    e = fails(p, 1, "specsim_trace")
    assert "unknown trace version 2" in str(e)


@pytest.mark.parametrize("over, field", [({"source": None}, "source"), ({"source": 3}, "source"),
                                         ({"synthetic": "no"}, "synthetic")])
def test_bad_header_fields(tmp_path, over, field):
    p = write_lines(tmp_path, {**HEADER, **over}, request())
    fails(p, 1, field)


def test_header_without_records(tmp_path):
    p = write_lines(tmp_path, HEADER)
    e = fails(p, 1, None)
    assert "no records" in str(e)


def test_bad_json(tmp_path):
    p = write_lines(tmp_path, HEADER, request(), '{"type": "request", "id": ')
    e = fails(p, 3, None)
    assert "bad JSON" in str(e)


# --------------------------------------------------------------------------------------------
# record errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rec, field, words", [
    # accepted > drafted
    (request(m=[3, 9, 0]), "m[1]", "accepted 9 > drafted k=8"),
    # negative / zero lengths
    (request(context=[4100, -1, 4112]), "context[1]", "≥ 1"),
    (request(k=[4, 0, 8]), "k[1]", "≥ 1"),
    (request(m=[3, -2, 0]), "m[1]", "≥ 0"),
    # wrong array lengths
    (request(context=[4100, 4104]), "context", "has 2 entries, expected 3"),
    (request(m=[3, 7, 0, 1]), "m", "has 4 entries, expected 3"),
    (request(k=[], context=[], m=[]), "k", "at least one iteration"),
    (request(entropy=[[0.1] * 4, [0.1] * 8]), "entropy", "2 rows, expected 3"),
    (request(accept_prob=[[0.5] * 4, [0.5] * 7, [0.5] * 8]), "accept_prob[1]", "k=8"),
    (request(accept_prob=[[0.5] * 4, [1.5] * 8, [0.5] * 8]), "accept_prob[1]", "[0.0, 1.0]"),
    (request(entropy=[[0.1] * 4, [-0.1] * 8, [0.1] * 8]), "entropy[1]", "[0.0, 1000.0]"),
    # bool where an int is expected
    (request(k=[4, True, 8]), "k[1]", "integer"),
    (request(m=[False, 7, 0]), "m[0]", "integer"),
    (request(context=[4100.0, 4104, 4112]), "context[0]", "integer"),
    (histogram(k=True), "k", "boolean"),
    (histogram(counts=[5, 0, True, 1]), "counts[2]", "integer"),
    (request(id=True), "id", "boolean"),
    # histograms: wrong length / empty / bad k / bad context
    (histogram(counts=[5, 0, 2]), "counts", "has 3 entries, expected 4"),
    (histogram(counts=[5, 0, 2, 1, 1]), "counts", "has 5 entries, expected 4"),
    (histogram(counts=[0, 0, 0, 0]), "counts", "empty"),
    (histogram(counts=[5, -1, 2, 1]), "counts[1]", "≥ 0"),
    (histogram(k=0, counts=[3]), "k", "≥ 1"),
    (histogram(k=3.0), "k", "integer"),
    (histogram(context=0.5), "context", "≥ 1"),
    # s, the sparsity ratio
    (request(s=0), "s", "(0, 1]"),
    (request(s=1.5), "s", "(0, 1]"),
    (request(s=-0.1), "s", "(0, 1]"),
    (request(s="0.1"), "s", "number"),
    (request(s=True), "s", "boolean"),
    # missing / wrong kinds
    ({k: v for k, v in request().items() if k != "s"}, "s", "missing"),
    ({k: v for k, v in request().items() if k != "m"}, "m", "missing"),
    ({k: v for k, v in request().items() if k != "type"}, "type", "missing"),
    (request(type="steps"), "type", "unknown record type"),
    (request(policy=""), "policy", "empty"),
    (request(policy=None), "policy", "null"),
    (request(k="8"), "k", "list"),
    ([1, 2, 3], None, "JSON object"),
])
def test_record_errors(tmp_path, rec, field, words):
    p = write_lines(tmp_path, HEADER, histogram(id="ok"), rec)
    e = fails(p, 3, field)
    assert words in str(e)


def test_nan_sparsity(tmp_path):
    # json.loads accepts NaN; it must still be rejected
    p = write_lines(tmp_path, HEADER, json.dumps(request(s=0.1)).replace("0.1", "NaN"))
    fails(p, 2, "s")


def test_duplicate_ids(tmp_path):
    p = write_lines(tmp_path, HEADER, request(id="a"), histogram(id="b"), histogram(id="a"))
    e = fails(p, 4, "id")
    assert "duplicate id 'a' (first on line 2)" in str(e)


def test_integer_ids_are_kept_as_strings(tmp_path):
    p = write_lines(tmp_path, HEADER, request(id=7))
    assert read_trace(p).requests[0].id == "7"


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


def _good():
    return HistogramTrace("h", "unknown", None, 1, np.array([2, 3]))


def test_atomic_write_keeps_old_file_when_a_record_fails(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, HEADER, [_good()])
    before = path.read_bytes()
    bad = HistogramTrace("x", object(), None, 1, np.array([1, 1]))  # policy not serialisable

    def records():
        yield _good()
        yield bad

    with pytest.raises(TraceError, match=": policy: "):
        write_trace(path, HEADER, records())
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["t.jsonl"]  # no temporary file left behind
    assert read_trace(path).histograms[0].counts.tolist() == [2, 3]


def test_write_refuses_records_that_read_would_reject(tmp_path):
    path = tmp_path / "t.jsonl"
    bad = RequestTrace("r", "vegas", 0.05, np.array([10]), np.array([2]), np.array([3]))
    with pytest.raises(TraceError, match="accepted 3 > drafted k=2"):
        write_trace(path, HEADER, [bad])
    assert not path.exists()


def test_written_file_is_world_readable(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, HEADER, [_good()])
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask   # not mkstemp's 0600


def test_atomic_write_keeps_old_file_when_the_generator_raises(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, HEADER, [_good()])
    before = path.read_bytes()

    def records():
        yield _good()
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        write_trace(path, HEADER, records())
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["t.jsonl"]


def test_write_rejects_bad_header_before_touching_the_file(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, HEADER, [_good()])
    before = path.read_bytes()
    with pytest.raises(TraceError) as exc:
        write_trace(path, {"specsim_trace": 1}, [_good()])
    assert exc.value.field == "source" and exc.value.path == str(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["t.jsonl"]


# --------------------------------------------------------------------------------------------
# edge cases: each names file, line and the precise field
# --------------------------------------------------------------------------------------------


def test_per_draft_strings_raise_trace_error(tmp_path):
    p = write_lines(tmp_path, HEADER, request(entropy=[["a"] * 4, [0.1] * 8, [0.1] * 8]))
    fails(p, 2, "entropy[0][0]")


def test_per_draft_nested_lists_rejected(tmp_path):
    p = write_lines(tmp_path, HEADER, request(accept_prob=[[[0.5]] * 4, [0.5] * 8, [0.5] * 8]))
    fails(p, 2, "accept_prob[0][0]")


def test_histogram_nan_context_rejected(tmp_path):
    p = write_lines(tmp_path, HEADER, json.dumps(histogram(context=7.5)).replace("7.5", "NaN"))
    fails(p, 2, "context")


def test_header_error_line_after_blank_lines(tmp_path):
    p = write_lines(tmp_path, "", "", {**HEADER, "specsim_trace": 2}, request())
    fails(p, 3, "specsim_trace")


def test_non_utf8_is_a_trace_error(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(json.dumps(HEADER).encode() + b"\n\xff\xfe\n")
    with pytest.raises(TraceError):
        read_trace(p)


def test_huge_integers_are_a_trace_error(tmp_path):
    p = write_lines(tmp_path, HEADER, request(context=[2 ** 70, 4104, 4112]))
    fails(p, 2, "context[0]")


def test_per_draft_rows_read_as_a_list_of_arrays_kept_flat(tmp_path):
    p = write_lines(tmp_path, HEADER, request(entropy=[[0.5, 1, 2.0, 0.0], [1.0] * 8,
                                                       [0.25] * 8]))
    rows = read_trace(p).requests[0].entropy
    assert isinstance(rows, RaggedRows) and len(rows) == 3
    assert rows.values.shape == (20,) and rows.offsets.tolist() == [0, 4, 12, 20]
    assert rows[0].tolist() == [0.5, 1.0, 2.0, 0.0] and rows[-1].tolist() == [0.25] * 8
    assert [r.size for r in rows] == [4, 8, 8]
    padded = rows.padded(8)
    assert padded[0, :4].tolist() == [0.5, 1.0, 2.0, 0.0] and np.all(np.isnan(padded[0, 4:]))
    assert np.array_equal(padded[1:], [[1.0] * 8, [0.25] * 8])
    with pytest.raises(IndexError):
        rows[3]


def test_reading_without_per_draft_fields_still_validates_them(tmp_path):
    good = write_lines(tmp_path, HEADER, request(accept_prob=[[0.5] * 4, [0.5] * 8, [0.5] * 8]),
                       name="good.jsonl")
    r = read_trace(good, per_draft=False).requests[0]
    assert r.accept_prob is None and r.entropy is None and r.m.tolist() == [3, 7, 0]
    bad = write_lines(tmp_path, HEADER, request(accept_prob=[[0.5] * 4, [1.5] * 8, [0.5] * 8]),
                      name="bad.jsonl")
    with pytest.raises(TraceError) as exc:
        read_trace(bad, per_draft=False)
    assert (exc.value.line, exc.value.field) == (2, "accept_prob[1]")


@pytest.mark.parametrize("key,values,field", [
    ("m", [3, True, 0], "m[1]"), ("m", [3, 7.0, 0], "m[1]"), ("m", [3, 9, 0], "m[1]"),
    ("context", [4100, 0, 1], "context[1]"), ("context", [4100, 2**64, 1], "context[1]"),
])
def test_integer_arrays_checked_in_bulk_name_the_first_bad_entry(tmp_path, key, values,
                                                                   field):
    fails(write_lines(tmp_path, HEADER, request(**{key: values})), 2, field)
