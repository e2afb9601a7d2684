"""One writer per output folder: an advisory lock that names its holder.

``sweep``, ``calibrate``, ``demo`` and ``run-kernel`` (and ``compare`` / ``report`` given
``--out``) write several files into one folder (or append to one file). Two runs into the same place would interleave rows in
``sweep.csv`` or mix two fits' reports, so each such command holds a lock for its whole run:

- the lock is ``fcntl.flock`` (the standard library's binding of the POSIX advisory lock,
  chosen over the ``filelock`` package because it needs no dependency and the kernel
  releases it when the holding process dies, however it dies);
- the lock file (``.tpusim.lock`` in the folder, or ``.NAME.lock`` beside a file) holds the
  holder's pid, command and start time, so a second run says who holds it and exits 2;
- a clean finish empties the lock file; a lock file still naming a pid is one left by a
  killed run: *stale*, its pid is gone and the kernel already released its lock, so the
  next run takes it over and says so.

The lock file is never deleted (deleting a flock file lets two runs lock two different
inodes); it is hidden and a few dozen bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from hwmodels.errors import InputError

FOLDER_LOCK_NAME = ".tpusim.lock"


def lock_path(target: Path, *, is_folder: bool) -> Path:
    """Where the lock for ``target`` lives: inside a folder, or beside a file."""
    return target / FOLDER_LOCK_NAME if is_folder else target.parent / f".{target.name}.lock"


def _holder(text: str) -> tuple[int | None, str]:
    """(pid, description) from a lock file's first line, ``pid command started``."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    pid_text, _, rest = first.partition(" ")
    try:
        return int(pid_text), rest
    except ValueError:
        return None, first


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


@contextlib.contextmanager
def output_lock(target: Path, *, command: str, is_folder: bool = True,
                on_stale: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Hold the lock for ``target`` for the ``with`` body; InputError if another run holds it.

    Never waits: a second writer is refused at once with the holder's pid and command.
    ``on_stale`` receives one line when a killed run's lock is taken over.
    """
    path = lock_path(Path(target), is_folder=is_folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise InputError(f"{target}: cannot create the output lock {path.name}: {error.strerror or error}") from None
    try:
        previous = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, what = _holder(previous)
            who = f"process {pid} ({what})" if pid is not None else "another process"
            raise InputError(f"{target} is in use by {who}; wait for it to finish or choose another output") from None
        pid, what = _holder(previous)
        if pid is not None and pid != os.getpid() and not _alive(pid) and on_stale is not None:
            on_stale(f"taking over a stale lock in {target} left by process {pid} ({what}), "
                     f"which is no longer running")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} tpusim {command}, started {stamp}\n".encode(), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)  # a clean finish leaves an empty file: only a killed run leaves a pid
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
