"""One line for a pydantic validation error: every problem at once, and where to read the format.

A user fixing a file by hand should not have to run a command once per missing field, so
:func:`describe_validation_error` reports all of them in one line::

    my.jsonl: line 1: missing fields system, context, backend; batch: Input should be
    greater than or equal to 1 (the format: `tpusim schema measurement`)

Locations are dotted paths; a list element that carries a ``name`` is addressed by it
(``links.ici.latency_s``), the same paths calibration overlays use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError


def location_path(loc: Sequence[int | str], data: Any) -> str:
    """A pydantic error location as a dotted path, naming list elements by ``name``."""
    parts: list[str] = []
    node: Any = data
    for key in loc:
        if isinstance(key, int):
            element = node[key] if isinstance(node, list) and 0 <= key < len(node) else None
            name = element.get("name") if isinstance(element, Mapping) else None
            if isinstance(name, str) and name:
                parts.append(name)
            elif parts:
                parts[-1] = f"{parts[-1]}[{key}]"
            else:
                parts.append(f"[{key}]")
            node = element
        else:
            parts.append(str(key))
            node = node.get(key) if isinstance(node, Mapping) else None
    return ".".join(parts)


def describe_validation_error(source: str, error: ValidationError, data: Any = None, *,
                              schema: str | None = None) -> str:
    """``<source>: missing fields a, b; c.d: <message>; ...`` (+ the schema command to run).

    ``schema`` names a ``tpusim schema`` topic (``measurement``, ``model``, ...); when given,
    the line ends with the command that prints the format.
    """
    missing: list[str] = []
    problems: list[str] = []
    for item in error.errors(include_url=False):
        field = location_path(item.get("loc", ()), data)
        if item.get("type") == "missing":
            missing.append(field or "(top level)")
            continue
        message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
        problems.append(f"{field}: {message}" if field else message)
    parts = []
    if missing:
        parts.append(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    parts.extend(problems)
    line = f"{source}: {'; '.join(parts)}"
    if schema:
        line += f" (the format: `tpusim schema {schema}`)"
    return line
