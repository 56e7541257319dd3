#!/usr/bin/env bash
# Round R (next session, one H200): issue #3's last bar, Collect-2-Query <= 5% over off at hd128
# 128K. Session 15: the per-sequence summed row (atomic adds) runs 1.03x off launched alone
# (Nsight Compute: its 2 MB stay in L2) but 1.02-1.34x from one CUDA graph to the next, where off
# repeats to 0.5% (BENCHMARKS.md, session 15). Plain stores were steady across sessions: a fp32
# row per KV head 513.8 / 514.4 us (1.06x) in two sessions' runs, a bf16 one 1.046x once
# (c2q_store_probe sum-bf16, session 14).
#
#   1  (~200 s)  bash scripts/gpu_round_r.sh trial
#      c2q_sum_ab --harness, five rounds of 8 / 25 ms graphs: off, the summed row (two buffers),
#      and the plain-store rows per KV head in fp32 and bf16, at hd128 128K q8 / q16, 32K q8 and
#      hd64 128K q8. If the bf16 row per KV head is steady and <= 1.05 where the summed row is
#      not: make it collect_sum's row (DraftSelection sums its 8 rows: 8.4 MB read per layer at
#      batch 4, 128K), re-measure the Vegas verify + refresh rows of the four calibrations, and
#      run validation round 10. If neither is: an L2 evict_last hint on the adds (inline PTX
#      red...L2::cache_hint; the row layout is replicated across warps, so only one thread per
#      element may add) is the next lead.
#      found (session 16, 57 s; benchmarks/c2q-sum-harness-h200-s16.json): neither. hd128 128K
#      q8, medians of 5 rounds over off's (8 / 25 ms graphs): sum 1.099 / 1.106, fp32 per KV
#      head 1.074 / 1.095, bf16 per KV head 1.104 / 1.125; q16: 1.087 / 1.105, 1.225 / 1.254,
#      1.240 / 1.241; 32K q8: 1.055 / 1.068, 1.050 / 1.058, 1.051 / 1.046. Off itself spread
#      484-519 us on that machine. Half the bytes, no atomics: no cheaper, no steadier.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
case "${1:-}" in
trial)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
    timeout 400 python3 scripts/c2q_sum_ab.py --harness --rounds 5 --timings 8ms,25ms \
        --shapes 128:131072:8,128:131072:16,128:32768:8,64:131072:8 --out "$OUT/harness" \
        2>&1 | grep -v "^\["
    ;;
*)
    echo "usage: bash scripts/gpu_round_r.sh trial   (see the header)"
    exit 2
    ;;
esac
