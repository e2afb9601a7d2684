"""Facts and flags are written once: byte units, the lane width, the VMEM limit and the
command-line options every layer shares each have one owner, and every parser refuses
abbreviations. Read from the source with ``ast`` (nothing is imported but the owners)."""

from __future__ import annotations

import ast
import functools
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("hwmodels", "tpusim", "megakernel", "calibration", "benchmarks", "tests")

UNIT_OWNER = "hwmodels/units.py"
# The GPU harness imports of the house only the record layer (tests/test_gpu_bench.py): its one mirror.
UNIT_MIRROR = "calibration/gpu_bench/micro.py"
LANE_OWNER = "tpusim/schedule/kernel_layout.py"
OPTIONS_OWNER = "tpusim/cli_options.py"
# --seed is left out: beside the routing draw (add_routing_options) it seeds weights, arrivals and
# samples, a different meaning per command.
SHARED_FLAGS = ("--model", "--hardware", "--chips", "--batch", "--context", "--schedule", "--routing")


@functools.cache
def _trees() -> dict[str, ast.Module]:
    return {str(path.relative_to(ROOT)): ast.parse(path.read_text(encoding="utf-8"))
            for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))}


def _assigned(names: set[str], *, any_case: bool = True) -> list[str]:
    """``file:line NAME`` for every assignment to one of ``names`` (any scope; in any case
    unless ``any_case`` is False: a local ``lane`` index is not the lane width)."""
    found = []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name) and (name.id.upper() if any_case else name.id) in names:
                        found.append(f"{path}:{node.lineno} {name.id}")
    return found


def test_byte_units_have_one_owner() -> None:
    owners = {entry.partition(":")[0] for entry in _assigned({"KIB", "MIB", "GIB"})}
    assert owners == {UNIT_OWNER, UNIT_MIRROR}, sorted(owners)


def test_the_harness_mirror_agrees_with_the_owner() -> None:
    from calibration.gpu_bench import micro
    from hwmodels import units

    assert (micro.KIB, micro.MIB, micro.GIB) == (units.KIB, units.MIB, units.GIB) == (1 << 10, 1 << 20, 1 << 30)


def test_the_lane_width_has_one_owner() -> None:
    assert [entry.partition(":")[0] for entry in _assigned({"LANE", "LANES"}, any_case=False)] == [LANE_OWNER]


def test_lanes_are_imported_from_their_owner() -> None:
    """No second door: ``LANES`` is imported from the owner, never re-exported by another module."""
    owner = LANE_OWNER.removesuffix(".py").replace("/", ".")
    elsewhere = [f"{path}:{node.lineno} from {node.module}" for path, tree in _trees().items()
                 for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and any(alias.name == "LANES" for alias in node.names) and node.module != owner]
    assert elsewhere == []


def test_the_vmem_limit_comes_from_the_catalog() -> None:
    """No VMEM figure is written in the kernel's code: the limit is the catalog's (the chip's, or
    the published kernel's chip's where none is named)."""
    written = [entry for entry in _assigned({"DEFAULT_VMEM_LIMIT_BYTES", "VMEM_LIMIT_BYTES"})
               if entry.startswith("megakernel/")]
    assert written == []
    from hwmodels.catalog import load_chip
    from megakernel.vmem_limit import PUBLISHED_KERNEL_CHIP, vmem_limit_for

    catalog = load_chip(PUBLISHED_KERNEL_CHIP).memory("vmem").capacity_bytes.value
    assert vmem_limit_for(PUBLISHED_KERNEL_CHIP) == catalog


def _calls(name: str) -> list[tuple[str, ast.Call]]:
    return [(path, node) for path, tree in _trees().items() if not path.startswith("tests/")
            for node in ast.walk(tree) if isinstance(node, ast.Call)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)) == name]


def _refuses_abbreviations(call: ast.Call) -> bool:
    return any(k.arg == "allow_abbrev" and isinstance(k.value, ast.Constant) and k.value.value is False
               for k in call.keywords)


def _subcommand_files() -> tuple[str, ...]:
    """Where ``tpusim``'s commands live: its own (``tpusim/app/``), and the modules the layers
    above register through entry points (``tpusim.commands``, :mod:`tpusim.app.plugins`); all are
    built by add_subparsers from tpusim's Parser. The kernel's standalone ``python -m`` tools
    beside them (``megakernel/commands/``) build their own parsers and are held to the rule."""
    entries = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["tpusim.commands"]
    return ("tpusim/app/", *sorted({value.split(":")[0].replace(".", "/") + ".py" for value in entries.values()}))


def test_every_parser_refuses_abbreviations() -> None:
    """Outside ``tpusim``'s commands every ArgumentParser (and subparser) says allow_abbrev=False;
    inside them, the Parser class says so for all (tests/test_cli_refusals.py checks the instances)."""
    commands = _subcommand_files()
    assert "megakernel/commands/run_kernel.py" in commands and "calibration/commands/calibrate.py" in commands
    parsers = _calls("ArgumentParser") + _calls("add_parser")
    assert len(parsers) > 30  # the scan sees the tools, not nothing
    missing = [f"{path}:{call.lineno}" for path, call in parsers
               if not path.startswith(commands) and not _refuses_abbreviations(call)]
    assert missing == []
    direct = [f"{path}:{call.lineno}" for path, call in _calls("ArgumentParser") if path.startswith(commands)]
    assert direct == []  # tpusim's commands are built by add_subparsers from its Parser


def test_shared_options_are_defined_once() -> None:
    defined: dict[str, list[str]] = {flag: [] for flag in SHARED_FLAGS}
    for path, call in _calls("add_argument"):
        if call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value in defined:
            defined[call.args[0].value].append(f"{path}:{call.lineno}")
    assert {flag: [site.partition(":")[0] for site in sites] for flag, sites in defined.items()} == \
        {flag: [OPTIONS_OWNER] for flag in SHARED_FLAGS}


APPEND_OWNER = "hwmodels/atomic.py"  # one O_APPEND write (+ fsync): opening for append, here only
# The sweep's outputs append CSV rows (tpusim/sweep/outputs.py), not records.
APPEND_MIRRORS = {"tpusim/sweep/outputs.py"}
# Every JSON-lines file (records, measurements, the GPU harness's output, Optuna's journal)
# is written by the record layer's one writer, the only caller of the appending primitives.
JSONL_OWNER = "hwmodels/records/jsonl.py"
APPEND_PRIMITIVES = {"append_bytes", "open_for_append"}


def _opens_for_append(node: ast.AST) -> bool:
    """``open(..., "a")`` / ``path.open("a")`` / ``os.open(..., O_APPEND ...)``."""
    if not isinstance(node, ast.Call):
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    if name != "open":
        return False
    args = [*node.args, *(k.value for k in node.keywords if k.arg == "mode")]
    return any(isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("a") for a in args) \
        or any(isinstance(n, ast.Attribute) and n.attr == "O_APPEND" for a in node.args for n in ast.walk(a))


def test_one_jsonl_appender() -> None:
    writers = sorted({path for path, tree in _trees().items() for node in ast.walk(tree)
                      if _opens_for_append(node) and not path.startswith("tests/")})
    assert writers == sorted({APPEND_OWNER, *APPEND_MIRRORS}), writers


def _called_name(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def _json_line(node: ast.AST) -> bool:
    """``json.dumps(x) + "\\n"`` (no ``indent``: a line, not a JSON document)."""
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)
            and isinstance(node.right, ast.Constant) and node.right.value == "\n"
            and isinstance(node.left, ast.Call) and _called_name(node.left) == "dumps"
            and not any(k.arg == "indent" for k in node.left.keywords))


def _to_stdout(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether ``node`` sits inside ``sys.stdout.write(...)`` or ``print(...)`` (a tool's
    output stream, not a record file)."""
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, ast.Call) and (ast.unparse(node.func) in ("sys.stdout.write", "print")):
            return True
    return False


def test_one_jsonl_writer() -> None:
    """Only the record layer's writer calls the appending primitives or builds JSON lines for
    a file; everything else goes through it (hwmodels.records.jsonl)."""
    appenders, line_builders = set(), set()
    for path, tree in _trees().items():
        if path.startswith("tests/") or path in (APPEND_OWNER, JSONL_OWNER):
            continue
        parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _called_name(node) in APPEND_PRIMITIVES:
                appenders.add(f"{path}:{node.lineno}")
            if _json_line(node) and not _to_stdout(node, parents):
                line_builders.add(f"{path}:{node.lineno}")
    assert sorted(appenders) == [] and sorted(line_builders) == []
