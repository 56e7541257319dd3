"""What the `specsim` commands print on a terminal: user data (names, prompts, paths, file
contents quoted in errors) with its control characters escaped, so that a trace or config
cannot move the cursor, recolour the screen or hide text; and the one-line error format."""
from __future__ import annotations

import re

import click

#: C0 controls but tab and newline, DEL, C1 controls, the line and paragraph separators and the
#: bidirectional overrides and isolates: printed as escapes.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e"
                      "\u2066-\u2069]")
_CONTROL_OR_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e"
                              "\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\x1b": "\\x1b"}
#: The longest error line printed (the rest is cut with an ellipsis).
MAX_ERROR_CHARS = 1000


def _escape(match: re.Match) -> str:
    ch = match.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text, *, one_line: bool = False) -> str:
    """``text`` with control characters as escapes (``\\x1b``, ``\\u202e``); with
    ``one_line`` newlines and tabs too."""
    return (_CONTROL_OR_LINE if one_line else _CONTROL).sub(_escape, str(text))


#: A number that prints as a negative zero ("-0.0", "−0.00%"), not part of a word or a number.
_NEGATIVE_ZERO = re.compile("(?<![\\w.])[-−](0(?:\\.0+)?)(?![\\d.])")


def without_negative_zero(text: str) -> str:
    """``text`` with every printed negative zero ("-0.0%") written as zero."""
    return _NEGATIVE_ZERO.sub(r"\1", text)


def echo(message="", *, err: bool = False, nl: bool = True) -> None:
    """``click.echo`` of ``message`` for a reader: :func:`printable` (its own line breaks
    kept), without negative zeros. JSON goes out through ``click.echo`` as it is."""
    click.echo(without_negative_zero(printable(message)), err=err, nl=nl)


def error_line(message) -> str:
    """``specsim: error: MESSAGE`` on one line, escaped and at most
    :data:`MAX_ERROR_CHARS` long."""
    text = printable(message, one_line=True).strip()
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS - 1] + "…"
    return f"specsim: error: {text}"
