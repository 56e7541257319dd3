#!/usr/bin/env bash
# Round S (session 16, one H200): at 128K the per-KV-head row with an L2 evict_last hint still
# ran 1.06-1.07x off, even on a quarter of its lines (c2q_evict_probe kv32-el, kv32-el-2of8),
# where at 32K the hint made it free (1.004 / 0.997). Do the hinted lines leave L2 at 128K
# (DRAM writes ~ the row's bytes: the hint loses to the 2 GB stream, so write-back is still
# the cost) or stay (DRAM writes ~ off's: something else costs the 6%)?
#
#   1  bash scripts/gpu_round_s.sh counters    (Nsight Compute, eager launches, 128K and 32K; 42 s)
#      found (session 16; benchmarks/c2q-counters-h200-s16.txt), us and MB written per launch:
#      128K: off 469-470 / 2.8-3.0, sum 488-491 / 6.6-7.7, per KV head 498-501 / 19.3-22.5,
#      + evict_last 490-505 / 12.9-19.2, on a quarter of the lines 487-488 / 6.8-8.5: at 128K
#      the hint does not keep the lines (they are written back all the same).
#      32K: off 123.5 / 2.5, sum 132 / 3.4-4.1, per KV head 131.6-133 / 6.4-7.6, + evict_last
#      129.5-130.3 / 2.4-3.7: at 32K the hint keeps them, and launched alone the row still
#      costs 5% (in graphs, c2q_evict_probe: 1.004-1.023). Write-back is part of the cost, not
#      all of it.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
case "${1:-}" in
counters)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
    for shape in 128:131072:8 128:32768:8; do
        timeout 200 "$NCU" --clock-control none --cache-control none -k regex:_verify_kernel \
            --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
            --csv python3 scripts/c2q_counters.py --repeats 3 --shape "$shape" \
            > "$OUT/ncu-$shape.csv" 2> "$OUT/ncu-$shape.err"
        echo "== $shape: rc $?"
        python3 - "$OUT/ncu-$shape.csv" <<'PY'
import collections, csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head, launches = rows[0], collections.defaultdict(dict)
for r in rows[1:]:
    d = dict(zip(head, r))
    launches[d["ID"]][d["Metric Name"]] = (d["Metric Value"], d["Metric Unit"])
for i, m in sorted(launches.items(), key=lambda x: int(x[0])):
    print(i, "  ".join(f"{k.split('__')[1]} {v} {u}" for k, (v, u) in sorted(m.items())))
PY
        tail -n 2 "$OUT/ncu-$shape.err"
    done
    ;;
*)
    echo "usage: bash scripts/gpu_round_s.sh counters   (see the header)"
    exit 2
    ;;
esac
