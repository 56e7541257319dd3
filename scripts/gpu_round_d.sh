#!/usr/bin/env bash
# (Run in session 9, on two GPUs at once: BENCHMARKS.md, Calibration.)
# Round D (session 9, 30 min of device time): re-calibrate both shipped models on the engine
# paths that become the defaults — the fused one-position cache append
# (SPECSIM_FUSED_APPEND=1: Qwen3-8B plain b4 32K 10.54 -> 9.92 ms, SmolLM2's Vegas loop
# 10.6 -> 8.67 ms) and each policy's fastest ranking (SPECSIM_RANKING=best: radix for
# SparseSpec-L and Quest; Quest's SmolLM2 loop 37.9 -> 14.4 ms) — so that the defaults can be
# flipped in the same commit as the calibrations that time them (BENCHMARKS.md, Engine).
# Every op the flip touches is re-measured (plain and draft steps append; SparseSpec-L's
# refresh and Quest's draft rank; the loop overheads carry the launches); verify rows stay
# (session 8's, at every shape: a verify pass appends q positions through the torch path
# either way).
#
#   A  (~570 s)  bash scripts/gpu_round_d.sh smollm2-135m 440 1536,3072,6144
#      (the third argument: the refreshes alone also at these contexts, between the grid's
#      factor-2 points, where torch.topk's time jumps — held-out selection:vegas 5.5% on the
#      4-point grid; ~90 s more)
#   B  (~590 s, made within 30 s of A's end, so /root/cal-d survives)
#                bash scripts/gpu_round_d.sh qwen3-8b 560
#   C  (~590 s, at once)  bash scripts/gpu_round_d.sh qwen3-8b 560   (resumes B's checkpoint)
#
# The checkpoint lives in /root/cal-d (kept while the machine stays warm); each call copies it
# to $OUT/cal-d/. Here, per model, once its file is complete (every shape: the script prints
# how many it has):
#   python scripts/merge_calibrations.py NEW models/calibrations/h200/<model>.json OUT \
#       --replace plain,draft,selection,overhead --note "fused append + best ranking (session 9)"
#   (no --keep-other-shapes: rows of the old paths must not stay at shapes the new run missed)
#   python scripts/merge_calibrations.py SEL models/calibrations/h200/smollm2-135m.json OUT \
#       --replace selection --keep-other-shapes --note "refreshes at the in-between contexts"
#   (SEL: $OUT/cal-d-sel/smollm2-135m.json, measured on the same new paths)
#   specsim calibrate --check models/calibrations/h200/<model>.json
# then flip FUSED_APPEND's and RANKING's defaults (specsim/engine/decode.py,
# specsim/kernels/selection.py) in the same commit, and plan validation round 7 before its run.
set -u
model=${1:?usage: bash scripts/gpu_round_d.sh MODEL BUDGET_S [SELECTION_CONTEXTS]}
budget=${2:-520}
selection_contexts=${3:-}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /root/cal-d "$OUT/cal-d"
SPECSIM_FUSED_APPEND=1 SPECSIM_RANKING=best python3 scripts/calibrate_shipped.py \
    --out-dir /root/cal-d --models "$model" --only plain,draft,selection,overhead \
    --budget-s "$budget" --repeats 10 2>&1 | grep -v "^\[" | tail -4
cp /root/cal-d/*.json "$OUT/cal-d/"
if [ -n "$selection_contexts" ]; then
    mkdir -p /root/cal-d-sel "$OUT/cal-d-sel"
    SPECSIM_FUSED_APPEND=1 SPECSIM_RANKING=best python3 scripts/calibrate_shipped.py \
        --out-dir /root/cal-d-sel --models "$model" --only selection \
        --contexts "$selection_contexts" --budget-s 90 --repeats 10 2>&1 | grep -v "^\[" | tail -2
    cp /root/cal-d-sel/*.json "$OUT/cal-d-sel/"
fi
python3 - "$model" <<'EOF'
import json, sys
rows = json.load(open(f"/root/cal-d/{sys.argv[1]}.json"))["measurements"]
shapes = {(r["batch"], r["context"]) for r in rows if r["op"] == "plain"}
print(f"{sys.argv[1]}: {len(rows)} rows, plain at {len(shapes)} shapes: {sorted(shapes)}")
EOF
