"""The checkout the tests run in: where its scripts and benchmark programs lie, and a
benchmark program's ``main`` run in the test's process."""
import importlib
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def benchmark(name, monkeypatch):
    """benchmarks/<name>.py imported as it imports its siblings (its folder on the path) and
    its module-level settings put back after the test (``main`` sets some)."""
    monkeypatch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
    module = importlib.import_module(name)
    for setting in [n for n, v in vars(module).items() if n.isupper()]:
        monkeypatch.setattr(module, setting, getattr(module, setting))
    return module


def run_main(main, capsys, *argv):
    """``main(argv)`` in this process (torch and Triton already imported, the interpreter as
    the suite sets it up), as ``subprocess.run`` tells a program's run: its exit code, stdout
    and stderr."""
    capsys.readouterr()
    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)
