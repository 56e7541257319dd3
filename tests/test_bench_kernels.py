"""benchmarks/bench_kernels.py and bench_prefill.py exercised on the CPU (``--dry-run``:
Triton's interpreter, tiny shapes, timings meaningless): every row each times on the GPU is
produced, and its own correctness check (against the torch references) passes. FlashInfer is
stood in for by a torch module with its wrappers' documented semantics (paged KV in its HND
layout, bottom-right causal mask), which checks how the benchmark lays out and indexes its
pages; the real kernels run on the GPU only."""
import json
import sys

import pytest
import torch

from repo import benchmark, run_main


STAND_IN = '''
import torch

__version__ = "stand-in"


class _Paged:
    def __init__(self, workspace, kv_layout="NHD", use_tensor_cores=False, backend="auto"):
        assert kv_layout == "HND"

    def _plan(self, qo_indptr, indptr, indices, last, heads, kv_heads, head_dim, page,
              causal=True, q_data_type=None, kv_data_type=None):
        self.qo, self.indptr, self.indices, self.last = qo_indptr, indptr, indices, last
        self.page = page

    def _run(self, q, cache, out):
        k_pages, v_pages = cache                       # [pages, kv_heads, page, head_dim]
        for b in range(len(self.indptr) - 1):
            chosen = self.indices[self.indptr[b]:self.indptr[b + 1]].long()
            length = (len(chosen) - 1) * self.page + int(self.last[b])
            k = k_pages[chosen].transpose(0, 1).flatten(1, 2)[:, :length].float()
            v = v_pages[chosen].transpose(0, 1).flatten(1, 2)[:, :length].float()
            rows = q[self.qo[b]:self.qo[b + 1]].float().transpose(0, 1)   # [heads, q, d]
            group = rows.shape[0] // k.shape[0]
            k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
            scores = rows @ k.transpose(1, 2) / rows.shape[-1] ** 0.5
            position = length - rows.shape[1] + torch.arange(rows.shape[1])
            scores[:, torch.arange(length)[None, :] > position[:, None]] = float("-inf")
            out[self.qo[b]:self.qo[b + 1]] = (scores.softmax(-1) @ v).transpose(0, 1)
        return out


class BatchDecodeWithPagedKVCacheWrapper(_Paged):
    def plan(self, indptr, indices, last, heads, kv_heads, head_dim, page, q_len_per_req=1,
             **kwargs):
        self._plan(torch.arange(len(indptr)) * q_len_per_req, indptr, indices, last, heads,
                   kv_heads, head_dim, page, **kwargs)
        self.q_len = q_len_per_req

    def run(self, q, cache, out=None, q_len_per_req=1):
        assert q_len_per_req == self.q_len, "planned for another q_len_per_req"
        return self._run(q, cache, out)


class BatchPrefillWithPagedKVCacheWrapper(_Paged):
    def plan(self, qo_indptr, indptr, indices, last, heads, kv_heads, head_dim, page,
             **kwargs):
        self._plan(qo_indptr, indptr, indices, last, heads, kv_heads, head_dim, page,
                   **kwargs)

    def run(self, q, cache, out=None):
        return self._run(q, cache, out)
'''


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real benchmark")
def test_bench_kernels_dry_run(tmp_path, monkeypatch, capsys):
    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "__init__.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "flashinfer", None)   # gone again after the test
    del sys.modules["flashinfer"]                          # the stand-in, imported here
    done = run_main(benchmark("bench_kernels", monkeypatch).main, capsys, "--dry-run",
                    "--head-dims", "128", "--q-lens", "1,8,16", "--out", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "bench_kernels.json").read_text())
    errors = results["errors hd128"]
    assert {"verify q=8 sum", "logits q=16 sum", "verify q=16 sep", "sparse"} <= set(errors)
    assert all(e < 1e-4 for e in errors.values()), errors       # fp32 in the interpreter
    shape = next(v for k, v in results.items() if k.startswith("hd128 "))
    timed = {"verify q=1", "verify q=16", "verify q=16 +c2q sum", "verify q=16 +all",
             "sparse s=.07 seq sorted", "select vegas sum",
             "select sparsespec (radix)"}
    assert timed <= set(shape)
    assert all("error" not in shape[name] for name in timed)
    assert "targets:" in done.stdout
    # the FlashInfer peer: every row timed, on its paged copy of the same cache, and the same
    # attention as specsim's verify computes
    assert results["flashinfer"] == "flashinfer stand-in"
    for name in ("flashinfer decode q=1", "flashinfer decode q=8", "flashinfer prefill q=8"):
        assert shape[name]["error_vs_verify"] < 1e-4, (name, shape[name])
    assert "FlashInfer's best time / verify's" in done.stdout


def test_flashinfer_missing_is_one_line_reason(monkeypatch):
    """Without FlashInfer the benchmark names why and times the other peers."""
    bench_kernels = benchmark("bench_kernels", monkeypatch)
    monkeypatch.setitem(sys.modules, "flashinfer", None)       # import raises ImportError
    module, reason = bench_kernels.import_flashinfer()
    assert module is None
    assert reason.startswith("flashinfer not importable (ModuleNotFoundError: ")
    assert "\n" not in reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real benchmark")
def test_bench_prefill_dry_run(tmp_path, monkeypatch, capsys):
    """benchmarks/bench_prefill.py on the CPU: its correctness check of every path and peer
    against the definition passes, and every (shape, path, implementation) row is timed."""
    out = tmp_path / "bench_prefill.json"
    done = run_main(benchmark("bench_prefill", monkeypatch).main, capsys, "--dry-run",
                    "--repeats", "1", "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert len(results["checks"]) == 2 * 3 * 2              # engine and flex, every path
    assert all(c["max_abs_err"] < 1e-4 for c in results["checks"])
    timed = {(r["shape"], r["path"], r["impl"]) for r in results["rows"] if r["ms"]}
    # engine and flex on every path; SDPA's causal kernel where no window; building flex's
    # mask for a new prompt length on the window path
    assert len(timed) == 2 * (3 * 2 + 2 + 1)
