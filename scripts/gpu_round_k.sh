#!/usr/bin/env bash
# Round K (next session, one H200): can Collect-2-Query meet issue #3's "<= 5% over off" at
# hd128 by storing the two rows from the main tile under whole waves?
#
# Session 11's kernel table (BENCHMARKS.md) under waves: at q = 16 the main-tile store cost
# +0.4% over off (537 vs 534 us, hd128 128K: its 64-row tile is a WAVE_CONFIGS tile, 4 chunks
# of 128-key blocks), the separate tile +16% (its tile keeps the "sm" plan); at q = 8 the
# separate tile (a WAVE_CONFIGS tile) cost +10%, the main tile +27% (its 32-row "main" tile is
# not in WAVE_CONFIGS: "sm" plan). So: sweep both tiles at q = 8 and 16 over whole-wave
# configs at each context.
#
#   1  (~420 s)  bash scripts/gpu_round_k.sh probe
#      decode_config_probe.py, hd128 then hd64 (64 / 8 heads), 128K/32K/8K, cases
#      8:off 8:separate 8:main 16:off 16:separate 16:main -> $OUT/probe-hd*/decode_config_probe.json
#
# Here, afterwards: where a main-tile config at (4 chunks, 128 keys) is within 5% of off,
# add (head_dim, rows, "main") to WAVE_CONFIGS, make plan_verify store Vegas' rows from the main
# tile for those tiles (collect_separate's default), test it (tests/test_kernels_attention.py:
# the plan rule and the logits in the interpreter), then re-measure the verify rows of the
# four calibrations, per model (about 60-120 s each):
#   PYTHONPATH=. python3 scripts/calibrate_shipped.py --out-dir "$OUT/cal" --models <m> \
#       --only verify --budget-s 200 --repeats 10
# and gate them with compare_calibrations.py --changed-only before merge_calibrations.py
# --replace verify.
#
# Ran in session 12 (487 s of device time): only the hd128 128K cases got their grids inside
# the 270 s budget, and the hd64 half printed nothing (cut by its timeout). At q = 8 the best
# main-tile config was 4.03 TB/s against 4.08 separate and 4.52 off: no rescue. What followed
# (c2q_store_probe.py, BENCHMARKS.md session 12) found the store itself is the cost.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
case "${1:-}" in
probe)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
    cases=8:off,8:separate,8:main,16:off,16:separate,16:main
    timeout 300 python3 scripts/decode_config_probe.py --head-dims 128 \
        --contexts 131072,32768,8192 --cases "$cases" --budget-s 270 --out "$OUT/probe-hd128" \
        2>&1 | sed -n '/^TB\/s/,$p'
    timeout 140 python3 scripts/decode_config_probe.py --head-dims 64 --heads 64,8 \
        --contexts 131072,32768 --cases "$cases" --budget-s 120 --out "$OUT/probe-hd64" \
        2>&1 | sed -n '/^TB\/s/,$p'
    ;;
*)
    echo "usage: bash scripts/gpu_round_k.sh probe"; exit 2
    ;;
esac
