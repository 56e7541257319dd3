#!/usr/bin/env bash
# Session 10, call 8 (x2): SPECSIM_VERIFY_SPLITS=waves against sm in the engine (Qwen3-8B plain
# b4 32K/128K; the Vegas table at 32K), the sparse kernel grid (hd128) and the SmolLM2 shape
# (b32, 9/3 heads, hd64) through scripts/decode_config_probe.py; the kernel tests with waves.
export PYTHONPATH=.
trace=traces/smollm2-135m-greedy-bf16-h200-continuous.jsonl
(
 CUDA_VISIBLE_DEVICES=1 timeout 200 python3 scripts/decode_config_probe.py --no-verify --head-dims 128 --contexts 32768,131072,8192 --sparse 0.07 --budget-s 150 --out $OUT/sparse128 > /tmp/ps.log 2>&1
 CUDA_VISIBLE_DEVICES=1 timeout 200 python3 scripts/decode_config_probe.py --head-dims 64 --heads 9,3 --batch 32 --contexts 4096,8192 --sparse 0.07 --budget-s 150 --out $OUT/smollm2 > /tmp/pm.log 2>&1
 CUDA_VISIBLE_DEVICES=1 SPECSIM_VERIFY_SPLITS=waves timeout 70 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py -k "wave or verify_matches or collect_two" 2>&1 | tail -n 2 > /tmp/pt.log
) &
for rule in sm waves; do
 CUDA_VISIBLE_DEVICES=0 SPECSIM_VERIFY_SPLITS=$rule timeout 120 python3 scripts/engine_benchmark.py --compile --fuse --contexts 32768,131072 --batch 4 --new-tokens 64 --out $OUT/plain-$rule.json 2>&1 | grep "^context" | sed "s/^/$rule: /"
done
CUDA_VISIBLE_DEVICES=0 SPECSIM_VERIFY_SPLITS=waves timeout 240 python3 scripts/engine_benchmark.py --compile --fuse --contexts 32768 --batch 4 --new-tokens 64 --trace $trace --policy vegas --ks 2,4,6,8,10,12 --ss 0.03,0.05,0.07,0.1 --out $OUT/engine-vegas-32768-waves.json 2>&1 | grep -v "^\[" > /tmp/tv.log
wait
cat /tmp/pt.log; tail -n 26 /tmp/tv.log
grep -v "^  " /tmp/ps.log | tail -5; grep -v "^  " /tmp/pm.log | tail -8
