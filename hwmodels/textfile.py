"""Reading a user's text file (YAML, JSON, JSON lines) with one-line errors.

Every reader of a user-named file goes through :func:`read_user_text`, so a missing file,
a folder, or binary garbage is an :class:`~hwmodels.errors.InputError` naming the path,
never a ``UnicodeDecodeError`` traceback.
"""

from __future__ import annotations

from pathlib import Path

from hwmodels.errors import InputError


def read_user_text(path: Path | str, *, kind: str = "text") -> str:
    """The UTF-8 text of ``path``; InputError (one line, naming the path) if it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not a {kind} file (byte {error.start} is not UTF-8 text)") from None
