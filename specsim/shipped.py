"""The one locator of specsim's shipped data: the model catalogue, calibrations, validation
runs and example traces, wherever the package is installed (a checkout, an editable install,
a wheel).

Shipped files are named by their path in the repository (``models/qwen3-8b/config.json``,
``traces/synthetic-sparse-selfspec.jsonl``); :func:`shipped_path` turns that name into a file
on disk through :mod:`importlib.resources`. ``SPECSIM_MODELS`` names a user's own catalogue
folder (laid out as ``models/``), searched before the shipped one (:func:`catalog_file`).
"""
from __future__ import annotations

import atexit
import os
from contextlib import ExitStack
from importlib import resources
from pathlib import Path

from specsim.errors import SpecsimError

#: Top-level folder of the repository -> the package it installs as.
PACKAGES = {"models": "specsim.data.models", "traces": "specsim.data.traces"}

_extracted = ExitStack()          # files that had to be extracted (a zipped install)
atexit.register(_extracted.close)


def _split(relative: str) -> tuple[str, str]:
    top, _, rest = relative.replace("\\", "/").lstrip("./").partition("/")
    if top not in PACKAGES or not rest:
        raise SpecsimError(f"{relative}: shipped data lies under {' or '.join(PACKAGES)}/")
    return top, rest


def _resource(relative: str):
    top, rest = _split(relative)
    node = resources.files(PACKAGES[top])
    for part in rest.split("/"):
        node = node / part
    return node


def shipped_file(relative: str) -> str | None:
    """The shipped file named ``relative`` (``traces/...``, ``models/...``) as a path on disk,
    or None where this install has no such file."""
    try:
        node = _resource(relative)
    except (SpecsimError, ModuleNotFoundError):
        return None
    if not node.is_file():
        return None
    if isinstance(node, Path):
        return str(node)
    return str(_extracted.enter_context(resources.as_file(node)))


def shipped_path(relative: str) -> Path:
    """:func:`shipped_file`, raising a one-line error where the file does not ship."""
    found = shipped_file(relative)
    if found is None:
        raise SpecsimError(f"{relative}: not shipped with this install of specsim")
    return Path(found)


def shipped_root(top: str) -> Path:
    """The folder on disk holding the shipped ``models`` or ``traces`` data."""
    node = resources.files(PACKAGES[top])
    if isinstance(node, Path):
        return node
    return Path(_extracted.enter_context(resources.as_file(node)))


def catalog_dirs() -> list[Path]:
    """Folders holding the model and hardware catalogue, searched in order: ``$SPECSIM_MODELS``
    (a user's own catalogue, laid out as ``models/``) where set, then the shipped ``models/``."""
    env = os.environ.get("SPECSIM_MODELS")
    return ([Path(env)] if env else []) + [shipped_root("models")]


def catalog_dir() -> Path:
    """The first catalogue folder (:func:`catalog_dirs`): the user's own where set."""
    return catalog_dirs()[0]


def catalog_file(relative: str) -> Path:
    """``relative`` (``qwen3-8b/config.json``, ``calibrations/h200/qwen3-8b.json``) in the
    first catalogue folder that has it; where none has it, its path in the first folder (for
    the caller's own 'no such file' handling)."""
    dirs = catalog_dirs()
    for folder in dirs:
        if (folder / relative).is_file():
            return folder / relative
    return dirs[0] / relative


def catalog_names(folder: str = "", pattern: str = "*") -> list[str]:
    """Names matching ``pattern`` in ``folder`` of every catalogue folder, user's first, each
    once: e.g. ``catalog_names("hardware", "*.json")``."""
    seen: dict[str, None] = {}
    for root in catalog_dirs():
        for path in sorted((root / folder).glob(pattern)):
            seen.setdefault(path.name, None)
    return list(seen)


def display_name(path: str | os.PathLike) -> str:
    """``path`` as shipped data's repository name (``models/...``) where it is shipped data,
    else as given: what reports print, so that they read the same on every install."""
    resolved = Path(path).resolve()
    for top in PACKAGES:
        try:
            return f"{top}/{resolved.relative_to(shipped_root(top).resolve()).as_posix()}"
        except ValueError:
            continue
    return str(path)


def resolve(path: str) -> str:
    """A user's path as given where it exists, else the shipped file of that name (so that
    ``--trace traces/synthetic-sparse-selfspec.jsonl`` works from any folder), else as given
    (for the caller's own 'no such file' error)."""
    if os.path.exists(path):
        return path
    try:
        return shipped_file(path) or path
    except SpecsimError:
        return path
