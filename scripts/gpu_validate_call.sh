#!/usr/bin/env bash
# One device call of `specsim validate --gpu` without the CLI: measure setup $2 of plan $1,
# one process per group of policies ($3: groups separated by ';', policies in a group by ',',
# e.g. "vegas,quest;sparsespec" — a CUDA device-side assert ends only its own process), $4
# repeats (default 2); each part is written under $OUT/parts-$2/ as soon as it is done (a call
# cut short keeps them), then all are merged into $OUT/measured-$2.json; each part's last lines
# are printed (CUDA-event warnings dropped).
set -u
plan=$1 setup=$2 groups=$3 repeats=${4:-2}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
parts=$OUT/parts-$setup
rm -rf "$parts" && mkdir -p "$parts"
IFS=';' read -ra group_list <<< "$groups"
for i in "${!group_list[@]}"; do
    python3 -m specsim.validate "$plan" "$parts/part-$i.json" "$repeats" "$setup" \
        "${group_list[$i]}" 2>&1 | grep -v CUDAEvent | grep -v "^\[" | tail -12
done
python3 -m specsim.validate merge "$OUT/measured-$setup.json" "$parts"/part-*.json
