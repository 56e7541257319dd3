"""The capture protocol run against a live server (``specsim calibrate --from-server URL``).

For each shape (concurrency B, prompt length C): the server's ``/metrics`` text is read, B
client threads each send ``requests_per_slot`` completions one after another (so that B are in
flight for nearly the whole run; the prompt is C token ids, ``max_tokens`` the output length,
EOS ignored, greedy), and ``/metrics`` is read again. The server's OpenAI-compatible
``/v1/completions`` and ``/v1/models`` are used, as vLLM and SGLang serve them; nothing else is
assumed of it. The result is a capture document (:mod:`specsim.costs.engine_profile`), written
as it grows so that an interrupted capture keeps its finished runs.

Only the standard library talks to the server (``urllib``), with a timeout on every call.
"""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from specsim.costs.engine_profile import CAPTURE_KEY, ENGINES, ProfileError

#: Completions each client thread sends one after another in a run.
REQUESTS_PER_SLOT = 2
#: Token id the prompts repeat (any id every tokenizer has: small ids are special or bytes).
PROMPT_TOKEN = 1000


def _get(url: str, timeout: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        raise ProfileError(f"{url}: {getattr(exc, 'reason', exc)}") from None


def _post(url: str, body: dict, timeout: float) -> dict:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode("utf-8", "replace") or "{}")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:200]
        raise ProfileError(f"{url}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{url}: {getattr(exc, 'reason', exc)}") from None


def engine_of(metrics: str, url: str) -> str:
    """vLLM or SGLang, by the prefix of its metrics."""
    for engine in ENGINES:
        if f"\n{engine}:" in "\n" + metrics:
            return engine
    raise ProfileError(f"{url}/metrics: neither vllm: nor sglang: metrics (is the server "
                       f"started with its metrics enabled?)")


def served_model(base: str, timeout: float) -> str:
    doc = json.loads(_get(f"{base}/v1/models", timeout) or "{}")
    try:
        return str(doc["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise ProfileError(f"{base}/v1/models: no served model listed") from None


def capture(url: str, shapes: list[tuple[int, int]], output_tokens: int,
            speculative: dict | None, *, requests_per_slot: int = REQUESTS_PER_SLOT,
            timeout: float = 600.0, progress=None, write=None, gpu: str | None = None) -> dict:
    """Run the protocol (module doc) at each (concurrency, prompt tokens) of ``shapes``.
    ``write(doc)`` is called after every run; ``progress(1)`` after every request."""
    base = url.rstrip("/")
    metrics = _get(f"{base}/metrics", timeout)
    engine = engine_of(metrics, base)
    model = served_model(base, timeout)
    doc = {CAPTURE_KEY: 1, "engine": engine, "engine_version": None, "model": model,
           "gpu": gpu, "server": base, "runs": []}
    lock = threading.Lock()

    def one(prompt_tokens: int):
        body = {"model": model, "prompt": [PROMPT_TOKEN] * prompt_tokens,
                "max_tokens": output_tokens, "min_tokens": output_tokens,
                "ignore_eos": True, "temperature": 0.0, "stream": False}
        _post(f"{base}/v1/completions", body, timeout)
        if progress:
            with lock:
                progress(1)

    for concurrency, prompt_tokens in shapes:
        before = _get(f"{base}/metrics", timeout)

        def slot(_):
            for _ in range(requests_per_slot):
                one(prompt_tokens)

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            list(pool.map(slot, range(concurrency)))
        after = _get(f"{base}/metrics", timeout)
        doc["runs"].append({"concurrency": concurrency, "input_tokens": prompt_tokens,
                            "output_tokens": output_tokens, "speculative": speculative,
                            "requests": concurrency * requests_per_slot,
                            "before": before, "after": after})
        if write:
            write(doc)
    return doc


def parse_speculative(text: str | None) -> dict | None:
    """``none``; ``DRAFTER,k=K`` (``eagle3,k=4``); ``sparse-self,POLICY,s=S,k=K``."""
    if text is None or text.strip().lower() in ("", "none", "plain"):
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or "=" in parts[0]:
        raise ProfileError(f"--speculative {text!r}: expected none, DRAFTER,k=K or "
                           f"sparse-self,POLICY,s=S,k=K")
    out: dict = {"drafter": parts[0]}
    for p in parts[1:]:
        key, sep, value = p.partition("=")
        if not sep:
            if out["drafter"] == "sparse-self" and "policy" not in out:
                out["policy"] = key
                continue
            raise ProfileError(f"--speculative {text!r}: expected KEY=VALUE after the drafter, "
                               f"got {p!r}")
        if key not in ("k", "s"):
            raise ProfileError(f"--speculative {text!r}: expected k=K or s=S, got {p!r}")
        try:
            out[key] = int(value) if key == "k" else float(value)
        except ValueError:
            raise ProfileError(f"--speculative {text!r}: {key}: expected a number, got "
                               f"{value!r}") from None
    if "k" not in out:
        raise ProfileError(f"--speculative {text!r}: the server's k is needed (k=K)")
    from specsim.costs.engine_profile import _speculative
    _speculative(out, f"--speculative {text!r}")
    return out
