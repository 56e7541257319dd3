"""The decode-shaped linear kernel (specsim.kernels.skinny_gemm) against an fp32 torch
reference: fresh random inputs every run, output poisoned first, ragged row counts (1, odd,
the most), column counts and K not multiples of the blocks, strided rows. Triton's interpreter
on the CPU (fp32/fp16, small shapes); bf16 at the engine's shapes on a GPU."""
import os

import torch

if not torch.cuda.is_available():  # before triton kernels are defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import seeding  # noqa: E402

from specsim.kernels.skinny_gemm import (MAX_M, default_block_n, skinny_gemm,  # noqa: E402
                                         skinny_gemm_reference)

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPE = torch.bfloat16 if GPU else torch.float32
TOLERANCE = 1e-2 if GPU else 1e-5

# (rows, N, K, block_n, block_k)
CASES_CPU = [(1, 48, 64, 16, 32), (3, 40, 100, 16, 32), (16, 64, 96, 32, 64),
             (MAX_M, 33, 40, 16, 16)]
CASES_GPU = [(4, 6144, 4096, None, 128), (4, 4096, 4096, None, 128),
             (16, 24576, 4096, None, 128), (9, 4096, 12288, None, 128),
             (1, 49152, 576, None, 64), (64, 1536, 576, None, 64)]
CASES = CASES_GPU if GPU else CASES_CPU


def fresh_generator(device=DEVICE, offset=0):
    return seeding.generator(offset, device)


@pytest.mark.parametrize("case", CASES)
def test_skinny_gemm_matches_reference(case):
    m, n, k, block_n, block_k = case
    g = fresh_generator()
    x = torch.randn(m, k, generator=g, device=DEVICE).to(DTYPE)
    w = (torch.randn(n, k, generator=g, device=DEVICE) / k ** 0.5).to(DTYPE)
    out = torch.full((m, n), float("nan"), dtype=DTYPE, device=DEVICE)
    got = skinny_gemm(x, w, out=out, block_n=block_n, block_k=block_k)
    ref = skinny_gemm_reference(x, w)
    assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
    assert float((got.float() - ref).norm() / ref.norm()) < TOLERANCE


def test_leading_dimensions_and_strided_rows():
    """[batch, tokens, K] in, [batch, tokens, N] out; rows of x taken with a stride (a slice of
    a wider activation) read correctly."""
    g = fresh_generator()
    wide = torch.randn(2, 3, 80, generator=g, device=DEVICE).to(DTYPE)
    x = wide[..., 8:72]                                     # stride 80 between rows
    w = torch.randn(24, 64, generator=g, device=DEVICE).to(DTYPE)
    got = skinny_gemm(x.reshape(6, 64), w, block_n=16, block_k=32).view(2, 3, 24)
    ref = skinny_gemm_reference(x, w)
    assert got.shape == (2, 3, 24)
    assert float((got.float() - ref).norm() / ref.norm()) < TOLERANCE


def test_bad_shapes_are_refused():
    x = torch.zeros(MAX_M + 1, 32, device=DEVICE, dtype=DTYPE)
    w = torch.zeros(16, 32, device=DEVICE, dtype=DTYPE)
    with pytest.raises(ValueError, match="rows"):
        skinny_gemm(x, w)
    with pytest.raises(ValueError, match="features"):
        skinny_gemm(x[:2, :16], w)
    with pytest.raises(ValueError, match="contiguous"):
        skinny_gemm(x[:2].t().contiguous().t()[:, :32], w)


def test_default_block_fills_the_gpu():
    """The widest column block that still leaves no multiprocessor without a program."""
    from specsim.kernels._runtime import multiprocessor_count
    sms = multiprocessor_count(DEVICE)
    for n in (576, 4096, 6144, 24576, 151936):
        block = default_block_n(n, DEVICE)
        assert block in (16, 32, 64, 128)
        assert block == 16 or n / block >= sms          # enough programs at this width
        assert block == 128 or n / (2 * block) < sms     # and the next wider had too few


@pytest.mark.skipif(GPU, reason="the dry run is the CPU's check of the benchmark script")
def test_benchmark_script_dry_run(tmp_path):
    """benchmarks/bench_skinny_gemm.py runs end to end (interpreter, tiny shapes) and writes a
    row per projection and row count, each with the kernel's checked result."""
    import json
    import subprocess
    import sys

    from repo import REPO_ROOT
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_skinny_gemm.py"),
                           "--dry-run", "--models", "smollm2-135m", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "bench_skinny_gemm.json").read_text())["rows"]
    assert {(r["proj"], r["M"]) for r in rows} == \
        {(p, m) for p in ("qkv", "o", "gate_up", "down", "lm_head") for m in (1, 4)}
    assert all(r["skinny_error"] < 1e-2 for r in rows)
