#!/usr/bin/env bash
# Round Q (session 15, one H200): the summed Collect-2-Query row's DRAM bytes under Nsight
# Compute (scripts/c2q_counters.py: off, sum, sum-kvhead launched eagerly, each checked).
# If "sum" writes and reads far more than its 2 MB row (the row's lines leaving L2 between the
# KV heads' adds), the cure is keeping them in L2 (an evict_last hint on the adds) or plain
# stores (a bf16 row per KV head, c2q_store_probe sum-bf16 1.046x off); if not, the cost is in L2.
#
#   1  (49 s)  bash scripts/gpu_round_q.sh counters
#      found (benchmarks/c2q-counters-h200-s15.txt): launched alone, "sum" reads its 2 MB row
#      once and writes 4-7 MB more than off (L2 reduction hit rate 91.8%: each sector's first
#      touch misses), 1.03x off; "sum-kvhead" writes its 16.8 MB, 1.06x. The row stays in L2:
#      the graph-to-graph spread is not explained by bytes.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
profile() {      # $1: tag, $2: metrics, $3: shape
    timeout 150 "$NCU" --clock-control none --cache-control none -k regex:_verify_kernel \
        --metrics "$2" --csv python3 scripts/c2q_counters.py --repeats 3 --shape "$3" \
        > "$OUT/ncu-$1.csv" 2> "$OUT/ncu-$1.err"
    echo "== $1 ($3): rc $?"
    python3 - "$OUT/ncu-$1.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head = rows[0]
for r in rows[1:]:
    d = dict(zip(head, r))
    print(d.get("ID"), d.get("Metric Name"), d.get("Metric Unit"), d.get("Metric Value"))
PY
    tail -n 3 "$OUT/ncu-$1.err"
}
case "${1:-}" in
counters)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
    echo "ncu: $NCU"
    timeout 60 python3 scripts/c2q_counters.py --repeats 3 2>&1 | grep -v "^\["
    base=dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
    profile bytes128 "$base" 128:131072:8
    profile bytes32 "$base" 128:32768:8
    profile l2 lts__t_sectors_op_red.sum,lts__t_sector_op_red_hit_rate.pct,lts__t_sectors_op_write.sum 128:131072:8
    ;;
*)
    echo "usage: bash scripts/gpu_round_q.sh counters   (see the header)"
    exit 2
    ;;
esac
