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
