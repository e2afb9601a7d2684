"""Writing a user's output path: atomic, never destroying what the path points at.

Every writer of a file the user names (``--trace``, ``--plot``, ``--out``, reports, overlays,
schedules) goes through this module, as every reader goes through :mod:`hwmodels.textfile`.

What a path may be, and what happens (one rule, here only):

================================  =====================================================
the path is                        what is written
================================  =====================================================
absent                             a new regular file, mode ``0666 & ~umask``
a regular file                     replaced atomically; its mode is kept
a symlink to either of the above   written **through**: the file the link points at is
                                   replaced and the link stays a link (as ``> link``
                                   in a shell does); a dangling link creates its target
anything else (a directory, FIFO,  refused: :class:`~hwmodels.errors.InputError`, one line
device, socket), or a link to one  naming the path and what it is; nothing is touched
================================  =====================================================

Atomic replacement: (1) write a temporary file in the *target's* folder (same filesystem,
so the rename is atomic); (2) flush and fsync it; (3) set its mode (above); (4)
``os.replace`` it over the target; (5) fsync the folder so the rename is durable. If any
step fails the temporary file is removed and the previous file is left exactly as it was.
:func:`append_bytes` is the appending writer (one ``O_APPEND`` write, then fsync) under the
same path rules; :func:`check_output_file` and :func:`check_output_folder` let a command
refuse a bad path before it computes anything.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from hwmodels.errors import InputError


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_output_file(path: Path | str) -> Path:
    """The regular file that writing ``path`` will replace or create (symlinks resolved).

    Raises InputError (one line) when ``path`` is, or links to, something other than a
    regular file, or when a symlink loops."""
    given = Path(path)
    try:
        target = Path(os.path.realpath(given, strict=False))
    except (OSError, RuntimeError) as error:  # a symlink loop on some Pythons
        raise InputError(f"{given}: cannot resolve the output path: {error}") from None
    try:
        info = os.stat(target)
    except FileNotFoundError:
        return target
    except OSError as error:
        raise InputError(f"{given}: cannot use as an output file: {error.strerror or error}") from None
    if not stat.S_ISREG(info.st_mode):
        shown = f"{given} (-> {target})" if target != given.absolute() else str(given)
        raise InputError(f"{shown}: is {_kind(info.st_mode)}, not a regular file; "
                         "refusing to write over it (name a file path)")
    return target


def check_output_folder(path: Path | str) -> Path:
    """``path`` as an output folder: absent (it will be created) or a directory (symlinks
    followed); InputError (one line) for anything else."""
    given = Path(path)
    target = Path(os.path.realpath(given, strict=False))
    try:
        info = os.stat(target)
    except FileNotFoundError:
        return given
    except OSError as error:
        raise InputError(f"{given}: cannot use as an output folder: {error.strerror or error}") from None
    if not stat.S_ISDIR(info.st_mode):
        kind = "a regular file" if stat.S_ISREG(info.st_mode) else _kind(info.st_mode)
        raise InputError(f"{given}: is {kind}, not a folder; name a folder for the outputs")
    return given


def _umask() -> int:
    """The process umask (read by setting and restoring it: POSIX has no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _new_mode(target: Path) -> int:
    """The mode the written file gets: the existing file's, else ``0666 & ~umask``."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


def write_bytes_atomic(path: Path | str, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring); returns ``path``."""
    given = Path(path)
    target = check_output_file(given)
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = _new_mode(target)
    fd, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    temp_path = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_path, mode)  # mkstemp makes 0600; the user's umask decides, as for `>`
        os.replace(temp_path, target)
    except BaseException:
        with contextlib.suppress(OSError):
            temp_path.unlink()
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return given


def write_text_atomic(path: Path | str, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def open_for_append(path: Path | str) -> int:
    """An ``O_APPEND`` file descriptor on ``path`` (created ``0666 & ~umask`` if absent),
    after the same checks as a replacing write; the caller closes it."""
    target = check_output_file(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # O_NONBLOCK: should the path turn into a FIFO after the check, open fails instead of hanging.
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{path}: is not a regular file; refusing to append to it")
    os.set_blocking(fd, True)
    return fd


def append_bytes(path: Path | str, data: bytes, *, sync: bool = True) -> Path:
    """Append ``data`` in one ``O_APPEND`` write, then fsync (unless ``sync`` is False: the
    data is then with the OS, safe from the process being killed but not from a power cut);
    returns ``path``."""
    fd = open_for_append(path)
    try:
        written = os.write(fd, data)
        if written != len(data):  # pragma: no cover - short writes on local files are rare
            raise OSError(f"short write to {path} ({written} of {len(data)} bytes)")
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return Path(path)
