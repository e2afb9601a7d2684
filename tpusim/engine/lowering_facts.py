"""What lowering needs from a program alone, worked out once per program.

A sweep lowers one program under many schedules, and a calibration under many chip
figures; these facts depend on neither, so :func:`lowering_facts` remembers them for as long
as the program lives (by identity; a calibration's residual walks a dozen programs in turn,
which a short LRU would forget one by one) and every lowering of the program reads them:

- each op's kind of lowering (:data:`EXPERT_OP`, :data:`ALIGNED_WEIGHT_OP`, :data:`WEIGHT_OP`,
  :data:`OTHER_OP`) and the dtype its matmuls run at;
- each op's weight tensors as small integers, one per distinct shape (name, family,
  format, rows, cols): a K3 step has ~2,400 tensor references but ~30 shapes, and the
  lowering's memos keyed on the integer skip hashing the tensor's enum-valued fields (an
  enum's hash is a Python call) on every reference;
- each routed expert op's copies (:func:`expert_layout`): labels and bytes, values then
  scales per tensor, and per tensor which of them a piece reading it waits for;
- per layer, its KDA recurrent-state bytes and KV-cache bytes per token;
- the execution policy's kernel plan of the program (:func:`kernel_plan`: one per policy's
  plan function, by identity).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from tpusim.engine.costs import op_matmul_dtype
from tpusim.engine.execution import KernelPlan
from tpusim.workload.program import Op, Program
from tpusim.workload.registry.names import Family
from tpusim.workload.shapes import TensorSpec, kv_cache_bytes_per_token, recurrent_state_bytes

ROUTED = Family.ROUTED_EXPERT
EXPERT_OP, ALIGNED_WEIGHT_OP, WEIGHT_OP, OTHER_OP = range(4)
KEPT_PROGRAMS = 4  # programs whose facts are remembered (a sweep plans one program)

# An expert op's copies as (label, bytes), and per tensor the positions of those it waits for
ExpertLayout = tuple[tuple[tuple[str, int], ...], tuple[tuple[int, ...], ...]]


def is_expert_op(op: Op) -> bool:
    tensors = op.tensors
    return bool(tensors) and tensors[0].family == ROUTED and all(t.family == ROUTED for t in tensors)


def is_aligned(op: Op) -> bool:
    """Whether a weight op's matmuls pair with its tensors (each contracts over one tensor's rows)."""
    return op.unit == "mxu" and len(op.matmuls) == len(op.tensors) and all(
        contraction == tensor.rows for tensor, (_m, contraction, _n) in zip(op.tensors, op.matmuls, strict=True))


@dataclass(frozen=True)
class LoweringFacts:
    """Per op of one program (indices of ``program.ops``); see the module docstring."""

    kinds: list[int]
    dtypes: list[str]
    tensor_shapes: list[tuple[int, ...]]  # per op: the shape number of each of its tensors
    shapes: list[TensorSpec]  # shape number -> the first tensor of that shape
    expert_layouts: dict[int, ExpertLayout]  # expert op index -> its copies (label suffix "")
    mispredicted_layouts: dict[int, ExpertLayout]  # the same, labelled ".mispredicted"
    # per layer, filled as lowerings ask (:meth:`state_bytes`, :meth:`kv_bytes_per_token`)
    _state_bytes: dict[int, int] = field(default_factory=dict, compare=False, repr=False)
    _kv_bytes: dict[int, int] = field(default_factory=dict, compare=False, repr=False)

    def state_bytes(self, program: Program, layer: int) -> int:
        """One sequence's KDA recurrent-state bytes in ``layer`` of ``program`` (these facts'
        program; 0: not a KDA layer)."""
        nbytes = self._state_bytes.get(layer)
        if nbytes is None:
            nbytes = self._state_bytes[layer] = recurrent_state_bytes(program.model, program.plan, layer)
        return nbytes

    def kv_bytes_per_token(self, program: Program, layer: int) -> int:
        """KV-cache bytes per token of one sequence in ``layer`` of ``program`` (these facts' program)."""
        nbytes = self._kv_bytes.get(layer)
        if nbytes is None:
            nbytes = self._kv_bytes[layer] = kv_cache_bytes_per_token(program.model, program.plan, layer)
        return nbytes


def expert_layout(tensors: tuple[TensorSpec, ...], label_suffix: str = "") -> ExpertLayout:
    """An expert op's copies as (label, bytes), values then scales per tensor, and per tensor
    the positions of the copies a piece reading it waits for (the copies named after it)."""
    copies: list[tuple[str, int]] = []
    for tensor in tensors:
        name = f"{tensor.name}{label_suffix}"
        values, scales = tensor.value_bytes, tensor.scale_bytes
        if values:
            copies.append((name, values))
        if scales:
            copies.append((f"{name}.scales", scales))
    by_tensor: dict[str, list[int]] = {}
    for position, (name, _bytes) in enumerate(copies):
        by_tensor.setdefault(name.removesuffix(".scales"), []).append(position)
    return tuple(copies), tuple(tuple(by_tensor.get(tensor.name, ())) for tensor in tensors)


def _facts(program: Program) -> LoweringFacts:
    ops = program.ops
    kinds = [EXPERT_OP if is_expert_op(op) else (ALIGNED_WEIGHT_OP if is_aligned(op) else WEIGHT_OP)
             if op.tensors else OTHER_OP for op in ops]
    numbers: dict[tuple[str, str, str, int, int], int] = {}
    shapes: list[TensorSpec] = []
    tensor_shapes: list[tuple[int, ...]] = []
    for op in ops:
        found = []
        for tensor in op.tensors:
            key = (tensor.name, tensor.family, tensor.format_name, tensor.rows, tensor.cols)
            number = numbers.get(key)
            if number is None:
                number = numbers[key] = len(shapes)
                shapes.append(tensor)
            found.append(number)
        tensor_shapes.append(tuple(found))
    layouts: dict[tuple[tuple[int, ...], str], ExpertLayout] = {}
    by_op: tuple[dict[int, ExpertLayout], dict[int, ExpertLayout]] = ({}, {})
    for index, kind in enumerate(kinds):
        if kind != EXPERT_OP:
            continue
        for suffix, out in zip(("", ".mispredicted"), by_op, strict=True):
            key = (tensor_shapes[index], suffix)
            layout = layouts.get(key)
            if layout is None:
                layout = layouts[key] = expert_layout(ops[index].tensors, suffix)
            out[index] = layout
    return LoweringFacts(kinds, [op_matmul_dtype(op) for op in ops], tensor_shapes, shapes, *by_op)


_FACTS: dict[int, LoweringFacts] = {}  # id(program) -> its facts, dropped when the program is collected


def lowering_facts(program: Program) -> LoweringFacts:
    """:class:`LoweringFacts` of ``program``, remembered while the program lives (by identity:
    the entry is removed by a finalizer when the program is collected, before its id can be
    reused, and holds no reference to the program)."""
    facts = _FACTS.get(id(program))
    if facts is None:
        facts = _FACTS[id(program)] = _facts(program)
        weakref.finalize(program, _FACTS.pop, id(program), None)
    return facts


_PLANS: list[tuple[Program, Callable[[Program], KernelPlan], KernelPlan]] = []


def kernel_plan(program: Program, plan_of: Callable[[Program], KernelPlan]) -> KernelPlan:
    """``plan_of(program)`` (an :class:`~tpusim.engine.execution.ExecutionPolicy`'s
    ``kernel_plan``, a pure function of the program), remembered for the last few (program,
    function) pairs, both by identity: the plan walks and checks every op."""
    for position, (known, known_of, plan) in enumerate(_PLANS):
        if known is program and known_of is plan_of:
            _PLANS.append(_PLANS.pop(position))
            return plan
    plan = plan_of(program)
    _PLANS.append((program, plan_of, plan))
    del _PLANS[:-KEPT_PROGRAMS]
    return plan
