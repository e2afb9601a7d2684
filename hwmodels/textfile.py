"""Reading a user's text file (YAML, JSON, JSON lines) with one-line errors.

Every reader of a user-named file goes through :func:`read_user_text`, so a missing file,
a folder, or binary garbage is an :class:`~hwmodels.errors.InputError` naming the path,
never a ``UnicodeDecodeError`` traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hwmodels.errors import InputError


def read_user_text(path: Path | str, *, kind: str = "text") -> str:
    """The UTF-8 text of ``path``; InputError (one line, naming the path) if it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not a {kind} file (byte {error.start} is not UTF-8 text)") from None


def read_user_json(path: Path | str) -> Any:
    """The parsed JSON of ``path``; InputError (one line: the path, and the line of a syntax
    error) if it cannot be read or parsed."""
    try:
        return json.loads(read_user_text(path, kind="JSON"))
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: line {error.lineno}: invalid JSON: {error.msg}") from None
