#!/usr/bin/env bash
# One device call (cold machine, ~10 min): checks and measures what changed on the CPU since
# round A (session 6), then re-measures the loop overheads alone.
#   1. GPU tests: a forced iteration syncs no more often than a free one (the forced m now
#      goes up through a pinned buffer), SPECSIM_RANKING=radix captures in graphs and decodes
#      what topk decodes (the fused Quest selection copied s up from the host at each call,
#      which a capturing stream refuses), the radix kernels at realistic shapes;
#   2. Quest's loop (SmolLM2 b32 4K k4) with the torch selection vs the fused kernel, and the
#      torch cache writes vs the fused one-position append (SPECSIM_FUSED_APPEND=1); Vegas'
#      loop with the fused append (its torch-write figure: round A, 10.6 ms);
#   3. Qwen3-8B's plain step at batch 4, 32K with and without the fused append (#4's floor);
#   4. scripts/verify_tile_probe.py: verify configs where the calibrations step between
#      neighbouring q (SmolLM2 hd64 q = 6–10 on a 32-row tile; Qwen3-8B b1 32K C2Q q = 6/8,
#      all-row q = 13): a variant that wins → DEFAULT_CONFIGS, then re-measure the verify rows
#      (calibrate --only verify, merge --replace verify,verify:last-token,...);
#   5. SmolLM2's loop overheads alone (calibrate --only overhead), written after every shape to
#      $OUT/cal-overhead/smollm2-135m.json (resumable: the same command on a warm machine
#      continues). Here: merge_calibrations.py NEW SHIPPED OUT --replace overhead.
# Qwen3-8B's (its loops take ~10× longer) in a call of their own:
#   PYTHONPATH=. python3 scripts/calibrate_shipped.py --out-dir "$OUT/cal-overhead" \
#       --models qwen3-8b --only overhead --budget-s 400 --repeats 10
# Usage: bash scripts/gpu_round_b.sh [SMOLLM2_BUDGET_S=180]
set -u
export PYTHONPATH=.
SMOLLM2_BUDGET_S=${1:-180}
python3 -m pytest -q -x tests/test_engine_gpu.py -k "forced or radix or fused" 2>&1 | tail -3
python3 -m pytest -q -x tests/test_kernels_topk.py 2>&1 | tail -1
for variant in "topk 0" "radix 0" "topk 1" "radix 1"; do set -- $variant
    PROFILE=0 SPECSIM_RANKING=$1 SPECSIM_FUSED_APPEND=$2 python3 scripts/loop_profile.py \
        smollm2-135m 32 4096 4 quest 2>&1 | grep -E "loop clock|Error" | head -2 \
        | sed "s/^/[$1 fused=$2] /"
done
PROFILE=0 SPECSIM_FUSED_APPEND=1 python3 scripts/loop_profile.py smollm2-135m 32 4096 4 vegas \
    2>&1 | grep -E "loop clock|Error" | head -2 | sed "s/^/[vegas fused=1] /"
for fused in 0 1; do     # Qwen3-8B plain step at b4 32K: 10.5 ms in the validation runs, floor 8.5
    SPECSIM_FUSED_APPEND=$fused python3 scripts/engine_benchmark.py --compile --fuse \
        --contexts 32768 --batch 4 --new-tokens 32 --out "$OUT/engine-fused$fused.json" 2>&1 \
        | grep -E "context 32768|Error" | head -2 | sed "s/^/[plain fused=$fused] /"
done
python3 scripts/verify_tile_probe.py smollm2 2>&1 | tail -17 > "$OUT/verify-tiles.txt"
python3 scripts/verify_tile_probe.py qwen3-8b 2>&1 | tail -15 >> "$OUT/verify-tiles.txt"
cut -c1-160 "$OUT/verify-tiles.txt"
python3 scripts/calibrate_shipped.py --out-dir "$OUT/cal-overhead" --models smollm2-135m \
    --only overhead --budget-s "$SMOLLM2_BUDGET_S" --repeats 10 2>&1 | grep -v "^\[" | tail -4
