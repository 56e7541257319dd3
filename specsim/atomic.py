"""Atomic file writes: a temporary file beside the target, renamed into place, so a reader
never sees a half-written trace, calibration, report or page (and an error leaves the old
file as it was); and the matching read of a JSON document with errors that name the file."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[IO[str]]:
    """``with atomic_writer(path) as fh: ...`` — the file appears only if the block succeeds,
    with the permissions the umask gives (not mkstemp's 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    with atomic_writer(path) as fh:
        fh.write(text)
    return Path(path)


def read_json(path: str | os.PathLike, what: str) -> object:
    """The JSON document at ``path``; a missing or truncated/malformed file raises a
    ``SpecsimError`` naming the file and ``what`` it should be (e.g. "calibration file")."""
    from specsim.errors import SpecsimError
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise SpecsimError(f"{path}: no such {what}") from None
    except json.JSONDecodeError as exc:
        raise SpecsimError(f"{path}: bad {what}: not JSON (truncated?) at line {exc.lineno}: "
                           f"{exc.msg}") from None


def read_versioned_json(path: str | os.PathLike, what: str, format_key: str,
                        version: int) -> tuple[dict, dict]:
    """(document, its ``provenance`` object) of a specsim data file that declares
    ``{format_key: version}``: any file that cannot be read as such (missing, not UTF-8, not
    JSON, another format or version, no provenance) raises a one-line ``SpecsimError`` naming
    the file and ``what`` it should be."""
    from specsim.errors import SpecsimError

    def bad(message):
        return SpecsimError(f"{path}: bad {what}: {message}")
    try:
        doc = read_json(path, what)
    except (OSError, ValueError, RecursionError) as exc:   # e.g. not UTF-8, a folder
        raise bad(f"cannot be read as JSON text ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get(format_key) != version:
        raise bad(f"expected \"{format_key}\": {version}")
    provenance = doc.get("provenance")
    if not isinstance(provenance, dict):
        raise bad("missing provenance")
    return doc, provenance
