"""Reading a user's file (text, JSON, JSON lines, YAML) with one-line errors.

Every reader of a user-named file goes through this module, so a missing file, a folder,
binary garbage or a syntax error is an :class:`~hwmodels.errors.InputError` whose one line
names the file (and the line of a syntax error), never a ``UnicodeDecodeError`` or parser
traceback. ``shown`` is how the message names the file (default: the path as given; the
catalog passes its display path).

| reader              | returns                               | readers |
| ---                 | ---                                   | --- |
| :func:`read_user_bytes` | the raw bytes                     | (the others) |
| :func:`read_user_text`  | UTF-8 text (gunzipped when ``gzipped`` and the bytes are gzip) | measurements ``.jsonl``, model catalog YAML, routing |
| :func:`read_user_json`  | parsed JSON                       | schedules, HF configs, sweep specs, traces, gpu_bench output, published data |
| :func:`read_user_jsonl` | ``(line number, parsed)`` per non-blank, non-``#`` line | demo records |
| :func:`read_user_yaml`  | parsed YAML                       | catalog entries and overlays (:func:`hwmodels.files.read_yaml_mapping`) |
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import yaml

from hwmodels.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"


def read_user_bytes(path: Path | str, *, shown: str | None = None) -> bytes:
    """The bytes of ``path``; InputError (one line, naming the path) if it cannot be read."""
    name = str(path) if shown is None else shown
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{name}: file not found") from None
    except OSError as error:
        raise InputError(f"{name}: cannot read: {error.strerror or error}") from None


def read_user_text(path: Path | str, *, kind: str = "text", shown: str | None = None,
                   gzipped: bool = False) -> str:
    """The UTF-8 text of ``path`` (decompressed first when ``gzipped`` and it starts with the
    gzip magic); InputError (one line, naming the path) if it cannot be read or decoded."""
    name = str(path) if shown is None else shown
    raw = read_user_bytes(path, shown=name)
    if gzipped and raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except EOFError:
            raise InputError(f"{name}: truncated gzip stream (partial write?)") from None
        except (OSError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
            raise InputError(f"{name}: corrupt gzip stream: {error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{name}: not a {kind} file (byte {error.start} is not UTF-8 text)") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as open() reads text


def read_user_json(path: Path | str, *, kind: str = "JSON", shown: str | None = None,
                   gzipped: bool = False) -> Any:
    """The parsed JSON of ``path``; InputError (one line: the path, and the line of a syntax
    error) if it cannot be read or parsed."""
    name = str(path) if shown is None else shown
    text = read_user_text(path, kind=kind, shown=name, gzipped=gzipped)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{name}: line {error.lineno}: invalid JSON: {error.msg}") from None


def read_user_jsonl(path: Path | str, *, shown: str | None = None) -> list[tuple[int, Any]]:
    """``(line number, parsed value)`` for each line of a JSON-lines file, blank and ``#``
    lines skipped; InputError naming the path and the first line that does not parse."""
    name = str(path) if shown is None else shown
    out = []
    for number, raw in enumerate(read_user_text(path, kind="JSON lines", shown=name).split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            out.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            raise InputError(f"{name}: line {number}: invalid JSON: {error.msg} at column {error.colno}") from None
    return out


def read_user_yaml(path: Path | str, *, shown: str | None = None) -> Any:
    """The parsed YAML of ``path`` (``yaml.safe_load``); InputError (one line: the path, and
    the line and column of a syntax error) if it cannot be read or parsed."""
    name = str(path) if shown is None else shown
    text = read_user_text(path, kind="YAML", shown=name)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise InputError(f"{name}: {where}YAML syntax error: {problem}") from None
