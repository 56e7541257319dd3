#!/usr/bin/env bash
# Session 10, call 10: the kernel tests in bf16 with SPECSIM_VERIFY_SPLITS=waves (the split-rule
# and whole-wave cases, every verify case with and without Collect-2-Query) and hd64 q = 8 at
# 64 query / 8 KV heads with its WAVE_CONFIGS entry (sm vs waves, no grid).
export PYTHONPATH=.
SPECSIM_VERIFY_SPLITS=waves timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/test_kernels_attention.py -k "wave or split_rules or verify_matches or collect_two_rows or collect_all or causal or sparse" 2>&1 | tail -n 3
timeout 100 python3 scripts/decode_config_probe.py --head-dims 64 --contexts 8192,32768 --budget-s 1 \
    --out /tmp/q 2>&1 | grep -E "^hd" | grep -v " | "
