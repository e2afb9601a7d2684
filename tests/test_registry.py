"""The op registry is the one definition of every model's ops (tpusim.workload.registry).

1. No module outside the registry (and the tests) spells a registered op, role, tensor,
   family, format key, state buffer or collective name as a string literal: code names them
   through the typed members. Docstrings, f-string text and ``Literal[...]`` annotations
   are prose or types, not code paths, and are skipped.
2. The kernel's DMA plan and the simulator's program read one registry object: changing a
   block in the registry changes both, in the same place.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from megakernel import dma_plan
from tpusim.workload import registry
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program
from tpusim.workload.registry.block import OpSpec
from tpusim.workload.registry.names import VOCABULARIES, MlaOp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tpusim", "megakernel", "calibration", "hwmodels", "benchmarks")
REGISTRY = ROOT / "tpusim" / "workload" / "registry"
# Registered words that are also ordinary words elsewhere (a phase, a layer kind, a JSON key).
ORDINARY_WORDS = {"attention", "dense", "embedding", "kv"}


def registered_names() -> set[str]:
    return {member.value for vocabulary in VOCABULARIES for member in vocabulary} - ORDINARY_WORDS


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """Docstrings, the literal text of f-strings and Literal[...] annotations."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skipped.add(id(first.value))
        elif isinstance(node, ast.JoinedStr):
            skipped.update(id(value) for value in node.values if isinstance(value, ast.Constant))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
            skipped.update(id(sub) for sub in ast.walk(node.slice))
    return skipped


def name_literals(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, value) of every string literal in ``source`` that is a registered name."""
    tree = ast.parse(source)
    skipped = _skipped_nodes(tree)
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value in names and id(node) not in skipped)


def test_no_registered_name_is_spelt_as_a_string_literal_outside_the_registry() -> None:
    names = registered_names()
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if REGISTRY in path.parents:
                continue
            found += [f"{path.relative_to(ROOT)}:{line}: {value!r}"
                      for line, value in name_literals(path.read_text(), names)]
    assert not found, "name these through tpusim.workload.registry.names:\n" + "\n".join(found)


def test_the_literal_check_finds_a_planted_name() -> None:
    source = '"""Docstring mentioning moe.topk is prose."""\nx = f"moe.topk"\nif op.role == "moe.topk":\n    pass\n'
    assert name_literals(source, registered_names()) == [(3, "moe.topk")]


def _kernel_layer_ops(kind: str) -> list[str]:
    return [op.name for op in dma_plan.attention_ops(kind, 1)]


def _program_layer_ops(model_name: str, layer: int) -> list[str]:
    model = load_model(model_name)
    program = build_program(model, plan_for(model, 1), batch=1)
    return [op.name for op in program.layers[layer].ops]


def test_kernel_windows_and_program_walk_the_same_op_sequence() -> None:
    """Every MoE layer of the K3-shaped mini model: the program's ops are the kernel's window
    ops for that layer (attention + MoE before experts, experts, after experts)."""
    model = load_model("kimi-k3-mini")
    program = build_program(model, plan_for(model, 1), batch=2)
    for layer in program.layers[1:]:
        kernel = [op.name for op in dma_plan.attention_ops(layer.attention_kind, 0) + dma_plan.moe_head_ops(0)
                  + dma_plan.expert_ops(layer.routed_experts) + dma_plan.moe_tail_ops(0)]
        assert [op.name for op in layer.ops] == kernel, layer.layer
    head = [op.name for op in program.head_ops]
    assert head == [op.name for op in dma_plan.head_ops(1)]


@pytest.mark.parametrize("position", [0, 5, 8])
def test_a_registry_change_reaches_program_and_kernel_alike(monkeypatch: pytest.MonkeyPatch, position: int) -> None:
    """Insert a probe op into the MLA block: the program of an MLA layer and the kernel's MLA
    window both run it, at the same place (they read one registry object)."""
    probe = OpSpec(MlaOp.CORE, unit="vpu", role="attn.probe")  # a second core pass, any role
    mla = registry.BLOCKS["mla"]
    ops = list(mla.ops)
    ops.insert(position, probe)
    monkeypatch.setitem(registry.BLOCKS, "mla", replace(mla, ops=tuple(ops)))
    kernel = _kernel_layer_ops("mla")
    model = load_model("kimi-k3-mini")
    layer = next(i for i in range(model.num_layers) if model.attention_kind(i) == "mla")
    program = _program_layer_ops("kimi-k3-mini", layer)[:len(kernel)]
    assert kernel == program
    assert kernel[position] == MlaOp.CORE and kernel.count(MlaOp.CORE) == 2


def test_expert_op_names_round_trip_through_the_registry() -> None:
    assert [registry.expert_index(registry.expert_op(j)) for j in (0, 3, 12)] == [0, 3, 12]
    assert registry.is_expert_op(registry.expert_op(7))
    assert not any(registry.is_expert_op(name) for name in (MlaOp.CORE, "expert", "expert.gate_up"))
