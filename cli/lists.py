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


def parse_shapes(text: str, option: str = "--shapes", low_context: int = 256
                 ) -> list[tuple[int, int]]:
    """Comma-separated BATCHxCONTEXT pairs (``8x32768``; ``k``/``K`` after the context means
    ×1024: ``4x64k``), each once, in the order given; anything else is one line."""
    out: list[tuple[int, int]] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        parts = item.lower().split("x")
        try:
            if len(parts) != 2:
                raise ValueError
            context = parts[1]
            scale = 1024 if context.endswith("k") else 1
            pair = (int(parts[0]), int(context.rstrip("k")) * scale)
        except ValueError:
            raise SpecsimError(f"{option}: '{item}' is not BATCHxCONTEXT (e.g. 8x32768 or "
                               f"4x64k)") from None
        if pair[0] < 1:
            raise SpecsimError(f"{option}: '{item}': the batch is below 1")
        if pair[1] < low_context:
            raise SpecsimError(f"{option}: '{item}': the context is below {low_context}")
        if pair not in out:
            out.append(pair)
    if not out:
        raise SpecsimError(f"{option}: give one or more BATCHxCONTEXT pairs, comma-separated")
    return out


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
