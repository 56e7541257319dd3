"""Errors that the CLI turns into one-line messages (no traceback).

Every error about an input file (:class:`InputError` and its subclasses) carries the file, the
line and the field it concerns as attributes (``path``, ``line``, ``field``, ``reason``) and
reads ``FILE:LINE: FIELD: REASON``, where a bad value's reason reads ``expected …, got …``; the
value is quoted through :func:`quote`, which keeps at most :data:`QUOTE_CHARS` characters of it.
"""
from __future__ import annotations

#: the most characters of a bad value an error message quotes
QUOTE_CHARS = 40


def quote(value, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters (an integer of 400 digits, a 1 MB string),
    with how long it was when cut."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** limit:
        digits = len(str(abs(value))) if abs(value) < 10 ** 4000 else None
        return f"an integer of {digits} digits" if digits else "an integer of over 4000 digits"
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit - 1]}… ({len(text)} characters)"


def one_line(text: str) -> str:
    """``text`` with line breaks, terminal escapes and other unprintable characters written
    as Python escapes, so that it prints as one line and changes nothing on a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class SpecsimError(Exception):
    """Any user-facing error: bad input, unknown name, inconsistent data."""


class InputError(SpecsimError):
    """A malformed or inconsistent input file; names the file, the line and the field."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None):
        self.path, self.line, self.field, self.reason = path, line, field, message
        where = ":".join(str(x) for x in (path, line) if x is not None)
        prefix = f"{where}: " if where else ""
        shown = field if field is None or len(field) <= 5 * QUOTE_CHARS else (
            f"{field[:5 * QUOTE_CHARS - 1]}…")
        field_part = f"{shown}: " if field else ""
        super().__init__(one_line(f"{prefix}{field_part}{message}"))


class TraceError(InputError):
    """A malformed or inconsistent trace (any importer's input)."""


class SpecFileError(InputError):
    """A model config or hardware spec whose content is malformed or out of range."""


class LimitError(SpecsimError):
    """A value beyond what specsim models (e.g. a draft length above the limit), named with
    the limit; ``what`` is the option or quantity it concerns."""

    def __init__(self, what: str, message: str):
        self.what, self.reason = what, message
        super().__init__(one_line(f"{what}: {message}"))


class UnknownNameError(SpecsimError):
    """A model or hardware name that is not in the catalogue; lists the known ones."""

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind, self.name, self.known = kind, name, known
        super().__init__(f"unknown {kind} '{name}'; known: {', '.join(sorted(known))} "
                         f"(or give a path to a JSON file)")
