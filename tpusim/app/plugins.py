"""What the layers above ``tpusim`` add to its command line, found through entry points.

The house reads top-down (hwmodels → tpusim → megakernel → calibration): ``tpusim/app`` is
the ground floor's application layer and names no module above it. The upper layers own
their commands (``megakernel/commands/``, ``calibration/commands/``) and declare them, with
the optional pieces a ``tpusim`` command shows when they are installed, as entry points in
``pyproject.toml``; :func:`load` finds them with :func:`importlib.metadata.entry_points`, as
pytest and flake8 find their plugins. The groups:

``tpusim.commands``
    ``NAME = "module:register"``: ``register(subparsers)`` adds the subcommand ``NAME``
    (``run-kernel``, ``lower``, ``calibrate``, ``report``, ``demo``).
``tpusim.schemas``
    ``TOPIC = "module:function"``: ``function()`` returns the :class:`tpusim.app.schemas.Topic`
    of a file format ``tpusim schema TOPIC`` prints (``measurement``).
``tpusim.compare_notes``
    ``NAME = "module:function"``: ``function(args, systems, batches)`` returns lines printed
    under ``tpusim compare``'s table (the compiler-priced TPU v7 row).
``tpusim.compile_checks``
    ``NAME = "module:function"``: ``function(args, system, plan, compiles)`` checks that
    ``tpusim sweep --compile-check`` can run here (an InputError otherwise) and returns the
    acceptor the sweep calls per row (Mosaic's compile).

A group's entries are loaded when a command needs them (``tpusim --help`` loads the
commands only; their modules import their heavy parts inside functions). An entry point that
fails to load is a :class:`PluginError` naming it, the group and the cause.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

COMMANDS = "tpusim.commands"
SCHEMAS = "tpusim.schemas"
COMPARE_NOTES = "tpusim.compare_notes"
COMPILE_CHECKS = "tpusim.compile_checks"

# The project declares its entry points in pyproject.toml; an environment installed before a
# change there keeps the old metadata until it is installed again.
REINSTALL = "reinstall the project (pip install -e .) so its entry points are current"


class PluginError(Exception):
    """An entry point of one of the groups above that could not be loaded (an installation
    problem, not the user's input: the CLI prints it as one line and exits 1)."""


def _where(entry: EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    origin = f" of {dist.name}" if dist is not None else ""
    return f"entry point {entry.name} = {entry.value!r} (group {entry.group}{origin})"


def load(group: str) -> dict[str, Any]:
    """Every entry point of ``group``, loaded: name -> object, sorted by name (the metadata's
    order is the installer's). Two entries of one name, or one that fails to import, raise
    :class:`PluginError`."""
    found: dict[str, Any] = {}
    for entry in sorted(entry_points(group=group), key=lambda e: (e.name, e.value)):
        if entry.name in found:
            raise PluginError(f"two entry points named {entry.name} in group {group}; {REINSTALL}")
        try:
            found[entry.name] = entry.load()
        except Exception as error:  # any import failure: say which entry point, then why
            raise PluginError(f"{_where(entry)} failed to load: {type(error).__name__}: {error}; "
                              f"{REINSTALL}") from error
    return found
