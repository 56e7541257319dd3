import importlib.util
import sys
from pathlib import Path

from seeding import RUN_SEED


def _load_checkout_cli() -> None:
    """``specsim.cli`` is the repository's top-level ``cli/`` folder. With ``PYTHONPATH`` at a
    checkout, ``specsim`` comes from the checkout but ``specsim.cli`` would come from wherever an
    editable install points (another checkout); load the checkout's own ``cli/`` instead."""
    import specsim

    root = Path(__file__).resolve().parents[1]
    if Path(specsim.__file__).resolve().parents[1] != root or "specsim.cli" in sys.modules:
        return
    init = root / "cli" / "__init__.py"
    spec = importlib.util.spec_from_file_location("specsim.cli", init,
                                                  submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["specsim.cli"] = module
    spec.loader.exec_module(module)
    specsim.cli = module


_load_checkout_cli()


def pytest_report_header(config):
    return f"random inputs: SPECSIM_TEST_SEED={RUN_SEED} reproduces this run"


def pytest_configure(config):
    """Torch on one thread: the tests' models and kernels are tiny, where a second thread costs
    more in hand-offs than it gains (about 6x on CI's 2 cores for the engine's tiny models)."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` run only when ``-m`` selects them (``pytest -m slow``); each has a
    fast test covering the same behaviour in the default run."""
    import pytest

    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="a long case: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
