#!/usr/bin/env bash
# One device call (cold machine, ~10 min): what changed on the CPU since the last GPU round is
# checked and measured before anything depends on it, then SmolLM2's calibration is re-measured.
#   1. the GPU tests of the engine (its loop changed: packed host reads, the collector paused)
#      and of the radix top-K kernel at realistic shapes;
#   2. scripts/loop_profile.py: where the ~1 ms per iteration outside the priced steps goes
#      (SmolLM2 batch 32, 4K, k = 4), Chrome trace under $OUT/profile;
#   3. bench_kernels' selection rows: torch.topk vs sort vs the radix kernels (Qwen3-8B shapes),
#      and Quest's loop with its selection in torch vs the fused kernel (SPECSIM_RANKING=radix);
#   4. the SmolLM2 calibration with the new measurements (overheads at k = 2 and 8 by the loop's
#      clock, all-row verify, SparseSpec-L's refresh by rows), written after every shape to
#      $OUT/cal/smollm2-135m.json (a call cut short keeps what it measured).
# Usage: bash scripts/gpu_round_a.sh [SMOLLM2_BUDGET_S=240]
set -u
export PYTHONPATH=.
python3 -m pytest -q -x tests/test_engine_gpu.py tests/test_kernels_topk.py 2>&1 | tail -3
python3 scripts/loop_profile.py smollm2-135m 32 4096 4 vegas "$OUT/profile" \
    > "$OUT/loop-profile.txt" 2>&1; grep -v CUDAEvent "$OUT/loop-profile.txt" | head -1
python3 benchmarks/bench_kernels.py --head-dims 128 --contexts 32768 --q-lens 8 --no-check \
    --budget-s 90 --out "$OUT/bench" 2>&1 | grep -i "select" | tail -12
for ranking in topk radix; do
    PROFILE=0 SPECSIM_RANKING=$ranking python3 scripts/loop_profile.py smollm2-135m 32 4096 4 \
        quest 2>&1 | grep -v CUDAEvent | head -1 | sed "s/^/[$ranking] /"
done
python3 scripts/calibrate_shipped.py --out-dir "$OUT/cal" --models smollm2-135m \
    --budget-s "${1:-240}" --repeats 10 2>&1 | grep -v "^\[" | tail -5
