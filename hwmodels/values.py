"""Values a user types: numbers, lists and ``key=value`` lists, checked by one rule each.

Every flag and every list or pair parser of the project reads its text through these
functions, so one rule holds everywhere (issue 48, "validate before work"):

1. **Numbers** are finite (``nan``, ``inf`` refused), whole where the quantity counts
   (``int``: seeds, budgets, evaluation limits, layers; ``1.5`` and ``1e3`` refused), and
   inside ``[minimum, maximum]`` (an ``exclusive`` minimum for rates and exponents that must
   be above it).
2. **Lists** (``1,2,4``) have no empty item: ``1,,2``, a leading or trailing comma and an
   empty text are refused, not dropped.
3. **Pairs** (``key=value,...``) have a key, an ``=`` and a value in every item, and no key
   given twice (``experts=fp8,experts=bf16`` would otherwise let the last one win silently).

Each problem is an :class:`~hwmodels.errors.InputError` whose message starts with ``where``
(the flag or field, e.g. ``--seed``) and the text given, so the CLI prints it as its one line.
This module sits at the bottom of the house (``hwmodels``) because parsers in every layer
above read through it; it knows nothing of models or chips.
"""

from __future__ import annotations

import math

from hwmodels.errors import InputError

SEED_MAX = 2**32 - 1  # numpy's legacy RandomState and Optuna's samplers take seeds below 2**32


def number(text: str | float, where: str, *, kind: type = float, minimum: float | None = None,
           maximum: float | None = None, exclusive_minimum: bool = False) -> int | float:
    """``text`` as a ``kind`` (int or float) inside the range (module docstring, rule 1)."""
    shown = str(text).strip()
    try:
        if kind is int:
            if isinstance(text, (float, bool)):
                raise ValueError
            value: int | float = int(shown)
        else:
            value = float(shown)
    except ValueError:
        expected = "a whole number" if kind is int else "a number"
        raise InputError(f"{where} {shown!r}: expected {expected}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{where} {shown}: must be a finite number")
    if minimum is not None and (value <= minimum if exclusive_minimum else value < minimum):
        raise InputError(f"{where} {shown}: must be {'>' if exclusive_minimum else '>='} {minimum:g}")
    if maximum is not None and value > maximum:
        raise InputError(f"{where} {shown}: must be <= {maximum:g}")
    return value


def items(text: str, where: str, *, separator: str = ",") -> list[str]:
    """The stripped items of a list (module docstring, rule 2)."""
    parts = [part.strip() for part in str(text).split(separator)]
    if not any(parts):
        raise InputError(f"{where} {text!r}: empty; give at least one item")
    if not all(parts):
        raise InputError(f"{where} {text!r}: an empty item (two separators in a row, or one at an end)")
    return parts


def number_list(text: str, where: str, *, kind: type = int, minimum: float | None = None,
                maximum: float | None = None, exclusive_minimum: bool = False) -> list[int | float]:
    """A list of numbers, each checked by :func:`number` (rules 1 and 2)."""
    return [number(item, where, kind=kind, minimum=minimum, maximum=maximum, exclusive_minimum=exclusive_minimum)
            for item in items(text, where)]


def pairs(text: str, where: str, *, separator: str = ",", keys: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """The ``(key, value)`` items of ``key=value`` lists (rule 3); with ``keys``, a key outside
    them is refused too. Values may be empty only where the caller allows it (checked there)."""
    found: dict[str, str] = {}
    for item in items(text, where, separator=separator):
        key, sep, value = (piece.strip() for piece in item.partition("="))
        if not sep or not key:
            known = f" with KEY one of {', '.join(keys)}" if keys else ""
            raise InputError(f"{where} {text!r}: {item!r}: expected KEY=VALUE{known}")
        if keys is not None and key not in keys:
            raise InputError(f"{where} {text!r}: {item!r}: unknown key {key!r}; known: {', '.join(keys)}")
        if key in found:
            raise InputError(f"{where} {text!r}: {key} given twice ({key}={found[key]} and {key}={value}); give it once")
        found[key] = value
    return list(found.items())
