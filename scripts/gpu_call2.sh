#!/usr/bin/env bash
set -u
export PYTHONPATH=.
python3 scripts/diag_loop.py smollm2-135m 1 1024 2>&1 | grep -v Warning | head -40
python3 scripts/diag_loop.py qwen3-8b 4 32768 2>&1 | grep -v Warning | head -12
python3 scripts/calibrate_shipped.py --out-dir "$OUT/cal" --models "$1" --budget-s "$2" \
    --repeats 10 2>&1 | grep -v "^\[" | tail -30
