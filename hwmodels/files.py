"""Where catalog files live, and reading them with one-line errors.

The built-in catalog is ``hwmodels/catalog/*.yaml`` (published figures, read-only); the local
folder (``$TPUSIM_LOCAL_DIR``, else ``hwmodels/catalog/local/``) holds machine-local entries
and calibrated overlays. Every problem reading a YAML file or validating it becomes an
:class:`~hwmodels.errors.InputError` whose one line names the file and the field path. Both
:mod:`hwmodels.catalog` and :mod:`hwmodels.overlay` read files through this module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hwmodels.errors import InputError

BUILTIN_DIR = Path(__file__).resolve().parent / "catalog"
LOCAL_DIR_ENV = "TPUSIM_LOCAL_DIR"


def local_dir() -> Path:
    """The folder for machine-local entries and calibrated overlays (may not exist yet)."""
    override = os.environ.get(LOCAL_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return BUILTIN_DIR / "local"


def display_path(path: Path | str) -> str:
    """``path`` relative to the working directory when it lies below it, else absolute."""
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(Path.cwd()))
    except ValueError:
        return str(resolved)


def read_yaml_mapping(path: Path | str) -> dict[str, Any]:
    """Read a YAML file whose top level must be a mapping; errors are one-line InputErrors."""
    shown = display_path(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{shown}: file not found") from None
    except OSError as error:
        raise InputError(f"{shown}: cannot read: {error.strerror or error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise InputError(f"{shown}: {where}YAML syntax error: {problem}") from None
    if not isinstance(data, dict):
        kind = "empty file" if data is None else f"a {type(data).__name__}"
        raise InputError(f"{shown}: expected a mapping of fields at the top level, got {kind}")
    return data


def _loc_to_path(loc: Sequence[int | str], data: Any) -> str:
    """Render a pydantic error location as a dotted path, naming list elements by ``name``."""
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


def format_validation_error(source: str, error: ValidationError, data: Any) -> str:
    """One line: ``<source>: <field path>: <message>`` (+ how many more errors there were)."""
    errors = error.errors(include_url=False)
    first = errors[0]
    field = _loc_to_path(first.get("loc", ()), data)
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    line = f"{source}: {field}: {message}" if field else f"{source}: {message}"
    if len(errors) > 1:
        line += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return line
