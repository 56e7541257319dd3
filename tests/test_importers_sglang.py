"""Importers of SGLang (/metrics, /generate responses, /server_info) and AIPerf
(profile_export.jsonl), and the trace's Hugging Face model id matched to the catalogue.

Hand-worked cases use the fixtures in tests/fixtures/ (README.md there names the schema
sources); the comments give the arithmetic. Properties: generated SGLang dumps, valid or
broken, are read or refused in one TraceError line.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specsim.errors import SpecsimError, TraceError
from specsim.traces.importers import FORMATS, TraceImportWarning, detect_format, load_trace
from specsim.traces.importers.common import geometric_counts, geometric_rate

FIX = Path(__file__).parent / "fixtures"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
NEW = ("sglang-metrics", "sglang-requests", "sglang-server-info", "aiperf")
FIXTURES = {"sglang_metrics.prom": "sglang-metrics", "sglang_metrics_dp.prom": "sglang-metrics",
            "sglang_requests.jsonl": "sglang-requests",
            "sglang_server_info.json": "sglang-server-info",
            "aiperf_profile_export.jsonl": "aiperf"}


def quietly(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceImportWarning)
        return fn(*args, **kwargs)


def mean_length(h) -> float:
    """E[m+1] of a histogram record."""
    return float(np.dot(np.arange(h.k + 1) + 1, h.counts) / h.counts.sum())


def one_line_error(excinfo, path, field_part):
    text = str(excinfo.value)
    assert "\n" not in text and text.startswith(str(path)), text
    assert field_part in text, text


def write(tmp_path, name, text, mode="w"):
    p = tmp_path / name
    if mode == "w":
        p.write_text(text)
    else:
        p.write_bytes(text)
    return p


# --------------------------------------------------------------------------------------------
# the geometric reading of a mean
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("length,k", [(1.0, 3), (2.8, 3), (4.0, 3), (3.2, 5), (1.5, 1)])
def test_geometric_rate_solves_the_iid_mean(length, k):
    p = geometric_rate(length, k)
    assert sum(p ** i for i in range(k + 1)) == pytest.approx(length, abs=1e-9)
    counts = geometric_counts(length, k, 10000)
    assert counts.sum() == 10000 and counts.size == k + 1
    assert abs(np.dot(np.arange(k + 1) + 1, counts) / 10000 - length) <= k / 10000


# --------------------------------------------------------------------------------------------
# SGLang /metrics
# --------------------------------------------------------------------------------------------

def test_sglang_metrics_counters_give_the_lifetime_mean():
    with pytest.warns(TraceImportWarning, match="geometric"):
        trace = load_trace(FIX / "sglang_metrics.prom")
    (h,) = trace.histograms
    # (generation 1400 + 2000 − requests 16 + 24) / verify calls 1200 = 3360 / 1200 = 2.8
    assert h.k == 3 and h.iterations == 1200
    assert mean_length(h) == pytest.approx(2.8, abs=3 / 1200)
    assert trace.header["model"] == LLAMA and trace.header["import_format"] == "sglang-metrics"
    assert trace.header["speculative"] == {"num_steps": 3, "k_source": "sglang:spec_num_steps",
                                           "num_draft_tokens": 4.0}
    assert "p = 0.7655" in " ".join(trace.header["import_warnings"])


def test_sglang_metrics_gauges_keep_one_record_per_data_parallel_rank():
    trace = quietly(load_trace, FIX / "sglang_metrics_dp.prom")
    h0, h1 = trace.histograms
    assert 'dp_rank="0"' in h0.id and 'dp_rank="1"' in h1.id and "tp_rank" not in h0.id
    assert h0.k == h1.k == 5 and h0.iterations == h1.iterations == 10000
    assert mean_length(h0) == pytest.approx(3.2, abs=1e-3)
    assert mean_length(h1) == pytest.approx(2.9, abs=1e-3)
    assert any("nominal 10000 steps" in w for w in trace.header["import_warnings"])


def test_sglang_metrics_openmetrics_crlf_bom_and_exemplars_read_the_same(tmp_path):
    text = (FIX / "sglang_metrics.prom").read_text().replace(
        "} 1200.0", '} 1200.0 # {trace_id="abc"} 1.0 1764900000.0')
    p = write(tmp_path, "m.prom", b"\xef\xbb\xbf" + (text + "# EOF\nsglang:x 1\n").replace(
        "\n", "\r\n").encode(), mode="b")
    a, b = quietly(load_trace, p), quietly(load_trace, FIX / "sglang_metrics.prom")
    assert a.histograms[0].counts.tolist() == b.histograms[0].counts.tolist()


def test_sglang_metrics_tp_copies_that_disagree_are_averaged_with_a_warning(tmp_path):
    text = (FIX / "sglang_metrics_dp.prom").read_text()
    lines = text.splitlines()
    i = next(j for j, x in enumerate(lines) if 'dp_rank="0"' in x and 'tp_rank="1"' in x
             and "accept_length" in x)
    lines[i] = lines[i].replace(" 3.2", " 3.0")
    with pytest.warns(TraceImportWarning, match="disagree"):
        trace = load_trace(write(tmp_path, "m.prom", "\n".join(lines) + "\n"))
    assert mean_length(trace.histograms[0]) == pytest.approx(3.1, abs=1e-3)


def test_sglang_metrics_without_num_steps_needs_k(tmp_path):
    text = "\n".join(x for x in (FIX / "sglang_metrics_dp.prom").read_text().splitlines()
                     if "spec_num_steps" not in x) + "\n"
    p = write(tmp_path, "m.prom", text)
    with pytest.raises(TraceError) as e:
        quietly(load_trace, p)
    one_line_error(e, p, "sglang:spec_num_steps")
    assert "k" in e.value.reason
    trace = quietly(load_trace, p, k=4)
    assert trace.histograms[0].k == 4 and trace.header["speculative"]["k_source"] == \
        "the importer's k"


@pytest.mark.parametrize("edit,field_part,reason", [
    ((" 3.2\n", " 9.5\n"), "sglang:spec_accept_length", "outside 1..k+1"),
    (("} 5\n", "} 2.5\n"), "sglang:spec_num_steps", "whole number"),
    ((" 3.2\n", " NaN\n"), "sglang:spec_accept_length", "finite"),
    ((" 3.2\n", " -1\n"), "sglang:spec_accept_length", "finite"),
])
def test_sglang_metrics_bad_values_are_one_line_errors(tmp_path, edit, field_part, reason):
    text = (FIX / "sglang_metrics_dp.prom").read_text().replace(*edit, 1)
    p = write(tmp_path, "m.prom", text)
    with pytest.raises(TraceError) as e:
        quietly(load_trace, p)
    one_line_error(e, p, field_part)
    assert reason in str(e.value) and e.value.line is not None


def test_an_idle_sglang_dump_is_refused(tmp_path):
    p = write(tmp_path, "m.prom", 'sglang:spec_accept_length{tp_rank="0"} 0.0\n'
                                  'sglang:spec_num_steps{tp_rank="0"} 3\n')
    with pytest.raises(TraceError, match="no scheduler recorded"):
        quietly(load_trace, p)
    p = write(tmp_path, "n.prom", 'sglang:num_running_reqs{tp_rank="0"} 0.0\n')
    with pytest.raises(TraceError, match="is speculative decoding on"):
        load_trace(p)


def test_detection_tells_sglang_from_vllm_dumps(tmp_path):
    assert detect_format(FIX / "vllm_metrics.prom") == "vllm-metrics"
    assert detect_format(FIX / "sglang_metrics.prom") == "sglang-metrics"
    other = "".join(f"python_gc_objects_collected_total{{generation=\"{i}\"}} 1\n"
                    for i in range(30))
    p = write(tmp_path, "m.prom", other + (FIX / "sglang_metrics_dp.prom").read_text())
    assert detect_format(p) == "sglang-metrics"


@st.composite
def sglang_dumps(draw):
    """A dump of SGLang's spec gauges and counters: valid, or with one value broken."""
    k = draw(st.integers(1, 12))
    lines = ["# TYPE sglang:spec_accept_length gauge"]
    for dp in range(draw(st.integers(1, 3))):
        for tp in range(draw(st.integers(1, 2))):
            labels = f'dp_rank="{dp}",model_name="m",tp_rank="{tp}"'
            length = draw(st.floats(1.0, k + 1.0) | st.just(0.0))
            lines.append(f"sglang:spec_accept_length{{{labels}}} {length!r}")
            lines.append(f"sglang:spec_num_steps{{{labels}}} {k}")
    if draw(st.booleans()):
        verify = draw(st.integers(0, 10**6))
        lines.append(f'sglang:spec_verify_calls_total{{model_name="m"}} {verify}')
        lines.append(f'sglang:generation_tokens_total{{model_name="m"}} '
                     f'{draw(st.integers(0, 10**7))}')
    if draw(st.booleans()):
        i = draw(st.integers(1, len(lines) - 1))
        bad = draw(st.sampled_from(["NaN", "-3", "+Inf", "1e400", "x", "", "2.5", "99"]))
        lines[i] = lines[i].rsplit(" ", 1)[0] + " " + bad
    return "\n".join(lines) + "\n"


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(sglang_dumps())
def test_generated_sglang_dumps_are_read_or_refused_in_one_line(dump):
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "m.prom"
        p.write_text(dump)
        try:
            trace = quietly(load_trace, p)
        except TraceError as e:
            assert "\n" not in str(e) and str(e).startswith(str(p))
            return
        for h in trace.histograms:
            assert 1.0 <= mean_length(h) <= h.k + 1


# --------------------------------------------------------------------------------------------
# SGLang /generate responses and /server_info
# --------------------------------------------------------------------------------------------

def test_sglang_requests_histograms_and_a_mean():
    with pytest.warns(TraceImportWarning, match="geometric"):
        trace = load_trace(FIX / "sglang_requests.jsonl")
    a, b, c = trace.histograms
    # k = spec_num_proposed_drafts / spec_verify_ct = 33 / 11 = 3
    assert (a.id, a.k, a.counts.tolist()) == ("8f1c2a", 3, [2, 1, 2, 6])
    # older names; the histogram ends at m = 2 and is padded to k + 1 = 24 / 8 + 1
    assert (b.id, b.k, b.counts.tolist()) == ("8f1c2b", 3, [4, 3, 1, 0])
    # mean only: (49 − 1) / 16 = 3.0 over 16 steps
    assert c.k == 3 and c.iterations == 16
    assert mean_length(c) == pytest.approx(3.0, abs=3 / 16)
    assert trace.header["model"] is None


def test_sglang_requests_with_server_info_take_its_drafter():
    trace = quietly(load_trace, FIX / "sglang_requests.jsonl",
                    server_info=FIX / "sglang_server_info.json")
    drafter = trace.header["drafter"]
    assert drafter["algorithm"] == "EAGLE3" and drafter["num_steps"] == 3
    assert trace.header["model"] == LLAMA
    assert {h.policy for h in trace.histograms} == {
        "EAGLE3:jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"}


@pytest.mark.parametrize("edit,field_part", [
    (lambda m: m.update(spec_correct_drafts_histogram=[2, 1, 2, 5]),
     "spec_correct_drafts_histogram"),
    (lambda m: m.update(spec_correct_drafts_histogram=[2, 1, 2, 0, 6]),
     "spec_correct_drafts_histogram"),
    (lambda m: m.update(spec_num_proposed_drafts=34), "spec_num_proposed_drafts"),
    (lambda m: m.update(spec_verify_ct="11"), "spec_verify_ct"),
])
def test_sglang_requests_inconsistent_lines_are_one_line_errors(tmp_path, edit, field_part):
    lines = (FIX / "sglang_requests.jsonl").read_text().splitlines()
    obj = json.loads(lines[0])
    edit(obj["meta_info"])
    p = write(tmp_path, "r.jsonl", "\n".join([json.dumps(obj)] + lines[1:]) + "\n")
    with pytest.raises(TraceError) as e:
        quietly(load_trace, p, format="sglang-requests")
    one_line_error(e, p, field_part)
    assert e.value.line == 1


def test_sglang_server_info_pretty_printed_is_detected_and_read():
    assert detect_format(FIX / "sglang_server_info.json") == "sglang-server-info"
    trace = quietly(load_trace, FIX / "sglang_server_info.json")
    (h,) = trace.histograms
    assert h.k == 3 and mean_length(h) == pytest.approx(2.75, abs=1e-3)
    assert trace.header["model"] == LLAMA
    assert trace.header["drafter"]["draft_model"].startswith("jamesliu1/")


def test_sglang_server_info_without_speculation_is_refused(tmp_path):
    info = json.loads((FIX / "sglang_server_info.json").read_text())
    info["speculative_algorithm"] = None
    p = write(tmp_path, "s.json", json.dumps(info, indent=2))
    with pytest.raises(TraceError) as e:
        load_trace(p)
    one_line_error(e, p, "speculative_algorithm")


# --------------------------------------------------------------------------------------------
# AIPerf
# --------------------------------------------------------------------------------------------

def test_aiperf_records_become_histogram_and_request_records():
    with pytest.warns(TraceImportWarning, match="failed"):
        trace = load_trace(FIX / "aiperf_profile_export.jsonl")
    (h,) = trace.histograms
    # sparse {0: 4, 1: 3, 3: 6} with num_spec_tokens 3 -> [4, 3, 0, 6]
    assert (h.id, h.k, h.counts.tolist()) == ("a1f0", 3, [4, 3, 0, 6])
    (r,) = trace.requests
    # prompt 120 (input_sequence_length); context 121, then + m + 1 per step
    assert r.m.tolist() == [3, 0, 2, 3, 1] and r.k.tolist() == [3] * 5
    assert r.context.tolist() == [121, 125, 126, 129, 133]


def test_aiperf_without_acceptance_records_is_refused(tmp_path):
    lines = []
    for line in (FIX / "aiperf_profile_export.jsonl").read_text().splitlines():
        obj = json.loads(line)
        obj["spec_decode_acceptance"] = None
        lines.append(json.dumps(obj))
    p = write(tmp_path, "a.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(TraceError) as e:
        quietly(load_trace, p)
    one_line_error(e, p, "spec_decode_acceptance")
    assert "latencies" in str(e.value)


def test_aiperf_histogram_disagreeing_with_its_steps_is_an_error(tmp_path):
    lines = (FIX / "aiperf_profile_export.jsonl").read_text().splitlines()
    obj = json.loads(lines[0])
    obj["spec_decode_acceptance"]["num_spec_steps"] = 14
    p = write(tmp_path, "a.jsonl", json.dumps(obj) + "\n")
    with pytest.raises(TraceError) as e:
        load_trace(p)
    one_line_error(e, p, "spec_decode_acceptance.acceptance_histogram")


# --------------------------------------------------------------------------------------------
# formats, the command line
# --------------------------------------------------------------------------------------------

def test_the_new_formats_are_named_and_detected():
    from specsim.cli import defaults
    for name in NEW:
        assert name in FORMATS and name in defaults.FORMATS
    for fixture, name in FIXTURES.items():
        assert detect_format(FIX / fixture) == name


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_predict_runs_on_each_fixture(fixture, tmp_path):
    from specsim.cli.main import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["predict", "--trace", str(FIX / fixture), "--json", "--bootstrap", "50",
                     "--format", FIXTURES[fixture]])
    assert code in (0, None)
    report = json.loads(out.getvalue())
    assert report["groups"] and report["best"]


# --------------------------------------------------------------------------------------------
# Hugging Face ids and the catalogue
# --------------------------------------------------------------------------------------------

def test_every_catalogue_entry_lists_the_hf_id_its_config_came_from():
    from specsim.specs import HF_IDS, known_models, load_model
    assert sorted(HF_IDS) == known_models()
    for name, ids in HF_IDS.items():
        source = load_model(name).source
        official = re.search(r"huggingface\.co/([^/\s]+/[^/\s]+)/", source).group(1)
        assert official in ids, (name, official)


@pytest.mark.parametrize("recorded,name", [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"), ("Qwen/Qwen3-8B", "qwen3-8b"),
    ("qwen/qwen3-8b", "qwen3-8b"), ("/models/Qwen2.5-7B-Instruct/", "qwen2.5-7b"),
    ("SmolLM2-135M", "smollm2-135m"), ("llama-3.2-3b", "llama-3.2-3b"),
    ("someone/Llama-3.1-70B", None), ("", None)])
def test_hf_ids_resolve_to_the_catalogue(recorded, name):
    from specsim.specs import catalogue_name
    assert catalogue_name(recorded) == name


def test_the_costed_model_and_why(tmp_path, monkeypatch):
    from specsim.cli import defaults
    assert defaults.model_for(None, {"model": LLAMA}) == (
        "llama-3.1-8b", f"the trace's model '{LLAMA}' is the catalogue's llama-3.1-8b")
    name, why = defaults.model_for(None, {"model": "acme/tiny-7b"})
    assert name == defaults.FALLBACK_MODEL and "neither in the catalogue" in why
    snapshot = tmp_path / "models--acme--tiny-7b" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((Path(__file__).parents[1] / "models" / "qwen3-4b"
                                           / "config.json").read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert defaults.model_for(None, {"model": "acme/tiny-7b"}) == (
        "acme/tiny-7b", "the trace's model, its config from the local Hugging Face cache")


def test_predict_notes_the_model_only_where_it_differs():
    from specsim.cli.main import main
    for fixture, expect in (("sglang_metrics.prom", None),
                            ("sglang_requests.jsonl", "names no model")):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            main(["predict", "--trace", str(FIX / fixture), "--json", "--bootstrap", "50"])
        report = json.loads(out.getvalue())
        notes = " ".join(report["notes"])
        assert "recorded on" not in notes
        if expect:
            assert expect in notes
        else:
            assert report["model"]["name"] == "llama-3.1-8b"


def test_one_line_errors_from_every_new_importer_on_foreign_files():
    for fixture in FIXTURES:
        for name in NEW:
            try:
                quietly(load_trace, FIX / fixture, format=name)
            except SpecsimError as e:
                assert "\n" not in str(e) and len(str(e)) < 1000
