"""What a block kind declares: its weight tensors and its op sequence.

A decoder layer is an attention block (:mod:`.kda`, :mod:`.mla` or :mod:`.gqa`) followed
by an MLP block (:mod:`.moe` or :mod:`.dense_mlp`); the step ends with :mod:`.head`. Each
block module declares a :class:`Block`: the tensors it owns (name, family, format key, in
the order arenas place them) and its ops in execution order (name, role, unit, the tensors
each reads). The program builder (:mod:`tpusim.workload.program`), the issue plan and the
kernel's DMA/window plan (:mod:`megakernel.dma_plan`) all walk these sequences, so the
simulator and the kernel cannot order a layer differently.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from tpusim.workload.registry.names import Family, FormatKey

Unit = Literal["mxu", "vpu"]
Phase = Literal["attention", "moe", "mlp", "head"]


@dataclass(frozen=True)
class TensorDecl:
    """A weight tensor kind a block owns (shapes: :mod:`tpusim.workload.shapes`)."""

    name: str
    family: Family
    format_key: FormatKey


@dataclass(frozen=True)
class OpSpec:
    """One op of a block.

    ``tensors``: weights it streams, in read order; ``reads_small``: it reads its layer's
    small-parameter row too (after its tensors); ``rereads``: weights of an earlier op it
    reads again (absorbed MLA attention reads ``mla.kv_b`` in ``mla.core``); ``optional``:
    present only when the model has every tensor it reads; ``repeated``: one op per routed
    expert (``expert[j]``)."""

    name: str
    unit: Unit = "mxu"
    tensors: tuple[str, ...] = ()
    role: str | None = None
    reads_small: bool = False
    rereads: tuple[str, ...] = ()
    optional: bool = False
    repeated: bool = False

    @property
    def anchor(self) -> str:
        """The role plans anchor collectives on: ``role`` when given, else the op's name."""
        return self.role or self.name

    def present(self, tensors: Collection[str]) -> bool:
        """Whether a layer whose tensors are ``tensors`` runs this op."""
        return not self.optional or all(name in tensors for name in self.tensors)


@dataclass(frozen=True)
class Block:
    """A block kind: ``kind`` (``kda``, ``mla``, ``gqa``, ``moe``, ``dense``, ``head``), the
    program phase its ops belong to, its tensors and its ops."""

    kind: str
    phase: Phase
    tensors: tuple[TensorDecl, ...]
    ops: tuple[OpSpec, ...]

    def present_ops(self, tensors: Collection[str]) -> tuple[OpSpec, ...]:
        """The ops a layer with weight tensors ``tensors`` runs, in order."""
        return tuple(op for op in self.ops if op.present(tensors))

    def split_at_experts(self) -> tuple[tuple[OpSpec, ...], OpSpec | None, tuple[OpSpec, ...]]:
        """(ops before the routed experts, the expert op, ops after them); the whole block and
        None for a block without experts."""
        for index, op in enumerate(self.ops):
            if op.repeated:
                return self.ops[:index], op, self.ops[index + 1:]
        return self.ops, None, ()
