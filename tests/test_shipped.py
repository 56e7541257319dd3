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
