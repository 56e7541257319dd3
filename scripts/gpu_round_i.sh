#!/usr/bin/env bash
# Round I (session 11): re-measure the plain and verify rows of all four shipped H200
# calibrations with SPECSIM_VERIFY_SPLITS=waves (the rule as revised in session 10 from the
# SmolLM2 / Qwen3-4B re-measurements: whole waves only for WAVE_CONFIGS' tiles), on a machine
# of two H200s (kind nvidia-h200-x2), two models per GPU, one call (~520 s):
#
#   bash scripts/gpu_round_i.sh            # -> $OUT/cal/<model>.json (provenance.engine.verify_splits = waves)
#
# Here, afterwards, per model (stop if a tile got slower: then revise WAVE_CONFIGS instead):
#   python scripts/compare_calibrations.py models/calibrations/h200/<m>.json <OUT>/cal/<m>.json --fail-above 1.03
#   python scripts/merge_calibrations.py <OUT>/cal/<m>.json models/calibrations/h200/<m>.json \
#       models/calibrations/h200/<m>.json --replace plain,verify --note "whole-wave verify splits"
# then flip VERIFY_SPLITS' default to "waves" (verify_attention.py) in the same commit, run
# `specsim calibrate --check` on each file, and plan validation round 8 from the new files
# before any run (`specsim validate plan ... --out benchmarks/validation-plan-h200-r8.json`).
set -u
export PYTHONPATH=. SPECSIM_VERIFY_SPLITS=waves
cal() {   # $1: GPU, $2: model, $3: budget (s)
    CUDA_VISIBLE_DEVICES=$1 timeout $(( $3 + 40 )) python3 scripts/calibrate_shipped.py \
        --out-dir "$OUT/cal" --models "$2" --budget-s "$3" --repeats 10 --only plain,verify \
        2>&1 | grep -v "^\[" | tail -n 2
}
(cal 1 qwen3-8b 250; cal 1 llama-3.1-8b 250) > /tmp/gpu1.log &
cal 0 smollm2-135m 150
cal 0 qwen3-4b 250
wait
cat /tmp/gpu1.log
