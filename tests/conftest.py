from seeding import RUN_SEED


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
