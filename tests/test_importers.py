"""Importers: vLLM /metrics, vLLM per-request JSON Lines, Spec-Bench; detection and dispatch.

Hand-worked cases use the fixtures in tests/fixtures/ (the comments give the arithmetic).
Properties: what a writer of each format writes, its importer reads back (and the detector
names); whatever a corrupted file holds, loading it gives a trace the native format accepts
or one TraceError line naming the file (and the line and field where there is one).
"""
from __future__ import annotations

import json
import re
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specsim.errors import TraceError
from specsim.traces.format import RequestTrace, make_header, read_trace, write_trace
from specsim.traces.importers import (FORMATS, TraceImportWarning, detect_format,
                                      import_specbench, import_vllm_metrics,
                                      import_vllm_requests, load_trace)

FIX = Path(__file__).parent / "fixtures"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def where(excinfo, path, line, field_part):
    """The error names the file, the line and the field, as attributes and in its message."""
    e = excinfo.value
    assert e.path == str(path)
    assert e.line == line
    assert e.field is not None and field_part in e.field
    assert str(e).startswith(f"{path}:{line}: {e.field}: ")    # FILE:LINE: FIELD: REASON
    assert field_part in str(e)


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def jsonl(tmp_path, name, objs):
    return write(tmp_path, name, "".join(json.dumps(o) + "\n" for o in objs))


# --------------------------------------------------------------------------------------------
# vLLM /metrics
# --------------------------------------------------------------------------------------------

# engine 0: drafts 1000, per-pos (700, 450, 250) -> counts (1000-700, 700-450, 450-250, 250)
# engine 1: drafts 2.4e+03, per-pos (1.5e+03, 900, 4.2e+02) -> (900, 600, 480, 420)
ENGINE0 = f"engine=0,model_name={MODEL}"
ENGINE1 = f"engine=1,model_name={MODEL}"


def test_metrics_fixture_survivals_become_histograms(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceImportWarning)
        trace = import_vllm_metrics(FIX / "vllm_metrics.prom")
    assert [h.id for h in trace.histograms] == [ENGINE0, ENGINE1]
    assert trace.requests == []
    h0, h1 = trace.histograms
    assert h0.k == h1.k == 3
    assert h0.counts.tolist() == [300, 250, 200, 250]
    assert h1.counts.tolist() == [900, 600, 480, 420]
    # the histogram reproduces the counters it came from
    assert h0.iterations == 1000 and int(np.dot(np.arange(4), h0.counts)) == 1400
    assert h1.iterations == 2400 and int(np.dot(np.arange(4), h1.counts)) == 2820
    assert all(h.policy == "unknown" and h.s is None and h.context is None
               for h in trace.histograms)
    hdr = trace.header
    assert "vllm-metrics" in hdr["source"] and "vllm_metrics.prom" in hdr["source"]
    assert hdr["model"] == MODEL and hdr["import_format"] == "vllm-metrics"
    assert hdr["context_known"] is False and "import_warnings" not in hdr
    # an imported trace is a valid native trace
    out = tmp_path / "t.jsonl"
    write_trace(out, trace.header, trace.histograms)
    back = read_trace(out)
    assert [h.counts.tolist() for h in back.histograms] == [[300, 250, 200, 250],
                                                           [900, 600, 480, 420]]


def test_metrics_policy_and_s_arguments():
    trace = import_vllm_metrics(FIX / "vllm_metrics.prom", policy="vegas", s=0.05)
    assert {(h.policy, h.s) for h in trace.histograms} == {("vegas", 0.05)}
    with pytest.raises(TraceError) as exc:
        import_vllm_metrics(FIX / "vllm_metrics.prom", s=1.5)
    assert exc.value.field == "s"


def test_metrics_nonmonotone_fixture_names_line_and_position():
    path = FIX / "vllm_metrics_nonmonotone.prom"
    with pytest.raises(TraceError) as exc:
        import_vllm_metrics(path)
    where(exc, path, 13, 'position="1"')
    assert "750" in str(exc.value) and "survival" in str(exc.value)


PROM_HEAD = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
"""


def prom(drafts="1000.0", draft_tokens="3000.0", accepted="1400.0",
         per_pos=("700.0", "450.0", "250.0"), labels='model_name="m",engine="0"'):
    lines = [PROM_HEAD.rstrip("\n")]
    if drafts is not None:
        lines.append(f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}")
    if draft_tokens is not None:
        lines.append(f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {draft_tokens}")
    if accepted is not None:
        lines.append(f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}")
    for i, v in enumerate(per_pos):
        if v is not None:
            lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},'
                         f'position="{i}"}} {v}')
    return "\n".join(lines) + "\n"


def test_metrics_first_survival_above_num_drafts(tmp_path):
    p = write(tmp_path, "m.prom", prom(per_pos=("1100.0", "450.0", "250.0"), accepted="1800.0"))
    with pytest.raises(TraceError) as exc:
        import_vllm_metrics(p)
    where(exc, p, 6, 'position="0"')
    assert "num_drafts" in str(exc.value)


def test_metrics_sum_of_per_pos_must_match_accepted(tmp_path):
    p = write(tmp_path, "m.prom", prom(accepted="1401.0"))
    with pytest.raises(TraceError) as exc:
        import_vllm_metrics(p)
    where(exc, p, 5, "vllm:spec_decode_num_accepted_tokens_total")
    assert "1400" in str(exc.value) and "1401" in str(exc.value)


@pytest.mark.parametrize("accepted, ok", [("1.40e+03", True),    # 1400 ± 5: shortened by a tool
                                          ("1.4e+03", True),     # 1400 ± 50
                                          ("1400", False),       # plain decimals are exact
                                          ("1.400e+03", False)])  # 1400 ± 0.5
def test_metrics_sum_tolerance_follows_written_precision(tmp_path, accepted, ok):
    p = write(tmp_path, "m.prom", prom(accepted=accepted, per_pos=("700", "450", "251")))
    if ok:
        assert import_vllm_metrics(p).histograms[0].counts.tolist() == [300, 250, 199, 251]
    else:
        with pytest.raises(TraceError, match="num_accepted_tokens"):
            import_vllm_metrics(p)


def test_metrics_draft_tokens_above_k_times_drafts_is_an_error(tmp_path):
    p = write(tmp_path, "m.prom", prom(draft_tokens="3001.0"))
    with pytest.raises(TraceError) as exc:
        import_vllm_metrics(p)
    where(exc, p, 4, "vllm:spec_decode_num_draft_tokens_total")


def test_metrics_short_drafts_warn_and_are_flagged(tmp_path):
    p = write(tmp_path, "m.prom", prom(draft_tokens="2900.0"))
    with pytest.warns(TraceImportWarning, match="shorter than k=3"):
        trace = import_vllm_metrics(p)
    assert trace.histograms[0].counts.tolist() == [300, 250, 200, 250]
    assert any("2900" in w for w in trace.header["import_warnings"])


def test_metrics_missing_draft_tokens_and_accepted_warn(tmp_path):
    p = write(tmp_path, "m.prom", prom(draft_tokens=None, accepted=None))
    with pytest.warns(TraceImportWarning) as record:
        trace = import_vllm_metrics(p)
    messages = " ".join(str(w.message) for w in record)
    assert "num_draft_tokens" in messages and "num_accepted_tokens" in messages
    assert len(trace.header["import_warnings"]) == 2


def test_metrics_without_total_suffix_and_with_underscore_prefix(tmp_path):
    text = prom().replace("_total{", "{")
    p = write(tmp_path, "m.prom", text)
    assert import_vllm_metrics(p).histograms[0].counts.tolist() == [300, 250, 200, 250]
    p2 = write(tmp_path, "m2.prom", prom().replace("vllm:", "vllm_"))
    assert import_vllm_metrics(p2).histograms[0].counts.tolist() == [300, 250, 200, 250]


def test_metrics_same_counter_with_and_without_total_is_rejected(tmp_path):
    text = prom() + 'vllm:spec_decode_num_drafts{model_name="m",engine="0"} 1000.0\n'
    p = write(tmp_path, "m.prom", text)
    with pytest.raises(TraceError) as exc:
        import_vllm_metrics(p)
    where(exc, p, 9, "vllm:spec_decode_num_drafts")
    assert "line 3" in str(exc.value)


def test_metrics_label_values_with_escapes_timestamps_and_exemplars(tmp_path):
    labels = 'model_name="org/m \\"v2\\", final" , engine="0",'
    text = prom(labels=labels.rstrip(","))
    # a timestamp after one value, an OpenMetrics exemplar after another, and # EOF
    text = text.replace("1000.0", "1000.0 1756736798000")
    text = text.replace("1400.0", '1400.0 # {trace_id="abc"} 1.0')
    p = write(tmp_path, "m.prom", text + "# EOF\n")
    trace = import_vllm_metrics(p)
    assert trace.histograms[0].id == 'engine=0,model_name=org/m "v2", final'
    assert trace.header["model"] == 'org/m "v2", final'
    assert trace.histograms[0].counts.tolist() == [300, 250, 200, 250]


def test_metrics_v0_counters_only_explain_what_is_missing(tmp_path):
    text = ("# TYPE vllm:spec_decode_draft_acceptance_rate gauge\n"
            'vllm:spec_decode_draft_acceptance_rate{model_name="m"} 0.6\n'
            'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 32594.0\n'
            'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 53716.0\n'
            'vllm:spec_decode_num_emitted_tokens_total{model_name="m"} 34244.0\n')
    p = write(tmp_path, "v0.prom", text)
    with pytest.raises(TraceError, match="V0") as exc:
        import_vllm_metrics(p)
    assert "per_pos" in exc.value.field


@pytest.mark.parametrize("value, reason", [("12.5", "whole number"), ("NaN", "finite"),
                                           ("-3.0", "≥ 0"), ("+Inf", "finite"),
                                           ("abc", "not a number")])
def test_metrics_bad_counter_values(tmp_path, value, reason):
    p = write(tmp_path, "m.prom", prom(drafts=value))
    with pytest.raises(TraceError, match=reason) as exc:
        import_vllm_metrics(p)
    assert exc.value.line == 3 and "vllm:spec_decode_num_drafts_total" in exc.value.field


def test_metrics_position_gap(tmp_path):
    p = write(tmp_path, "m.prom", prom(per_pos=("700.0", None, "250.0"), accepted="950.0"))
    with pytest.raises(TraceError, match="missing position 1") as exc:
        import_vllm_metrics(p)
    where(exc, p, 7, 'position="2"')


def test_metrics_missing_drafts_counter(tmp_path):
    p = write(tmp_path, "m.prom", prom(drafts=None))
    with pytest.raises(TraceError) as exc:
        import_vllm_metrics(p)
    where(exc, p, 3, "vllm:spec_decode_num_drafts_total")


def test_metrics_duplicate_sample(tmp_path):
    text = prom() + 'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 1400\n'
    p = write(tmp_path, "m.prom", text)
    with pytest.raises(TraceError, match="first on line 5") as exc:
        import_vllm_metrics(p)
    assert exc.value.line == 9


def test_metrics_idle_engine_is_skipped(tmp_path):
    idle = prom(drafts="0.0", draft_tokens="0.0", accepted="0.0", per_pos=("0.0",) * 3,
                labels='model_name="m",engine="1"').split("\n", 2)[2]
    p = write(tmp_path, "m.prom", prom() + idle)
    with pytest.warns(TraceImportWarning, match="idle"):
        trace = import_vllm_metrics(p)
    assert [h.id for h in trace.histograms] == ["engine=0,model_name=m"]


def test_metrics_malformed_line(tmp_path):
    p = write(tmp_path, "m.prom", prom() + 'vllm:spec_decode_num_drafts_total{engine="1 5\n')
    with pytest.raises(TraceError, match="unterminated") as exc:
        import_vllm_metrics(p)
    assert exc.value.line == 9


# --------------------------------------------------------------------------------------------
# vLLM per-request JSON Lines
# --------------------------------------------------------------------------------------------


def test_requests_histogram_fixture():
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceImportWarning)
        trace = import_vllm_requests(FIX / "vllm_requests_histogram.jsonl")
    assert trace.requests == []
    got = {h.id: (h.k, h.counts.tolist()) for h in trace.histograms}
    # V0 survival counts [10, 8, 4, 2] -> [10-8, 8-4, 4-2, 2]
    assert got == {"chatcmpl-7f3a": (3, [39, 1, 0, 3]), "chatcmpl-91bc": (3, [5, 2, 3, 10]),
                   "0": (3, [2, 4, 2, 2])}
    assert trace.header["model"] == MODEL
    assert "vllm_requests_histogram.jsonl" in trace.header["source"]


def test_requests_per_step_fixture():
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceImportWarning)
        trace = import_vllm_requests(FIX / "vllm_requests_steps.jsonl", policy="quest", s=0.1)
    r1, r2 = trace.requests
    # prompt 100, first token from prefill -> 101; then + (m+1) per step: +4, +1, +3
    assert r1.id == "chatcmpl-req1"
    assert r1.context.tolist() == [101, 105, 106, 109]
    assert r1.k.tolist() == [3, 3, 3, 3] and r1.m.tolist() == [3, 0, 2, 1]
    # prompt 20 -> 21, +5, +5, +1, +2
    assert r2.id == "req-2"
    assert r2.context.tolist() == [21, 26, 31, 32, 34]
    assert r2.k.tolist() == [4] * 5 and r2.m.tolist() == [4, 4, 0, 1, 2]
    assert {(r.policy, r.s) for r in trace.requests} == {("quest", 0.1)}
    assert trace.header["context_known"] is True
    # completion_tokens of req1 = 1 + Σ(m+1) = 11 (what the fixture's usage says)
    assert 1 + r1.tokens == 11


def test_requests_without_prompt_length_mark_context_unknown(tmp_path):
    p = jsonl(tmp_path, "r.jsonl", [{"request_id": "a", "k": 2, "per_step_accepted": [2, 1, 0]}])
    trace = import_vllm_requests(p)
    assert trace.requests[0].context.tolist() == [1, 4, 6]
    assert trace.header["context_known"] is False


def test_requests_variable_draft_length_and_empty_steps(tmp_path):
    p = jsonl(tmp_path, "r.jsonl", [{"id": "v", "prompt_len": 10,
                                     "per_step_accepted": [1, 3, 0, 0],
                                     "per_step_drafted": [2, 3, 0, 3]}])
    with pytest.warns(TraceImportWarning, match="drafted nothing"):
        trace = import_vllm_requests(p)
    r = trace.requests[0]
    # 11, +2 -> 13, +4 -> 17, empty step emits 1 -> 18
    assert r.context.tolist() == [11, 13, 18]
    assert r.k.tolist() == [2, 3, 3] and r.m.tolist() == [1, 3, 0]


def stats_line(**over):
    sd = {"acceptance_histogram": [39, 1, 0, 3], "num_spec_steps": 43,
          "num_accepted_draft_tokens": 10, "num_draft_tokens": 129, "num_spec_tokens": 3}
    sd.update(over)
    return {"id": "x", "usage": {"prompt_tokens": 5}, "metrics": {"speculative_decoding": sd}}


@pytest.mark.parametrize("over, field, words", [
    ({"num_spec_steps": 44}, "metrics.speculative_decoding.acceptance_histogram", "44"),
    ({"num_spec_tokens": 4}, "metrics.speculative_decoding.acceptance_histogram", "k+1"),
    ({"num_accepted_draft_tokens": 11}, "metrics.speculative_decoding.acceptance_histogram",
     "11"),
    ({"num_draft_tokens": 130}, "metrics.speculative_decoding.num_draft_tokens", "exceed"),
    ({"acceptance_histogram": [39, -1, 0, 3]},
     "metrics.speculative_decoding.acceptance_histogram[1]", "≥ 0"),
    ({"acceptance_histogram": [39, True, 0, 3]},
     "metrics.speculative_decoding.acceptance_histogram[1]", "integer"),
    ({"num_spec_steps": 43.0}, "metrics.speculative_decoding.num_spec_steps", "integer"),
    ({"per_step_accepted": [0, 4], "num_spec_steps": 2, "acceptance_histogram": None,
      "num_accepted_draft_tokens": 4, "num_draft_tokens": None},
     "metrics.speculative_decoding.per_step_accepted[1]", "> k = 3"),
    ({"per_step_accepted": [0, 1], "num_spec_steps": None, "num_draft_tokens": None,
      "num_accepted_draft_tokens": None},
     "metrics.speculative_decoding.acceptance_histogram", "disagrees"),
    ({"per_step_accepted": [1, 2], "per_step_drafted": [3, 1], "acceptance_histogram": None,
      "num_spec_steps": 2, "num_accepted_draft_tokens": 3, "num_draft_tokens": 4},
     "metrics.speculative_decoding.per_step_accepted[1]", "drafted 1"),
])
def test_requests_inconsistent_records(tmp_path, over, field, words):
    good = {**stats_line(), "id": "ok"}
    p = jsonl(tmp_path, "r.jsonl", [good, stats_line(**over)])
    with pytest.raises(TraceError) as exc:
        import_vllm_requests(p)
    where(exc, p, 2, field)
    assert exc.value.field == field
    assert words in str(exc.value)


def test_requests_v0_survival_must_not_increase(tmp_path):
    p = jsonl(tmp_path, "r.jsonl", [{"request_id": "0",
                                     "metrics": {"spec_token_acceptance_counts": [10, 4, 6]}}])
    with pytest.raises(TraceError) as exc:
        import_vllm_requests(p)
    where(exc, p, 1, "metrics.spec_token_acceptance_counts[2]")


def test_requests_null_stats_are_skipped(tmp_path):
    null = {"id": "n2", "metrics": {"speculative_decoding": None}}
    p = jsonl(tmp_path, "r.jsonl", [stats_line(), null])
    with pytest.warns(TraceImportWarning, match="null"):
        trace = import_vllm_requests(p)
    assert [h.id for h in trace.histograms] == ["x"]
    p2 = jsonl(tmp_path, "r2.jsonl", [null])
    with pytest.warns(TraceImportWarning), pytest.raises(TraceError, match="no request"):
        import_vllm_requests(p2)


def test_requests_line_without_stats(tmp_path):
    p = jsonl(tmp_path, "r.jsonl", [stats_line(), {"id": "y", "usage": {"prompt_tokens": 3}}])
    with pytest.raises(TraceError) as exc:
        import_vllm_requests(p)
    where(exc, p, 2, "acceptance_histogram")
    assert "per_step_accepted" in str(exc.value)


def test_requests_duplicate_ids_and_bad_json(tmp_path):
    p = jsonl(tmp_path, "r.jsonl", [stats_line(), stats_line()])
    with pytest.raises(TraceError, match="first on line 1") as exc:
        import_vllm_requests(p)
    where(exc, p, 2, "id")
    p2 = write(tmp_path, "b.jsonl", json.dumps(stats_line()) + "\n\n{oops\n")
    with pytest.raises(TraceError, match="bad JSON") as exc:
        import_vllm_requests(p2)
    assert exc.value.line == 3


def test_requests_k_fallback_argument(tmp_path):
    p = jsonl(tmp_path, "r.jsonl", [{"id": "a", "prompt_len": 4, "per_step_accepted": [1, 2]}])
    with pytest.raises(TraceError) as exc:
        import_vllm_requests(p)
    where(exc, p, 1, "num_spec_tokens")
    trace = import_vllm_requests(p, k=2)
    assert trace.requests[0].k.tolist() == [2, 2]
    with pytest.raises(TraceError):
        import_vllm_requests(p, k=1)  # accepted 2 > k = 1


# --------------------------------------------------------------------------------------------
# Spec-Bench
# --------------------------------------------------------------------------------------------

# q81 accept_lengths [3,1,4,2 | 1,5,2] -> m = l-1, context = 1 + Σ previous lengths
# q82 accept_lengths [2,2,6,1 | 4,3]
Q81_M, Q81_CTX = [2, 0, 3, 1, 0, 4, 1], [1, 4, 5, 9, 11, 12, 17]
Q82_M, Q82_CTX = [1, 1, 5, 0, 3, 2], [1, 3, 5, 11, 12, 16]


def test_specbench_fixture_infers_k_as_lower_bound(tmp_path):
    with pytest.warns(TraceImportWarning, match="lower bound"):
        trace = import_specbench(FIX / "specbench.jsonl")
    r81, r82 = trace.requests
    assert (r81.id, r82.id) == ("81:0", "82:0")
    assert r81.m.tolist() == Q81_M and r81.context.tolist() == Q81_CTX
    assert r82.m.tolist() == Q82_M and r82.context.tolist() == Q82_CTX
    assert r81.k.tolist() == [5] * 7 and r82.k.tolist() == [5] * 6  # max(6) - 1
    # tokens emitted = Σ accept_lengths (both turns)
    assert r81.tokens == 18 and r82.tokens == 18
    hdr = trace.header
    assert hdr["k_inferred"] is True and hdr["k_lower_bound"] == 5
    assert hdr["context_known"] is False and hdr["model"] == "vicuna-7b-v1.3-eagle-float16"
    out = tmp_path / "t.jsonl"
    write_trace(out, hdr, trace.requests)
    assert read_trace(out).requests[1].m.tolist() == Q82_M


def test_specbench_with_k(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceImportWarning)
        trace = import_specbench(FIX / "specbench.jsonl", k=8, policy="sparsespec", s=0.1)
    assert trace.header["k_inferred"] is False
    assert all(r.k.tolist() == [8] * r.iterations for r in trace.requests)
    assert trace.requests[0].policy == "sparsespec" and trace.requests[0].s == 0.1


def test_specbench_step_beyond_k(tmp_path):
    path = FIX / "specbench.jsonl"
    with pytest.raises(TraceError) as exc:
        import_specbench(path, k=4)
    where(exc, path, 2, "choices[0].accept_lengths[2]")


@pytest.mark.parametrize("choice, field", [
    ({"index": 0, "accept_lengths": [2, 0, 3]}, "choices[0].accept_lengths[1]"),
    ({"index": 0, "accept_lengths": [2, 1.5]}, "choices[0].accept_lengths[1]"),
    ({"index": 0, "new_tokens": [3]}, "choices[0].accept_lengths"),
])
def test_specbench_bad_choices(tmp_path, choice, field):
    p = jsonl(tmp_path, "s.jsonl", [{"question_id": 1, "model_id": "m", "choices": [choice]}])
    with pytest.raises(TraceError) as exc:
        import_specbench(p, k=4)
    where(exc, p, 1, field)


def test_specbench_several_choices(tmp_path):
    p = jsonl(tmp_path, "s.jsonl", [{"question_id": "q7", "choices": [
        {"index": 0, "accept_lengths": [1, 2]}, {"index": 1, "accept_lengths": [3]}]}])
    trace = import_specbench(p, k=2)
    assert [r.id for r in trace.requests] == ["q7:0", "q7:1"]
    assert trace.requests[1].m.tolist() == [2]


# --------------------------------------------------------------------------------------------
# detection and dispatch
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, fmt", [("vllm_metrics.prom", "vllm-metrics"),
                                       ("vllm_metrics_nonmonotone.prom", "vllm-metrics"),
                                       ("vllm_requests_histogram.jsonl", "vllm-requests"),
                                       ("vllm_requests_steps.jsonl", "vllm-requests"),
                                       ("specbench.jsonl", "specbench")])
def test_detect_fixture_formats(name, fmt):
    assert detect_format(FIX / name) == fmt


def test_detect_and_load_native(tmp_path):
    trace = import_vllm_requests(FIX / "vllm_requests_steps.jsonl")
    out = tmp_path / "native.jsonl"
    write_trace(out, trace.header, trace.requests)
    assert detect_format(out) == "specsim"
    back = load_trace(out)
    assert [r.context.tolist() for r in back.requests] == [[101, 105, 106, 109],
                                                           [21, 26, 31, 32, 34]]
    with pytest.raises(TraceError, match="only apply to imported"):
        load_trace(out, policy="vegas")


@pytest.mark.parametrize("text", ["hello world\n", '{"foo": 1}\n', "[1, 2]\n", "\n\n"])
def test_detect_unknown_lists_formats(tmp_path, text):
    p = write(tmp_path, "x.txt", text)
    with pytest.raises(TraceError) as exc:
        detect_format(p)
    for fmt in FORMATS:
        assert f"'{fmt}'" in str(exc.value)
    assert exc.value.path == str(p)


def test_load_dispatch_and_options(tmp_path):
    t = load_trace(FIX / "vllm_metrics.prom", policy="vegas")
    assert [h.counts.tolist() for h in t.histograms][0] == [300, 250, 200, 250]
    assert t.histograms[0].policy == "vegas"
    t = load_trace(FIX / "specbench.jsonl", k=6)
    assert t.requests[0].k.tolist() == [6] * 7
    with pytest.raises(TraceError, match="unknown trace format 'csv'") as exc:
        load_trace(FIX / "specbench.jsonl", format="csv")
    assert all(f"'{f}'" in str(exc.value) for f in FORMATS)
    # an explicit format overrides detection: a Prometheus dump is not JSON Lines
    with pytest.raises(TraceError, match="bad JSON") as exc:
        load_trace(FIX / "vllm_metrics.prom", format="specbench")
    assert exc.value.line == 1


def test_missing_file(tmp_path):
    p = tmp_path / "nope.prom"
    for fn in (detect_format, load_trace, import_vllm_metrics, import_vllm_requests,
               import_specbench):
        with pytest.raises(TraceError, match="no such file") as exc:
            fn(p)
        assert exc.value.path == str(p)


# --------------------------------------------------------------------------------------------
# properties: what each format's writer writes, its importer reads back
# --------------------------------------------------------------------------------------------

PROPERTY = settings(max_examples=40, deadline=None, database=None)


@contextmanager
def file_holding(content: str | bytes, name: str = "input"):
    """A temporary file with this content (hypothesis runs many examples per test call)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        yield path


def strict(call, *args, **kwargs):
    """The call's result, failing on any TraceImportWarning (a clean input warns of nothing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceImportWarning)
        return call(*args, **kwargs)


def quiet(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceImportWarning)
        return call(*args, **kwargs)


#: counts[m] = steps that accepted m of k drafts, for k = 1..6
histograms = st.integers(1, 6).flatmap(
    lambda k: st.lists(st.integers(0, 10**6), min_size=k + 1, max_size=k + 1)
).filter(lambda counts: sum(counts) > 0)


def metrics_dump(label_sets: list[list[int]], model: str = "m") -> str:
    """What vLLM's Prometheus client writes for one histogram per engine: per counter its HELP
    and TYPE lines, one sample per engine (per position for the survivals), a _created gauge."""
    lines = []
    for counter in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                    "num_accepted_tokens_per_pos"):
        name = f"vllm:spec_decode_{counter}"
        lines += [f"# HELP {name}_total Spec decode counter.", f"# TYPE {name}_total counter"]
        for engine, counts in enumerate(label_sets):
            k, labels = len(counts) - 1, f'model_name="{model}",engine="{engine}"'
            survival = [sum(counts[i + 1:]) for i in range(k)]   # steps that accepted > i
            samples = {"num_drafts": [("", sum(counts))],
                       "num_draft_tokens": [("", k * sum(counts))],
                       "num_accepted_tokens": [("", sum(survival))],
                       "num_accepted_tokens_per_pos": [(f',position="{i}"', v)
                                                       for i, v in enumerate(survival)]}
            lines += [f"{name}_total{{{labels}{extra}}} {float(v)}"
                      for extra, v in samples[counter]]
            lines.append(f"{name}_created{{{labels}}} 1.756736798733569e+09")
    return "\n".join(lines) + "\n"


@PROPERTY
@given(st.lists(histograms, min_size=1, max_size=3))
def test_metrics_dump_round_trips(label_sets):
    with file_holding(metrics_dump(label_sets)) as path:
        assert detect_format(path) == "vllm-metrics"
        trace = strict(load_trace, path)
    assert [h.counts.tolist() for h in trace.histograms] == label_sets
    assert [h.k for h in trace.histograms] == [len(c) - 1 for c in label_sets]
    assert [h.id for h in trace.histograms] == [f"engine={e},model_name=m"
                                                for e in range(len(label_sets))]
    assert trace.header["model"] == "m" and trace.requests == []


STAT_PLACES = ("metrics.speculative_decoding", "speculative_decoding", "spec_decode_metrics",
               "metrics", "")


@st.composite
def vllm_requests(draw):
    """(JSON object, expected record): one request's accepted drafts per step, reported the
    way one vLLM version does: a summary histogram, per-step lists (with or without the drafted
    lengths), or V0's survival counts; under any of the places vLLM puts them."""
    k = draw(st.integers(1, 6))
    accepted = draw(st.lists(st.integers(0, k), min_size=1, max_size=25))
    kind = draw(st.sampled_from(["summary", "per-step", "drafted", "v0"]))
    place = draw(st.sampled_from(("metrics",) if kind == "v0" else STAT_PLACES))
    prompt = draw(st.none() | st.integers(1, 10**5))
    steps, hist = len(accepted), np.bincount(accepted, minlength=k + 1).tolist()
    if kind == "v0":
        stats = {"spec_token_acceptance_counts":
                 [steps] + [sum(a >= i for a in accepted) for i in range(1, k + 1)]}
    else:
        stats = {"acceptance_histogram": hist, "num_spec_steps": steps,
                 "num_accepted_draft_tokens": sum(accepted), "num_spec_tokens": k,
                 "num_draft_tokens": k * steps}
    drafted = [k] * steps
    if kind == "per-step":
        stats["per_step_accepted"] = accepted
    if kind == "drafted":
        drafted = [draw(st.integers(max(a, 1), k)) for a in accepted]
        stats.update(per_step_accepted=accepted, per_step_drafted=drafted,
                     num_draft_tokens=sum(drafted))
    obj = {"model": "m"}
    if place:
        *parents, leaf = place.split(".")
        node = obj
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = stats
    else:
        obj.update(stats)
    if prompt is not None:
        obj.update(draw(st.sampled_from([{"usage": {"prompt_tokens": prompt}},
                                         {"prompt_len": prompt}])))
    if kind in ("summary", "v0"):
        return obj, ("histogram", k, hist)
    # context at step j: prompt + the prefill's token + Σ_{i<j} (m_i + 1)
    context = (prompt or 0) + 1 + np.concatenate(([0], np.cumsum(np.add(accepted, 1))[:-1]))
    return obj, ("request", drafted, accepted, context.tolist(), prompt is not None)


@PROPERTY
@given(st.lists(vllm_requests(), min_size=1, max_size=4), st.sampled_from(["id", "request_id"]))
def test_vllm_requests_round_trip(lines, id_key):
    objs = [{id_key: f"r{i}", **obj} for i, (obj, _) in enumerate(lines)]
    with file_holding("".join(json.dumps(o) + "\n" for o in objs)) as path:
        assert detect_format(path) == "vllm-requests"
        trace = strict(load_trace, path)
    want_requests = [(f"r{i}", *want[1:]) for i, (_, want) in enumerate(lines)
                     if want[0] == "request"]
    want_histograms = [(f"r{i}", *want[1:]) for i, (_, want) in enumerate(lines)
                       if want[0] == "histogram"]
    assert [(r.id, r.k.tolist(), r.m.tolist(), r.context.tolist(), want[-1])
            for r, want in zip(trace.requests, want_requests)] == want_requests
    assert len(trace.requests) == len(want_requests)
    assert [(h.id, h.k, h.counts.tolist()) for h in trace.histograms] == want_histograms
    assert trace.header["context_known"] == (bool(want_requests)
                                             and all(w[-1] for w in want_requests))


#: accept_lengths of every (question, choice): tokens each step emitted, 1..k+1
specbench_answers = st.integers(1, 6).flatmap(lambda k: st.tuples(st.just(k), st.lists(
    st.lists(st.lists(st.integers(1, k + 1), min_size=1, max_size=25), min_size=1, max_size=2),
    min_size=1, max_size=3)))


def specbench_file(questions) -> str:
    """Spec-Bench's answer lines: one per question, one choice per list of accept_lengths."""
    return "".join(json.dumps({"question_id": q, "model_id": "m", "choices": [
        {"index": c, "turns": ["..."], "new_tokens": [sum(lengths)], "wall_time": [0.1],
         "accept_lengths": lengths} for c, lengths in enumerate(choices)]}) + "\n"
        for q, choices in enumerate(questions))


@PROPERTY
@given(specbench_answers, st.booleans())
def test_specbench_round_trip(answers, k_given):
    k, questions = answers
    with file_holding(specbench_file(questions)) as path:
        assert detect_format(path) == "specbench"
        trace = quiet(load_trace, path, **({"k": k} if k_given else {}))
    every = [lengths for choices in questions for lengths in choices]
    k_used = k if k_given else max(1, max(max(lengths) for lengths in every) - 1)
    assert trace.header["k_inferred"] is not k_given
    assert [r.id for r in trace.requests] == [f"{q}:{c}" for q, choices in enumerate(questions)
                                             for c in range(len(choices))]
    for r, lengths in zip(trace.requests, every):
        assert r.m.tolist() == [n - 1 for n in lengths]          # the bonus token is not a draft
        assert r.k.tolist() == [k_used] * len(lengths)
        assert r.context.tolist() == (1 + np.concatenate(([0], np.cumsum(lengths)[:-1]))).tolist()
        assert r.tokens == sum(lengths)


# --------------------------------------------------------------------------------------------
# properties: corrupted input is a trace or one TraceError line, never a traceback
# --------------------------------------------------------------------------------------------


def native_file(k: int, questions) -> str:
    header = make_header(source="test", model="m")
    records = [RequestTrace(f"{q}:{c}", "vegas", 0.05, 1 + np.cumsum([0, *lengths[:-1]]),
                            np.full(len(lengths), k), np.asarray(lengths) - 1).to_json()
               for q, choices in enumerate(questions) for c, lengths in enumerate(choices)]
    return "".join(json.dumps(o) + "\n" for o in [header, *records])


valid_files = st.one_of(
    st.lists(histograms, min_size=1, max_size=2).map(metrics_dump),
    st.lists(vllm_requests(), min_size=1, max_size=3).map(
        lambda lines: "".join(json.dumps({"id": f"r{i}", **obj}) + "\n"
                              for i, (obj, _) in enumerate(lines))),
    specbench_answers.map(lambda answers: specbench_file(answers[1])),
    specbench_answers.map(lambda answers: native_file(*answers)))

#: what a corrupted number becomes
JUNK = ["-1", "1.5", "1e400", "NaN", "99999999999999999999", "true", '"x"', "null", "[]", "{}",
        "", "0", "-0.0", "1e+03"]
#: what a corrupted file gains
NOISE = ["{", "}", "[", "]", '"', ",", ":", "=", "\n", "#", "\\", "-", "0", "e", " ", "\xff"]


@st.composite
def corrupted(draw):
    """A valid file of any format after one to three edits: a number replaced by junk, a span
    deleted, a character inserted, a line doubled, the end cut off, bytes that are not UTF-8."""
    data = draw(valid_files).encode()
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["number", "delete", "insert", "double", "cut", "bytes"]))
        at = draw(st.integers(0, len(data)))
        if kind == "number":
            numbers = [m.span() for m in re.finditer(rb"-?\d+(\.\d+)?(e[+-]?\d+)?", data)]
            if numbers:
                a, b = draw(st.sampled_from(numbers))
                data = data[:a] + draw(st.sampled_from(JUNK)).encode() + data[b:]
        elif kind == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 20)):]
        elif kind == "insert":
            noise = draw(st.sampled_from(NOISE))
            data = data[:at] + (b"\xff" if noise == "\xff" else noise.encode()) + data[at:]
        elif kind == "double":
            lines = data.split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            data = b"\n".join(lines[:i + 1] + lines[i:])
        elif kind == "cut":
            data = data[:at]
        else:
            data = data[:at] + b"\xc3\x28" + data[at:]
    return data


@settings(max_examples=300, deadline=None, database=None)
@given(corrupted())
# a Spec-Bench answer timed with an overflowing literal: no measured rate is recorded
@example(b'{"question_id": 0, "model_id": "m", "choices": [{"index": 0, "turns": ["..."], '
         b'"new_tokens": [1], "wall_time": [1e400], "accept_lengths": [1]}]}\n')
@example(b'{"question_id": 0, "model_id": "m", "choices": [{"index": 0, "turns": ["..."], '
         b'"new_tokens": [1e400], "wall_time": [0.1], "accept_lengths": [1]}]}\n')
def test_corrupted_input_is_a_trace_or_one_line_naming_the_problem(data):
    lines = max(1, len(data.splitlines()))
    with file_holding(data) as path:
        try:
            trace = quiet(load_trace, path)
        except TraceError as exc:
            text = str(exc)
            assert "\n" not in text and exc.path == str(path) and text.startswith(f"{path}")
            assert exc.line is None or 1 <= exc.line <= lines
            assert exc.line is None or text.startswith(f"{path}:{exc.line}: ")
            assert exc.field is None or f"{exc.field}: " in text
            return
        # what an importer accepts is a valid native trace: written and read back unchanged
        out = path.with_name("native.jsonl")
        write_trace(out, trace.header, [*trace.requests, *trace.histograms])
        back = read_trace(out)
    assert [r.to_json() for r in back.requests] == [r.to_json() for r in trace.requests]
    assert [h.to_json() for h in back.histograms] == [h.to_json() for h in trace.histograms]


def test_load_trace_without_per_draft_fields_keeps_the_rest(tmp_path):
    path = tmp_path / "t.jsonl"
    rec = RequestTrace("r0", "vegas", 0.05, np.array([10, 14]), np.array([3, 3]),
                       np.array([3, 1]), entropy=[np.array([0.5, 1.0, 2.0])] * 2,
                       accept_prob=[np.array([0.9, 0.8, 0.1])] * 2, prompt_id="p0")
    write_trace(path, make_header(source="unit test"), [rec])
    full, lean = load_trace(path), load_trace(path, per_draft=False)
    assert [e.tolist() for e in full.requests[0].entropy] == [[0.5, 1.0, 2.0]] * 2
    r = lean.requests[0]
    assert r.entropy is None and r.accept_prob is None
    assert (r.context.tolist(), r.k.tolist(), r.m.tolist(), r.prompt_id) == \
        ([10, 14], [3, 3], [3, 1], "p0")
