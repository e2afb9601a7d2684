"""The engine's optional compiled accelerator (issue 49); everything else is in pyproject.toml.

The event loop's hot modules (:data:`ENGINE_MODULES`, in ``tpusim/engine``) are plain Python
and stay the source and the reference: here Cython compiles the same ``.py`` files, with the
type declarations of the ``.pxd`` file beside each one where there is one (Cython's
"augmenting .pxd"), into extension modules that ``import tpusim.engine`` prefers. Both give
the same floats: C doubles are IEEE doubles, the operations and their order are those of the
source, and the C compiler is told not to contract ``a * b + c`` into a fused multiply-add
(``-ffp-contract=off``; no ``-ffast-math``).

Optional: without a C compiler, or where Cython is missing (a build without the build
requirements), or if a module fails to compile, the install goes on and the engine runs
interpreted. Each built module's source hashes are written to ``tpusim/engine/_compiled.json``
beside it; :mod:`tpusim.engine.native` refuses a build whose ``.py`` or ``.pxd`` has changed
since (reinstall to rebuild), and ``TPUSIM_ENGINE=interpreted`` forces the interpreted engine.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
ENGINE = "tpusim/engine"


def _native() -> object:
    """:mod:`tpusim.engine.native` loaded from its file alone (standard library only; importing
    the package would need its dependencies, which the isolated build does not have): the one
    owner of the module list and the record's name."""
    spec = importlib.util.spec_from_file_location("_tpusim_engine_native", ROOT / ENGINE / "native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_NATIVE = _native()
ENGINE_MODULES: tuple[str, ...] = _NATIVE.ENGINE_MODULES  # type: ignore[attr-defined]
RECORD: str = _NATIVE.RECORD.name  # type: ignore[attr-defined]


def source_hashes(module: str) -> dict[str, str]:
    """sha256 of the module's ``.py`` and, where there is one, its ``.pxd``."""
    out = {}
    for suffix in (".py", ".pxd"):
        path = ROOT / ENGINE / f"{module}{suffix}"
        if path.exists():
            out[suffix] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


class OptionalBuildExt(build_ext):
    """``build_ext`` that never fails the install, and records what it built."""

    def run(self) -> None:
        self.failed: set[str] = set()
        try:
            super().run()
        except Exception as error:  # (no compiler at all: the interpreted engine)
            self._skip(f"the compiled engine was not built ({error}); the engine runs interpreted")
        self._record()

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as error:
            self._skip(f"{ext.name} was not compiled ({error}); the engine runs interpreted")
            self.failed.add(ext.name)

    def _skip(self, line: str) -> None:
        sys.stderr.write(f"tpusim: {line}\n")

    def _record(self) -> None:
        """Write ``_compiled.json`` beside the built modules: module -> its source hashes."""
        built: dict[str, object] = {}
        folder: Path | None = None
        for ext in self.extensions:
            module = ext.name.rsplit(".", 1)[1]
            path = Path(self.get_ext_fullpath(ext.name))
            folder = path.parent
            if not path.exists():
                continue
            if ext.name in self.failed:  # an earlier build's module, left in place: remove it
                path.unlink()
                continue
            # built (or found up to date) from the sources as they are now: not older than them
            sources = [ROOT / ENGINE / f"{module}{suffix}" for suffix in (".py", ".pxd")]
            if path.stat().st_mtime >= max(source.stat().st_mtime for source in sources if source.exists()):
                built[module] = {"file": path.name, **source_hashes(module)}
        if folder is None:
            return
        record = folder / RECORD
        if built:
            import Cython

            folder.mkdir(parents=True, exist_ok=True)
            partial = record.with_name(record.name + ".tmp")  # written whole, then renamed into place
            partial.write_text(json.dumps({"cython": Cython.__version__, "modules": built}, indent=1) + "\n")
            os.replace(partial, record)
        elif record.exists():
            record.unlink()


def engine_extensions() -> list[Extension]:
    if os.environ.get("TPUSIM_ENGINE") == "interpreted":  # also skips the build
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        sys.stderr.write("tpusim: Cython is not installed; the engine runs interpreted\n")
        return []
    flags = [] if sys.platform == "win32" else ["-ffp-contract=off"]
    extensions = [
        Extension(f"tpusim.engine.{module}", [f"{ENGINE}/{module}.py"], extra_compile_args=flags,
                  optional=True)
        for module in ENGINE_MODULES
    ]
    try:
        # annotation_typing off: the .py files' annotations are for readers and type checkers
        # (a ``str`` parameter takes a str subclass there); the C types are in the .pxd files
        return cythonize(extensions, language_level=3, quiet=True,
                         compiler_directives={"annotation_typing": False})
    except Exception as error:
        sys.stderr.write(f"tpusim: Cython failed ({error}); the engine runs interpreted\n")
        return []


setup(ext_modules=engine_extensions(), cmdclass={"build_ext": OptionalBuildExt})
