"""A built wheel carries specsim's shipped data and runs its main commands from a folder
outside the checkout: the wheel is installed with ``--no-deps`` into a fresh virtual
environment that sees this interpreter's packages (``--system-site-packages``: nothing is
downloaded), and ``specsim predict``, ``dashboard`` and ``review`` run there on the shipped
defaults."""
import json
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from repo import REPO_ROOT

#: One worker builds and installs the wheel for every test here (two builds of the one source
#: tree at once share its build folders).
pytestmark = pytest.mark.xdist_group("wheel")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the virtual environment's python, its specsim command, a folder outside the checkout)."""
    if shutil.which("pip") is None and subprocess.run(
            [sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.skip("pip is not available")
    root = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(root / "dist"), str(REPO_ROOT)], capture_output=True, text=True,
        timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (root / "dist").glob("specsim-*.whl")
    env_dir = root / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
         str(wheel)], capture_output=True, text=True, timeout=300)
    if done.returncode and "no such option: --python" in done.stderr:   # pip < 22.3
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                               "--prefix", str(env_dir), str(wheel)],
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    outside = root / "elsewhere"
    outside.mkdir()
    return python, env_dir / "bin" / "specsim", outside, wheel


def test_wheel_holds_the_shipped_data(installed):
    *_, wheel = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = [p.relative_to(REPO_ROOT).as_posix() for top in ("models", "traces")
               for p in (REPO_ROOT / top).rglob("*")
               if p.is_file() and p.suffix in (".json", ".jsonl", ".md")]
    missing = [p for p in shipped if f"specsim/data/{p}" not in names]
    assert shipped and not missing, missing[:5]


def test_installed_package_is_the_wheel_not_the_checkout(installed):
    python, _, outside, _ = installed
    where = subprocess.run([str(python), "-c", "import specsim, specsim.shipped as s; "
                            "print(specsim.__file__); print(s.catalog_dir())"],
                           capture_output=True, text=True, cwd=outside, timeout=60)
    assert where.returncode == 0, where.stderr[-2000:]
    package, catalogue = where.stdout.split()
    assert str(REPO_ROOT) not in package and str(REPO_ROOT) not in catalogue
    assert Path(catalogue, "calibrations", "h200", "smollm2-135m.json").is_file()


def test_predict_dashboard_and_review_run_from_the_wheel(installed):
    _, specsim, outside, _ = installed
    run = lambda *args: subprocess.run([str(specsim), *args], capture_output=True,  # noqa: E731
                                       text=True, cwd=outside, timeout=300)
    predicted = run("predict", "--json", "--bootstrap", "50")
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    report = json.loads(predicted.stdout)
    assert report["cost_model"] == "calibrated" and report["groups"]
    assert all(g["speedup_at_k_star"] > 0 for g in report["groups"])
    # a model without a calibration: the shipped operator table and the other models'
    # calibrations, read from the installed data
    composed = run("predict", "--json", "--bootstrap", "50", "--model", "llama-3.2-3b")
    assert composed.returncode == 0, composed.stderr[-2000:]
    composed = json.loads(composed.stdout)
    assert composed["cost_model"] == "operators" and "fitted on the calibrations of" in \
        composed["costs"] and composed["cost_validation"].startswith("validated on h200")
    # another GPU's page: the H200's operator table scaled, from the installed data (one
    # GPU and one batch x context: the page's size is the dashboard tests' concern)
    page = run("dashboard", "--out", "report.html", "--hardware", "a100-80gb",
               "--compare-hardware", "a100-80gb", "--batches", "8", "--contexts", "8192")
    assert page.returncode == 0, page.stderr[-2000:]
    assert (outside / "report.html").stat().st_size > 10_000
    review = run("review")
    assert review.returncode == 0, review.stderr[-2000:]
    assert review.stdout.strip()
