#!/usr/bin/env bash
# Round L (next session, one H200, ~17 of the 30 device minutes): check session 12's summed
# Collect-2-Query plans on the GPU, ask whether the per-head store's cost is the DRAM or the
# SM's store path, then re-measure what a "sum" default changes in the four calibrations.
#
# Session 12 (BENCHMARKS.md): the per-head C2Q cost at hd128 q = 8 (+9%) is the store alone
# (the dot is free); collect_sum now sums the collecting tile's dot (1.04-1.06x off at hd128
# q = 8; the engine 1% faster at k = 4). Its q = 16 plans (WAVE_CONFIGS "sum" entries) were
# measured with explicit configs in c2q_store_probe run 3, not yet through plan_verify's
# defaults, and the kernel's sum tests have not run on the GPU with them.
#
#   1  (~330 s)  bash scripts/gpu_round_l.sh trial
#      the bf16 kernel tests of the sum path and the plan rules; c2q_store_probe with rows-l2
#      (the same stores kept in a 0.5 MB slot per program: no DRAM writes) beside rows and
#      store-only, hd128 and hd64, 128K and 32K, q 8 and 16 (prod-sum on the new plans);
#      bench_kernels' table (its "+c2q sum" rows on the new q = 16 plans)
#   2  (~360 s)  C2Q=sum bash scripts/gpu_round_j.sh cal smollm2-135m,qwen3-4b 170,300
#   3  (~250 s)  C2Q=sum bash scripts/gpu_round_j.sh cal qwen3-8b,llama-3.1-8b 250,250
#
# Here, afterwards: if rows-l2 runs at off's speed, the cost is the DRAM writes (no store
# layout can help; the bar needs fewer bytes: the summed row); if it costs like rows, the SM's
# store path is the cost and a TMA bulk store (tl.make_tensor_descriptor) is worth a trial.
# For the calibrations, per model: compare_calibrations.py OLD NEW --changed-only (a "sum"
# file's Vegas tiles compare as "sum" tiles, all gated), then
# merge_calibrations.py NEW OLD OLD --replace verify,selection, flip selection.C2Q's default
# to "sum" in the same commit, `specsim calibrate --check` each file, and plan a validation
# round (Vegas, Qwen3-8B) before running it.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
case "${1:-}" in
trial)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
    timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py \
        -k "sum or split_rules or collect" 2>&1 | tail -n 3
    timeout 120 python3 scripts/c2q_store_probe.py --head-dims 128,64 \
        --contexts 131072,32768 --q-lens 8,16 --variants off,rows,store-only,rows-l2,sum-sep \
        --out "$OUT/probe" 2>&1 | sed -n '/^µs per/,$p'
    timeout 230 python3 benchmarks/bench_kernels.py --head-dims 128,64 \
        --contexts 131072,32768,8192 --q-lens 1,8,16 --no-check --budget-s 190 \
        --out "$OUT/kernels" 2>&1 | tee "$OUT/kernels.log" | sed -n '/^targets/,$p'
    ;;
*)
    echo "usage: bash scripts/gpu_round_l.sh trial   (calibrations: see the header)"
    exit 2
    ;;
esac
