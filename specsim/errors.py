"""Errors that the CLI turns into one-line messages (no traceback)."""
from __future__ import annotations


class SpecsimError(Exception):
    """Any user-facing error: bad input, unknown name, inconsistent data."""


class TraceError(SpecsimError):
    """A malformed or inconsistent trace; names the file, the line and the field."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None):
        self.path, self.line, self.field, self.reason = path, line, field, message
        where = ":".join(str(x) for x in (path, line) if x is not None)
        prefix = f"{where}: " if where else ""
        field_part = f"field '{field}': " if field else ""
        super().__init__(f"{prefix}{field_part}{message}")


class UnknownNameError(SpecsimError):
    """A model or hardware name that is not in the catalogue; lists the known ones."""

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind, self.name, self.known = kind, name, known
        super().__init__(f"unknown {kind} '{name}'; known: {', '.join(sorted(known))} "
                         f"(or give a path to a JSON file)")
