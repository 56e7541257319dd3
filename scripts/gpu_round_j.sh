#!/usr/bin/env bash
# Round J (session 11, 30 min of device time, one H200: the two-GPU kind was not lent, so round
# I's calls run one after another here). Decide the two session-10 trials (whole-wave splits,
# the summed Collect-2-Query), then re-measure what they touch in the four shipped calibrations.
#
#   1  (~450 s)  bash scripts/gpu_round_j.sh trial
#      the kernel and engine GPU tests in bf16 under SPECSIM_VERIFY_SPLITS=waves (collect_sum
#      included: it has not run on a GPU yet); the engine's Vegas loop, Qwen3-8B b4 32K, with
#      SPECSIM_C2Q rows and sum alternating in one process (rows,sum,rows,sum: the spread of
#      a repeat is the noise) -> $OUT/c2q.json; bench_kernels under waves at 128K/32K/8K,
#      hd128 and hd64, q 1, 8, 16 ("+c2q sum" and "select vegas sum" beside the rows)
#      -> $OUT/kernels/bench_kernels.json
#   2  (351 s)   C2Q=rows|sum bash scripts/gpu_round_j.sh cal smollm2-135m,qwen3-4b 170,300
#   3  (243 s)   C2Q=rows|sum bash scripts/gpu_round_j.sh cal qwen3-8b,llama-3.1-8b 250,250
#      (session 11 ran both with C2Q=rows: sum lost in call 1; the times are those runs')
#      plain and verify rows (with C2Q=sum, selection too) under waves, the models one after
#      the other -> $OUT/cal/<model>.json (written after every shape: a cut call keeps them)
#
# Here, afterwards, per model (stop if a tile got slower: revise WAVE_CONFIGS instead):
#   python scripts/compare_calibrations.py models/calibrations/h200/<m>.json <OUT>/cal/<m>.json --fail-above 1.03
#   python scripts/merge_calibrations.py <OUT>/cal/<m>.json models/calibrations/h200/<m>.json \
#       models/calibrations/h200/<m>.json --replace plain,verify[,selection] --note "..."
# then flip VERIFY_SPLITS' default to "waves" (verify_attention.py) and, if it won, C2Q's to
# "sum" (engine/selection.py) in the same commit, and `specsim calibrate --check` each file.
set -u
export PYTHONPATH=. SPECSIM_VERIFY_SPLITS=waves PYTHONUNBUFFERED=1
trace=traces/smollm2-135m-greedy-bf16-h200-continuous.jsonl
case "${1:-}" in
trial)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py \
        -k "verify or wave or split or sum" 2>&1 | tail -n 3
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py \
        -k "summed or graphs_replay" 2>&1 | tail -n 3
    timeout 150 python3 scripts/engine_benchmark.py --compile --fuse --contexts 32768 \
        --batch 4 --new-tokens 64 --trace "$trace" --policy vegas --ks 4,8 --ss 0.05 \
        --c2q rows,sum,rows,sum --out "$OUT/c2q.json" 2>&1 | grep -E "^context|s=|wrote"
    timeout 230 python3 benchmarks/bench_kernels.py --head-dims 128,64 \
        --contexts 131072,32768,8192 --q-lens 1,8,16 --no-check --budget-s 190 \
        --out "$OUT/kernels" 2>&1 | tee "$OUT/kernels.log" | sed -n '/^total/,$p'
    ;;
cal)
    only=plain,verify
    [ "${C2Q:-rows}" = sum ] && only=plain,verify,selection
    export SPECSIM_C2Q=${C2Q:-rows}
    IFS=, read -r -a models <<< "${2:?models}"
    IFS=, read -r -a budgets <<< "${3:?budgets}"
    for i in "${!models[@]}"; do
        timeout $(( ${budgets[$i]} + 40 )) python3 scripts/calibrate_shipped.py \
            --out-dir "$OUT/cal" --models "${models[$i]}" --budget-s "${budgets[$i]}" \
            --repeats 10 --only "$only" 2>&1 | grep -v "^\[" | tail -n 2
    done
    ;;
*)
    echo "usage: bash scripts/gpu_round_j.sh trial | [C2Q=sum] bash scripts/gpu_round_j.sh cal M1,M2 B1,B2"
    exit 2
    ;;
esac
