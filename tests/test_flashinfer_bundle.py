"""scripts/flashinfer_bundle.py: FlashInfer packed for an offline GPU machine, its sources
trimmed to what the decode and prefill JIT builds read (on stand-in wheels: no download)."""
import importlib.util
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from repo import REPO_ROOT

spec = importlib.util.spec_from_file_location(
    "flashinfer_bundle", REPO_ROOT / "scripts" / "flashinfer_bundle.py")
bundle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bundle)

#: A stand-in for the installed package: what the trim keeps and what it drops.
KEPT = ("flashinfer/__init__.py", "flashinfer/decode.py", "flashinfer/data/csrc/batch_decode.cu",
        "flashinfer/data/include/flashinfer/attention/decode.cuh",
        "flashinfer/experimental/keep.py", "flashinfer/cake_x/runner.py")
DROPPED = ("flashinfer/data/cutlass/include/cute/tensor.hpp",
           "flashinfer/data/csrc/fused_moe/moe.cu", "flashinfer/cake_x/csrc/kernel.cu",
           "flashinfer/moe_ep/kernel_src/a.cu", "flashinfer/experimental/b12x/k.cu",
           "flashinfer/experimental/cake/k.cu", "flashinfer/experimental/qwen_3_5_block/k.cu",
           "flashinfer/__pycache__/decode.cpython-312.pyc")


def wheel(folder, name, version, files):
    """A minimal pure-Python wheel holding ``files`` (each a few bytes)."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for file in files:
            archive.writestr(file, "x = 1\n" * 50)
        archive.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\n"
                                             f"Version: {version}\n")
        archive.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{dist}/RECORD", "")
    return path


@pytest.fixture
def wheels(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel(folder, "flashinfer_python", "0.7.4", KEPT + DROPPED)
    wheel(folder, "apache_tvm_ffi", "0.1.15", ("tvm_ffi/__init__.py",))
    return folder


def test_trim_keeps_the_decode_sources_and_drops_the_rest(tmp_path):
    for file in KEPT + DROPPED:
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_text("y" * 100)
    freed = bundle.trim(tmp_path / "flashinfer")
    assert freed == 100 * len(DROPPED)
    assert all((tmp_path / file).is_file() for file in KEPT)
    assert not any((tmp_path / file).exists() for file in DROPPED)


def test_trim_refuses_a_folder_that_is_not_the_package(tmp_path):
    with pytest.raises(bundle.BundleError, match="not an installed flashinfer package"):
        bundle.trim(tmp_path)


def test_bundle_unpacks_on_the_gpu_side_with_install_sh(tmp_path, wheels, capsys):
    out = tmp_path / "bundle"
    assert bundle.main(["--out", str(out), "--wheels", str(wheels)]) == 0
    assert "wrote" in capsys.readouterr().out
    with tarfile.open(out / "flashinfer.tar.xz") as tar:
        names = set(tar.getnames())
    assert set(KEPT) <= names and not names & set(DROPPED)
    site = tmp_path / "site"
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    done = subprocess.run(["bash", str(out / "install.sh"), str(site)], capture_output=True,
                          text=True, env={"PATH": path})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"export PYTHONPATH={site}:$PYTHONPATH"
    assert (site / "flashinfer" / "data" / "csrc" / "batch_decode.cu").is_file()
    assert (site / "tvm_ffi" / "__init__.py").is_file()
    assert not (site / "flashinfer" / "data" / "cutlass").exists()


def test_bad_input_is_one_line_and_nothing_is_overwritten(tmp_path, wheels, capsys):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert bundle.main(["--out", str(out), "--wheels", str(wheels)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "not an empty folder" in error
    assert (out / "mine.txt").read_text() == "keep" and len(list(out.iterdir())) == 1
    assert bundle.main(["--out", str(tmp_path / "b2"), "--wheels", str(tmp_path / "no")]) == 2
    assert "no such folder" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert bundle.main(["--out", str(tmp_path / "b3"), "--wheels", str(empty)]) == 2
    assert "no flashinfer_python-*.whl" in capsys.readouterr().err
    assert not (tmp_path / "b3").exists()
    junk = tmp_path / "junk"
    junk.mkdir()
    for name in ("flashinfer_python-0.7.4-py3-none-any.whl",
                 "apache_tvm_ffi-0.1-py3-none-any.whl"):
        (junk / name).write_text("not a wheel")
    assert bundle.main(["--out", str(tmp_path / "b4"), "--wheels", str(junk)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("error: pip install flashinfer_python")
