"""Fuzzing of everything specsim reads: every case is either read or refused in one
SpecsimError line; no other exception escapes.

Two kinds: hypothesis strategies that build valid and broken traces, model configs, hardware
specs, vLLM metric dumps and vLLM per-request statistics; and mutations (truncation, byte flips, JSON type swaps and field
deletions, Prometheus value swaps) of every file in tests/fixtures/, the first lines of every
shipped trace, and the shipped model and hardware files, each read by every importer and by
the model, hardware and arrivals readers, and a sample of them through the commands that read
them (predict, costs: exit code, one error line, nothing written). The default run is capped
to a few seconds; ``pytest -m slow tests/test_fuzz_inputs.py`` runs the long one.
"""
import gzip
import json
import math
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seeding import seed
from specsim.costs.engine_profile import read_capture, read_profile
from specsim.analytical import MAX_K
from specsim.errors import SpecsimError
from specsim.shipped import shipped_root
from specsim.simulator.arrivals import from_file
from specsim.specs import load_hardware, load_model
from specsim.traces.acceptance import estimate_acceptance
from specsim.traces.importers import FORMATS, load_trace

FIXTURES = Path(__file__).parent / "fixtures"
SHORT, LONG = 40, 1500          # hypothesis examples per property: default run, long run
MUTATIONS_SHORT, MUTATIONS_LONG = 12, 300   # mutations of each kind per file
FAST = dict(deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                   HealthCheck.filter_too_much])


def read_or_refused(fn):
    """Call ``fn``: its result, or None when it raised a one-line SpecsimError."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return fn()
        except SpecsimError as e:
            text = str(e)
            assert text and "\n" not in text and len(text) < 1000, text
            return None


def every_reader(path: Path):
    """Read ``path`` with format detection, with each importer, as model and hardware files
    and as an arrivals file; each read or refused in one line."""
    results = {"auto": read_or_refused(lambda: load_trace(path))}
    for name in FORMATS:
        results[name] = read_or_refused(lambda: load_trace(path, format=name))
    results["model"] = read_or_refused(lambda: load_model(str(path)))
    results["hardware"] = read_or_refused(lambda: load_hardware(str(path)))
    results["capture"] = read_or_refused(lambda: read_capture(str(path)))
    results["profile"] = read_or_refused(lambda: read_profile(str(path)))
    results["arrivals"] = read_or_refused(lambda: from_file(str(path)))
    for name, trace in results.items():
        if name in FORMATS + ("auto",) and trace is not None:
            for group in trace.groups().values():
                est = read_or_refused(lambda: estimate_acceptance(group))
                if est is not None:
                    assert np.all(np.isfinite(est.expected_tokens))
    return results


# ---- mutations of shipped and fixture files --------------------------------------------------


def sources() -> list[tuple[str, bytes]]:
    """(name, bytes) of every fixture, the first 3 lines of every shipped trace, and the
    shipped model and hardware files."""
    out = [(p.name, p.read_bytes()) for p in sorted(FIXTURES.iterdir()) if p.is_file()]
    traces = shipped_root("traces")
    for p in sorted(traces.glob("*.jsonl")):
        with open(p, "rb") as fh:
            out.append((p.name, b"".join(fh.readline() for _ in range(3))))
    models = shipped_root("models")
    out += [(p.parent.name + "-config.json", p.read_bytes())
            for p in sorted(models.glob("*/config.json"))[:3]]
    out += [(p.name, p.read_bytes()) for p in sorted(models.glob("hardware/*.json"))[:2]]
    return out


SWAPS = [None, True, -1, 0, 2**70, 1e308, -0.5, "x", [], [1, "a"], {"a": 1}, [[]] * 3]


def json_mutations(raw: bytes, rng: np.random.Generator, n: int):
    """Type swaps and field deletions in the JSON objects of ``raw`` (a JSON file, or JSON
    Lines)."""
    text = raw.decode("utf-8", "replace")
    whole = text.strip().startswith("{") and "\n{" not in text.strip()
    docs = [text] if whole else text.splitlines()
    for _ in range(n):
        i = int(rng.integers(len(docs)))
        try:
            obj = json.loads(docs[i])
        except ValueError:
            continue
        paths = list(_paths(obj))
        if not paths:
            continue
        where = paths[int(rng.integers(len(paths)))]
        parent, key = _locate(obj, where)
        if isinstance(parent, dict) and rng.random() < 0.4:
            del parent[key]
        else:
            parent[key] = SWAPS[int(rng.integers(len(SWAPS)))]
        out = list(docs)
        out[i] = json.dumps(obj, indent=1 if whole else None)
        yield ("\n".join(out) + "\n").encode()


def _paths(obj, prefix=()):
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) \
        else ()
    for key, value in list(items)[:40]:
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))


def _locate(obj, path):
    for key in path[:-1]:
        obj = obj[key]
    return obj, path[-1]


PROM_VALUES = [b"NaN", b"+Inf", b"-1", b"1e400", b"abc", b"0", b"1.5", b"99999999999999999999",
               b'0 # {a="b"} 1', b""]


def byte_mutations(raw: bytes, rng: np.random.Generator, n: int):
    """Truncations, byte flips, deleted and repeated lines, and Prometheus value swaps."""
    lines = raw.split(b"\n")
    for _ in range(n):
        yield raw[:int(rng.integers(len(raw) + 1))]
        flipped = bytearray(raw)
        for at in rng.integers(len(raw), size=int(rng.integers(1, 4))):
            flipped[at] = int(rng.integers(256))
        yield bytes(flipped)
        i = int(rng.integers(len(lines)))
        yield b"\n".join(lines[:i] + lines[i + 1:])
        yield b"\n".join(lines[:i + 1] + lines[i:])
        if lines[i] and not lines[i].startswith(b"#") and b" " in lines[i]:
            head = lines[i].rsplit(b" ", 1)[0]
            swapped = head + b" " + PROM_VALUES[int(rng.integers(len(PROM_VALUES)))]
            yield b"\n".join(lines[:i] + [swapped] + lines[i + 1:])


def mutate_and_read(n: int, offset: int):
    rng = np.random.default_rng(seed(offset))
    with tempfile.TemporaryDirectory() as tmp:
        for name, raw in sources():
            cases = [*byte_mutations(raw, rng, n), *json_mutations(raw, rng, n)]
            for j, case in enumerate(cases):
                p = Path(tmp) / name
                p.write_bytes(case)
                every_reader(p)
                if j % 8 == 0:
                    gz = Path(tmp) / (name + ".gz")
                    gz.write_bytes(gzip.compress(case))
                    read_or_refused(lambda: load_trace(gz))


def test_mutations_of_every_fixture_and_shipped_file_are_read_or_refused_in_one_line():
    mutate_and_read(MUTATIONS_SHORT, 1)


def test_the_unmutated_sources_read_as_they_are():
    with tempfile.TemporaryDirectory() as tmp:
        for name, raw in sources():
            p = Path(tmp) / name
            p.write_bytes(raw)
            results = every_reader(p)
            if name.endswith(".jsonl") and "nonmonotone" not in name:
                assert results["auto"] is not None, name
            if name.endswith("config.json"):
                assert results["model"] is not None, name


# ---- hypothesis: traces ----------------------------------------------------------------------

ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                               max_size=4),
    max_leaves=12)


@st.composite
def request_records(draw, rid="r0"):
    n = draw(st.integers(1, 12))
    k = draw(st.lists(st.integers(1, MAX_K), min_size=n, max_size=n))
    m = [draw(st.integers(0, kk)) for kk in k]
    context = draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n))
    rec = {"type": "request", "id": rid, "policy": draw(st.sampled_from(["vegas", "quest", "x"])),
           "s": draw(st.none() | st.floats(0.001, 1.0)), "context": context, "k": k, "m": m}
    if draw(st.booleans()):
        rec["accept_prob"] = [[draw(st.floats(0, 1)) for _ in range(kk)] for kk in k]
    return rec


@st.composite
def histogram_records(draw, rid="h0"):
    k = draw(st.integers(1, MAX_K))
    counts = draw(st.lists(st.integers(0, 10**6), min_size=k + 1, max_size=k + 1)
                  .filter(lambda c: sum(c) > 0))
    return {"type": "histogram", "id": rid, "policy": "p", "s": None, "k": k, "counts": counts,
            "context": draw(st.none() | st.floats(1, 1e6))}


@st.composite
def valid_traces(draw):
    n = draw(st.integers(1, 4))
    records = [draw(request_records(f"r{i}") | histogram_records(f"h{i}")) for i in range(n)]
    return [{"specsim_trace": 1, "source": "fuzz"}, *records]


def write_lines(lines, suffix=".jsonl") -> str:
    fh = tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False)
    with fh:
        for x in lines:
            fh.write((x if isinstance(x, str) else json.dumps(x)) + "\n")
    return fh.name


def check_valid_trace(lines):
    path = write_lines(lines)
    trace = load_trace(path)
    got = {r.id: r.to_json() for r in (*trace.requests, *trace.histograms)}
    assert sorted(got) == sorted(x["id"] for x in lines[1:])
    for x in lines[1:]:
        g = got[x["id"]]
        assert g.get("k") == x["k"] and g.get("m") == x.get("m") and g.get("counts") == \
            x.get("counts")
    for group in trace.groups().values():
        est = estimate_acceptance(group)
        assert np.all((est.survival >= 0) & (est.survival <= 1))


@st.composite
def broken_traces(draw):
    lines = draw(valid_traces())
    i = draw(st.integers(0, len(lines) - 1))
    obj = lines[i]
    key = draw(st.sampled_from(sorted(obj)))
    if draw(st.booleans()):
        del obj[key]
    else:
        obj[key] = draw(ANY_JSON)
    text = [json.dumps(x, allow_nan=True) for x in lines]
    if draw(st.booleans()):
        j = draw(st.integers(0, len(text) - 1))
        text[j] = text[j][:draw(st.integers(0, len(text[j])))]
    return text


def check_broken_trace(text):
    path = write_lines(text)
    read_or_refused(lambda: load_trace(path))
    for name in FORMATS:
        read_or_refused(lambda: load_trace(path, format=name))


# ---- hypothesis: model configs and hardware specs --------------------------------------------

SIZE = st.integers(-3, 300) | st.sampled_from([10**400, 2**31, 1e300, 0.5, "8", None, True])


@st.composite
def configs(draw):
    keys = ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "num_hidden_layers", "intermediate_size", "vocab_size", "num_experts",
            "num_experts_per_tok", "sliding_window", "max_position_embeddings"]
    cfg = {key: draw(SIZE) for key in keys if draw(st.integers(0, 5))}
    cfg["model_type"] = draw(st.sampled_from(["llama", "qwen3", "qwen2", "gpt_oss", "qwen3_moe"]))
    if draw(st.booleans()):
        cfg["layer_types"] = draw(st.lists(st.sampled_from(["full_attention",
                                                            "sliding_attention", "x"]),
                                           max_size=6))
    return cfg


def check_config(cfg):
    path = write_lines([json.dumps(cfg, allow_nan=True)], ".json")
    spec = read_or_refused(lambda: load_model(path))
    if spec is not None:
        assert spec.num_heads % spec.num_kv_heads == 0 and spec.head_dim >= 1
        assert spec.param_count() > 0 and spec.kv_bytes_per_token > 0
        assert spec.weight_bytes_per_forward(4) > 0


NUMBER = (st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 10**7)
          | st.sampled_from([None, "1", True, 10**400]))


@st.composite
def hardware_specs(draw):
    keys = ["memory_bandwidth_TBps", "bf16_dense_TFLOPs", "memory_GB", "interconnect_GBps"]
    spec = {key: draw(NUMBER) for key in keys if draw(st.integers(0, 6))}
    if draw(st.booleans()):
        spec["measured"] = {"memory_bandwidth_TBps": draw(NUMBER), "bf16_TFLOPs": draw(NUMBER)}
    if draw(st.booleans()):
        spec["overheads_s"] = {draw(st.sampled_from(["forward", "iteration", "x"])): draw(NUMBER)}
    return spec


def check_hardware(spec):
    path = write_lines([json.dumps(spec, allow_nan=True)], ".json")
    hw = read_or_refused(lambda: load_hardware(path))
    if hw is not None:
        for value in (hw.bandwidth, hw.flops, hw.memory_bytes, hw.interconnect_bandwidth):
            assert math.isfinite(value) and value > 0


# ---- hypothesis: vLLM metric dumps -----------------------------------------------------------


@st.composite
def metric_dumps(draw):
    """Counters of one or two label sets, consistent or not, written in varied notations."""
    lines = ["# HELP vllm:spec_decode_num_drafts_total Number of drafts.",
             "# TYPE vllm:spec_decode_num_drafts_total counter"]
    expected = {}
    for engine in range(draw(st.integers(1, 2))):
        labels = f'model_name="m",engine="{engine}"'
        k = draw(st.integers(1, 8))
        drafts = draw(st.integers(0, 10**6))
        survival = sorted(draw(st.lists(st.integers(0, max(drafts, 1)), min_size=k,
                                        max_size=k)), reverse=True)
        if draw(st.integers(0, 4)) == 0:   # sometimes not monotone
            survival = draw(st.permutations(survival))
        accepted = sum(survival) + draw(st.sampled_from([0, 0, 0, 1, -1]))
        draft_tokens = k * drafts - draw(st.sampled_from([0, 0, 1, -1, k * drafts]))

        def num(v):
            return draw(st.sampled_from([str(v), f"{float(v)}", f"{float(v):e}"]))
        lines.append(f"vllm:spec_decode_num_drafts_total{{{labels}}} {num(drafts)}")
        lines.append(f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {num(draft_tokens)}")
        lines.append(f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {num(accepted)}")
        for i, v in enumerate(survival):
            exemplar = ' # {trace_id="t"} 1.0' if draw(st.booleans()) else ""
            lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},'
                         f'position="{i}"}} {num(v)}{exemplar}')
        expected[engine] = (drafts, survival, accepted, draft_tokens)
    if draw(st.booleans()):
        lines.append("# EOF")
    return "\n".join(lines) + "\n", expected


def check_metric_dump(dump):
    text, expected = dump
    path = write_lines([text], ".prom")
    trace = read_or_refused(lambda: load_trace(path))
    if trace is None:
        return
    for h in trace.histograms:
        engine = int(h.id.split("engine=")[1].split(",")[0])
        drafts, survival, accepted, draft_tokens = expected[engine]
        assert int(h.counts.sum()) == drafts and np.all(h.counts >= 0)
        assert accepted <= draft_tokens
        assert int(h.counts @ np.arange(h.k + 1)) == sum(survival)


# ---- hypothesis: vLLM per-request statistics -------------------------------------------------

SMALL = st.lists(st.integers(0, 12), max_size=10)
STAT_VALUES = {"acceptance_histogram": SMALL, "per_step_accepted": SMALL,
               "per_step_drafted": SMALL, "spec_token_acceptance_counts": SMALL,
               "num_spec_steps": st.integers(0, 50), "num_spec_tokens": st.integers(0, 70),
               "num_accepted_draft_tokens": st.integers(0, 200),
               "num_draft_tokens": st.integers(0, 500), "prompt_len": st.integers(0, 10**6)}


@st.composite
def request_statistics(draw):
    """Lines of per-request statistics: plausible fields, sometimes of the wrong type, at one
    of the places the importer looks."""
    lines = []
    for i in range(draw(st.integers(1, 3))):
        stats = {key: draw(strategy | ANY_JSON if draw(st.integers(0, 6)) == 0 else strategy)
                 for key, strategy in STAT_VALUES.items() if draw(st.booleans())}
        place = draw(st.sampled_from([(), ("metrics",), ("metrics", "speculative_decoding"),
                                      ("spec_decode_metrics",)]))
        line = stats
        for key in reversed(place):
            line = {key: line}
        lines.append({"request_id": f"q{i}", **line})
    return lines, draw(st.none() | st.integers(-1, 70))


def check_request_statistics(case):
    lines, k = case
    path = write_lines(lines)
    for options in ({}, {"k": k}):
        trace = read_or_refused(lambda: load_trace(path, format="vllm-requests", **options))
        if trace is not None:
            for r in trace.requests:
                assert np.all(r.m <= r.k) and np.all(r.k <= MAX_K)
            for h in trace.histograms:
                assert h.counts.size == h.k + 1 <= MAX_K + 1
    read_or_refused(lambda: load_trace(path))


CASES = [(valid_traces(), check_valid_trace), (broken_traces(), check_broken_trace),
         (request_statistics(), check_request_statistics),
         (configs(), check_config), (hardware_specs(), check_hardware),
         (metric_dumps(), check_metric_dump)]


@pytest.mark.parametrize("strategy, check", CASES, ids=[c.__name__ for _, c in CASES])
def test_generated_inputs_are_read_or_refused_in_one_line(strategy, check):
    settings(max_examples=SHORT, **FAST)(given(strategy)(check))()


# ---- the same mutations through the commands ------------------------------------------------
#: Commands a mutated file goes through: (its role, the arguments around its path).
COMMANDS = [("trace", ["predict", "--batch", "4", "--k-max", "4", "--bootstrap", "50",
                       "--policy", "vegas", "--sparsity", "0.05", "--context", "4096",
                       "--json", "--trace"]),
            ("model", ["costs", "--batch", "2", "--context", "4096", "--model"]),
            ("hardware", ["costs", "--batch", "2", "--context", "4096", "--hardware"])]


def run_command(args) -> tuple[int, str]:
    """(exit code, stderr) of ``main(args)`` in this process, its output discarded."""
    import contextlib
    import io

    from specsim.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main([str(a) for a in args])
    return code, err.getvalue()


def mutate_through_commands(n: int, offset: int) -> int:
    """Each mutated source through every command of its role: exit 0, or 1/2 with one
    ``specsim: error:`` line and no traceback; nothing written beside it. Returns the cases."""
    rng = np.random.default_rng(seed(offset))
    cases = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, raw in sources():
            role = "model" if name.endswith("-config.json") else \
                "hardware" if name.endswith(".json") and b"bandwidth" in raw else "trace"
            mutated = [*byte_mutations(raw, rng, n), *json_mutations(raw, rng, n)]
            folder = Path(tmp) / f"{name}.d"
            folder.mkdir()
            for case in mutated[:: max(1, len(mutated) // (2 * n))]:
                p = folder / name
                p.write_bytes(case)
                for command_role, args in COMMANDS:
                    if command_role != role:
                        continue
                    code, err = run_command(args + [p])
                    cases += 1
                    assert code in (0, 1, 2) and "Traceback" not in err, (name, code, err)
                    if code:
                        errors = [x for x in err.splitlines()
                                  if not x.startswith("specsim: note: ")]
                        assert len(errors) == 1 and errors[0].startswith("specsim: error: "), \
                            (name, err)
                    assert sorted(q.name for q in folder.iterdir()) == [name], name
                    assert p.read_bytes() == case, name
    return cases


def test_mutated_files_through_the_commands_exit_cleanly_and_write_nothing():
    assert mutate_through_commands(2, 3) >= 20


@pytest.mark.slow
def test_long_fuzzing(request):
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("the long fuzzing run is selected with -m slow")
    for strategy, check in CASES:
        settings(max_examples=LONG, **FAST)(given(strategy)(check))()
    mutate_and_read(MUTATIONS_LONG, 2)
    mutate_through_commands(20, 4)
