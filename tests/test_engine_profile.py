"""Engine profiles: captures of a server's metrics read as time per step, the fit recovering
planted per-phase parameters, its answer at batch/context mixes other than the fit's, one-line
refusals of bad captures, the live capture protocol against a server on 127.0.0.1, and the
commands that fit and apply a profile."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from specsim.costs import make_cost_model
from specsim.costs.engine_profile import (ProfileError, ProfiledCostModel, fit_profile,
                                          read_capture, read_profile)
from specsim.specs import load_hardware, load_model

PLANTED = dict(a_plain=1.6, b_plain=0.9e-3, a_draft=1.3, a_verify=1.8, b_iter=1.4e-3)
MODEL = "qwen3-8b"


@pytest.fixture(scope="module")
def base():
    got = make_cost_model(load_model(MODEL), load_hardware("h200"), 1, "auto")
    return got[0] if isinstance(got, tuple) else got


def planted_step(base, b, c, spec):
    ctx = [c] * b
    if spec is None:
        return PLANTED["a_plain"] * base.plain_step(ctx).seconds + PLANTED["b_plain"]
    it = base.iteration(ctx, spec["k"], spec["s"], spec["policy"])
    return (PLANTED["a_draft"] * it.draft.seconds + PLANTED["a_verify"] * it.verify.seconds
            + it.selection.seconds + PLANTED["b_iter"])


def metrics(engine, itl_sum, itl_count, drafts=0.0, accepted=0.0, length=None,
            name="inter_token_latency_seconds"):
    """A metrics text split over two label sets (two engines / ranks), as servers expose."""
    lines = [f"# HELP {engine}:{name} inter-token latency", f"# TYPE {engine}:{name} histogram"]
    for part, share in (("0", 0.4), ("1", 0.6)):
        lab = f'{{engine="{part}",model_name="m"}}'
        lines += [f"{engine}:{name}_sum{lab} {itl_sum * share!r}",
                  f"{engine}:{name}_count{lab} {itl_count * share!r}"]
        if engine == "vllm":
            lines += [f"vllm:spec_decode_num_drafts_total{lab} {drafts * share!r}",
                      f"vllm:spec_decode_num_accepted_tokens_total{lab} {accepted * share!r}"]
    if length is not None:
        lines.append(f'sglang:spec_accept_length{{tp_rank="0"}} {length!r}')
    return "\n".join(lines) + "\n"


def run_doc(base, engine, b, c, out, spec=None, tau=1.0):
    step = planted_step(base, b, int(c + out / 2), spec)   # at the run's mean context
    count = 10.0 * b * (out - 1)
    itl = step / tau
    drafts = count / tau
    before = metrics(engine, 5.0, 100.0, 50.0, 20.0)
    after = metrics(engine, 5.0 + itl * count, 100.0 + count, 50.0 + drafts,
                    20.0 + drafts * (tau - 1), length=tau if spec else None)
    return {"concurrency": b, "input_tokens": c, "output_tokens": out,
            "speculative": None if spec is None else {"drafter": "sparse-self", **spec},
            "before": before, "after": after}


PLAIN_SHAPES = [(1, 2000), (4, 2000), (16, 6000), (8, 30000)]
SPEC_RUNS = [((2, 4000), 2, 2.2), ((8, 4000), 4, 3.1), ((4, 16000), 8, 4.0),
             ((16, 8000), 4, 2.9), ((1, 30000), 2, 2.5)]


def write_capture(tmp_path, base, engine="vllm", name="cap.json", runs=None):
    if runs is None:
        runs = [run_doc(base, engine, b, c, 200) for b, c in PLAIN_SHAPES]
        runs += [run_doc(base, engine, b, c, 200,
                         {"policy": "vegas", "s": 0.05, "k": k}, tau)
                 for (b, c), k, tau in SPEC_RUNS]
    doc = {"specsim_server_capture": 1, "engine": engine, "engine_version": "0.34.0",
           "model": "Qwen/Qwen3-8B", "gpu": "NVIDIA H200", "runs": runs}
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_fit_recovers_the_planted_profile(tmp_path, base, engine):
    cap = read_capture(write_capture(tmp_path, base, engine))
    assert [r.concurrency for r in cap.runs][:4] == [b for b, _ in PLAIN_SHAPES]
    spec = cap.runs[5]
    assert spec.tokens_per_iteration == pytest.approx(3.1)
    profile = fit_profile([cap], base, "test")
    assert profile.plain_scale == pytest.approx(PLANTED["a_plain"], rel=1e-6)
    assert profile.plain_fixed_s == pytest.approx(PLANTED["b_plain"], rel=1e-5)
    assert profile.draft_scale == pytest.approx(PLANTED["a_draft"], rel=1e-6)
    assert profile.verify_scale == pytest.approx(PLANTED["a_verify"], rel=1e-6)
    assert profile.iteration_fixed_s == pytest.approx(PLANTED["b_iter"], rel=1e-5)
    assert profile.notes == ()


def test_the_profile_answers_at_shapes_the_fit_never_saw(tmp_path, base):
    profile = fit_profile([read_capture(write_capture(tmp_path, base))], base, "test")
    adjusted = ProfiledCostModel(base, profile)
    for b, c in ((32, 12000), (2, 60000), (64, 1024)):
        assert adjusted.plain_step([c] * b).seconds == pytest.approx(
            planted_step(base, b, c, None), rel=1e-6)
        for k in (3, 6):
            spec = {"policy": "sparsespec", "s": 0.05, "k": k}
            it = adjusted.iteration([c] * b, k, 0.05, "sparsespec")
            assert it.seconds == pytest.approx(planted_step(base, b, c, spec), rel=1e-6)
            assert any("adjusted to the vllm 0.34.0 profile" in n for n in it.verify.notes)


def test_one_speculative_shape_gets_one_scale_and_says_so(tmp_path, base):
    runs = [run_doc(base, "vllm", b, c, 200) for b, c in PLAIN_SHAPES]
    runs += [run_doc(base, "vllm", 8, 4000, 200, {"policy": "vegas", "s": 0.05, "k": 4}, 3.0)]
    profile = fit_profile([read_capture(write_capture(tmp_path, base, runs=runs))], base, "t")
    assert profile.draft_scale == profile.verify_scale
    assert any("one scale for draft and verify" in n for n in profile.notes)
    runs = [run_doc(base, "vllm", 4, 2000, 200)]
    profile = fit_profile([read_capture(write_capture(tmp_path, base, runs=runs))], base, "t")
    assert profile.plain_fixed_s == 0.0 and profile.draft_scale is None
    assert any("a scale alone" in n for n in profile.notes)


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.update(engine="tgi"), "engine: expected one of vllm, sglang"),
    (lambda d: d["runs"][0].update(concurrency=0), "concurrency: expected an integer ≥ 1"),
    (lambda d: d["runs"][0].update(concurrency=float("nan")), "concurrency: expected an int"),
    (lambda d: d["runs"][4]["speculative"].update(k=float("inf")), "k: expected an integer"),
    (lambda d: d["runs"][0].update(after=d["runs"][0]["after"].replace(
        "inter_token_latency", "other")), "no inter-token latency histogram"),
    (lambda d: d["runs"][0].update(before=d["runs"][0]["after"],
                                   after=d["runs"][0]["before"]), "fell during the run"),
    (lambda d: d["runs"][4]["speculative"].update(k=1), "more than k + 1"),
    (lambda d: d["runs"][4]["speculative"].update(policy="magic"), "names its policy"),
    (lambda d: d["runs"][4].update(speculative={"drafter": "wizard", "k": 2}), "kind must be"),
    (lambda d: d["runs"][0].update(after="vllm:x{ 1"), "run 1: after"),
    (lambda d: d.pop("specsim_server_capture"), "not a specsim server capture"),
])
def test_bad_captures_are_refused_in_one_line(tmp_path, base, mutate, words):
    doc = json.loads(open(write_capture(tmp_path, base)).read())
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=words.replace("+", r"\+")) as err:
        read_capture(str(path))
    assert "\n" not in str(err.value)


class _FakeServer(BaseHTTPRequestHandler):
    """/metrics (counters that grow with every completion), /v1/models, /v1/completions."""

    state = {"count": 0, "inflight": 0, "most": 0, "bodies": []}
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def _send(self, body: str, kind="application/json"):
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/metrics":
            n = self.state["count"]
            return self._send(metrics("vllm", 0.01 * 255 * n, 255.0 * n), "text/plain")
        if self.path == "/v1/models":
            return self._send(json.dumps({"data": [{"id": "Qwen/Qwen3-8B"}]}))
        self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.state["inflight"] += 1
            self.state["most"] = max(self.state["most"], self.state["inflight"])
            self.state["bodies"].append(body)
        time.sleep(0.05)
        with self.lock:
            self.state["inflight"] -= 1
            self.state["count"] += 1
        self._send(json.dumps({"choices": [{"text": "x"}]}))


def test_the_live_capture_keeps_the_concurrency_and_the_protocol(tmp_path):
    from specsim.costs.server_capture import capture
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        written = []
        doc = capture(url, [(3, 64), (1, 32)], 256, None, write=lambda d: written.append(
            len(d["runs"])))
    finally:
        server.shutdown()
    state = _FakeServer.state
    assert state["most"] == 3 and len(state["bodies"]) == 3 * 2 + 1 * 2
    first = state["bodies"][0]
    assert first["max_tokens"] == 256 and first["ignore_eos"] is True
    assert sorted({len(b["prompt"]) for b in state["bodies"]}) == [32, 64]
    assert doc["engine"] == "vllm" and doc["model"] == "Qwen/Qwen3-8B"
    assert written == [1, 2]
    path = tmp_path / "live.json"
    path.write_text(json.dumps(doc))
    runs = read_capture(str(path)).runs
    assert [r.concurrency for r in runs] == [3, 1]
    assert runs[0].inter_token_s == pytest.approx(0.01)


def test_the_commands_fit_and_apply_a_profile(tmp_path, base):
    from specsim.cli.main import cli
    cap = write_capture(tmp_path, base)
    out = tmp_path / "profile.json"
    r = CliRunner().invoke(cli, ["calibrate", "--from-server", cap, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "plain step = 1.600 x specsim's + 0.900 ms" in r.output
    assert read_profile(str(out)).verify_scale == pytest.approx(PLANTED["a_verify"])
    args = ["predict", "--model", MODEL, "--batch", "8", "--context", "8192", "--json"]
    plain = json.loads(CliRunner().invoke(cli, args).output)
    got = CliRunner().invoke(cli, args + ["--engine-profile", str(out)])
    assert got.exit_code == 0, got.output
    adjusted = json.loads(got.output)
    text = json.dumps(adjusted)
    assert "adjusted to the vllm 0.34.0 profile" in text
    assert text != json.dumps(plain)
    r = CliRunner().invoke(cli, ["predict", "--engine-profile", cap])
    assert r.exit_code != 0 and "not a specsim engine profile" in str(r.exception)
    r = CliRunner().invoke(cli, ["calibrate", "--from-server", cap])
    assert r.exit_code != 0 and "--out" in r.output


def test_simulate_and_tune_take_the_profile(tmp_path, base):
    from specsim.cli.main import cli
    from test_simulator import _sweep_trace
    cap = write_capture(tmp_path, base)
    out = tmp_path / "profile.json"
    assert CliRunner().invoke(cli, ["calibrate", "--from-server", cap, "--out",
                                    str(out)]).exit_code == 0
    path = _sweep_trace(tmp_path)
    common = ["--trace", path, "--model", MODEL, "--arrivals", "all:8", "--output-tokens",
              "30", "--json"]
    runs = {}
    for name, extra in (("bare", []), ("profiled", ["--engine-profile", str(out)])):
        r = CliRunner().invoke(cli, ["simulate", *common, "--k", "2", "--sparsity", "0.1",
                                     *extra])
        assert r.exit_code == 0, r.output
        runs[name] = json.loads(r.output)
    assert "adjusted to the vllm" in runs["profiled"]["costs"]
    # the engine's plain step is 1.6x specsim's and more: the profiled run is slower
    assert runs["profiled"]["summary"]["throughput_tokens_per_s"] < \
        runs["bare"]["summary"]["throughput_tokens_per_s"]
    r = CliRunner().invoke(cli, ["tune", *common, "--k", "2", "--workers", "1",
                                 "--engine-profile", str(out)])
    assert r.exit_code == 0, r.output
    assert "adjusted to the vllm" in json.loads(r.output[r.output.index("{"):])["costs"]
    r = CliRunner().invoke(cli, ["tune", *common, "--engine-profile", cap])
    assert r.exit_code != 0 and "not a specsim engine profile" in str(r.exception)


@pytest.mark.parametrize("value", ["NaN", "+Inf"])
def test_non_finite_counters_are_refused(tmp_path, base, value):
    doc = json.loads(open(write_capture(tmp_path, base)).read())
    run = doc["runs"][0]
    lines = run["after"].splitlines()
    at = next(i for i, line in enumerate(lines) if "_sum{" in line)
    lines[at] = lines[at].rsplit(" ", 1)[0] + " " + value
    run["after"] = "\n".join(lines)
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match="not finite"):
        read_capture(str(path))


def test_a_bad_profile_is_refused_in_one_line(tmp_path, base):
    good = tmp_path / "p.json"
    fit_profile([read_capture(write_capture(tmp_path, base))], base, "t").write(str(good))
    for key, value, words in (("runs", 3, "runs: expected a list"),
                              ("draft_scale", None, "both numbers or both null"),
                              ("plain_scale", -1, "positive factor"),
                              ("engine", 5, "expected a text")):
        doc = json.loads(good.read_text())
        doc[key] = value
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(doc))
        with pytest.raises(ProfileError, match=words) as err:
            read_profile(str(bad))
        assert "\n" not in str(err.value)


def test_the_servers_speculative_setting_reads_or_is_refused_in_one_line():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from specsim.costs.server_capture import parse_speculative

    assert parse_speculative("none") is None
    assert parse_speculative("eagle3,k=4") == {"drafter": "eagle3", "k": 4}
    assert parse_speculative("sparse-self,vegas,s=0.05,k=8") == {
        "drafter": "sparse-self", "policy": "vegas", "s": 0.05, "k": 8}

    @settings(max_examples=150, deadline=None)
    @given(st.text(alphabet="abcegklnoprsuvxy3-_=,.0123456789 :", max_size=30))
    def read(text):
        try:
            got = parse_speculative(text)
        except ProfileError as exc:
            assert "\n" not in str(exc)
        else:
            assert got is None or (isinstance(got["k"], int) and got["k"] >= 1)

    read()
