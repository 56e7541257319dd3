"""The checkout the tests run in: where its scripts and benchmark programs lie."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
