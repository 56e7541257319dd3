#!/usr/bin/env bash
# Round O (next session, one H200): why bench_kernels reads the per-sequence summed row at
# 1.06-1.10x off where c2q_sum_ab.py read the same kernel at 1.02-1.03x, and Qwen3-8B's verify
# and refresh rows re-measured on session 14's kernels (its budget ran out at 2 of 13 shapes).
#
#   1  (~460 s)  bash scripts/gpu_round_o.sh trial
#      c2q_sum_ab.py: production's summed row timed its own way ("sum") and bench_kernels' way
#      ("sum-bench": new_logits_buffer, 25 ms graphs) in one process; then bench_kernels' table
#      (every shape, 8K too). If "sum-bench" is the slow one, the harness is the cause: find
#      which of its two differences it is and fix the benchmark, not the number.
#      Then decode_config_probe on hd64's 128-row q = 16 tile (q16/q1 1.7-1.9 in session 14's
#      table): kernel_resources.py shows its 256-key blocks on 8 warps at 255 registers with
#      40 B of spills, 128-key blocks on 8 warps at 246 and none; if another config wins at
#      128K and 32K, put it in WAVE_CONFIGS and re-measure SmolLM2's verify (q >= 11 at hd64
#      runs a 64-row tile there: check which shipped model runs the 128-row one first).
#      found (session 15, 277 s): sum 497.1 us (1.024x), sum-bench 516.0 (1.063x), the table
#      527.8 (1.091x) at hd128 128K q8; hd64 q = 16's best plan 8 chunks of 64-key blocks on 4
#      warps (334 us against 414): see gpu_round_p.sh for what the difference turned out to be
#   2  (~330 s, at once, warm)  bash scripts/gpu_round_n.sh cal qwen3-8b 280
#      found: complete, 416 rows in 247 s; merged
#   then here: compare_calibrations.py OLD NEW --family verify, merge_calibrations.py NEW OLD
#      OLD --replace verify,selection:vegas, specsim calibrate --check; then plan validation
#      round 9 (Qwen3-8B, the per-sequence row) before running it.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
case "${1:-}" in
trial)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
    timeout 120 python3 scripts/c2q_sum_ab.py --out "$OUT/ab" 2>&1 | grep -v "^\["
    timeout 230 python3 benchmarks/bench_kernels.py --head-dims 128,64 \
        --contexts 131072,32768,8192 --q-lens 1,8,16 --no-check --budget-s 190 \
        --out "$OUT/kernels" 2>&1 | tee "$OUT/kernels.log" | sed -n '/^targets/,$p'
    timeout 110 python3 scripts/decode_config_probe.py --head-dims 64 --cases 16:off \
        --contexts 131072,32768 --budget-s 90 --out "$OUT/hd64q16" 2>&1 | tail -n 8
    ;;
*)
    echo "usage: bash scripts/gpu_round_o.sh trial   (see the header)"
    exit 2
    ;;
esac
