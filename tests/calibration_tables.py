"""Synthetic calibration tables of known structure, shared by the cost-model tests."""
import numpy as np

from specsim.costs.calibration_file import Calibration, Measurement
from specsim.specs import load_hardware, load_model

MODEL = load_model("llama-3.1-8b")
HW = load_hardware("h200")
KV = MODEL.kv_bytes_per_token            # all layers are full attention
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
BATCHES = (1, 2, 4, 8, 16, 32)


def provenance(**over) -> dict:
    return {"gpu": "NVIDIA H200", "gpu_memory_bytes": 150e9, "driver": "580", "cuda": "12.8",
            "torch": "2.11", "triton": "3.6", "kernel_config_hash": "abc",
            "model_spec_hash": MODEL.spec_hash(), "model": MODEL.name,
            "date": "2026-11-29T00:00:00Z", "engine": {"cache_align": 128}, **over}


def true_ms(op, batch, context, q=1, s=None) -> float:
    """Known structure: W(tokens) (a kink at 64 tokens) + K(bytes) (bandwidth 4 TB/s)."""
    tokens = batch * q
    w = 4.0 + 0.01 * tokens + (0.5 if tokens > 64 else 0.0)
    if op == "plain" or op == "verify":
        kv = batch * context * KV
        return w + kv / 4e12 * 1e3 * (1 + 0.02 * q)
    if op.startswith("draft"):
        sel = min(context, max(int(np.ceil(s * context)), 256) + 32)
        return w + batch * sel * KV / 2.5e12 * 1e3
    return 0.02 + batch * context * 1e-7     # selection


def synthetic(noise=0.0, seed=0, contexts=CONTEXTS, batches=BATCHES,
              qs=(1, 2, 3, 4, 6, 8, 12, 16), **prov) -> Calibration:
    """Plain, verify (at ``qs``), Vegas' draft and refresh at every (batch, context)."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in batches:
        for c in contexts:
            def add(op, q=1, s=None):
                t = true_ms(op, b, c, q, s)
                rows.append(Measurement(op, b, c, q, s,
                                        list(t * (1 + noise * rng.standard_normal(5)))))
            add("plain")
            for q in qs:
                add("verify", q)
            add("draft:vegas", s=0.05)
            add("selection:vegas", s=0.05)
    return Calibration(provenance(**prov), {"copy_bandwidth": 4.3e12}, rows)


def with_rows(calibration: Calibration, rows) -> Calibration:
    """The calibration with ``rows`` added."""
    return Calibration(calibration.provenance, calibration.ceilings,
                       list(calibration.measurements) + list(rows))


def at_every_shape(calibration: Calibration, op, q, s, ms) -> list[Measurement]:
    """Rows of ``op`` at every (batch, context) the calibration measured, ``ms(b, c)`` each."""
    shapes = sorted({(m.batch, m.context) for m in calibration.measurements})
    return [Measurement(op, b, c, q, s, [ms(b, c)] * 3) for b, c in shapes]


def with_overheads(cal, plain_us=lambda b: 40 + 2 * b, spec_us=lambda b: 90 + 5 * b,
                   noise=0.0) -> Calibration:
    """Measured loop overheads added (µs, by batch; noisy samples may be negative)."""
    rng = np.random.default_rng(7)
    rows = list(cal.measurements)
    for b in sorted({m.batch for m in rows}):
        for c in sorted({m.context for m in rows}):
            rows.append(Measurement("overhead:plain", b, c, 1, None,
                                    list(plain_us(b) / 1e3 + noise * rng.standard_normal(3))))
            rows.append(Measurement("overhead:speculative", b, c, 5, None,
                                    list(spec_us(b) / 1e3 + noise * rng.standard_normal(3))))
    return Calibration(cal.provenance, cal.ceilings, rows)
