"""Bad input through `specsim.cli.main.main`: every case ends in one `specsim: error:` line on
stderr with exit status 1 (bad data) or 2 (bad usage), no traceback, within 30 s, and leaves
its input files byte for byte as they were; outputs are checked before any work starts."""
import io
import json
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from specsim.cli.main import main
from specsim.shipped import shipped_file
from specsim.traces.format import RequestTrace, make_header, write_trace

FIXTURES = Path(__file__).parent / "fixtures"
#: Python that runs the CLI with torch and triton made unimportable.
WITHOUT_GPU_PACKAGES = """
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Missing())
from specsim.cli.main import main
code = main(sys.argv[1:])
sys.exit(code if "torch" not in sys.modules and "triton" not in sys.modules else 99)
"""


def run(args):
    """(exit code, stdout, stderr, seconds) of ``main(args)`` in this process."""
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - started


def run_process(args, stdin: bytes | None = None, script: str | None = None):
    """(exit code, stdout, stderr) of the CLI in a new interpreter."""
    command = [sys.executable, "-c", script or "import sys; from specsim.cli.main import "
               "main; sys.exit(main(sys.argv[1:]))", *map(str, args)]
    env = {k: v for k, v in os.environ.items() if k != "SPECSIM_DEBUG"}
    proc = subprocess.run(command, input=stdin, capture_output=True, timeout=120, env=env)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def assert_one_line_error(code, err, expected_code, says="", notes=False):
    """One ``specsim: error:`` line (after ``specsim: note:`` lines where ``notes``)."""
    assert code == expected_code, err
    lines = err.splitlines()
    if notes:
        lines = [line for line in lines if not line.startswith("specsim: note: ")]
    assert len(lines) == 1 and lines[0].startswith("specsim: error: "), err
    assert err.endswith("\n") and "Traceback" not in err and "\x1b" not in err
    assert says in err, err


def small_trace(path: Path, k: int = 3, model: str | None = "smollm2-135m") -> Path:
    rng = np.random.default_rng(0)
    records = []
    for j in range(6):
        m = rng.integers(0, k + 1, 12)
        records.append(RequestTrace(f"vegas-{j}", "vegas", 0.05,
                                    1000 + np.concatenate([[0], np.cumsum(m + 1)[:-1]]),
                                    np.full(12, k), m, prompt_id=f"p{j}"))
    write_trace(path, make_header(source="test", model=model), records)
    return path


@pytest.fixture
def trace(tmp_path):
    return small_trace(tmp_path / "trace.jsonl")


def unchanged_after(paths, args):
    """Run ``args``; assert each of ``paths`` kept its bytes; return (code, out, err)."""
    before = {p: Path(p).read_bytes() for p in paths}
    code, out, err, seconds = run(args)
    assert seconds < 30
    for p, data in before.items():
        assert Path(p).read_bytes() == data, f"{p} changed"
    return code, out, err


# --------------------------------------------------------------------------------------------
# bad usage: exit 2
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["predict", "--k-max", "100000"], "--k-max"),
    (["dashboard", "--k-max", "100000"], "--k-max"),
    (["costs", "--context", "nan"], "--context"),
    (["costs", "--context", "1e400"], "--context"),
    (["predict", "--context", "nan"], "--context"),
    (["predict", "--holdout", "1.5"], "--holdout"),
    (["predict", "--alpha", "0.5"], "--gamma"),
])
def test_bad_options_are_one_line_usage_errors(args, says):
    code, out, err, seconds = run(args)
    assert_one_line_error(code, err, 2, says)
    assert seconds < 30 and out == ""


def test_an_unwritable_output_is_refused_before_any_work(tmp_path, trace):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for out in (blocker / "page.html", tmp_path):           # under a file; a folder
        code, _, err = unchanged_after([trace], ["dashboard", "--trace", trace, "--out", out])
        assert_one_line_error(code, err, 2, "--out")
    code, _, err = unchanged_after([trace], ["simulate", "--trace", trace, "--chrome-trace",
                                             blocker / "events.json"])
    assert_one_line_error(code, err, 2, "--chrome-trace")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "trace.jsonl"]


def _same_file_as(kind: str, target: Path) -> Path:
    if kind == "path":
        return target
    other = target.with_name(f"{kind}-of-{target.name}")
    (os.symlink if kind == "symlink" else os.link)(target, other)
    return other


@pytest.mark.parametrize("kind", ["path", "symlink", "hard link"])
def test_an_output_onto_an_input_is_refused(tmp_path, trace, kind):
    onto = _same_file_as(kind, trace)
    code, _, err = unchanged_after([trace], ["simulate", "--trace", trace, "--chrome-trace",
                                             onto])
    assert_one_line_error(code, err, 2, "is an input of this command")
    code, _, err = unchanged_after([trace], ["dashboard", "--trace", trace, "--out", onto])
    assert_one_line_error(code, err, 2, "is an input of this command")
    code, _, err = unchanged_after([trace], ["validate", "plan", "--trace", trace, "--out", onto,
                                             "--force"])
    assert_one_line_error(code, err, 2, "is an input of this command")


@pytest.mark.parametrize("kind", ["path", "symlink", "hard link"])
def test_validate_outputs_never_replace_the_plan_or_measurements(tmp_path, kind):
    plan, measured = tmp_path / "plan.json", tmp_path / "measured.json"
    plan.write_bytes(Path(shipped_file("models/validation/h200-qwen3-8b-plan.json")).read_bytes())
    measured.write_bytes(
        Path(shipped_file("models/validation/h200-qwen3-8b-measured.json")).read_bytes())
    for target in (plan, measured):
        onto = _same_file_as(kind, target)
        code, _, err = unchanged_after([plan, measured], [
            "validate", "report", "--plan", plan, "--measured", measured, "--markdown", onto])
        assert_one_line_error(code, err, 2, "--markdown")
    code, _, err = unchanged_after([measured], ["validate", "merge", measured, "--out",
                                                _same_file_as("path", measured)])
    assert_one_line_error(code, err, 2, "--out")


# --------------------------------------------------------------------------------------------
# bad data: exit 1
# --------------------------------------------------------------------------------------------


def test_escape_sequences_in_user_data_are_never_printed_raw(tmp_path):
    evil = "\x1b[2J\x1b]0;owned\x07model\u202e"
    trace = small_trace(tmp_path / "trace.jsonl", model=evil)
    code, out, err = unchanged_after([trace], ["predict", "--trace", trace, "--model", evil])
    assert_one_line_error(code, err, 1, "\\x1b[2J")
    code, out, err = unchanged_after([trace], ["predict", "--trace", trace, "--bootstrap",
                                               "50"])
    assert code == 0, err
    for text in (out, err):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    missing = tmp_path / "no\x1b[31msuch.jsonl"
    code, _, err, _ = run(["predict", "--trace", missing])
    assert_one_line_error(code, err, 1, "no\\x1b[31msuch.jsonl")


def test_a_missing_trace_is_bad_data(tmp_path):
    code, _, err, _ = run(["predict", "--trace", tmp_path / "none.jsonl"])
    assert_one_line_error(code, err, 1, "none.jsonl")


def test_validate_report_without_a_plan_says_what_to_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err, _ = run(["validate", "report"])
    assert_one_line_error(code, err, 1, "specsim validate plan")
    assert "models/validation/h200-qwen3-8b-plan.json" in err


# --------------------------------------------------------------------------------------------
# inputs that are streams
# --------------------------------------------------------------------------------------------


def test_a_trace_on_stdin_predicts_as_the_file_does(trace):
    args = ["predict", "--bootstrap", "50", "--json"]
    code, out, err = run_process(args + ["--trace", "-"], stdin=trace.read_bytes())
    assert code == 0, err
    piped = json.loads(out)
    code, out, err = run_process(args + ["--trace", "/dev/stdin"], stdin=trace.read_bytes())
    assert code == 0, err
    device = json.loads(out)
    expected = json.loads(run(args + ["--trace", trace])[1])
    for got, name in ((piped, "<stdin>"), (device, "/dev/stdin")):
        assert got.pop("trace") == name
        assert got == {k: v for k, v in expected.items() if k != "trace"}


def test_an_empty_stdin_is_one_line(tmp_path):
    code, _, err = run_process(["predict", "--trace", "-"], stdin=b"")
    assert_one_line_error(code, err, 1, "<stdin>")
    assert "specsim-stdin" not in err


# --------------------------------------------------------------------------------------------
# without torch and triton
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, command", [
    (["run"], "specsim run"),
    (["trace", "--out", "{tmp}/t.jsonl"], "specsim trace"),
    (["models", "fetch"], "specsim models fetch"),
    (["validate", "--gpu", "--plan", "{tmp}/plan.json", "--out", "{tmp}/m.json"],
     "specsim validate --gpu"),
])
def test_gpu_commands_without_torch_say_what_to_install(tmp_path, args, command):
    code, out, err = run_process([a.format(tmp=tmp_path) for a in args],
                                 script=WITHOUT_GPU_PACKAGES)
    assert_one_line_error(code, err, 1, command)
    assert 'pip install "specsim[gpu]"' in err and "CUDA build of torch" in err


def test_plans_and_reports_need_neither_torch_nor_triton(tmp_path):
    """The shipped setups (forced and free-running) with every policy: one s and one k each."""
    plan = tmp_path / "plan.json"
    code, out, err = run_process(["validate", "plan", "--out", plan, "--s", "0.1", "--k-forced",
                                  "2", "--k-free", "2"], script=WITHOUT_GPU_PACKAGES)
    assert code == 0, err
    setups = json.loads(plan.read_text())["setups"]
    assert {s["setup"]["mode"] for s in setups} == {"forced", "free"}
    code, out, err = run_process(["validate", "report", "--plan",
                                  "models/validation/h200-qwen3-8b-plan.json", "--json"],
                                 script=WITHOUT_GPU_PACKAGES)
    assert code == 0, err
    assert json.loads(out)["setups"]


# --------------------------------------------------------------------------------------------
# bad data read by the importers and specs
# --------------------------------------------------------------------------------------------

def _huge_k_trace(path: Path) -> Path:
    record = {"type": "request", "id": "a", "policy": "vegas", "s": 0.05,
              "context": [100, 200], "k": [10**6, 10**6], "m": [3, 5]}
    path.write_text(json.dumps(make_header(source="test")) + "\n" + json.dumps(record) + "\n")
    return path


def _accepted_over_drafted(path: Path) -> Path:
    text = (FIXTURES / "vllm_metrics.prom").read_text()
    lines = []
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode_num_accepted_tokens_total"):
            name, value = line.rsplit(" ", 1)
            line = f"{name} {float(value) * 1000:.1f}"
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    return path


def _negative_hidden_size(path: Path) -> Path:
    config = json.loads(Path(shipped_file("models/smollm2-135m/config.json")).read_text())
    config["hidden_size"] = -576
    path.write_text(json.dumps(config))
    return path


def _bad_byte_on_line_4(path: Path, trace: Path) -> Path:
    lines = trace.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3][:10] + b"\xff\xfe" + lines[3][10:]
    path.write_bytes(b"".join(lines))
    return path


def test_a_trace_with_a_huge_k_is_one_line(tmp_path):
    path = _huge_k_trace(tmp_path / "huge.jsonl")
    code, _, err = unchanged_after([path], ["predict", "--trace", path, "--bootstrap", "50"])
    assert_one_line_error(code, err, 1)


def test_more_accepted_than_drafted_is_refused(tmp_path):
    path = _accepted_over_drafted(tmp_path / "metrics.prom")
    code, _, err = unchanged_after([path], ["predict", "--trace", path])
    assert_one_line_error(code, err, 1, "accepted")


def test_a_negative_hidden_size_is_one_line(tmp_path):
    path = _negative_hidden_size(tmp_path / "config.json")
    code, _, err = unchanged_after([path], ["costs", "--model", path])
    assert_one_line_error(code, err, 1, "hidden_size")


def test_tune_without_sparse_groups_is_one_line(tmp_path):
    path = FIXTURES / "specbench.jsonl"
    code, _, err = unchanged_after([path], ["tune", "--trace", path, "--workers", "1"])
    assert_one_line_error(code, err, 1, "no sparse groups", notes=True)


def test_a_bad_byte_on_line_4_is_reported_at_line_4(tmp_path, trace):
    path = _bad_byte_on_line_4(tmp_path / "bad.jsonl", trace)
    code, _, err = unchanged_after([path], ["predict", "--trace", path])
    assert_one_line_error(code, err, 1, f"{path}:4")


def _edit_record(trace: Path, old: str, new: str) -> str:
    header, record, *_ = trace.read_text().splitlines()
    assert old in record
    return f"{header}\n{record.replace(old, new, 1)}\n"


@pytest.mark.parametrize("name, content, says", [
    ("nan", lambda t: _edit_record(t, '"s":0.05', '"s":NaN'), "NaN"),
    ("infinity", lambda t: _edit_record(t, '"context":[1000', '"context":[Infinity'),
     "Infinity"),
    ("huge integer", lambda t: _edit_record(t, '"context":[1000', '"context":[1' + "0" * 400),
     "401 digits"),
    ("duplicate key", lambda t: _edit_record(t, '"s":0.05', '"s":0.05,"s":0.07'),
     "duplicate key"),
    ("deep nesting", lambda t: t.read_text().splitlines()[0] + "\n" + "[" * 100000 + "\n",
     ":2:"),
    ("truncated", lambda t: t.read_text()[: len(t.read_text()) // 2], "bad JSON"),
])
def test_malformed_trace_content_is_one_line(tmp_path, trace, name, content, says):
    path = tmp_path / "bad.jsonl"
    path.write_text(content(trace))
    code, out, err = unchanged_after([path], ["predict", "--trace", path, "--bootstrap", "50"])
    assert_one_line_error(code, err, 1, says)
    assert out == ""


def test_unusual_but_valid_traces_are_read(tmp_path, trace):
    expected = json.loads(run(["predict", "--trace", trace, "--bootstrap", "50", "--json"])[1])
    for name, data in (("bom", b"\xef\xbb\xbf" + trace.read_bytes()),
                       ("crlf", trace.read_bytes().replace(b"\n", b"\r\n"))):
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(data)
        code, out, err, _ = run(["predict", "--trace", path, "--bootstrap", "50", "--json"])
        assert code == 0, err
        got = json.loads(out)
        assert got.pop("trace") == str(path)
        assert got == {k: v for k, v in expected.items() if k != "trace"}
