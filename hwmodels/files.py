"""Where catalog files live, and reading them with one-line errors.

The built-in catalog is ``hwmodels/catalog/*.yaml`` (published figures, read-only); the local
folder (``$TPUSIM_LOCAL_DIR``, else the user's data directory via ``platformdirs``) holds machine-local entries
and calibrated overlays. Every problem reading a YAML file (through :func:`hwmodels.textfile.read_user_yaml`) or
validating it becomes an :class:`~hwmodels.errors.InputError` whose one line names the file
and the field path. Both
:mod:`hwmodels.catalog` and :mod:`hwmodels.overlay` read files through this module.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hwmodels.errors import InputError
from hwmodels.textfile import read_user_yaml
from hwmodels.validation import describe_validation_error

BUILTIN_DIR = Path(__file__).resolve().parent / "catalog"
LOCAL_DIR_ENV = "TPUSIM_LOCAL_DIR"


def local_dir() -> Path:
    """The folder for machine-local entries and calibrated overlays (may not exist yet):
    ``$TPUSIM_LOCAL_DIR`` if set, else the user's data directory for tpusim
    (``platformdirs.user_data_dir``: ``~/.local/share/tpusim`` on Linux), never a folder
    inside the installed package."""
    override = os.environ.get(LOCAL_DIR_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs  # a well-kept library for per-OS user folders

    return Path(platformdirs.user_data_dir("tpusim", appauthor=False))


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
    data = read_user_yaml(path, shown=shown)
    if not isinstance(data, dict):
        kind = "empty file" if data is None else f"a {type(data).__name__}"
        raise InputError(f"{shown}: expected a mapping of fields at the top level, got {kind}")
    return data


def format_validation_error(source: str, error: ValidationError, data: Any, *,
                            schema: str | None = "hardware") -> str:
    """One line listing every problem, ending with the ``tpusim schema`` topic to read
    (:func:`hwmodels.validation.describe_validation_error`)."""
    return describe_validation_error(source, error, data, schema=schema)
