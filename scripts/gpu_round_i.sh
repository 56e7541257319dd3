#!/usr/bin/env bash
# Round I (session 11, 30 min of device time, kind nvidia-h200-x2): decide and flip the two
# session-10 trials, then re-measure what they touch in all four shipped H200 calibrations.
#
#   1  (~200 s)  bash scripts/gpu_round_i.sh trial
#      GPU 1: the kernel tests in bf16 under SPECSIM_VERIFY_SPLITS=waves (collect_sum and the
#      whole-wave cases included), then bench_kernels at 32K and 128K, q 1, 8, 16 (the
#      "+c2q sum" rows beside "+c2q"); GPU 0: the engine's Vegas loop, Qwen3-8B b4 32K, with
#      SPECSIM_C2Q=rows and =sum (both under waves) -> $OUT/c2q-*.json
#   2  (~560 s)  C2Q=sum|rows bash scripts/gpu_round_i.sh cal A      (smollm2-135m, qwen3-4b)
#   3  (~560 s)  C2Q=sum|rows bash scripts/gpu_round_i.sh cal B      (qwen3-8b, llama-3.1-8b)
#      plain and verify rows (and, with C2Q=sum, selection) under waves, one model per GPU
#      -> $OUT/cal/<model>.json. (Two calls: with selection the four do not fit in one.)
#
# Here, afterwards, per model (stop if a tile got slower: revise WAVE_CONFIGS instead):
#   python scripts/compare_calibrations.py models/calibrations/h200/<m>.json <OUT>/cal/<m>.json --fail-above 1.03
#   python scripts/merge_calibrations.py <OUT>/cal/<m>.json models/calibrations/h200/<m>.json \
#       models/calibrations/h200/<m>.json --replace plain,verify[,selection] --note "..."
# then flip VERIFY_SPLITS' default to "waves" (verify_attention.py) and, if it won, C2Q's to
# "sum" (engine/selection.py) in the same commit, `specsim calibrate --check` each file, and
# plan validation round 8 from the new files before any run.
set -u
export PYTHONPATH=. SPECSIM_VERIFY_SPLITS=waves
trace=traces/smollm2-135m-greedy-bf16-h200-continuous.jsonl
case "${1:-}" in
trial)
    (CUDA_VISIBLE_DEVICES=1 timeout 90 python3 -m pytest -q -p no:cacheprovider \
        tests/test_kernels_attention.py -k "verify or wave or split" 2>&1 | tail -n 2
     CUDA_VISIBLE_DEVICES=1 timeout 90 python3 -m pytest -q -p no:cacheprovider \
        tests/test_engine_gpu.py -k "summed or graphs_replay" 2>&1 | tail -n 2
     CUDA_VISIBLE_DEVICES=1 timeout 150 python3 benchmarks/bench_kernels.py --head-dims 128,64 \
        --contexts 131072,32768 --q-lens 1,8,16 --no-check --budget-s 120 --out "$OUT/kernels" \
        2>&1 | grep -E "verify|targets|^hd") > /tmp/k.log 2>&1 &
    for mode in rows sum; do
        CUDA_VISIBLE_DEVICES=0 SPECSIM_C2Q=$mode timeout 110 python3 scripts/engine_benchmark.py \
            --compile --fuse --contexts 32768 --batch 4 --new-tokens 64 --trace "$trace" \
            --policy vegas --ks 4,8 --ss 0.05 --out "$OUT/c2q-$mode.json" 2>&1 \
            | grep -E "^context|s=" | sed "s/^/$mode: /"
    done
    wait
    cat /tmp/k.log
    ;;
cal)
    only=plain,verify
    [ "${C2Q:-rows}" = sum ] && only=plain,verify,selection
    export SPECSIM_C2Q=${C2Q:-rows}
    if [ "${2:-}" = A ]; then m0=smollm2-135m; m1=qwen3-4b; else m0=qwen3-8b; m1=llama-3.1-8b; fi
    for g in 0 1; do
        m=$m0; [ $g = 1 ] && m=$m1
        CUDA_VISIBLE_DEVICES=$g timeout 560 python3 scripts/calibrate_shipped.py \
            --out-dir "$OUT/cal" --models "$m" --budget-s 520 --repeats 10 --only "$only" \
            2>&1 | grep -v "^\[" | tail -n 2 &
    done
    wait
    ;;
*)
    echo "usage: bash scripts/gpu_round_i.sh trial | [C2Q=sum] bash scripts/gpu_round_i.sh cal A|B"; exit 2
    ;;
esac
