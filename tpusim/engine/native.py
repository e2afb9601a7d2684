"""Which engine runs: the compiled accelerator, or the interpreted modules (issue 49).

The event loop's hot modules (:data:`ENGINE_MODULES`) are plain Python, the source and the
reference. The install (``pip install -e .``; ``setup.py``) also compiles them with Cython
into extension modules beside them, which Python's import prefers; their results are the
same to the bit (``tests/test_engine_compiled.py``). :func:`choose` runs before any of them is
imported (first thing in :mod:`tpusim.engine`) and decides:

1. ``TPUSIM_ENGINE=interpreted`` in the environment: the interpreted engine, always;
2. no compiled module, or not all of them (no compiler or no Cython at install time, or a
   module that failed to compile, which the install said): the interpreted engine, silently
   (it is complete on its own);
3. a compiled module whose ``.py`` or ``.pxd`` changed after it was built (the sha256 the
   build recorded in ``_compiled.json`` differs): the interpreted engine, with one line on
   stderr saying to reinstall. A stale build is never used: it would run old code;
4. otherwise the compiled one.

The interpreted engine is loaded by putting each module's ``.py`` into ``sys.modules``
(:mod:`importlib`) before anything imports it, all of them or none: compiled modules declare
their classes' fields for one another (the ``.pxd`` files), so they are not mixed with
interpreted ones. :data:`ENGINE` says which runs (``bench_engine.py`` prints
:func:`description`).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

# the compiled modules, in an order each imports only earlier ones (setup.py reads this list)
ENGINE_MODULES = ("items", "loop", "hbm", "staging", "collectives", "lowering", "build", "stream")
PACKAGE = "tpusim.engine"
HERE = Path(__file__).resolve().parent
RECORD = HERE / "_compiled.json"
ENV_VAR = "TPUSIM_ENGINE"

ENGINE = "interpreted"  # or "compiled": set by choose()
REASON = ""  # why, in a few words
CYTHON_VERSION = ""


def _hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _compiled_state() -> tuple[str, str]:
    """("compiled" | "absent" | "partial" | "stale", detail) from the build's record and the
    sources (nothing is imported)."""
    # the file this interpreter would import for each module (its first extension suffix found)
    loaded: dict[str, str] = {}
    for module in ENGINE_MODULES:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if (HERE / f"{module}{suffix}").exists():
                loaded[module] = f"{module}{suffix}"
                break
    built = list(loaded)
    if not built:
        return "absent", "no compiled build"
    if len(built) < len(ENGINE_MODULES):  # a module failed to compile (the install said so)
        missing = ", ".join(module for module in ENGINE_MODULES if module not in built)
        return "partial", f"a partial build: {missing} not compiled"
    try:
        record = json.loads(RECORD.read_text())
        modules = record["modules"]
    except (OSError, ValueError, KeyError, TypeError):
        return "stale", f"{RECORD.name} is missing or unreadable"
    for module in ENGINE_MODULES:
        entry = modules.get(module)
        if entry is None or entry.get("file") != loaded[module]:  # (another Python's build, say)
            return "stale", f"{loaded[module]} is not in {RECORD.name}"
        for suffix in (".py", ".pxd"):
            path = HERE / f"{module}{suffix}"
            now = _hash(path) if path.exists() else None
            if now != entry.get(suffix):
                return "stale", f"{module}{suffix} changed after it was compiled"
    global CYTHON_VERSION
    CYTHON_VERSION = str(record.get("cython", ""))
    return "compiled", f"Cython {CYTHON_VERSION}" if CYTHON_VERSION else "compiled"


def _load_interpreted() -> None:
    """Import every engine module from its ``.py`` (before anything imports the compiled one)."""
    package = sys.modules[PACKAGE]
    for module in ENGINE_MODULES:
        name = f"{PACKAGE}.{module}"
        if name in sys.modules:
            continue
        loader = importlib.machinery.SourceFileLoader(name, str(HERE / f"{module}.py"))
        spec = importlib.util.spec_from_loader(name, loader)
        assert spec is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        try:
            loader.exec_module(loaded)
        except BaseException:
            del sys.modules[name]
            raise
        setattr(package, module, loaded)


def choose() -> str:
    """Decide which engine runs (module docstring) and load the interpreted one if so."""
    global ENGINE, REASON
    state, detail = _compiled_state()
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced == "interpreted":
        ENGINE, REASON = "interpreted", f"{ENV_VAR}=interpreted"
    elif state == "compiled":
        ENGINE, REASON = "compiled", detail
        return ENGINE
    else:
        ENGINE, REASON = "interpreted", detail
        if state == "stale":
            sys.stderr.write(f"tpusim: the compiled engine is out of date ({detail}); running the "
                             "interpreted engine: reinstall (pip install -e .) to rebuild it\n")
    if state != "absent":
        _load_interpreted()
    return ENGINE


def description() -> str:
    """One line: which engine runs and why (``engine: compiled (Cython 3.3.2)``)."""
    return f"engine: {ENGINE} ({REASON})"
