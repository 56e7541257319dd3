"""Pack FlashInfer for a GPU machine without internet, as the attention peer of
``benchmarks/bench_kernels.py``.

FlashInfer's wheel is ~100 MB (~860 MB installed, mostly CUTLASS, MoE and Blackwell sources);
its paged decode and prefill modules build at first use from a few of its sources (JIT, nvcc).
This script downloads the wheel and its one dependency that a CUDA image with torch usually
lacks (``apache-tvm-ffi``), installs FlashInfer into a folder, deletes the sources those two
modules never compile, and writes into ``--out``:

- ``flashinfer.tar.xz``  (~12 MB for 0.7.4) and the ``apache_tvm_ffi`` wheel (~3 MB),
- ``install.sh``: run on the GPU machine as ``bash install.sh DIR``; it unpacks both into DIR
  and prints the ``PYTHONPATH`` to export.

    python scripts/flashinfer_bundle.py --out fi-bundle       # any machine with pip's index
    # on the GPU machine, from a checkout holding fi-bundle/:
    bash fi-bundle/install.sh /tmp/fisite
    PYTHONPATH=/tmp/fisite:. FLASHINFER_CUDA_ARCH_LIST=9.0a \\
        python3 benchmarks/bench_kernels.py --head-dims 128 --q-lens 1,8,16 --no-check

``--wheels DIR`` takes wheels already downloaded instead. The folders deleted are those of
FlashInfer 0.7.4 (the default ``--version``); another version may need others kept: the
first JIT build names a missing source.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.7.4"
TVM_FFI_VERSION = "0.1.15.post2"

#: Folders under the installed ``flashinfer`` package that its paged decode and prefill JIT
#: builds never read (globs relative to the package folder).
UNUSED = ("data/cutlass", "cake_*/csrc", "moe_ep/kernel_src", "experimental/cake",
          "experimental/b12x", "experimental/qwen_3_5_block")
#: Under ``data/csrc`` only the files at the top level are kept: the decode and prefill
#: modules' sources; its subfolders hold other kernels' (MoE, GEMM, communication, ...).
SOURCES = "data/csrc"

INSTALL_SH = """#!/bin/bash
# Unpack FlashInfer {version} (trimmed to its decode and prefill sources) into DIR.
set -euo pipefail
dir="${{1:?usage: bash install.sh DIR}}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$dir"
tar xJf "$here/flashinfer.tar.xz" -C "$dir"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$dir" "$here"/{tvm_wheel}
echo "export PYTHONPATH=$dir:\\$PYTHONPATH"
"""


class BundleError(Exception):
    """A reason the bundle cannot be made, in one line."""


def trim(package: Path) -> int:
    """Delete from the installed ``flashinfer`` folder ``package`` what its decode and prefill
    JIT builds never read, and every ``__pycache__``; returns the bytes deleted."""
    if not (package / "__init__.py").is_file():
        raise BundleError(f"{package} is not an installed flashinfer package (no __init__.py)")
    doomed = [path for pattern in UNUSED for path in package.glob(pattern) if path.is_dir()]
    sources = package / SOURCES
    if sources.is_dir():
        doomed += [path for path in sources.iterdir() if path.is_dir()]
    doomed += list(package.rglob("__pycache__"))
    freed = 0
    for path in doomed:
        if path.exists():
            freed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
    return freed


def find_wheel(folder: Path, prefix: str) -> Path:
    wheels = sorted(folder.glob(f"{prefix}-*.whl"))
    if not wheels:
        raise BundleError(f"no {prefix}-*.whl in {folder}")
    return wheels[-1]


def pip(*args: str, what: str) -> None:
    """Run ``python -m pip ARGS`` quietly; a failure is a one-line ``BundleError`` naming
    ``what`` and pip's last line of error."""
    done = subprocess.run([sys.executable, "-m", "pip", *args, "-q"], capture_output=True,
                          text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise BundleError(f"{what}: {last}")


def download(folder: Path, version: str, tvm_version: str, python: str) -> None:
    pip("download", "--no-deps", "--only-binary=:all:", "--python-version", python,
        "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
        "--platform", "manylinux_2_24_x86_64", "--platform", "any",
        f"flashinfer-python=={version}", f"apache-tvm-ffi=={tvm_version}", "-d", str(folder),
        what="pip download")


def bundle(out: Path, wheels: Path, version: str) -> dict:
    """Install the FlashInfer wheel in ``wheels`` into a temporary folder, trim it and write
    the bundle into ``out`` (which must not exist or be empty)."""
    flashinfer_wheel = find_wheel(wheels, "flashinfer_python")
    tvm_wheel = find_wheel(wheels, "apache_tvm_ffi")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as temp:
        site = Path(temp)
        pip("install", "--no-deps", "--no-compile", "--target", str(site), str(flashinfer_wheel),
            what=f"pip install {flashinfer_wheel.name}")
        freed = trim(site / "flashinfer")
        with tarfile.open(out / "flashinfer.tar.xz", "w:xz") as tar:
            tar.add(site / "flashinfer", arcname="flashinfer")
    shutil.copy2(tvm_wheel, out / tvm_wheel.name)
    script = out / "install.sh"
    script.write_text(INSTALL_SH.format(version=version, tvm_wheel=tvm_wheel.name))
    script.chmod(0o755)
    return {"freed_bytes": freed, "tar_bytes": (out / "flashinfer.tar.xz").stat().st_size,
            "tvm_wheel": tvm_wheel.name}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path,
                        help="folder to write the bundle into (must not exist, or be empty)")
    parser.add_argument("--wheels", type=Path, default=None,
                        help="folder with flashinfer_python-*.whl and apache_tvm_ffi-*.whl "
                             "already downloaded (default: download them with pip)")
    parser.add_argument("--version", default=VERSION, help="FlashInfer version to download")
    parser.add_argument("--tvm-ffi-version", default=TVM_FFI_VERSION,
                        help="apache-tvm-ffi version to download")
    parser.add_argument("--python", default="3.12",
                        help="the GPU machine's Python (its tvm-ffi wheel is per version)")
    args = parser.parse_args(argv)
    try:
        if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
            raise BundleError(f"{args.out} exists and is not an empty folder; "
                              "choose another --out")
        if args.wheels is not None and not args.wheels.is_dir():
            raise BundleError(f"--wheels {args.wheels}: no such folder")
        with tempfile.TemporaryDirectory() as temp:
            wheels = args.wheels
            if wheels is None:
                wheels = Path(temp)
                print(f"downloading flashinfer-python {args.version} and apache-tvm-ffi "
                      f"{args.tvm_ffi_version} (~105 MB) ...", flush=True)
                download(wheels, args.version, args.tvm_ffi_version, args.python)
            done = bundle(args.out, wheels, args.version)
    except BundleError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: flashinfer.tar.xz {done['tar_bytes'] / 2**20:.1f} MiB "
          f"({done['freed_bytes'] / 2**20:.0f} MiB of unused sources left out), "
          f"{done['tvm_wheel']}, install.sh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
