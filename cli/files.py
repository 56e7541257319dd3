"""The files a `specsim` command reads and writes, checked before any work starts.

:func:`check_outputs` is the one check every command that writes a file runs first: each
destination must be writable (its folder exists or can be made, it is not a folder, a probe
file can be created beside it), no two outputs may be the same file, and no output may be one
of the command's inputs (the same path, or the same file through a symlink or a hard link).
The files themselves are written atomically (:mod:`specsim.atomic`).

:func:`trace_input` copies ``--trace -`` (standard input), a pipe or a device such as
``/dev/stdin`` once into a temporary file (the importers' own copy,
``specsim.traces.importers.readable_copy``) that lasts the command, so that its workers can
read it again; errors name it as given.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import tempfile

import click

#: The most bytes read from standard input or a pipe as a trace.
MAX_STREAM_BYTES = 4 << 30
#: Temporary files standing for a stream, and the name they stand for (for error messages).
_STREAM_NAMES: dict[str, str] = {}


def _existing(path) -> bool:
    return path is not None and os.path.exists(path)


def _same(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        try:
            return os.path.samefile(a, b)
        except OSError:
            return False
    return os.path.realpath(a) == os.path.realpath(b)


def _writable(option: str, path: str) -> None:
    if os.path.isdir(path):
        raise click.BadParameter(f"{path} is a folder; give a file name", param_hint=option)
    folder = os.path.dirname(os.path.abspath(path))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise click.BadParameter(f"cannot write {path}: {existing} is not a folder",
                                 param_hint=option)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise click.BadParameter(f"cannot write {path}: the file is read-only",
                                 param_hint=option)
    try:
        fd, probe = tempfile.mkstemp(prefix=".specsim-probe-", dir=existing)
    except OSError as exc:
        raise click.BadParameter(f"cannot write {path}: {exc.strerror or exc} in {existing}",
                                 param_hint=option) from None
    os.close(fd)
    os.unlink(probe)


def check_outputs(outputs: dict[str, str | None], inputs=()) -> None:
    """Refuse, before any work, every output of ``outputs`` (option name → path; None: not
    asked for) that cannot be written, that another output also names, or that is one of
    ``inputs`` (paths; those that do not name an existing file are skipped)."""
    given = [(option, str(path)) for option, path in outputs.items() if path is not None]
    sources = [str(p) for p in inputs if p is not None and _existing(str(p))]
    for i, (option, path) in enumerate(given):
        _writable(option, path)
        for source in sources:
            if _same(path, source):
                raise click.BadParameter(f"{path} is an input of this command "
                                         f"({_STREAM_NAMES.get(source, source)}); writing it "
                                         f"would replace it: give another file",
                                         param_hint=option)
        for other_option, other in given[:i]:
            if _same(path, other):
                raise click.BadParameter(f"{path} is also {other_option}'s file; give "
                                         f"another", param_hint=option)


def stream_name(text: str) -> str:
    """``text`` with the temporary files of :func:`trace_input` named as given."""
    for temporary, name in _STREAM_NAMES.items():
        text = text.replace(temporary, name)
    return text


def trace_input(path: str | None) -> str | None:
    """``path`` as it can be read more than once: ``-``, a pipe, a socket or a character device
    is copied once (at most :data:`MAX_STREAM_BYTES`; ``specsim.traces.importers.
    readable_copy``) into a temporary file, removed when the command ends; a regular file or
    None is returned as it is."""
    if path is None:
        return None
    if path == "-" and click.get_binary_stream("stdin").isatty():
        raise click.BadParameter("'-' reads the trace from standard input, which is a "
                                 "terminal here: pipe a trace in (specsim predict --trace "
                                 "- < trace.jsonl)", param_hint="--trace")
    from specsim.traces.importers import readable_copy

    copy = readable_copy(path, MAX_STREAM_BYTES)
    ctx = click.get_current_context(silent=True)
    keep = ctx.with_resource if ctx is not None else _outside_commands.enter_context
    readable = keep(copy)
    if readable != path:
        _STREAM_NAMES[readable] = "<stdin>" if path == "-" else path
    return readable


#: Copies made outside a click command (a library caller): removed when the process ends.
_outside_commands = contextlib.ExitStack()
atexit.register(_outside_commands.close)


def load_trace_arg(path: str | None, fmt: str = "auto", *, per_draft: bool = True):
    """The trace of a command's ``--trace`` (None: the shipped default trace) in format
    ``fmt`` ('auto' detects it), read through :func:`trace_input`; a stream's trace is named
    as given. ``per_draft`` False: the per-draft fields (entropy, accept_prob) are checked but
    not kept (commands that read only (context, k, m): predict, the dashboard)."""
    from specsim.cli import defaults
    from specsim.traces.importers import load_trace

    readable = trace_input(path) if path is not None else defaults.default_trace()
    trace = load_trace(readable, None if fmt == "auto" else fmt, per_draft=per_draft)
    if readable in _STREAM_NAMES:
        trace.path = _STREAM_NAMES[readable]
    return trace
