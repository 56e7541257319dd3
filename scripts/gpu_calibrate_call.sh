#!/usr/bin/env bash
# One device call: the engine's GPU tests, a tiny calibration smoke run (fails fast), then the
# shipped calibrations of the models given ($1, comma-separated) with per-model budgets ($2 s:
# one for all, or one per model, comma-separated). GPU_TESTS=0 skips the tests (a second call
# on the same tree).
set -u
export PYTHONPATH=.
if [ "${GPU_TESTS:-1}" != 0 ]; then
    python3 -m pytest -q -x tests/test_engine_gpu.py 2>&1 | tail -4
    python3 -m pytest -q -x tests/test_kernels_selection.py -k kv_cache 2>&1 | tail -2
fi
python3 - <<'PY' || exit 1
from specsim.calibrate import CalibrationGrid, measure
from specsim.specs import load_model
cal = measure(load_model("smollm2-135m"), CalibrationGrid(batches=[2], contexts=[1024, 2048],
              qs=[1, 5], sparsities=[0.1], policies=["vegas", "quest"], repeats=3),
              progress=False)
for m in cal.measurements:
    print("smoke", m.op, m.batch, m.context, m.q, m.s, round(m.median_ms, 3))
PY
python3 scripts/calibrate_shipped.py --out-dir "$OUT/cal" --models "$1" --budget-s "$2" \
    --repeats 10 2>&1 | grep -v "^\[" | tail -30
