#!/usr/bin/env bash
# Session 10, call 9 (x2): the whole-wave rule after the SmolLM2-shape probe (one chunk when
# one wave is >= 70% full; hd64 256-key blocks): sm vs waves at each shape, no grid; the
# engine's plain step of SmolLM2 (random weights, batch 32, 4K and 8K) under each rule; the
# kernel tests in bf16 with SPECSIM_VERIFY_SPLITS=waves.
export PYTHONPATH=.
(
 for shape in "--head-dims 64 --heads 9,3 --batch 32 --contexts 4096,8192" \
              "--head-dims 64 --contexts 8192,32768" "--head-dims 128 --contexts 8192,32768"; do
  CUDA_VISIBLE_DEVICES=1 timeout 100 python3 scripts/decode_config_probe.py $shape --budget-s 1 \
      --out /tmp/q 2>&1 | grep -E "^hd" | grep -v " | "
 done > /tmp/pq.log
 CUDA_VISIBLE_DEVICES=1 SPECSIM_VERIFY_SPLITS=waves timeout 90 python3 -m pytest -q \
     -p no:cacheprovider tests/test_kernels_attention.py -k "not tma" 2>&1 | tail -n 2 > /tmp/pt.log
) &
for rule in sm waves; do
 CUDA_VISIBLE_DEVICES=0 SPECSIM_VERIFY_SPLITS=$rule timeout 100 python3 scripts/engine_benchmark.py \
     --model smollm2-135m --compile --fuse --contexts 4096,8192 --batch 32 --new-tokens 64 \
     --out $OUT/plain-smollm2-$rule.json 2>&1 | grep "^context" | sed "s/^/$rule: /"
done
wait
cat /tmp/pt.log /tmp/pq.log
