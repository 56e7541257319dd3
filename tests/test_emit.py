"""`specsim predict --emit vllm|sglang|schedule`: the emitted names are the pinned engines'
(vLLM's ``SpeculativeConfig`` fields, SGLang's ``ServerArgs`` flags, the Vegas fork's fields),
the values are the prediction's best setting, ``--json`` carries the same under ``emit``, and
the schedule's cells are what ``predict --batch B --context C`` picks."""
import io
import json
import shlex
from contextlib import redirect_stderr, redirect_stdout

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim import deploy as D
from specsim.cli.main import main
from specsim.policies import POLICIES
from specsim.specs import known_models, load_model

#: few replicates: k* and the best setting come from the point estimates
FAST = ["--bootstrap", "50"]


def run(args):
    """(exit code, stdout, stderr) of ``main(args)`` in this process."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def run_json(args):
    code, out, err = run([*args, *FAST, "--json"])
    assert code == 0, err
    return json.loads(out)


def best_setting(report):
    """(policy, s, k, batch, context, tp) of a predict report's best group, as priced."""
    best = report["best"]
    group = next(g for g in report["groups"]
                 if g["policy"] == best["policy"] and g["s"] == best["s"])
    return (group["costed_as"]["policy"], group["costed_as"]["s"], group["k_star"],
            report["batch"], max(group["contexts"]), report["tp"])


VLLM_ARGS = ["predict", "--model", "qwen3-8b", "--tp", "2", "--batch", "8", "--context", "16384",
             "--emit", "vllm"]


#: The tests of the one vLLM report run on one pytest-xdist worker, which predicts it
#: once.
ON_THE_REPORT = pytest.mark.xdist_group("vllm-report")


@pytest.fixture(scope="module")
def vllm_report():
    return run_json(VLLM_ARGS)


@ON_THE_REPORT
def test_vllm_names_are_the_pinned_ones(vllm_report):
    emitted = vllm_report["emit"]
    config = emitted["speculative_config"]
    assert set(config) <= D.VLLM_SPECULATIVE_FIELDS | D.VEGAS_FORK_FIELDS
    assert set(config) - D.VEGAS_FORK_FIELDS <= D.VLLM_SPECULATIVE_FIELDS
    assert set(emitted["engine_args"]) <= set(D.VLLM_ENGINE_FLAGS)
    assert emitted["vllm_version"] == D.VLLM_VERSION
    assert emitted["needs_vegas_fork"] is True
    assert any("Vegas fork" in n for n in emitted["notes"])


@ON_THE_REPORT
def test_vllm_values_are_the_best_setting(vllm_report):
    policy, s, k, batch, context, tp = best_setting(vllm_report)
    emitted = vllm_report["emit"]
    config, engine = emitted["speculative_config"], emitted["engine_args"]
    assert config["method"] == D.VEGAS_FORK_METHOD
    assert config["num_speculative_tokens"] == k
    assert config["sparse_attn_algorithm"] == D.FORK_SPELLING[policy]
    assert config["sparse_attn_ratio"] == s
    assert config["sparse_attn_min_tokens"] == POLICIES[policy].min_selected
    assert (batch, context, tp) == (8, 16384, 2)
    assert engine["--max-num-seqs"] == batch
    assert engine["--tensor-parallel-size"] == tp
    assert engine["--max-model-len"] == context + D.OUTPUT_ROOM
    # the printed command carries the same values
    words = shlex.split(emitted["command"])
    assert words[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    assert json.loads(words[words.index("--speculative-config") + 1]) == config
    for flag, value in engine.items():
        assert words[words.index(flag) + 1] == str(value)


@ON_THE_REPORT
def test_vllm_text_prints_the_same_command(vllm_report):
    code, out, _ = run([*VLLM_ARGS, *FAST])
    assert code == 0
    emitted = vllm_report["emit"]
    if emitted["fork_has_algorithm"]:
        assert emitted["command"] in out.splitlines()
    else:           # shown commented out, after a line that says it is not deployable
        assert f"# {emitted['command']}" in out.splitlines()
        assert "NOT deployable as printed" in out
    assert "note: method 'sparse_attn'" in out


def test_default_prediction_prints_a_fork_command():
    code, out, _ = run(["predict", "--emit", "vllm", *FAST])
    assert code == 0
    lines = [x for x in out.splitlines() if x.startswith("vllm serve ")]
    assert len(lines) == 1 and "NOT deployable" not in out


def test_sglang_names_pinned_and_not_deployable():
    report = run_json(["predict", "--batch", "4", "--context", "8192", "--output-tokens",
                       "512", "--emit", "sglang"])
    policy, s, k, batch, context, tp = best_setting(report)
    emitted = report["emit"]
    assert set(emitted["engine_flags"]) <= D.SGLANG_FLAGS
    assert set(emitted["speculative_flags_needed"]) <= D.SGLANG_FLAGS
    assert emitted["deployable"] is False and emitted["command"] is None
    assert "no sparse self-speculation" in emitted["reason"]
    assert emitted["speculative_flags_needed"] == {
        "--speculative-num-steps": k, "--speculative-eagle-topk": 1,
        "--speculative-num-draft-tokens": k + 1}
    assert emitted["engine_flags"]["--max-running-requests"] == batch == 4
    assert emitted["engine_flags"]["--tp-size"] == tp
    assert emitted["engine_flags"]["--context-length"] == context + 512
    assert emitted["setting"]["policy"] == policy and emitted["setting"]["s"] == s


def test_schedule_cells_are_what_predict_picks():
    grid = ["--schedule-batches", "1,16", "--schedule-contexts", "4K,32K"]
    report = run_json(["predict", "--emit", "schedule", *grid])
    emitted = report["emit"]
    assert emitted["batches"] == [1, 16] and emitted["contexts"] == [4096, 32768]
    key = (emitted["policy"], emitted["s"])
    for batch, context in ((1, 32768), (16, 4096)):
        alone = run_json(["predict", "--batch", str(batch), "--context", str(context)])
        group = next(g for g in alone["groups"] if (g["policy"], g["s"]) == key)
        row, column = emitted["batches"].index(batch), emitted["contexts"].index(context)
        assert emitted["k_table"][row][column] == group["k_star"]
    # vLLM's batch-only form: k* per batch at the prediction's own context
    ranges = emitted["vllm_num_speculative_tokens_per_batch_size"]
    assert [r[:2] for r in ranges] == [[1, 15], [16, 16]]
    alone = run_json(["predict", "--batch", "16"])
    group = next(g for g in alone["groups"] if (g["policy"], g["s"]) == key)
    assert ranges[1][2] == group["k_star"]
    config = emitted["vllm_speculative_config"]
    assert set(config) <= D.VLLM_SPECULATIVE_FIELDS | D.VEGAS_FORK_FIELDS
    assert config["num_speculative_tokens"] == max(r[2] for r in ranges)


def test_without_emit_there_is_no_emit_key():
    assert "emit" not in run_json(["predict"])


@pytest.mark.parametrize("args", [
    ["predict", "--emit", "tensorrt"],
    ["predict", "--emit", "vllm", "--alpha", "0.7", "--gamma", "0.1"],
    ["predict", "--emit", "schedule", "--schedule-batches", "1,x"],
    ["predict", "--emit", "schedule", "--schedule-contexts", "0"],
])
def test_bad_emit_is_one_line(args):
    code, out, err = run(args)
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1, err


def test_catalogue_models_have_hf_ids():
    names = known_models()
    assert "qwen3-8b" in names
    for name in names:
        assert D.hf_id(load_model(name).source), name


settings_strategy = st.builds(
    D.Setting, model=st.just("qwen3-8b"), model_id=st.just("Qwen/Qwen3-8B"),
    policy=st.sampled_from(sorted(D.FORK_SPELLING)),
    s=st.floats(0.001, 1.0), k=st.integers(1, 16), speedup=st.floats(0.5, 3.0),
    batch=st.integers(1, 1024), context=st.integers(1, 1 << 17), tp=st.integers(1, 8),
    max_model_len=st.integers(1, 1 << 18))


@settings(max_examples=60, deadline=None)
@given(settings_strategy)
def test_every_setting_emits_pinned_names_and_its_values(setting):
    spec = load_model("qwen3-8b")
    vllm = D.emit_vllm(setting, spec)
    assert set(vllm.speculative_config) <= D.VLLM_SPECULATIVE_FIELDS | D.VEGAS_FORK_FIELDS
    words = shlex.split(vllm.command)
    assert json.loads(words[words.index("--speculative-config") + 1]) == {
        "method": "sparse_attn", "num_speculative_tokens": setting.k,
        "sparse_attn_algorithm": D.FORK_SPELLING[setting.policy],
        "sparse_attn_ratio": setting.s,
        "sparse_attn_min_tokens": POLICIES[setting.policy].min_selected}
    assert vllm.fork_has_algorithm == (
        D.FORK_SPELLING[setting.policy] in D.VEGAS_FORK_ALGORITHMS or setting.s >= 1.0)
    sglang = D.emit_sglang(setting, spec)
    assert set(sglang.engine_flags) | set(sglang.speculative_flags_needed) <= D.SGLANG_FLAGS
    assert not sglang.deployable and sglang.command is None


@given(st.lists(st.integers(1, 1 << 20), min_size=1, max_size=6))
def test_grid_reads_numbers_and_k_suffix(values):
    text = ",".join(f"{v // 1024}K" if v % 1024 == 0 else str(v) for v in values)
    assert D.grid(text, "--x") == values


drafter_settings = st.builds(
    D.Setting, model=st.just("qwen3-8b"), model_id=st.just("Qwen/Qwen3-8B"),
    policy=st.just("eagle"), s=st.none(), k=st.integers(1, 16), speedup=st.floats(0.5, 3.0),
    batch=st.integers(1, 1024), context=st.integers(1, 1 << 17), tp=st.integers(1, 8),
    max_model_len=st.integers(1, 1 << 18), drafter=st.sampled_from(sorted(D.VLLM_METHODS)),
    draft_name=st.one_of(st.none(), st.just("qwen3-8b-eagle3"), st.just("smollm2-135m")),
    tree_tokens=st.one_of(st.none(), st.integers(2, 64)))


@settings(max_examples=60, deadline=None)
@given(drafter_settings)
def test_a_separate_drafter_emits_stock_engine_commands(setting):
    """EAGLE, EAGLE-3, MTP, Medusa, a draft model or n-gram lookup: stock vLLM's method with
    k drafts (a draft or head named by its weights, a placeholder where the catalogue has no
    repository), and SGLang's algorithm where it has one: every name pinned, no fork."""
    spec = load_model("qwen3-8b")
    vllm = D.emit_vllm(setting, spec)
    assert set(vllm.speculative_config) <= D.VLLM_SPECULATIVE_FIELDS
    assert not vllm.needs_vegas_fork
    words = shlex.split(vllm.command)
    config = json.loads(words[words.index("--speculative-config") + 1])
    assert config["method"] == D.VLLM_METHODS[setting.drafter]
    assert config["num_speculative_tokens"] == setting.k
    assert ("model" in config) == (setting.drafter in ("eagle", "eagle3", "medusa",
                                                       "draft-model"))
    sglang = D.emit_sglang(setting, spec)
    assert sglang.deployable == (setting.drafter in D.SGLANG_METHODS)
    if sglang.deployable:
        flags = shlex.split(sglang.command)
        assert set(f for f in flags if f.startswith("--")) <= D.SGLANG_FLAGS
        assert flags[flags.index("--speculative-algorithm") + 1] in D.SGLANG_ALGORITHMS
        assert int(flags[flags.index("--speculative-num-steps") + 1]) == setting.k
    else:
        assert sglang.command is None and setting.drafter in sglang.reason


def test_an_eagle_trace_emits_eagle3_and_its_schedule():
    """A Spec-Bench EAGLE file priced with the shipped EAGLE-3 head of Qwen3-8B: vLLM's
    eagle3 method at the predicted k; its k schedule is stock vLLM's eagle3 config with k per
    batch, each cell predict's own k*; a tree drafter's schedule is refused in one line."""
    args = ["predict", "--trace", "tests/fixtures/specbench.jsonl", "--model", "qwen3-8b",
            "--drafter", "eagle:qwen3-8b-eagle3"]
    report = run_json([*args, "--emit", "vllm"])
    config = report["emit"]["speculative_config"]
    assert config["method"] == "eagle3"
    assert config["num_speculative_tokens"] == report["emit"]["setting"]["k"]
    grid = ["--schedule-batches", "1,8", "--schedule-contexts", "4K"]
    emitted = run_json([*args, *FAST, "--emit", "schedule", *grid])["emit"]
    config = emitted["vllm_speculative_config"]
    assert config["method"] == "eagle3" and "model" in config
    assert set(config) <= D.VLLM_SPECULATIVE_FIELDS
    alone = run_json([*args, *FAST, "--batch", "8", "--context", "4096"])
    assert emitted["k_table"][1][0] == alone["groups"][0]["k_star"]
    code, out, err = run([*args, *FAST, "--tree-tokens", "10", "--emit", "schedule", *grid])
    errors = [line for line in err.splitlines() if line.startswith("specsim: error: ")]
    assert code == 1 and len(errors) == 1 and out == ""
    assert "a tree of 10 tokens" in errors[0]
