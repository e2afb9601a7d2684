"""A lowered step priced again for other compute figures: the same copies, slabs and pieces, new times.

Lowering (:mod:`tpusim.engine.build`) turns a program and a schedule into structure (the
copies, the slabs, the pools and rings, each op's pieces and what each piece waits for,
frees and releases) and prices each piece from the chip's compute figures (the matrix and
vector units), each op's launches from the policy, and the collectives from the links.
The structure depends on neither those figures nor the per-step and per-layer costs (read
only by the run), so a calibration's next point — the end-to-end TPU fit moves the MXU's
weight push and the per-layer cost, the links stage the links — need not build it again:
:func:`reprice` walks the ops as :func:`~tpusim.engine.build.lower` does, asks a
:class:`~tpusim.engine.lowering.Builder` on the new chip the same questions (its memos are
the lowering's own formulas: :meth:`~tpusim.engine.lowering.Builder.slab_parts`,
:meth:`~tpusim.engine.lowering.Builder.expert_parts`, ...) and writes the answers into the
kept step's pieces in place. ``tests/test_engine_reprice.py`` checks a repriced step
against a fresh lowering, piece by piece and result by result, exactly.

Where another figure would change the structure itself (a time that becomes zero or
nonzero adds or drops a piece: a conversion, a trailing vector piece), the op's sequence of
units differs and :func:`reprice` declines, changing nothing; the step is then lowered
afresh. It also declines a ``during_selection`` step (the top-k's vector piece is cut
into the winners' shares after lowering: :mod:`tpusim.engine.expert_release`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hwmodels.schema import Chip, LinkSpec
from tpusim.engine.build import Lowered, _program_collectives, kv_tile_prices
from tpusim.engine.execution import ExecutionPolicy
from tpusim.engine.items import MXU, VPU, Piece
from tpusim.engine.lowering import Builder
from tpusim.engine.lowering_facts import ALIGNED_WEIGHT_OP, EXPERT_OP, WEIGHT_OP
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import VmemPlan
from tpusim.workload.program import Op, Program

new_piece = tuple.__new__  # Piece without its Python-level __new__ (as tpusim.engine.build)


def repriceable(schedule: Schedule, policy: ExecutionPolicy) -> bool:
    """Whether a step of ``schedule`` under ``policy`` can be repriced (module docstring): not
    with a collective pricer (it prices from the whole chip, the store's key then), nor where
    the top-k's pieces are cut after lowering."""
    return policy.collective_pricer is None and not (
        policy.cross_op_prefetch and schedule.expert_issue == "during_selection")


@dataclass(eq=False)
class StepPrices:
    """What repricing one lowered step reads each time (:func:`step_prices`): its ops in classes
    of equal pricing (every input of an op's times equal: the same few op kinds repeat in every
    layer), each class's units and current times, and the figures its collectives and launches
    were priced with."""

    members: list[list[int]]  # per class, its ops (indices)
    units: list[tuple[int, ...]]  # per class, its pieces' units
    seconds: list[tuple[float, ...]]  # per class, its pieces' times as the step now holds them
    links: list[LinkSpec]  # the chip links the step's collectives were priced on
    launch_s: float  # the policy's launch cost its ops' launches were priced at
    fixed_s: tuple[float, ...] | None  # the kernels' fixed times its ops hold


def step_prices(lowered: Lowered, program: Program, schedule: Schedule, chip: Chip, policy: ExecutionPolicy,
                vmem: VmemPlan) -> StepPrices:
    """``lowered``'s :class:`StepPrices` (lowered on ``chip`` under ``policy``)."""
    b = Builder(program, schedule, chip, policy, vmem)
    facts = b.facts
    classes: dict[tuple[object, ...], int] = {}
    members: list[list[int]] = []
    units: list[tuple[int, ...]] = []
    seconds: list[tuple[float, ...]] = []
    for index, (op, plan_) in enumerate(zip(program.ops, lowered.ops, strict=True)):
        kind = facts.kinds[index]
        branch = per_token = 0
        if kind > WEIGHT_OP and op.kv_read_bytes:
            if b.recurrent_state_bytes(op.layer):
                branch = 1
            else:
                branch = 2
                per_token = facts.kv_bytes_per_token(program, op.layer) * program.kv_sequences
        held = tuple([piece[1] for piece in plan_.pieces])
        key = (kind, branch, facts.tensor_shapes[index], op.matmuls, facts.dtypes[index], op.vector_flops, op.unit,
               op.kv_read_bytes if branch else 0, per_token, held)
        number = classes.get(key)
        if number is None:
            number = classes[key] = len(members)
            members.append([])
            units.append(held)
            seconds.append(tuple([piece[0] for piece in plan_.pieces]))
        members[number].append(index)
    fixed_s = b.kernels.fixed_s
    return StepPrices(members, units, seconds, chip.links, policy.launch_overhead_s,
                      tuple(fixed_s) if fixed_s else None)


def reprice(lowered: Lowered, prices: StepPrices, program: Program, schedule: Schedule, chip: Chip,
            policy: ExecutionPolicy, vmem: VmemPlan) -> bool:
    """Price ``lowered`` (whose :class:`StepPrices` is ``prices``, lowered from ``program`` under
    ``schedule`` on a chip and policy of the same structure) for ``chip`` and ``policy``, in
    place, and ``prices`` with it; False (nothing changed) where the pieces' structure would
    differ (module docstring)."""
    if not repriceable(schedule, policy):
        return False
    b = Builder(program, schedule, chip, policy, vmem)
    ops = program.ops
    new: list[tuple[float, ...]] = []
    for number, members in enumerate(prices.members):
        index = members[0]
        times = _op_times(b, program, index, ops[index])
        if tuple([unit for _seconds, unit in times]) != prices.units[number]:
            return False
        new.append(tuple([seconds for seconds, _unit in times]))
    plans = lowered.ops
    changed = False
    for number, seconds in enumerate(new):
        if seconds == prices.seconds[number]:
            continue
        changed = True
        prices.seconds[number] = seconds
        for index in prices.members[number]:
            plan_ = plans[index]
            plan_.pieces = [new_piece(Piece, (time_s, *piece[1:]))
                            for piece, time_s in zip(plan_.pieces, seconds, strict=True)]
    launch_s = policy.launch_overhead_s
    collectives_moved = chip.links != prices.links or launch_s != prices.launch_s  # what prices them
    if launch_s != prices.launch_s:
        changed = True
        prices.launch_s = launch_s
        for plan_ in plans:
            plan_.launch_s = plan_.launches * launch_s
    fixed_s = b.kernels.fixed_s
    fixed_s = tuple(fixed_s) if fixed_s else None
    if fixed_s != prices.fixed_s:
        changed = True
        prices.fixed_s = fixed_s
        for plan_ in plans:
            plan_.kernel_fixed_s = fixed_s[plan_.index] if fixed_s else 0.0
    if collectives_moved:
        changed = True
        prices.links = chip.links
        collectives = _program_collectives(b)
        for plan_, op in zip(plans, ops, strict=True):
            if op.collectives:
                plan_.collectives = collectives[plan_.index]
    if changed:
        lowered.op_rows = None  # the stream's copy of each op's fields (made again by the next run)
    return True


def _op_times(b: Builder, program: Program, index: int, op: Op) -> list[tuple[float, int]]:
    """(seconds, unit) of each piece :func:`~tpusim.engine.build.lower` makes for op ``index`` on
    ``b``'s chip, in order (the walk of ``lower`` and its ``_lower_*`` steps, prices only)."""
    facts = b.facts
    times: list[tuple[float, int]] = []
    vector_s = b.vector_s(op.vector_flops)
    kind = facts.kinds[index]
    if kind == EXPERT_OP:
        parts = b.expert_parts(op, index, facts.expert_layouts[index])
        for _waits, dequant_s, mxu_s in parts:
            if dequant_s:
                times.append((dequant_s, VPU))
            times.append((mxu_s, MXU))
        if not parts:
            times.append((0.0, MXU))
    elif kind <= WEIGHT_OP:
        slabs_of = []
        for tensor in op.tensors:
            _ring, _pool, chunk_bytes = b.tensor_queue(tensor)
            slabs_of.append([(None, rows) for rows, _values, _scales in b.slab_cut(tensor, chunk_bytes)])
        dtype = facts.dtypes[index]
        if kind == ALIGNED_WEIGHT_OP:
            for tensor, slabs, shape, matmul in zip(op.tensors, slabs_of, facts.tensor_shapes[index], op.matmuls,
                                                    strict=True):
                for dequant_s, mxu_s in b.slab_parts(tensor, shape, matmul, dtype, slabs):
                    if dequant_s is not None:
                        times.append((dequant_s, VPU))
                    times.append((mxu_s, MXU))
        else:
            matmul_s = b.op_matmul_s(op, dtype) + sum(b.dots_s(len(slabs), slabs[0][1], cols)
                                                      for slabs, (_r, _k, cols) in zip(slabs_of, op.matmuls,
                                                                                       strict=False))
            dequant_s = sum(b.dequant_s(tensor) for tensor in op.tensors)
            if dequant_s:
                times.append((dequant_s, VPU))
            if op.unit == "mxu" or matmul_s:
                times.append((matmul_s, MXU))
            times.append((vector_s, VPU))
            vector_s = 0.0
    elif op.kv_read_bytes and b.recurrent_state_bytes(op.layer):
        matmul_s = b.op_matmul_s(op, facts.dtypes[index])
        if matmul_s:
            times.append((matmul_s, MXU))
        times.append((vector_s, VPU))
        vector_s = 0.0
    elif op.kv_read_bytes:
        vector_s = _kv_tile_times(b, program, op, facts.dtypes[index], vector_s, times)
    else:
        matmul_s = b.op_matmul_s(op, facts.dtypes[index])
        if matmul_s:
            times.append((matmul_s, MXU))
    if vector_s or not times:
        times.append((vector_s, VPU))
    return times


def _kv_tile_times(b: Builder, program: Program, op: Op, dtype: str, vector_s: float,
                   times: list[tuple[float, int]]) -> float:
    """:func:`~tpusim.engine.build._lower_kv_tiles`'s pieces, prices only
    (:func:`~tpusim.engine.build.kv_tile_prices`); returns the vector time left for the trailing
    piece."""
    prices, coded = kv_tile_prices(b, op, dtype)
    times.extend((seconds, unit) for _size, seconds, unit in prices)
    return 0.0 if coded else vector_s
