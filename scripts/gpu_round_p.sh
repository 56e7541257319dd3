#!/usr/bin/env bash
# Round P (session 15, one H200). Round O's trial found the harness is the cause of
# bench_kernels' 1.06-1.10x reading of the summed row: c2q_sum_ab's "sum-bench" (new_logits_buffer,
# 25 ms graphs) ran 516 us where "sum" (NaN-filled buffer, 8 ms graphs) ran 497, off 485, at
# hd128 128K q8 (hd64 128K: 309 against 286). This call separates buffer from graph length
# (c2q_sum_ab --harness: off and sum, each buffer, 8 / 25 ms graphs and back-to-back launches,
# three rounds in alternating order, the SM clock and power logged beside), then runs validation
# round 9 (Qwen3-8B b4 32K forced, five policies, the per-sequence summed row and the merged
# calibration), whose plan was committed before the run.
#
#   1  (332 s)  bash scripts/gpu_round_p.sh trial
#      found: neither the buffer nor the graph's length: the summed row's time moves from one
#      graph to the next (hd128 128K q8: 497-546 us over nine graphs, off 474-476), so one
#      bench_kernels reading can land anywhere in that range. Lead: the 8 KV heads' programs of
#      a sequence walk the same keys in step and add into the same lines of its row at once.
#      Validation round 9: every policy 0.4-0.8% MAPE, regret 1.000.
#   then here: collect_stagger (SPECSIM_C2Q_STAGGER) walks each KV head's whole blocks from a
#      staggered start, as two runs of blocks; c2q_sum_ab's sum-wrapped, as one wrapped loop
#   2  (~250 s)  bash scripts/gpu_round_p.sh stagger
#      the collect_sum tests in bf16 (staggered and in step), then the harness over four
#      shapes with the staggered row beside the in-step one
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
case "${1:-}" in
trial)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,power.limit \
        --format=csv,noheader
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
        --format=csv -lms 100 > "$OUT/smi.csv" 2>&1 &
    smi=$!
    timeout 200 python3 scripts/c2q_sum_ab.py --harness --rounds 3 \
        --shapes 128:131072:8,64:131072:8,128:32768:8 --out "$OUT/harness" 2>&1 | grep -v "^\["
    kill $smi
    timeout 330 bash scripts/gpu_validate_call.sh benchmarks/validation-plan-h200-r9-qwen3-8b.json \
        qwen3-8b "vegas;sparsespec;streamingllm;quest;last-token" 1
    ;;
stagger)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py \
        -k "collect_sum or matches_reference" 2>&1 | tail -n 3 | tee "$OUT/tests.log"
    grep -q " failed" "$OUT/tests.log" && { echo "kernel tests failed: stop"; exit 1; }
    timeout 300 python3 scripts/c2q_sum_ab.py --harness --rounds 3 --timings 8ms,25ms \
        --shapes 128:131072:8,128:131072:16,64:131072:8,128:32768:8 --out "$OUT/harness" \
        2>&1 | grep -v "^\["
    ;;
*)
    echo "usage: bash scripts/gpu_round_p.sh trial | stagger   (see the header)"
    exit 2
    ;;
esac
