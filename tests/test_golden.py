"""Restructuring changes no number: ``predict --json``, ``validate report --json`` and
``calibrate --check --json`` on the shipped data equal the outputs recorded in ``golden/``.

Numbers compare to 1e-9 (relative); strings, booleans and list lengths exactly. Fields that
name where a file lies on this machine (``trace``, ``plan``, ``measured``, ``calibration``,
``source``) are not compared: they move with the checkout. A report whose key names changed
maps them back through ``RENAMED`` before the comparison; keys a newer report adds (a schema
version) are allowed, keys it drops are not.
"""
import gzip
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from specsim.cli.main import cli
from specsim.shipped import shipped_path

GOLDEN = Path(__file__).parent / "golden"

#: Fields that hold a path on this machine: not compared.
PATH_FIELDS = {"trace", "plan", "measured", "calibration", "source", "path"}

#: New key -> the key the golden files recorded it under (empty while no key was renamed).
RENAMED: dict[str, str] = {}

#: Keys a newer report adds that the golden files predate.
ADDED = {"schema_version", "worst_cell", "across_setups", "cost_source", "cost_validation"}


def _normalise(value):
    if isinstance(value, dict):
        return {RENAMED.get(k, k): _normalise(v) for k, v in value.items() if k not in ADDED}
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


def _compare(new, old, where="$"):
    """Every difference between two JSON values, as 'where: what' lines."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return [f"{where}: {type(new).__name__} where the golden file has an object"]
        out = [f"{where}.{k}: missing" for k in old if k not in new]
        out += [f"{where}.{k}: not in the golden file" for k in new if k not in old]
        for k in old:
            if k in new and k not in PATH_FIELDS:
                out += _compare(new[k], old[k], f"{where}.{k}")
        return out
    if isinstance(old, list):
        if not isinstance(new, list) or len(new) != len(old):
            return [f"{where}: list of {len(new) if isinstance(new, list) else new!r}, "
                    f"golden {len(old)}"]
        return [line for i, (a, b) in enumerate(zip(new, old))
                for line in _compare(a, b, f"{where}[{i}]")]
    if isinstance(old, bool) or old is None or isinstance(old, str):
        return [] if new == old else [f"{where}: {new!r} != golden {old!r}"]
    if isinstance(old, (int, float)):
        if isinstance(new, bool) or not isinstance(new, (int, float)):
            return [f"{where}: {new!r} != golden {old!r}"]
        if math.isnan(old) and math.isnan(new):
            return []
        return [] if math.isclose(new, old, rel_tol=1e-9, abs_tol=1e-12) else \
            [f"{where}: {new!r} != golden {old!r}"]
    return [] if new == old else [f"{where}: {new!r} != golden {old!r}"]


def _run(args):
    result = CliRunner().invoke(cli, args + ["--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


CASES = {
    "predict-default": lambda: ["predict"],
    "predict-qwen3-8b": lambda: [
        "predict", "--trace", str(shipped_path("traces/synthetic-sparse-selfspec.jsonl")),
        "--model", "qwen3-8b", "--batch", "4", "--context", "32768", "--bootstrap", "200"],
    "validate-qwen3-8b": lambda: [
        "validate", "report", "--plan", str(shipped_path("models/validation/h200-qwen3-8b-plan.json")),
        "--measured", str(shipped_path("models/validation/h200-qwen3-8b-measured.json"))],
    "validate-smollm2": lambda: [
        "validate", "report", "--plan", str(shipped_path("models/validation/h200-smollm2-135m-plan.json")),
        "--measured", str(shipped_path("models/validation/h200-smollm2-135m-measured.json"))],
    **{f"check-{m}": (lambda m=m: [
        "calibrate", "--check", str(shipped_path(f"models/calibrations/h200/{m}.json"))])
       for m in ("qwen3-8b", "smollm2-135m", "llama-3.1-8b", "qwen3-4b")},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_equals_golden(name):
    old = json.loads(gzip.open(GOLDEN / f"{name}.json.gz").read())
    new = _normalise(_run(CASES[name]()))
    diffs = _compare(new, old)
    assert not diffs, f"{len(diffs)} differences, first: " + "; ".join(diffs[:8])


def test_compare_finds_a_changed_number():
    """The comparison itself: a number off by more than 1e-9, a dropped key, a changed string
    and a shorter list are each reported; paths are not."""
    old = {"a": 1.0, "b": [1, 2], "c": "x", "trace": "/here", "d": {"e": 2}}
    assert _compare(dict(old, trace="/there"), old) == []
    assert _compare(dict(old, a=1.0 + 1e-6), old)
    assert _compare({k: v for k, v in old.items() if k != "d"}, old)
    assert _compare(dict(old, c="y"), old)
    assert _compare(dict(old, b=[1]), old)
