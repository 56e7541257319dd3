#!/usr/bin/env bash
# Round M (next session, one H200): time V addressed with K's offsets (SPECSIM_SHARED_KV_STRIDES)
# and the 64-row hd128 tiles' key blocks, then re-measure what the winners change.
#
# Session 13 (BENCHMARKS.md): c2q_store_probe's kernel, whose V loads reuse K's offsets, ran
# hd128 q = 16 10-13% faster than production on the same plan (sum-sep 505 vs prod 564 us at
# 128K; off 476 on 128-key blocks vs production's 502-511 on its 64-key plan). Compiled offline
# (scripts/kernel_resources.py), production's 64-row tile spends 269 LEA on V's own offset
# tensor and spills 96 B in the summed-C2Q form; with shared offsets 13 LEA and 36 B, the
# probe's twin. Production's summed q = 16 tile also ran best on 64-key blocks: 4 chunks
# 1.046 / 1.028 / 0.974 x off at 128K / 32K / 8K against the shipped 128-key plan's
# 1.18 / 1.14 / 1.02 (own strides). Neither change is the default yet: the shipped
# calibrations time the current kernels.
#
#   1  (~330 s)  bash scripts/gpu_round_m.sh trial
#      bf16 GPU tests of the shared addressing (verify and sparse, both V layouts); the probe at
#      hd128 q 8/12/16, 128K/32K/8K, production off and summed on 64- and 128-key plans, with
#      own strides then shared; bench_kernels' table with its "shared-kv" rows
#   then here: flip SHARED_KV_STRIDES (kernels/_runtime.py) if it wins everywhere it runs,
#      set WAVE_CONFIGS' (128, 64, "sum") and, if 128-key blocks now win, a (128, 64, "off")
#      entry from the probe's tables; commit; `specsim calibrate --check` stays for after
#   2  (~550 s)  bash scripts/gpu_round_m.sh cal smollm2-135m,qwen3-4b 200,300
#   3  (~550 s)  bash scripts/gpu_round_m.sh cal qwen3-8b,llama-3.1-8b 250,250
#      plain, verify and draft (the sparse kernel takes the switch too) on the new defaults
#   then here, per model: compare_calibrations.py OLD NEW --changed-only (gate 1.03 on the
#      changed tiles), merge_calibrations.py NEW OLD OLD --replace plain,verify,draft, and
#      `specsim calibrate --check`; record in BENCHMARKS.md and plan a validation round.
# Also worth a probe while the machine is warm: hd64's q = 16 tile (128 rows, q16/q1 1.7-2.0)
# runs 256-key blocks on 8 warps, which kernel_resources.py shows at 255 registers with 40 B
# of spills; 128-key blocks on 8 warps compile to 246 registers and none.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
case "${1:-}" in
trial)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py \
        -k "shared_kv or collect_sum or matches_reference" 2>&1 | tail -n 3
    for kv in own shared; do
        flag=""; [ "$kv" = shared ] && flag="--shared-kv"
        echo "== production with $kv V offsets"
        timeout 90 python3 scripts/c2q_store_probe.py --head-dims 128 \
            --contexts 131072,32768,8192 --q-lens 16,12,8 --variants off,sum-sep $flag \
            --off-configs 128:4:3:4,64:4:3:4 --sum-configs 128:4:3:4,64:4:3:4,64:4:3:8 \
            --out "$OUT/probe-$kv" 2>&1 | sed -n '/^µs per/,$p'
    done
    timeout 230 python3 benchmarks/bench_kernels.py --head-dims 128,64 \
        --contexts 131072,32768,8192 --q-lens 1,8,16 --no-check --budget-s 190 \
        --out "$OUT/kernels" 2>&1 | tee "$OUT/kernels.log" | sed -n '/^targets/,$p'
    ;;
cal)
    IFS=, read -r -a models <<< "${2:?models}"
    IFS=, read -r -a budgets <<< "${3:?budgets}"
    for i in "${!models[@]}"; do
        timeout $(( ${budgets[$i]} + 40 )) python3 scripts/calibrate_shipped.py \
            --out-dir "$OUT/cal" --models "${models[$i]}" --budget-s "${budgets[$i]}" \
            --repeats 10 --only plain,verify,draft 2>&1 | grep -v "^\[" | tail -n 2
    done
    ;;
*)
    echo "usage: bash scripts/gpu_round_m.sh trial | cal M1,M2 B1,B2   (see the header)"
    exit 2
    ;;
esac
