#!/usr/bin/env bash
# (Run in session 8: its results are validation rounds 5-6, VALIDATION.md.)
# Validation round 5's device calls (session 8, 30 min of device time), in this order:
#
#   A  (carry _big/gguf/smollm2.gguf.part-aa and .whl; ~530 s)
#        bash scripts/gpu_round_c.sh A
#      SmolLM2's first GGUF part goes up; Qwen3-8B's verify rows re-measured at every shape
#      the budget allows (the all-row verify of last-token / SparseSpec-L had 5 of 13 shapes;
#      StreamingLLM's own verify, which collects no logits, is new) -> $OUT/cal-verify/.
#   B  (carry _big/gguf/smollm2.gguf.part-ab; at once)      bash scripts/gpu_smollm2_stage.sh put
#   C  (carry _big/gguf/smollm2.gguf.part-ac; at once; ~450 s)
#        bash scripts/gpu_round_c.sh C
#      the weights joined and converted; the 48-prompt trace re-recorded with every
#      configuration's prompts through 32 slots as one continuous batch (the extended trace's
#      last 16 prompts had been recorded in a batch of 16: VALIDATION.md round 4, item 2) ->
#      $OUT/smollm2-135m-greedy-bf16-h200-continuous.jsonl; SmolLM2's verify rows -> $OUT/cal-verify/.
#
# Here, between C and D (the machine goes cold):
#   python scripts/merge_calibrations.py NEW models/calibrations/h200/<model>.json OUT \
#       --replace verify --keep-other-shapes --note "verify rows re-measured (session 8) ..."
#   (per model: the shapes the budget missed keep their verify rows); then
#   specsim calibrate --check models/calibrations/h200/<model>.json
#   cp the trace to traces/, document it in traces/README.md, then, committed before the runs:
#   specsim validate plan --trace traces/<new trace> --requests-free 96 \
#       --out benchmarks/validation-plan-h200-r5.json
#   specsim validate plan --no-free --trace traces/<new trace> \
#       --out benchmarks/validation-plan-h200-r5-qwen3-8b.json
#
#   D  (carry part-aa and .whl; ~350 s)
#        bash scripts/gpu_smollm2_stage.sh put; bash scripts/gpu_validate_call.sh \
#            benchmarks/validation-plan-h200-r5-qwen3-8b.json qwen3-8b \
#            "vegas,sparsespec,streamingllm,quest,last-token" 1; \
#        PYTHONPATH=. python3 scripts/verify_phase_probe.py qwen3-8b 4 32768 2; \
#        PYTHONPATH=. python3 -m pytest -q tests/test_engine_gpu.py -k "radix or fused" | tail -3
#      (the probe: Vegas' verify phase in runs was 0.5 ms above the calibration's at q = 3;
#      the tests: round B's -x stopped before the radix / fused-append engine tests ran)
#   E  (carry part-ab; at once)                               bash scripts/gpu_smollm2_stage.sh put
#   F  (carry part-ac; at once; ~400 s)
#        bash scripts/gpu_smollm2_stage.sh join && PYTHONPATH=/tmp/site bash \
#            scripts/gpu_validate_call.sh benchmarks/validation-plan-h200-r5.json smollm2 \
#            "vegas,quest;sparsespec,streamingllm;last-token" 1
#
# The engine's defaults stay as the shipped calibrations timed them (topk ranking, torch cache
# writes) for this round; the fused append and radix ranking (BENCHMARKS.md) become defaults
# in the round after, with their re-calibration.
set -u
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
case "${1:-}" in
A)
    bash scripts/gpu_smollm2_stage.sh put
    python3 scripts/calibrate_shipped.py --out-dir "$OUT/cal-verify" --models qwen3-8b \
        --only verify --budget-s "${2:-470}" --repeats 10 2>&1 | grep -v "^\[" | tail -3
    ;;
C)
    bash scripts/gpu_smollm2_stage.sh join || exit 1
    PYTHONPATH=.:/tmp/site python3 -m specsim.engine.record \
        traces/smollm2-prompt-ids-extended.json \
        "$OUT/smollm2-135m-greedy-bf16-h200-continuous.jsonl" --weights /root/smollm2 \
        --batch 32 --continuous 2>&1 | tail -2
    python3 scripts/calibrate_shipped.py --out-dir "$OUT/cal-verify" --models smollm2-135m \
        --only verify --budget-s "${2:-200}" --repeats 10 2>&1 | grep -v "^\[" | tail -3
    ;;
*)
    echo "usage: bash scripts/gpu_round_c.sh A|C [BUDGET_S]  (the calls in order: header)"
    exit 2
    ;;
esac
