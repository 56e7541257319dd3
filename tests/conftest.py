from seeding import RUN_SEED


def pytest_report_header(config):
    return f"random inputs: SPECSIM_TEST_SEED={RUN_SEED} reproduces this run"
