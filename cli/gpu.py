"""The optional GPU packages (the ``gpu`` extra: torch, triton) that `specsim run`, `trace`,
`calibrate --gpu`, `validate --gpu` and `models fetch` need: without them, one line saying
what to install instead of an import error."""
from __future__ import annotations

import importlib

from specsim.errors import SpecsimError

#: How to get the GPU packages: torch first (a CUDA build), so that pip does not pick one.
INSTALL = ('install a CUDA build of torch (https://pytorch.org/get-started/locally/), then '
           'pip install "specsim[gpu]"')


def require_gpu_packages(command: str, packages: tuple[str, ...] = ("torch", "triton")) -> None:
    """Raise :class:`SpecsimError` naming ``command``, the missing ``packages`` and
    :data:`INSTALL` when any of them cannot be imported."""
    missing = []
    for name in packages:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise SpecsimError(f"{command} needs {' and '.join(missing)}, which this install "
                           f"lacks: {INSTALL}")
