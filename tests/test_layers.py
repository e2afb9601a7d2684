"""The house reads top-down: imports point down the layers and never go round in a circle.

Layers, bottom to top: ``hwmodels`` → ``tpusim`` (its command line ``tpusim/app`` included)
→ ``megakernel`` → ``calibration``. Each layer owns its commands: ``megakernel/commands/``
and ``calibration/commands/`` register theirs (and the optional pieces a ``tpusim`` command
shows) as entry points that ``tpusim/app`` finds at run time (:mod:`tpusim.app.plugins`), so
no arrow runs back up. Inside ``tpusim/`` (docs/architecture.md): workload → schedule →
engine → report → sweep → compare → serving → app. Inside ``calibration/``: ``core`` and
``gpu_bench`` (the device harness) → ``sources`` → ``reports`` → ``commands``.
Every import counts, including those under ``if TYPE_CHECKING:`` and those inside functions
(they run, or they tie the modules together for a reader).
This walker is written here, independently of any tool, with the standard library only.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hwmodels", "tpusim", "megakernel", "calibration")
LAYER = {"hwmodels": 0, "tpusim": 1, "megakernel": 2, "calibration": 3}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[dotted.removesuffix(".__init__")] = path
    return found


def _layer(module: str) -> int:
    return LAYER[module.split(".")[0]]


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, bool]]:
    """(imported module, whether it runs at import time) for every import statement."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # Imports that do not run when the module is imported: inside functions, or typing-only.
    deferred = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                for n in ast.walk(f) if n is not f}
    deferred |= {id(n) for block in ast.walk(tree)
                 if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                 for statement in block.body for n in ast.walk(statement)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            target = _resolve(name, known)
            if target and target != module:
                found.append((target, id(node) not in deferred))
    return found


@functools.cache  # parsed once for the tests below (~2 s of CPU each time)
def _graph() -> tuple[dict[str, Path], dict[str, list[tuple[str, bool]]]]:
    known = _modules()
    return known, {module: _imports(module, path, known) for module, path in known.items()}


def _is_package_of(a: str, b: str) -> bool:
    """True when ``a`` is a package ``__init__`` that ``b`` lives in (a package re-exporting
    its own members is not an upward import)."""
    return b.startswith(a + ".")


def test_no_import_runs_up_the_layers() -> None:
    _, graph = _graph()
    upward = [f"{m} -> {t}" for m, targets in graph.items() for t, _ in targets
              if _layer(t) > _layer(m) and not _is_package_of(m, t)]
    assert upward == []


# Inside a package: the order of its sub-packages, bottom (0) to top. A module directly in the
# package (tpusim/__init__.py, calibration/__init__.py) is not ranked.
INNER = {
    "tpusim": {"workload": 0, "schedule": 1, "engine": 2, "report": 3, "sweep": 4, "compare": 5, "serving": 6,
               "app": 7, "__main__": 8},
    "calibration": {"core": 0, "gpu_bench": 0, "sources": 1, "reports": 2, "commands": 3},
}


def _inner(module: str) -> tuple[str, int] | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[0] not in INNER:
        return None
    rank = INNER[parts[0]].get(parts[1])
    return None if rank is None else (parts[0], rank)


def inner_upward(graph: dict[str, list[tuple[str, bool]]]) -> list[str]:
    """Imports from a lower sub-package of a package to a higher one, or across two of the same
    rank (``calibration.core`` and ``calibration.gpu_bench`` know nothing of each other)."""
    found = []
    for module, targets in graph.items():
        here = _inner(module)
        for target, _ in targets:
            there = _inner(target)
            if here is None or there is None or here[0] != there[0] or module.split(".")[1] == target.split(".")[1]:
                continue
            if there[1] >= here[1]:
                found.append(f"{module} -> {target}")
    return found


def test_packages_keep_their_inner_order() -> None:
    _, graph = _graph()
    assert inner_upward(graph) == []


def test_inner_order_check_fails_on_a_planted_upward_import() -> None:
    _, graph = _graph()
    planted = {**graph, "calibration.core.solver": [*graph["calibration.core.solver"],
                                                     ("calibration.sources.step_times", True)],
               "tpusim.engine.core": [*graph["tpusim.engine.core"], ("tpusim.serving.simulator", False)]}
    assert sorted(inner_upward(planted)) == ["calibration.core.solver -> calibration.sources.step_times",
                                     "tpusim.engine.core -> tpusim.serving.simulator"]


# What each lower layer must never import, by the first part of the module's name.
ABOVE = {"hwmodels": ("tpusim", "megakernel", "calibration"), "tpusim": ("megakernel", "calibration"),
         "megakernel": ("calibration",)}


def test_no_lower_layer_names_an_upper_one() -> None:
    """The plain statement of the rule, with no module graph: every ``import`` and ``from``
    statement anywhere in a file (inside functions and ``if TYPE_CHECKING:`` too) of
    ``hwmodels/``, ``tpusim/`` and ``megakernel/``, against the packages above it."""
    found = []
    for package, forbidden in ABOVE.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"
                          for name in names if name.split(".")[0] in forbidden]
    assert found == []


def test_commands_of_the_layers_above_are_entry_points() -> None:
    """``tpusim`` lists the commands of ``megakernel`` and ``calibration`` although it imports
    neither: they come from the ``tpusim.commands`` entry points (an installed project)."""
    from tpusim.app.cli import build_parser
    from tpusim.app.plugins import COMMANDS, load

    commands = load(COMMANDS)
    assert {name: f"{f.__module__}:{f.__name__}" for name, f in commands.items()} == {
        "calibrate": "calibration.commands.calibrate:register",
        "demo": "calibration.commands.demo:register",
        "lower": "megakernel.commands.lower:register",
        "report": "calibration.commands.calibrate:register_report",
        "run-kernel": "megakernel.commands.run_kernel:register",
    }
    assert set(commands) <= set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_circles() -> None:
    _, graph = _graph()
    edges = {m: {t for t, _ in targets if not _is_package_of(m, t)} for m, targets in graph.items()}
    assert _cycles(edges) == []


def test_cycle_finder_finds_a_planted_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_help_imports_neither_scipy_nor_jax() -> None:
    """``tpusim --help`` loads the commands of the layers above (their ``commands`` packages,
    through entry points) and nothing heavy of theirs."""
    code = ("import sys\nfrom tpusim.app.cli import build_parser\nbuild_parser().format_help()\n"
            "heavy = ('scipy', 'jax', 'jaxlib', 'calibration', 'megakernel', 'simpy', 'matplotlib')\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=ROOT).stdout.strip()
    light = {"calibration", "calibration.commands", "megakernel", "megakernel.commands"}
    assert [m for m in loaded.split(",") if m and m not in light
            and not m.startswith(("calibration.commands.", "megakernel.commands."))] == []
