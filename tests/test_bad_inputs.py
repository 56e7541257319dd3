"""Bad input ends in one SpecsimError line naming the file, line and field, quickly; unusual
but valid input (a byte-order mark, CRLF, gzip, OpenMetrics) is read like the plain form."""
import gzip
import json
import time
from pathlib import Path

import numpy as np
import pytest

from specsim import analytical
from specsim.errors import (QUOTE_CHARS, LimitError, SpecFileError, SpecsimError, TraceError,
                            quote)
from specsim.shipped import shipped_path
from specsim.simulator import SimConfig
from specsim.simulator.arrivals import MAX_REQUEST_TOKENS, MAX_REQUESTS, all_at_once, poisson
from specsim.simulator.engine import MAX_BATCH
from specsim.simulator.tuning import SweepSpec, TuningError, sweep
from specsim.specs import load_hardware, load_model
from specsim.traces.acceptance import estimate_acceptance
from specsim.traces.format import GZIP_MIN_BYTES, decompressed_limit, read_trace
from specsim.traces.importers import load_trace

FIXTURES = Path(__file__).parent / "fixtures"
HEADER = {"specsim_trace": 1, "source": "test"}
MAX_K = analytical.MAX_K


def request(**over):
    rec = {"type": "request", "id": "r0", "policy": "vegas", "s": 0.1,
           "context": [100, 104, 108], "k": [3, 3, 3], "m": [3, 3, 1]}
    return {**rec, **over}


def write(path: Path, *lines) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def refused(fn, kind=SpecsimError, *, path=None, line=None, field=None, seconds=5.0):
    """The one-line error ``fn`` raises, after checking its kind, place and speed."""
    start = time.perf_counter()
    with pytest.raises(kind) as info:
        fn()
    assert time.perf_counter() - start < seconds
    e = info.value
    # one line, and not a wall of text beyond the file's own name (however deep it lies)
    said = str(e).replace(str(path), "") if path is not None else str(e)
    assert "\n" not in str(e) and len(said) < 700
    if path is not None:
        assert e.path == str(path)
    if line is not None:
        assert e.line == line
    if field is not None:
        assert e.field == field
    return e


def outcome(path, **options):
    """What reading ``path`` gives: its records, or where and why it was refused."""
    try:
        trace = load_trace(path, **options)
    except TraceError as e:
        return ("refused", e.line, e.field, e.reason)
    return [r.to_json() for r in (*trace.requests, *trace.histograms)]


def same_records(a, b):
    assert len(a.requests) == len(b.requests) and len(a.histograms) == len(b.histograms)
    for x, y in zip(a.requests, b.requests):
        assert x.to_json() == y.to_json()
    for x, y in zip(a.histograms, b.histograms):
        assert x.to_json() == y.to_json()


# ---- draft length limits ---------------------------------------------------------------------


@pytest.mark.parametrize("k", [MAX_K + 1, 1_000_000, 10**30])
def test_a_request_drafting_beyond_max_k_is_refused_at_its_line(tmp_path, k):
    p = write(tmp_path / "t.jsonl", HEADER, request(id="ok"), request(id="big", k=[3, k, 3]))
    e = refused(lambda: load_trace(p), TraceError, path=p, line=3, field="k[1]")
    assert f"≤ {MAX_K}" in str(e)


def test_a_histogram_beyond_max_k_is_refused_before_its_counts_are_read(tmp_path):
    p = write(tmp_path / "t.jsonl", HEADER, {"type": "histogram", "id": "h", "policy": "x",
                                             "s": None, "k": 10**6, "counts": [1]})
    refused(lambda: load_trace(p), TraceError, path=p, line=2, field="k")


def test_max_k_itself_is_read(tmp_path):
    p = write(tmp_path / "t.jsonl", HEADER, request(k=[MAX_K], m=[MAX_K], context=[5]))
    assert int(load_trace(p).requests[0].k[0]) == MAX_K


@pytest.mark.parametrize("k_max", [MAX_K + 1, 100_000, 10**18])
def test_estimate_acceptance_refuses_k_max_beyond_the_limit_at_once(tmp_path, k_max):
    trace = load_trace(write(tmp_path / "t.jsonl", HEADER, request()))
    e = refused(lambda: estimate_acceptance(trace, k_max=k_max), LimitError, seconds=1.0)
    assert str(MAX_K) in str(e)
    assert estimate_acceptance(trace, k_max=MAX_K).survival.shape == (MAX_K,)


def test_the_closed_form_and_the_simulator_refuse_k_beyond_the_limit():
    refused(lambda: analytical.sparsespec_speedup(0.5, np.arange(1, 100_001), 0.1), LimitError)
    assert analytical.sparsespec_speedup(0.5, MAX_K, 0.0) == pytest.approx(0.5 * MAX_K + 1)
    refused(lambda: SimConfig("vegas", 0.1, k=MAX_K + 1), LimitError)
    refused(lambda: SimConfig("vegas", 0.1, k=0), LimitError)
    refused(lambda: SimConfig("vegas", 0.1, max_batch=MAX_BATCH + 1), SpecsimError)


def test_arrivals_beyond_their_limits_are_refused():
    refused(lambda: all_at_once(MAX_REQUESTS + 1, 10, 10), LimitError)
    refused(lambda: poisson(10, 1.0, 10, MAX_REQUEST_TOKENS + 1), LimitError)
    refused(lambda: poisson(10, float("nan"), 10, 10), SpecsimError)
    assert len(all_at_once(3, 10, MAX_REQUEST_TOKENS)) == 3


# ---- tune ------------------------------------------------------------------------------------


def test_tune_on_a_trace_without_sparse_groups_says_what_it_lacks():
    path = str(FIXTURES / "specbench.jsonl")
    spec = SweepSpec(path, "smollm2-135m", "h200", 1, ("all", 4, None, 32), 4,
                     trace_format="specbench", costs="roofline")
    e = refused(lambda: sweep(spec, [], [2], workers=1), TuningError)
    assert "no sparse groups" in str(e) and "s=null" in str(e)


# ---- vLLM metrics ----------------------------------------------------------------------------


def test_more_accepted_than_drafted_tokens_is_refused(tmp_path):
    text = (FIXTURES / "vllm_metrics.prom").read_text()
    line = next(x for x in text.splitlines() if "num_draft_tokens_total{" in x)
    name, value = line.rsplit(" ", 1)
    bad = tmp_path / "m.prom"
    bad.write_text(text.replace(line, f"{name} 10"))
    e = refused(lambda: load_trace(bad), TraceError, path=bad)
    assert "exceed drafted tokens" in str(e) and "10" in str(e)


def test_openmetrics_eof_exemplars_and_timestamps_are_read_like_plain_text(tmp_path):
    plain = load_trace(FIXTURES / "vllm_metrics.prom")
    lines = []
    for x in (FIXTURES / "vllm_metrics.prom").read_text().splitlines():
        if x.startswith("vllm:spec_decode") and not x.startswith("#"):
            x += ' # {trace_id="abc#1"} 1.0 1700000000.5'
        lines.append(x)
    p = tmp_path / "m.prom"
    p.write_text("\n".join(lines) + "\n# EOF\ngarbage after the end\n")
    same_records(load_trace(p), plain)


# ---- encodings, line ends, compression -------------------------------------------------------


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.iterdir()))
def test_a_byte_order_mark_and_crlf_are_read(tmp_path, fixture):
    raw = (FIXTURES / fixture).read_bytes()
    p = tmp_path / fixture
    p.write_bytes(b"\xef\xbb\xbf" + raw.replace(b"\n", b"\r\n"))
    assert outcome(p) == outcome(FIXTURES / fixture)


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.iterdir()))
def test_a_bad_byte_on_line_4_is_reported_at_line_4(tmp_path, fixture):
    lines = (FIXTURES / fixture).read_bytes().rstrip(b"\n").split(b"\n")
    fourth = lines[min(3, len(lines) - 1)]
    lines = (lines[:3] + [b""] * 3)[:3] + [fourth[:5] + b"\xff" + fourth[5:]]
    p = tmp_path / fixture
    p.write_bytes(b"\n".join(lines))
    e = refused(lambda: load_trace(p), TraceError, path=p, line=4)
    assert "UTF-8" in str(e)


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.iterdir()))
def test_gzip_files_are_read_like_the_plain_file(tmp_path, fixture):
    p = tmp_path / (fixture + ".gz")
    p.write_bytes(gzip.compress((FIXTURES / fixture).read_bytes()))
    assert outcome(p) == outcome(FIXTURES / fixture)
    truncated = tmp_path / "cut.gz"
    truncated.write_bytes(p.read_bytes()[:-12])
    e = refused(lambda: load_trace(truncated), TraceError, path=truncated)
    assert "gzip" in str(e)


def test_a_gzip_bomb_is_refused_once_it_expands_past_the_limit(tmp_path):
    p = tmp_path / "bomb.jsonl.gz"
    with gzip.open(p, "wb", compresslevel=9) as fh:
        fh.write((json.dumps(HEADER) + "\n").encode())
        block = b"0" * 2**24
        for _ in range(16):
            fh.write(block)
    assert decompressed_limit(p.stat().st_size) == GZIP_MIN_BYTES
    e = refused(lambda: load_trace(p), TraceError, path=p, line=2, seconds=10.0)
    assert "decompression bomb" in str(e)


def test_a_truncated_trace_is_refused_at_its_last_line(tmp_path):
    p = write(tmp_path / "t.jsonl", HEADER, request(id="a"), request(id="b"))
    p.write_bytes(p.read_bytes()[:-20])
    e = refused(lambda: load_trace(p), TraceError, path=p, line=3)
    assert "bad JSON" in str(e)


# ---- strict JSON -----------------------------------------------------------------------------


@pytest.mark.parametrize("text, field, words", [
    (json.dumps(request()).replace("0.1", "NaN"), "s", "NaN"),
    (json.dumps(request()).replace("0.1", "-Infinity"), "s", "Infinity"),
    (json.dumps(request())[:-1] + ', "k": [1]}', "k", "duplicate key 'k'"),
    (json.dumps(request()).replace("[100,", "[1" + "0" * 400 + ","), "context[0]", "401 digits"),
    (json.dumps(request()).replace("[100,", "[1" + "0" * 5000 + ","), None, "4300 digits"),
    ("[" * 100_000, None, "nested too deeply"),
])
def test_strict_json_in_a_trace(tmp_path, text, field, words):
    p = write(tmp_path / "t.jsonl", HEADER, text)
    e = refused(lambda: read_trace(p), TraceError, path=p, line=2, field=field)
    assert words in str(e)


def test_quotes_keep_at_most_a_few_dozen_characters():
    assert len(quote("x" * 10**6)) < QUOTE_CHARS + 30
    assert quote(10**400) == "an integer of 401 digits"
    assert quote(3) == "3" and quote("ab") == "'ab'"


def test_control_characters_in_errors_are_escaped(tmp_path):
    p = write(tmp_path / "t.jsonl", HEADER, request(type="\x1b[2J\nreq"))
    e = refused(lambda: read_trace(p), TraceError, path=p, line=2, field="type")
    assert "\x1b" not in str(e) and "\\x1b" in str(e)


# ---- model and hardware files ----------------------------------------------------------------

CONFIG = json.loads(Path(shipped_path("models/smollm2-135m/config.json")).read_text())
HARDWARE = json.loads(Path(shipped_path("models/hardware/h200.json")).read_text())


@pytest.mark.parametrize("key", ["hidden_size", "num_attention_heads", "num_key_value_heads",
                                 "num_hidden_layers", "intermediate_size", "vocab_size",
                                 "head_dim"])
@pytest.mark.parametrize("value", [-5, 1e300, 10**400, "64", 2.5])
def test_model_sizes_are_range_checked(tmp_path, key, value):
    p = tmp_path / "config.json"
    text = json.dumps({**CONFIG, key: 1}, indent=2).replace(f'"{key}": 1', f'"{key}": {value!r}'
                                                              if not isinstance(value, str)
                                                              else f'"{key}": "{value}"')
    p.write_text(text)
    line = next(i for i, x in enumerate(text.splitlines(), 1) if f'"{key}"' in x)
    e = refused(lambda: load_model(str(p)), SpecFileError, path=p, line=line, field=key)
    assert len(str(e)) < 200


def test_zero_sizes_and_indivisible_heads_are_refused(tmp_path):
    p = tmp_path / "config.json"
    for over, field in (({"num_attention_heads": 0}, "num_attention_heads"),
                        ({"hidden_size": 0}, "hidden_size"),
                        ({"num_key_value_heads": 0}, "num_key_value_heads"),
                        ({"vocab_size": 0}, "vocab_size"),
                        ({"num_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok"),
                        ({"num_attention_heads": 9, "num_key_value_heads": 2},
                         "num_key_value_heads")):
        p.write_text(json.dumps({**CONFIG, **over}, indent=2))
        refused(lambda: load_model(str(p)), SpecFileError, path=p, field=field)
    p.write_text(json.dumps(CONFIG, indent=2))
    assert load_model(str(p)).param_count() == load_model("smollm2-135m").param_count()


@pytest.mark.parametrize("text, line, field, words", [
    ('{\n"hidden_size": 8,\n"vocab_size": NaN\n}', 3, "vocab_size", "NaN"),
    ('{\n"hidden_size": 8,\n"hidden_size": 9\n}', 3, "hidden_size", "duplicate key"),
    ('{\n"hidden_size": 1e400\n}', None, None, "overflows"),
    ("[" * 100_000, None, None, "nested too deeply"),
    ('{\n"hidden_size": 8,\n', 3, None, "bad JSON"),
])
def test_strict_json_in_model_and_hardware_files(tmp_path, text, line, field, words):
    p = tmp_path / "x.json"
    p.write_text(text)
    for reader in (load_model, load_hardware):
        e = refused(lambda: reader(str(p)), SpecFileError, path=p, line=line, field=field)
        assert words in str(e)


def test_non_utf8_model_and_hardware_files_name_the_line(tmp_path):
    p = tmp_path / "x.json"
    p.write_bytes(b'{\n"a": 1,\n"b": "\xff"\n}')
    for reader in (load_model, load_hardware):
        refused(lambda: reader(str(p)), SpecFileError, path=p, line=3)
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(CONFIG).encode())
    assert load_model(str(p)).hidden_size == CONFIG["hidden_size"]


@pytest.mark.parametrize("key, value", [("memory_bandwidth_TBps", 0), ("memory_bandwidth_TBps", -1),
                                        ("bf16_dense_TFLOPs", 1e300), ("memory_GB", "141"),
                                        ("interconnect_GBps", True)])
def test_hardware_numbers_are_range_checked(tmp_path, key, value):
    p = tmp_path / "gpu.json"
    p.write_text(json.dumps({**HARDWARE, key: value}, indent=1))
    refused(lambda: load_hardware(str(p)), SpecFileError, path=p, field=key)


def test_hardware_overheads_and_measured_ceilings_are_range_checked(tmp_path):
    p = tmp_path / "gpu.json"
    for over, field in (({"overheads_s": {"forward": -1}}, "overheads_s.forward"),
                        ({"overheads_s": {"bogus": 1e-6}}, "overheads_s.bogus"),
                        ({"measured": {"memory_bandwidth_TBps": 1e9}},
                         "measured.memory_bandwidth_TBps")):
        p.write_text(json.dumps({**HARDWARE, **over}, indent=1))
        refused(lambda: load_hardware(str(p)), SpecFileError, path=p, field=field)
    p.write_text(json.dumps(HARDWARE))
    assert load_hardware(str(p)).bandwidth == load_hardware("h200").bandwidth


# ---- standard input and pipes ----------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["vllm_metrics.prom", "specbench.jsonl"])
def test_standard_input_is_detected_and_read_like_the_file(monkeypatch, fixture):
    import io
    import sys
    raw = (FIXTURES / fixture).read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
    assert outcome("-") == outcome(FIXTURES / fixture)


def test_a_pipe_is_read_once_and_errors_name_it(tmp_path):
    import os
    import threading
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def feed(data):
        with open(fifo, "wb") as fh:
            fh.write(data)
    for data, good in ((FIXTURES / "vllm_metrics.prom").read_bytes(), True), (b"{]\n", False):
        writer = threading.Thread(target=feed, args=(data,))
        writer.start()
        if good:
            assert outcome(fifo) == outcome(FIXTURES / "vllm_metrics.prom")
        else:
            refused(lambda: load_trace(fifo), TraceError, path=fifo, line=1)
        writer.join(5)


@pytest.mark.parametrize("stats, field", [
    ({"acceptance_histogram": [1] * 1_000_000}, "acceptance_histogram"),
    ({"num_spec_tokens": 10**6, "acceptance_histogram": [1, 1]}, "num_spec_tokens"),
    ({"spec_token_acceptance_counts": [5] * 100_000}, "spec_token_acceptance_counts"),
    ({"per_step_accepted": [1] * 100_000, "acceptance_histogram": [0] * 100_000},
     "acceptance_histogram"),
])
def test_vllm_request_statistics_beyond_max_k_are_refused_fast(tmp_path, stats, field):
    p = write(tmp_path / "r.jsonl", {"request_id": "a", **stats})
    e = refused(lambda: load_trace(p, format="vllm-requests"), TraceError, path=p, line=1,
                field=field, seconds=3.0)
    assert str(MAX_K) in str(e)


def test_specbench_steps_beyond_max_k_are_refused(tmp_path):
    p = write(tmp_path / "s.jsonl", {"question_id": 1, "choices": [
        {"index": 0, "accept_lengths": [3, 10**6, 2]}]})
    e = refused(lambda: load_trace(p, format="specbench"), TraceError, path=p, line=1,
                field="choices[0].accept_lengths[1]")
    assert str(MAX_K) in str(e)
