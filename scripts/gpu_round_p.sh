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
#      graph to the next (hd128 128K q8: 497-636 us over nine graphs, off 474-477), so one
#      bench_kernels reading can land anywhere in that range. Validation round 9: every policy
#      0.4-0.8% MAPE, regret 1.000 (VALIDATION.md).
#   2  (105 s)  "stagger" (this script at 0f270e6, dropped with the kernel change it timed):
#      the collect_sum tests in bf16 (28 passed) and the harness with collect_stagger beside
#      the in-step row: no steadier (521-617 against 522-582 us), 2% slower at 32K.
#   next: scripts/gpu_round_q.sh (Nsight Compute)
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
*)
    echo "usage: bash scripts/gpu_round_p.sh trial   (see the header)"
    exit 2
    ;;
esac
