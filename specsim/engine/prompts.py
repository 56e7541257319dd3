"""Long prompts for recording real traces: excerpts of source files installed on the machine.

A prompt is *described*, not stored: ``PromptSpec`` names a module (Python stdlib or an
installed package, found by module name so it works across versions), a byte range of its
source file cut at line boundaries, and a task — a question about the excerpt (chat-formatted)
or a plain continuation. The text is read at run time; the spec keeps the excerpt's sha256 so
a different installed version is noticed. ``DEFAULT_SPECS`` is the built-in set (≈2K–6K
tokens each for SmolLM2's tokenizer, within its 8K context); ``scripts/engine_prompts.py``
resolves it to a JSONL file (``write_prompt_file``), ``read_prompt_file`` reads one back.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from specsim.errors import SpecsimError

BYTES_PER_TOKEN = 4.3   # SmolLM2's tokenizer on Python source, measured on argparse.py

QUESTIONS = {
    "summary": "Summarise what the code above does in a few sentences, then describe its three "
               "most important functions or classes.",
    "errors": "Which parts of the code above handle errors or unusual input, and how?",
    "test": "Write a short unit test for one of the functions defined above.",
    "explain": "Explain the main algorithm in the code above step by step.",
}


@dataclass(frozen=True)
class PromptSpec:
    id: str
    module: tuple[str, ...] | str   # module name(s), first importable wins
    start: int                      # byte range of the source file, at line boundaries
    end: int
    task: str                       # a QUESTIONS key, or "continue"
    sha256: str = ""                # of the excerpt, when resolved

    @property
    def chat(self) -> bool:
        return self.task != "continue"


def module_file(module: tuple[str, ...] | str) -> Path:
    for name in (module,) if isinstance(module, str) else module:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            return Path(spec.origin)
    raise SpecsimError(f"no installed Python source for module {module}")


def _line_range(path: Path, start: int, length: int) -> tuple[int, int]:
    """[start, end) moved to line boundaries: start to the next line start, end to the last
    line end within start + length."""
    data = path.read_bytes()
    start = min(start, len(data))
    if start > 0 and data[start - 1:start] != b"\n":
        start = data.find(b"\n", start) + 1 or len(data)
    end = min(len(data), start + length)
    if end < len(data):
        end = data.rfind(b"\n", start, end) + 1 or end
    return start, end


def excerpt(spec: PromptSpec) -> bytes:
    with open(module_file(spec.module), "rb") as fh:
        fh.seek(spec.start)
        return fh.read(spec.end - spec.start)


def resolve(module, start_fraction: float, tokens: int, task: str, pid: str,
            fit: bool = False) -> PromptSpec:
    """A spec for ~``tokens`` tokens starting ``start_fraction`` into the module's file; with
    ``fit`` the start moves back as far as the excerpt needs to end inside the file, and a file
    too small for it is refused."""
    path = module_file(module)
    size = path.stat().st_size
    start = int(size * start_fraction)
    if fit:
        length = int(tokens * BYTES_PER_TOKEN)
        if size < length:
            raise SpecsimError(f"{path.name} ({size} bytes) is shorter than {tokens} tokens")
        start = min(start, size - length)
    start, end = _line_range(path, start, int(tokens * BYTES_PER_TOKEN))
    spec = PromptSpec(pid, module, start, end, task)
    return PromptSpec(pid, module, start, end, task, hashlib.sha256(excerpt(spec)).hexdigest())


#: (id, module, where to start in the file, target tokens, task)
DEFAULT_SET = [
    ("argparse-summary", "argparse", 0.10, 4000, "summary"),
    ("subprocess-errors", "subprocess", 0.30, 4000, "errors"),
    ("typing-continue", "typing", 0.40, 4000, "continue"),
    ("inspect-explain", "inspect", 0.50, 6000, "explain"),
    ("difflib-explain", "difflib", 0.05, 4000, "explain"),
    ("tarfile-test", "tarfile", 0.60, 2000, "test"),
    ("logging-summary", "logging", 0.20, 6000, "summary"),
    ("http-client-continue", "http.client", 0.35, 2000, "continue"),
    ("statistics-test", "statistics", 0.15, 4000, "test"),
    ("configparser-errors", "configparser", 0.45, 4000, "errors"),
    ("fromnumeric-summary", ("numpy._core.fromnumeric", "numpy.core.fromnumeric"), 0.25, 4000,
     "summary"),
    ("pydecimal-continue", "_pydecimal", 0.55, 6000, "continue"),
]


#: 36 more, for validation runs whose acceptance must average over more texts: in bf16 the
#: same prompt decoded at another batch shape can diverge at a near-tie and take 1.5x the
#: iterations (VALIDATION.md), so a 12-prompt mean moves by several percent.
EXTRA_SET = [
    ("email-hvp-explain", "email._header_value_parser", 0.30, 6000, "explain"),
    ("pathlib-summary", "pathlib", 0.20, 6000, "summary"),
    ("shutil-errors", "shutil", 0.40, 4000, "errors"),
    ("zipfile-continue", "zipfile", 0.50, 6000, "continue"),
    ("textwrap-test", "textwrap", 0.10, 2000, "test"),
    ("collections-explain", "collections", 0.30, 6000, "explain"),
    ("functools-summary", "functools", 0.20, 4000, "summary"),
    ("asyncio-events-errors", "asyncio.base_events", 0.40, 6000, "errors"),
    ("datetime-test", "datetime", 0.60, 4000, "test"),
    ("ssl-continue", "ssl", 0.30, 4000, "continue"),
    ("socket-summary", "socket", 0.20, 4000, "summary"),
    ("threading-explain", "threading", 0.35, 6000, "explain"),
    ("unittest-case-errors", "unittest.case", 0.50, 4000, "errors"),
    ("urllib-request-summary", "urllib.request", 0.60, 6000, "summary"),
    ("elementtree-continue", "xml.etree.ElementTree", 0.40, 6000, "continue"),
    ("pickle-explain", "pickle", 0.50, 4000, "explain"),
    ("pydoc-test", "pydoc", 0.30, 4000, "test"),
    ("random-summary", "random", 0.20, 4000, "summary"),
    ("enum-errors", "enum", 0.55, 6000, "errors"),
    ("dataclasses-explain", "dataclasses", 0.40, 6000, "explain"),
    ("ast-continue", "ast", 0.60, 4000, "continue"),
    ("tokenize-test", "tokenize", 0.30, 2000, "test"),
    ("calendar-summary", "calendar", 0.20, 2000, "summary"),
    ("imaplib-errors", "imaplib", 0.45, 4000, "errors"),
    ("ftplib-continue", "ftplib", 0.30, 4000, "continue"),
    ("mailbox-explain", "mailbox", 0.50, 6000, "explain"),
    ("locale-test", "locale", 0.70, 4000, "test"),
    ("fractions-summary", "fractions", 0.25, 4000, "summary"),
    ("ipaddress-errors", "ipaddress", 0.30, 6000, "errors"),
    ("optparse-continue", "optparse", 0.40, 6000, "continue"),
    ("pprint-explain", "pprint", 0.15, 2000, "explain"),
    ("tempfile-test", "tempfile", 0.35, 4000, "test"),
    ("http-server-summary", "http.server", 0.25, 6000, "summary"),
    ("pdb-continue", "pdb", 0.50, 6000, "continue"),
    ("doctest-errors", "doctest", 0.60, 6000, "errors"),
    ("traceback-explain", "traceback", 0.30, 4000, "explain"),
]

#: Excerpts that fill SmolLM2's 8K context (with a 128-token answer and k + 1 draft positions
#: behind them): the extended set's modules and tasks, each cut to ~7,700 tokens (moved back
#: in its file where it would run past the end; the 7 files shorter than that are skipped).
LONG_TOKENS = 7700
LONG_SET = [(f"{pid}-8k", module, where, LONG_TOKENS, task)
            for pid, module, where, _, task in DEFAULT_SET + EXTRA_SET]

#: Named prompt sets: ``default`` (the shipped traces' 12), ``extended`` (those + 36) and
#: ``long`` (8K-context excerpts of the extended set's files).
PROMPT_SETS = {"default": DEFAULT_SET, "extended": DEFAULT_SET + EXTRA_SET, "long": LONG_SET}
#: Sets whose excerpts are moved back to fit their files (``resolve(fit=True)``).
FITTED_SETS = {"long"}


def default_specs(name: str = "default") -> list[PromptSpec]:
    """A built-in set (``PROMPT_SETS``), resolved on this machine (modules that are missing
    are skipped)."""
    if name not in PROMPT_SETS:
        raise SpecsimError(f"unknown prompt set {name!r}; known: {', '.join(PROMPT_SETS)}")
    out = []
    for pid, module, where, tokens, task in PROMPT_SETS[name]:
        try:
            out.append(resolve(module, where, tokens, task, pid, fit=name in FITTED_SETS))
        except SpecsimError:
            continue
    return out


def write_prompt_file(path: str | Path, specs: list[PromptSpec]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        for spec in specs:
            fh.write(json.dumps(asdict(spec)) + "\n")
    os.replace(tmp, path)


def read_prompt_file(path: str | Path) -> list[PromptSpec]:
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            module = tuple(d["module"]) if isinstance(d["module"], list) else d["module"]
            out.append(PromptSpec(str(d["id"]), module, int(d["start"]), int(d["end"]),
                                  str(d["task"]), str(d.get("sha256", ""))))
        except (ValueError, KeyError, TypeError) as exc:
            raise SpecsimError(f"{path}:{n}: bad prompt line ({exc})") from None
    return out


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


class Tokenizer:
    """transformers' tokenizer when importable (chat template included), else the bare
    ``tokenizers`` one with a ChatML template (what SmolLM2 and Qwen use)."""

    def __init__(self, folder: str | Path):
        folder = str(folder)
        try:
            from transformers import AutoTokenizer
            self.hf = AutoTokenizer.from_pretrained(folder)
            self.raw = None
        except ImportError:
            from tokenizers import Tokenizer as RawTokenizer
            self.hf, self.raw = None, RawTokenizer.from_file(os.path.join(folder, "tokenizer.json"))

    def encode(self, text: str) -> list[int]:
        if self.hf is not None:
            return list(self.hf(text, add_special_tokens=False)["input_ids"])
        return self.raw.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids) if self.hf is not None else self.raw.decode(ids)

    def chat(self, user: str) -> list[int]:
        messages = [{"role": "user", "content": user}]
        if self.hf is not None and getattr(self.hf, "chat_template", None):
            text = self.hf.apply_chat_template(messages, tokenize=False,
                                               add_generation_prompt=True)
        else:
            text = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        return self.encode(text)


def prompt_tokens(spec: PromptSpec, tokenizer: Tokenizer, max_tokens: int | None = None
                  ) -> list[int]:
    """Token ids of one prompt; excerpts longer than ``max_tokens`` lose their beginning."""
    text = excerpt(spec).decode("utf-8", errors="replace")
    if not spec.chat:
        ids = tokenizer.encode(text)
        return ids[-max_tokens:] if max_tokens else ids

    def message(code: str) -> str:
        return ("Here is an excerpt of a Python source file:\n\n```python\n" + code
                + "\n```\n\n" + QUESTIONS[spec.task])

    ids = tokenizer.chat(message(text))
    if max_tokens and len(ids) > max_tokens:  # drop the excerpt's beginning, keep the task
        code = tokenizer.encode(text)
        ids = tokenizer.chat(message(tokenizer.decode(code[len(ids) - max_tokens + 16:])))
    return ids[-max_tokens:] if max_tokens else ids


def changed(spec: PromptSpec) -> bool:
    """True when the installed file's excerpt no longer has the recorded checksum."""
    return bool(spec.sha256) and hashlib.sha256(excerpt(spec)).hexdigest() != spec.sha256


__all__ = ["DEFAULT_SET", "PromptSpec", "QUESTIONS", "Tokenizer", "changed", "default_specs",
           "excerpt", "module_file", "prompt_tokens", "read_prompt_file", "resolve",
           "write_prompt_file"]
