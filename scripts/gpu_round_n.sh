#!/usr/bin/env bash
# Round N (session 14, one H200): is the summed Collect-2-Query row's cost its bytes or its work,
# and round M's trial (V addressed with K's offsets; the 64-row hd128 tiles' key blocks).
#
# Session 13: the summed fp32 row per KV head (0.78% of the KV bytes at hd128) ran 1.04-1.07x
# off at hd128 128K q = 8, where the per-head rows (3.1% of the bytes) ran 1.09-1.11x and the
# same per-head stores kept in L2 1.003x. Cost per byte written is 3-8x a byte read and not
# proportional to bytes, so before another layout: c2q_store_probe's sum-l2 (no DRAM writes),
# sum-nostore (dot and sum only), sum-bf16 (half the bytes) and sum-seq (an eighth: atomic adds
# over the KV heads into one row per sequence, the ranking Vegas actually uses).
#
#   1  (270 s)   bash scripts/gpu_round_n.sh trial
#      found: the summed row's cost is its DRAM bytes (sum-l2 1.000, sum-nostore 1.001, sum-sep
#      1.061, sum-bf16 1.046, sum-seq 1.027 at hd128 128K q8); shared V offsets mixed (q16 off
#      3% slower, summed 3% faster): left off; the 64-row hd128 off tile 5% faster on whole
#      waves of 128-key blocks
#   then here: collect_sum writes sum-seq's row (one per sequence, atomic adds); WAVE_CONFIGS
#      gains (128, 64, "off")
#   2  (~400 s)  bash scripts/gpu_round_n.sh check     GPU tests, the kernel table, SmolLM2's
#      Vegas verify and refresh re-measured
#      found: tests pass (bf16); SmolLM2 re-measured; but the table's summed q = 16 ran 1.23x
#      off: unmasked, the adds compiled to 176 B of spills (132 B masked), and an A/B in one
#      process (_big/atomic_ab.py, not kept) ran production 1.236x, the masked form 1.023x
#   then here: whole blocks add under an always-true mask; so everything is re-measured:
#   3  (~450 s)  bash scripts/gpu_round_n.sh cal smollm2-135m:vegas,qwen3-8b,llama-3.1-8b 90,130,130
#      verify (every policy: the 64-row off tile moved) and the refreshes
#   4  (~300 s, at once, warm)  bash scripts/gpu_round_n.sh cal qwen3-4b 130; bash
#      scripts/gpu_round_n.sh table 110
#   then here, per model: compare_calibrations.py OLD NEW --changed-only, merge_calibrations.py
#      NEW OLD OLD --replace verify,selection:vegas (SmolLM2: Vegas' rows only), calibrate --check
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
gpu_state() {
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
}
kernel_table() {    # bench_kernels' table within a budget of $1 seconds
    timeout 160 python3 benchmarks/bench_kernels.py --head-dims 128,64 \
        --contexts 131072,32768,8192 --q-lens 1,8,16 --no-check --budget-s "$1" \
        --out "$OUT/kernels" 2>&1 | tee "$OUT/kernels.log" | sed -n '/^targets/,$p'
}
case "${1:-}" in
trial)
    gpu_state
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py \
        -k "shared_kv or collect_sum or matches_reference" 2>&1 | tail -n 3
    echo "== the summed row: bytes or work"
    timeout 130 python3 scripts/c2q_store_probe.py --head-dims 128,64 \
        --contexts 131072,32768 --q-lens 8 \
        --variants off,rows,rows-l2,sum-sep,sum-l2,sum-nostore,sum-bf16,sum-seq \
        --out "$OUT/probe-sum" 2>&1 | sed -n '/^µs per/,$p'
    for kv in own shared; do
        flag=""; [ "$kv" = shared ] && flag="--shared-kv"
        echo "== production with $kv V offsets"
        timeout 80 python3 scripts/c2q_store_probe.py --head-dims 128 \
            --contexts 131072,32768,8192 --q-lens 16,12,8 --variants off,sum-sep $flag \
            --off-configs 128:4:3:4,64:4:3:4 --sum-configs 128:4:3:4,64:4:3:4,64:4:3:8 \
            --out "$OUT/probe-$kv" 2>&1 | sed -n '/^µs per/,$p'
    done
    kernel_table 125
    ;;
check)
    gpu_state
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py \
        -k "collect or matches_reference or wave or split" 2>&1 | tail -n 3 | tee "$OUT/tests.log"
    grep -q " failed" "$OUT/tests.log" && { echo "kernel tests failed: stop"; exit 1; }
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py \
        -k "summed or graphs_replay" 2>&1 | tail -n 3 | tee -a "$OUT/tests.log"
    grep -q " failed" "$OUT/tests.log" && { echo "engine tests failed: stop"; exit 1; }
    kernel_table 125
    timeout 160 python3 scripts/calibrate_shipped.py --out-dir "$OUT/cal" \
        --models smollm2-135m --policies vegas --budget-s 120 --repeats 10 \
        --only verify,selection 2>&1 | grep -v "^\[" | tail -n 2
    ;;
cal)      # M1[:policy+policy],M2 B1,B2: verify and the refreshes (of the named policies)
    IFS=, read -r -a models <<< "${2:?models}"
    IFS=, read -r -a budgets <<< "${3:?budgets}"
    for i in "${!models[@]}"; do
        model=${models[$i]%%:*}; policies=""
        [ "$model" != "${models[$i]}" ] && policies="--policies ${models[$i]#*:}"
        timeout $(( ${budgets[$i]} + 30 )) python3 scripts/calibrate_shipped.py \
            --out-dir "$OUT/cal" --models "$model" ${policies//+/,} --budget-s "${budgets[$i]}" \
            --repeats 10 --only verify,selection 2>&1 | grep -v "^\[" | tail -n 2
    done
    ;;
table)
    kernel_table "${2:-125}"
    ;;
*)
    echo "usage: bash scripts/gpu_round_n.sh trial | check | cal M1[:P1+P2],M2 B1,B2 | table [BUDGET]   (see the header)"
    exit 2
    ;;
esac
