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
#   1  (~560 s)  bash scripts/gpu_round_n.sh trial
#   then here: pick the summed row's form; flip SHARED_KV_STRIDES if it wins (round M's header)
#   2, 3         bash scripts/gpu_round_m.sh cal ...   (round M's header: what to re-measure)
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
case "${1:-}" in
trial)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
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
    timeout 160 python3 benchmarks/bench_kernels.py --head-dims 128,64 \
        --contexts 131072,32768,8192 --q-lens 1,8,16 --no-check --budget-s 125 \
        --out "$OUT/kernels" 2>&1 | tee "$OUT/kernels.log" | sed -n '/^targets/,$p'
    ;;
*)
    echo "usage: bash scripts/gpu_round_n.sh trial   (see the header)"
    exit 2
    ;;
esac
