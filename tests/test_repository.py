"""The repository holds the product and reads as one: the top-level entries the layout names,
a short list of maintainer scripts and benchmark programs, no file name tagged with the run
that made it, no development history in what a user or maintainer reads, and the published
figures short enough to read."""
import re
import subprocess

import pytest

from repo import REPO_ROOT

TOP_LEVEL = {".ci", ".gitignore", "README.md", "BENCHMARKS.md", "VALIDATION.md",
             "pyproject.toml", "specsim", "cli", "models", "traces", "tests", "benchmarks",
             "scripts", "docs", "LICENSE"}

#: A numbered session, a lettered or numbered round, a numbered visit, an issue number: how a
#: lab notebook dates its entries.
HISTORY = re.compile(r"\b(?:sessions? \d+|rounds? [A-Z]\b|rounds? \d+\b|visits? \d+\b|"
                     r"issues? #\d+)", re.IGNORECASE)

#: A run tag in a file name: "-s16", "-r9", "_round_a".
RUN_TAG = re.compile(r"[-_](?:s\d+|r\d+)(?=[-_.]|$)|round_|session", re.IGNORECASE)


def tracked_files() -> list[str]:
    done = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode:
        pytest.skip("not a git checkout")
    return [line for line in done.stdout.splitlines()
            if (REPO_ROOT / line).exists()]          # deleted in the work tree: gone


def test_only_the_layouts_top_level_entries():
    top = {path.split("/", 1)[0] for path in tracked_files()}
    assert top <= TOP_LEVEL, sorted(top - TOP_LEVEL)


def test_scripts_and_benchmarks_are_short_lists():
    files = tracked_files()
    scripts = [f for f in files if f.startswith("scripts/")]
    benchmarks = [f for f in files if f.startswith("benchmarks/")]
    assert len(scripts) <= 12, scripts
    assert len(benchmarks) <= 15, benchmarks
    assert "scripts/setup.sh" in scripts           # .ci/run's install


def test_no_file_name_carries_a_run_tag():
    tagged = [f for f in tracked_files() if RUN_TAG.search(f.rsplit("/", 1)[-1])]
    assert not tagged, tagged


def test_history_finds_what_it_should():
    # the examples are put together here, so that this file holds none of them as written
    for word, tag in (("session", "14"), ("round", "9"), ("round", "R"), ("visit", "2"),
                      ("issue", "#3")):
        assert HISTORY.search(f"measured in {word} {tag} found"), (word, tag)
    assert not HISTORY.search("rounds to the nearest") and not HISTORY.search("a round trip")


def test_no_development_history_where_users_and_maintainers_read():
    read = [f for f in tracked_files()
            if f in ("README.md", "BENCHMARKS.md", "VALIDATION.md", "traces/README.md")
            or (f.split("/", 1)[0] in ("specsim", "cli", "tests", "scripts", "benchmarks")
                and f.endswith((".py", ".md", ".sh")) and f != "tests/test_repository.py")]
    found = []
    for name in read:
        for number, line in enumerate((REPO_ROOT / name).read_text().splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{name}:{number}: {line.strip()[:80]}")
    assert not found, f"{len(found)} lines, first: " + " | ".join(found[:5])


def test_published_figures_fit_in_60_kb():
    size = sum((REPO_ROOT / name).stat().st_size for name in ("BENCHMARKS.md", "VALIDATION.md"))
    assert size <= 60_000, size
