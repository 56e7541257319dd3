import pytest
from seeding import RUN_SEED


def pytest_report_header(config):
    return f"random inputs: SPECSIM_TEST_SEED={RUN_SEED} reproduces this run"


def pytest_configure(config):
    """Torch on one thread: the tests' models and kernels are tiny, where a second thread costs
    more in hand-offs than it gains (about 6x on CI's 2 cores for the engine's tiny models).
    Triton's interpreter patches triton.language once per launch (``_patch_launch_once``).
    Both where tests run: not in pytest-xdist's controller, which hands them to its workers."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)
    _patch_launch_once()


def _patch_launch_once():
    """Triton's interpreter patches triton.language's modules (``inspect.getmembers`` over
    each) when a kernel is launched, restores them when it ends, and patches them again at
    every call of a ``@triton.jit`` helper inside it: the repeats are about 40% of the time
    of a kernel built from helpers. Here a helper's call patches only the modules the launch
    in progress has not; what runs is the same. It reaches into the interpreter's private
    names (of the pinned Triton): where one is missing, the interpreter runs as it comes."""
    try:
        import specsim.kernels._runtime  # noqa: F401  (sets Triton's mode before its import)
        from triton.runtime import interpreter
        patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
        interpreter._LangPatchScope  # noqa: B018  (what a skipped patch returns)
    except (ImportError, AttributeError):
        return
    if getattr(patch_lang, "once_per_launch", False):
        return
    import triton.language as tl
    state = {"launching": False, "patched": frozenset()}
    seen = {}                        # function -> the language modules its globals name

    def patch_once(fn):
        langs = seen.get(fn)
        if langs is None:
            langs = seen[fn] = frozenset(name for name, module in (("tl", tl), ("core", tl.core))
                                         if any(v is module for v in fn.__globals__.values()))
        if state["launching"] and state["patched"] and langs <= state["patched"]:
            return interpreter._LangPatchScope()            # nothing of its own to restore
        scope = patch_lang(fn)
        if state["launching"]:
            state["patched"] |= langs
        return scope

    def launch_once(self, *args, **kwargs):
        state["launching"], state["patched"] = True, frozenset()
        try:
            return launch(self, *args, **kwargs)
        finally:
            state["launching"], state["patched"] = False, frozenset()

    patch_once.once_per_launch = True
    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = launch_once


@pytest.fixture(scope="session")
def sparse_dashboard():
    """The page of the shipped synthetic sparse trace on Qwen3-8B: the H200 and the A100 80GB,
    batches 1 and 32 at 16K, a 4 x 3 regime map, four measured points. test_dashboard's page
    tests and the browser test read it; their tests share one xdist_group ("dashboard"), so
    one pytest-xdist worker builds it, once."""
    from repo import REPO_ROOT
    from specsim.dashboards import DashboardOptions, Validation, build_dashboard
    from specsim.dashboards.validation import ValidationPoint
    from specsim.specs import load_hardware, load_model
    from specsim.traces.format import read_trace

    hw = {"h200": load_hardware("h200"), "a100-80gb": load_hardware("a100-80gb")}
    points = [ValidationPoint("verify b=8 16K k=4", 3.91, 3.70, "verify"),
              ValidationPoint("verify b=32 16K k=4", 13.1, 12.2, "verify"),
              ValidationPoint("draft b=8 16K s=0.05", 1.21, 1.30, "draft"),
              ValidationPoint("plain b=32 16K", 12.5, 11.9, "plain step")]
    return build_dashboard(
        read_trace(REPO_ROOT / "traces" / "synthetic-sparse-selfspec.jsonl"),
        load_model("qwen3-8b"), hw,
        DashboardOptions(batches=(1, 32), contexts=(16384,), n_boot=100,
                         regime_batches=(1, 8, 64, 256), regime_contexts=(1024, 8192, 65536)),
        Validation(points, "example points"),
        trace_label="traces/synthetic-sparse-selfspec.jsonl")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` run only when ``-m`` selects them (``pytest -m slow``); each has a
    fast test covering the same behaviour in the default run."""
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="a long case: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
