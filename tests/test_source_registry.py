"""The one door for a calibration source (issue 47): every source is registered once
(:mod:`calibration.sources.registry`), ``tpusim calibrate`` picks and runs it through the
registry, and every overlay is built and written by :mod:`calibration.core.overlay_builder`
alone (read from the source with ``ast``, as tests/test_single_source.py reads the JSONL writer)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from calibration.core.overlay_builder import (
    build_overlay,
    fitted_figure,
    model_error_term,
    write_overlay,
)
from calibration.sources.registry import SOURCES, Request, recognise, source
from hwmodels.overlay import CalibratedValue, CalibrationOverlay, ModelErrorTerm, load_overlay

ROOT = Path(__file__).resolve().parents[1]
BUILDER = "calibration/core/overlay_builder.py"
OVERLAY_TYPE_OWNER = "hwmodels/overlay.py"
FOLDERS = ("hwmodels", "tpusim", "megakernel", "calibration", "benchmarks")
HOOKS = ("load", "fit", "overlay", "command")


def test_every_hook_resolves() -> None:
    for entry in SOURCES:
        for which in HOOKS:
            if getattr(entry, which) is not None:
                assert callable(entry.hook(which)), (entry.name, which)
        assert entry.command is not None or entry.tool, f"{entry.name}: neither a calibrate runner nor a tool"


def test_every_source_named_by_the_issue_is_registered() -> None:
    names = {entry.name for entry in SOURCES}
    assert names >= {"end to end", "part by part", "gpu stack", "gpu k3 stack", "gpu micro", "gpu batch sweeps",
                     "tpu v5e probes", "tpu kernel records", "tpu v5e fixed cost", "compiler static schedule",
                     "cpu loop"}
    with pytest.raises(KeyError, match="no calibration source 'nope'"):
        source("nope")


@pytest.mark.parametrize(("kind", "spec", "flags", "expected"), [
    ("tpu", "records.jsonl", {"kernel_records": True}, "tpu kernel records"),
    ("gpu", "records.jsonl", {"kernel_records": True}, "end to end"),  # kernel records calibrate a TPU only
    ("cpu", "cpu-loop", {}, "cpu loop"),
    ("cpu", "cpu-loop-quick", {}, "cpu loop"),
    ("gpu", "published:b200-vllm-qwen3.5", {}, "gpu stack"),
    ("tpu", "published:b200-vllm-qwen3.5", {}, "end to end"),
    ("gpu", "published:b300-sglang-k3", {}, "gpu k3 stack"),
    ("gpu", "h200.jsonl", {"micro_set": True}, "gpu micro"),
    ("tpu", "published:tpu7x-musespark", {"has_components": True}, "part by part"),
    ("tpu", "published:tpu7x-musespark", {"has_components": True, "parameters_given": True}, "end to end"),
    ("tpu", "published:tpu7x-musespark", {}, "end to end"),
])
def test_the_registry_picks_the_procedure(kind: str, spec: str, flags: dict[str, bool], expected: str) -> None:
    chip = SimpleNamespace(kind=kind, name=f"some-{kind}")
    picked = recognise(Request(chip, spec, **flags))  # type: ignore[arg-type]
    assert picked.name == expected
    assert picked.command is not None  # what `tpusim calibrate` recognises, it can run


def _overlay_doors(text: str, where: str) -> list[str]:
    """``where:line`` of every ``CalibrationOverlay(...)`` built and every ``save_overlay(...)`` call."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("CalibrationOverlay", "save_overlay"):
                found.append(f"{where}:{node.lineno} {name}")
    return found


def test_one_overlay_builder_and_one_writer() -> None:
    doors = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            if where not in (BUILDER, OVERLAY_TYPE_OWNER):
                doors[where] = _overlay_doors(path.read_text(encoding="utf-8"), where)
    assert [door for found in doors.values() for door in found] == []
    builder = _overlay_doors((ROOT / BUILDER).read_text(encoding="utf-8"), BUILDER)
    assert [door.split()[-1] for door in builder] == ["CalibrationOverlay", "save_overlay"]


def test_the_scan_sees_a_planted_door() -> None:
    planted = "from hwmodels.overlay import save_overlay\nsave_overlay(CalibrationOverlay(chip='x'))\n"
    assert sorted(_overlay_doors(planted, "planted.py")) == ["planted.py:2 CalibrationOverlay",
                                                              "planted.py:2 save_overlay"]


def _overlay_functions() -> set[str]:
    """``module:function`` (or ``module:Class.method``) of every function of calibration/sources
    that returns overlays."""
    out = set()
    for path in sorted((ROOT / "calibration" / "sources").glob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        scopes = [("", tree.body)] + [(f"{n.name}.", n.body) for n in tree.body if isinstance(n, ast.ClassDef)]
        for prefix, body in scopes:
            for node in body:
                if isinstance(node, ast.FunctionDef) and node.returns is not None \
                        and "CalibrationOverlay" in ast.unparse(node.returns):
                    out.add(f"{module}:{prefix}{node.name}")
    return out


def test_every_overlay_of_a_source_is_registered() -> None:
    """Adding a source that makes an overlay means registering it (calibration/README.md)."""
    registered = {entry.overlay for entry in SOURCES if entry.overlay is not None}
    found = _overlay_functions()
    assert len(found) >= 6
    assert found <= registered, sorted(found - registered)


def test_the_builder_and_the_writer(tmp_path: Path) -> None:
    error = SimpleNamespace(in_range_rel=0.1, extrapolated_rel=0.2, method="m", points=5, exact=False)
    overlay = build_overlay("tpu-v5e", "probes", {"dma.issue_latency_s": fitted_figure(1e-6, 1e-8, "probe"),
                                                  "execution.per_step_overhead_s": CalibratedValue(value=2e-5)},
                            model_error=error, measurements="probes.jsonl")
    assert overlay.parameters == {"dma.issue_latency_s": CalibratedValue(value=1e-6, uncertainty=1e-8,
                                                                         fitted_on="probe"),
                                  "execution.per_step_overhead_s": CalibratedValue(value=2e-5)}
    term = ModelErrorTerm(in_range_rel=0.1, extrapolated_rel=0.2, method="m", points=5, exact=False)
    assert overlay.model_error == term == model_error_term(dict(vars(error))) == model_error_term(term)
    assert model_error_term(None) is None
    plain = CalibrationOverlay(chip="tpu-v5e", fitted_on="probes", parameters=overlay.parameters, model_error=term,
                               measurements="probes.jsonl", created=overlay.created)
    assert overlay == plain  # the builder adds nothing a direct construction would not have
    path = write_overlay(overlay, tmp_path / "tpu-v5e.yaml", provenance={"errors": {"mape_before": 0.5}})
    assert load_overlay(path) == overlay.model_copy(update={"errors": {"mape_before": 0.5}})
