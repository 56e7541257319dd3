"""Comma-separated option values (``--batch 1,4,8``, ``--s 0.03,0.05``, ``--policies a,b``):
one parser per kind, each refusing a bad item in one line that names the option and the item."""
from __future__ import annotations

from specsim.errors import SpecsimError


def parse_ints(text: str, option: str, low: int = 1) -> list[int]:
    """Comma-separated integers of at least ``low``, sorted, each once; anything else is one
    line naming ``option`` and the value."""
    out = set()
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            raise SpecsimError(f"{option}: '{item}' is not an integer") from None
        if value < low:
            raise SpecsimError(f"{option}: {value} is below {low}")
        out.add(value)
    if not out:
        raise SpecsimError(f"{option}: give one or more integers, comma-separated")
    return sorted(out)


def parse_sparsities(text: str, option: str = "--s") -> list[float]:
    """Comma-separated fractions of the context kept, in (0, 1], sorted, each once."""
    out = set()
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            value = float(item)
        except ValueError:
            raise SpecsimError(f"{option}: '{item}' is not a number") from None
        if not 0.0 < value <= 1.0:          # NaN fails this too
            raise SpecsimError(f"{option}: {item} is not a fraction in (0, 1]")
        out.add(value)
    if not out:
        raise SpecsimError(f"{option}: give one or more sparsities, comma-separated")
    return sorted(out)


def parse_names(text: str, option: str) -> list[str]:
    """Comma-separated names in the order given, each once."""
    out = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not out:
        raise SpecsimError(f"{option}: give one or more names, comma-separated")
    return out
