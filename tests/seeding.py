"""Fresh random inputs for every test run, reproducible when one fails.

``RUN_SEED`` is drawn once per pytest session (or read from ``SPECSIM_TEST_SEED``);
``conftest.py`` prints it in the report header, so a failing case reruns with the same
inputs: ``SPECSIM_TEST_SEED=<seed> pytest ...``. Tests derive their generators from it with
a per-call offset, so cases within a run still differ from each other.
"""
import os

import numpy as np

RUN_SEED = int(os.environ.get("SPECSIM_TEST_SEED")
               or np.random.SeedSequence().entropy % 2**31)
# pytest-xdist's workers start after the controller has loaded ``conftest.py`` and inherit its
# environment: every worker draws from the seed the report header prints
os.environ["SPECSIM_TEST_SEED"] = str(RUN_SEED)


def seed(offset: int = 0) -> int:
    """This run's seed for the caller's ``offset``."""
    return (RUN_SEED + 1_000_003 * int(offset)) % 2**31


def generator(offset: int = 0, device="cpu") -> "torch.Generator":  # noqa: F821
    """A torch generator on ``device`` seeded for this run and ``offset`` (torch imported here:
    pytest-xdist's controller loads this module and runs no test)."""
    import torch
    return torch.Generator(device=device).manual_seed(seed(offset))
