"""One predictor of a measured record (issue 47): every measured step the calibration predicts
reaches the engine through :func:`calibration.sources.predict.simulate_measured` (a
``Measurement`` through :class:`~calibration.sources.predict.Predictor`, a K3-shard kernel record
through :func:`calibration.sources.tpu_chip_records.simulate_record`, the fixed-cost probe's
capped runs too), read from the source with ``ast`` as tests/test_source_registry.py reads the
overlay writer. A second record predictor (its own engine call without the capacity check, its
own program of a kernel record, its own engine call in a calibration module) fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from calibration.sources.registry import published_records, published_sets
from calibration.sources.tpu7x_published import PUBLISHED_DATASETS, load_published
from hwmodels.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("hwmodels", "tpusim", "megakernel", "calibration", "benchmarks")
THE_PREDICTOR = "calibration/sources/predict.py:simulate_measured"
THE_RECORD_PROGRAM = "calibration/sources/tpu_chip_records.py:record_step"
ENGINE_MODULES = ("tpusim.engine", "tpusim.engine.core")
# calibration modules that price *published* GPU points (serving-stack sweeps, K3 on B300) with
# the engine directly, capacity checked: no measured kernel record, and none may be added
PUBLISHED_GPU_PRICERS = ("calibration/reports/gpu_batch.py", "calibration/sources/gpu_batch_mechanisms.py",
                         "calibration/sources/gpu_batch_speculative.py", "calibration/sources/gpu_batch_sweeps.py",
                         "calibration/sources/gpu_stack.py", "calibration/sources/k3_b300.py")


def _call_name(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def _scopes(tree: ast.Module) -> dict[ast.AST, str]:
    """Each node of ``tree`` -> the name of the innermost function holding it ('' at module level)."""
    owner: dict[ast.AST, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else name
            owner[child] = inner
            visit(child, inner)

    visit(tree, "")
    return owner


def record_doors(text: str, where: str) -> dict[str, list[str]]:
    """``where:function`` of every engine run that skips the capacity check (``check_capacity=False``:
    a measured step), every program built from a kernel record (``record_program(...)``) and every
    call of the engine's ``simulate`` imported from :mod:`tpusim.engine`."""
    tree = ast.parse(text)
    owner = _scopes(tree)
    engine_names = {alias.asname or alias.name for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module in ENGINE_MODULES
                    for alias in node.names if alias.name == "simulate"}
    found: dict[str, list[str]] = {"unchecked": [], "record_program": [], "engine": []}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        at = f"{where}:{owner.get(node, '')}"
        if any(k.arg == "check_capacity" and isinstance(k.value, ast.Constant) and k.value.value is False
               for k in node.keywords):
            found["unchecked"].append(at)
        if _call_name(node) == "record_program":
            found["record_program"].append(at)
        if isinstance(node.func, ast.Name) and node.func.id in engine_names:
            found["engine"].append(at)
    return found


def _all_doors() -> dict[str, list[str]]:
    doors: dict[str, list[str]] = {"unchecked": [], "record_program": [], "engine": []}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for kind, found in record_doors(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))).items():
                doors[kind] += found
    return doors


def test_one_predictor_of_a_measured_record() -> None:
    doors = _all_doors()
    assert doors["unchecked"] == [THE_PREDICTOR]
    assert doors["record_program"] == [THE_RECORD_PROGRAM]
    calibration = sorted({door.split(":")[0] for door in doors["engine"] if door.startswith("calibration/")})
    assert calibration == sorted([THE_PREDICTOR.split(":")[0], *PUBLISHED_GPU_PRICERS])
    assert [door for door in doors["engine"] if door.startswith("calibration/sources/predict.py")] == [THE_PREDICTOR]


def test_the_scan_sees_a_planted_predictor() -> None:
    planted = ("from tpusim.engine import simulate as run\n"
               "def predict_ms(record, chip):\n"
               "    program, schedule = record_program(record)\n"
               "    return run(program, schedule, chip, check_capacity=False).step_s * 1e3\n")
    assert record_doors(planted, "planted.py") == {"unchecked": ["planted.py:predict_ms"],
                                                   "record_program": ["planted.py:predict_ms"],
                                                   "engine": ["planted.py:predict_ms"]}


def test_published_sets_are_read_through_the_registry() -> None:
    assert published_sets() == tuple(f"published:{name}" for name in PUBLISHED_DATASETS)
    assert published_records("published:tpu7x-musespark") == load_published("tpu7x-musespark")
    with pytest.raises(InputError, match=r"unknown published dataset 'b200-vllm-qwen3\.5'; known: tpu7x-musespark$"):
        published_records("published:b200-vllm-qwen3.5")  # a per-stage split, not step-time records
