"""The shipped-data locator: repository names to files on disk, from any folder, a user's own
catalogue before the shipped one, and one-line errors for what does not ship."""
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specsim.errors import SpecsimError
from specsim.shipped import (catalog_dirs, catalog_file, catalog_names, display_name, resolve,
                             shipped_file, shipped_path)


def test_shipped_names_resolve_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = shipped_path("traces/synthetic-sparse-selfspec.jsonl")
    assert trace.is_file() and trace.is_absolute()
    assert json.loads(trace.read_text().splitlines()[0])          # a header line
    assert shipped_path("models/calibrations/h200/qwen3-8b.json").is_file()
    assert display_name(trace) == "traces/synthetic-sparse-selfspec.jsonl"
    assert resolve("traces/synthetic-sparse-selfspec.jsonl") == str(trace)


def test_what_does_not_ship_is_none_or_one_line(tmp_path):
    assert shipped_file("traces/no-such-trace.jsonl") is None
    assert shipped_file("models") is None                       # a folder, not a file
    assert shipped_file("benchmarks/kernels-h200.json") is None  # not shipped data
    with pytest.raises(SpecsimError, match="not shipped"):
        shipped_path("models/no-such.json")
    mine = tmp_path / "mine.jsonl"
    mine.write_text("{}\n")
    assert display_name(mine) == str(mine)                      # a user's file as given
    assert resolve(str(mine)) == str(mine)
    assert resolve("nowhere.jsonl") == "nowhere.jsonl"           # left for the caller's error


@given(st.text(max_size=40))
def test_any_name_gives_a_path_or_none(name):
    found = shipped_file(name)
    assert found is None or Path(found).is_file()


def test_a_users_catalogue_comes_first(tmp_path, monkeypatch):
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "my-gpu.json").write_text("{}")
    (tmp_path / "qwen3-8b").mkdir()
    (tmp_path / "qwen3-8b" / "config.json").write_text("{}")
    monkeypatch.setenv("SPECSIM_MODELS", str(tmp_path))
    shipped = shipped_path("models/hardware/h200.json").parent.parent
    assert catalog_dirs() == [tmp_path, shipped]
    assert catalog_file("qwen3-8b/config.json") == tmp_path / "qwen3-8b" / "config.json"
    assert catalog_file("hardware/h200.json") == shipped / "hardware" / "h200.json"
    names = catalog_names("hardware", "*.json")
    assert names[0] == "my-gpu.json" and "h200.json" in names and len(set(names)) == len(names)


def test_a_checkout_run_without_installing_finds_the_data(tmp_path):
    """``PYTHONPATH=<checkout> python ...`` (how a GPU machine runs a copy of the tree): no
    installed package maps the data folders, and the locator still finds them in the
    checkout (``python -S``: no site-packages, so no editable install either)."""
    import subprocess
    import sys

    from repo import REPO_ROOT
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from specsim.shipped import shipped_path, catalog_file; "
            "print(shipped_path('traces/synthetic-sparse-selfspec.jsonl')); "
            "print(catalog_file('hardware/h200.json'))")
    done = subprocess.run([sys.executable, "-S", "-c", code, str(REPO_ROOT)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    trace, hardware = done.stdout.split()
    assert Path(trace) == REPO_ROOT / "traces" / "synthetic-sparse-selfspec.jsonl"
    assert Path(hardware) == REPO_ROOT / "models" / "hardware" / "h200.json"
