"""A ring-mode pool as the kernel runs it: the bank each slab lands in, read from the one issue plan.

In a pool of mode ``ring`` (:class:`tpusim.schedule.schema.PoolSpec`) every member tensor is
cut into bank-sized slabs that take the pool's banks in turn, in consumption order, across
tensors and layers. A slab's bank therefore depends on every pooled slab streamed before it,
not on its tensor's stack index as in a per-kind ring. The one statement of that rule is
:func:`tpusim.schedule.program_issue.program_reads`; this module does not restate it. It
builds the model's program (the dense ops do not depend on routing), asks
:func:`tpusim.schedule.program_issue.program_issue_plan` for the bank of every pooled copy,
and turns the answer into what a kernel compiled once for all layers can read:

- per layer and pool, two SMEM words (:func:`bank_table`): the bank of slab 0 of the layer's
  anchor attention kind (part ``attn``: its first pooled kind in
  :data:`~tpusim.schedule.issue_plan.RING_ORDER`) and of its anchor MoE kind (part ``moe``);
- per tensor kind, its static bank offset from its part's base (:attr:`PoolBanks.offset`):
  slab ``k`` of kind ``t`` in layer ``l`` is in bank ``(base[l, part(t)] + offset[t] + k) % banks``.

Layer 0's dense MLP and the head's ``lm_head`` run at layers the kernel knows statically, so
their banks come straight from the plan (:meth:`PoolBanks.first_bank`). :func:`pool_banks`
checks the formula against the plan for every pooled copy of the step and refuses
(:class:`UnsupportedSchedule`) a layout where the kernel's slab sizes differ from the program's.
Layers are the kernel's: the head is ``num_layers`` (the program numbers it -1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from megakernel.dims import ModelDims
from megakernel.errors import UnsupportedSchedule
from tpusim.schedule.issue_plan import RING_ORDER, Read, RingSpec, UnsupportedIssuePlan
from tpusim.schedule.program_issue import program_issue_plan
from tpusim.schedule.schema import Schedule
from tpusim.workload.program import build_program

PARTS = ("attn", "moe")  # tensor kinds whose layer is traced in the kernel's layer loop
ARENA_ROW_BYTES = 256  # one 128-lane row of uint16 words


def part_of(tensor: str) -> str | None:
    """The part whose SMEM base ``tensor``'s bank is counted from (None: a static layer)."""
    if tensor.startswith(("kda.", "mla.")):
        return "attn"
    if tensor.startswith("moe."):
        return "moe"
    return None


@dataclass(frozen=True)
class PoolBanks:
    """The banks of one ring-mode pool, as the issue plan places the step's slabs."""

    pool: str  # the pool's name in the schedule (the kernel's arena name)
    ring: str  # the issue plan's ring name (``pool:NAME``)
    index: int  # position among the schedule's ring pools (SMEM table column group)
    banks: int
    bank_rows: int  # 128-lane uint16 rows per bank
    first: dict[tuple[str, int], int]  # (tensor, layer) -> bank of its slab 0
    base: dict[tuple[int, str], int]  # (layer, part) -> bank the part's offsets count from
    offset: dict[str, int]  # tensor kind -> bank offset from its part's base

    def first_bank(self, tensor: str, layer: int) -> int:
        """Bank of slab 0 of ``tensor`` in ``layer`` (a static layer)."""
        return self.first[tensor, layer]

    def only_layer(self, tensor: str) -> int:
        """The one layer that has ``tensor`` (layer 0's dense MLP, the head's lm_head)."""
        layers = [layer for name, layer in self.first if name == tensor]
        if len(layers) != 1:
            raise UnsupportedSchedule(f"pools.{self.pool}: {tensor} is in {len(layers)} layers; the kernel "
                                      "expects it in one")
        return layers[0]


def pool_banks(dims: ModelDims, schedule: Schedule, slabs: dict[str, int]) -> dict[str, PoolBanks]:
    """Pool name -> :class:`PoolBanks` for every ring-mode pool of ``schedule`` with members in
    this model (``dims.model`` and ``dims.plan`` give the program); ``slabs``: tensor kind ->
    the kernel's slab count, for every pooled kind."""
    if dims.model is None or dims.plan is None:
        raise UnsupportedSchedule("a ring pool needs the model and plan: build the dims with megakernel.dims.model_dims")
    num_layers = dims.num_layers
    program = build_program(dims.model, dims.plan, batch=1, context_tokens=1)
    try:
        issue = program_issue_plan(program, schedule)
    except UnsupportedIssuePlan as error:
        raise UnsupportedSchedule(str(error)) from None
    names = [pool for pool, spec in schedule.pools.items() if spec.mode == "ring"]
    out: dict[str, PoolBanks] = {}
    for pool in names:
        ring = f"pool:{pool}"
        spec = issue.rings.get(ring)
        if spec is None:  # no member tensor in this model
            continue
        index = len(out)
        if spec.slab_size % ARENA_ROW_BYTES:
            raise UnsupportedSchedule(f"pools.{pool}.bank_bytes {spec.slab_size} is not a multiple of "
                                      f"{ARENA_ROW_BYTES} (one 128-lane row of 16-bit words)")
        first, count = _first_banks(issue.plan.buffer, ring, num_layers, spec.buffers)
        for key, got in count.items():
            if got != slabs.get(key[0]):
                raise UnsupportedSchedule(f"pools.{pool}: the program streams {key[0]} of layer {key[1]} in {got} "
                                          f"slabs, the kernel in {slabs.get(key[0], 0)}")
        base, offset = _parts(first, spec.buffers, pool)
        out[pool] = PoolBanks(pool, ring, index, spec.buffers, spec.slab_size // ARENA_ROW_BYTES, first, base, offset)
    return out


def _first_banks(buffer: dict, ring: str, num_layers: int, banks: int) -> tuple[dict[tuple[str, int], int], dict]:
    """(tensor, layer) -> bank of slab 0 and -> slab count; slab k must sit k banks further on
    (the kernel computes it so)."""
    banks_of: dict[tuple[str, int], dict[int, int]] = {}
    for unit, bank in buffer.items():
        if unit.ring != ring:
            continue
        tensor, layer = unit.key
        banks_of.setdefault((tensor, num_layers if layer == -1 else layer), {})[unit.slab] = bank
    first: dict[tuple[str, int], int] = {}
    count: dict[tuple[str, int], int] = {}
    for key, by_slab in banks_of.items():
        first[key], count[key] = by_slab[0], len(by_slab)
        if any(bank != (by_slab[0] + k) % banks for k, bank in by_slab.items()):
            raise UnsupportedSchedule(f"{ring}: the slabs of {key[0]} (layer {key[1]}) do not take consecutive banks")
    return first, count


def _parts(first: dict[tuple[str, int], int], banks: int, pool: str) -> tuple[dict, dict[str, int]]:
    """Per layer and part the base bank (that of the part's first kind in :data:`RING_ORDER`)
    and per kind its offset from it, checked to be the same in every layer."""
    by_layer: dict[tuple[int, str], list[str]] = {}
    for tensor, layer in first:
        part = part_of(tensor)
        if part is not None:
            by_layer.setdefault((layer, part), []).append(tensor)
    base: dict[tuple[int, str], int] = {}
    offset: dict[str, int] = {}
    for (layer, part), tensors in by_layer.items():
        anchor = min(tensors, key=RING_ORDER.index)
        base[layer, part] = first[anchor, layer]
        for tensor in tensors:
            shift = (first[tensor, layer] - base[layer, part]) % banks
            if offset.setdefault(tensor, shift) != shift:
                raise UnsupportedSchedule(f"pools.{pool}: {tensor}'s bank offset within its layer differs between "
                                          "layers; the kernel needs it static")
    return base, offset


def check_op_fits(op: str, reads: list[Read], specs: dict[str, RingSpec]) -> None:
    """An op reading several tensors of one ring pool needs their slabs in distinct banks: the
    kernel streams one tensor after the other, so a bank shared within the op would be
    refilled while the op still needs it (a wrap the issue rule does not see)."""
    slabs: dict[str, dict[object, int]] = {}
    for read in reads:
        if read.ring.startswith("pool:"):
            slabs.setdefault(read.ring, {})[read.key] = read.slabs or 1
    for ring, by_tensor in slabs.items():
        total = sum(by_tensor.values())
        if len(by_tensor) > 1 and total > specs[ring].buffers:
            names = " and ".join(str(key[0]) for key in by_tensor)  # type: ignore[index]
            raise UnsupportedSchedule(f"{op} reads {names}: {total} slabs of ring pool {ring[5:]!r}, more "
                                      f"than its {specs[ring].buffers} banks; use more or larger banks")


def bank_table(num_layers: int, pools: dict[str, PoolBanks]) -> np.ndarray:
    """int32[num_layers * 2 * max(1, pools)]: entry ``(layer * P + pool.index) * 2 + part``
    is the base bank of ``part`` (:data:`PARTS`) in ``layer`` (0 where the layer has none)."""
    width = max(1, len(pools))
    table = np.zeros((num_layers, width, len(PARTS)), np.int32)
    for banks in pools.values():
        for (layer, part), bank in banks.base.items():
            if layer < num_layers:
                table[layer, banks.index, PARTS.index(part)] = bank
    return table.reshape(-1)


def bank_word(layer: object, pools: int, index: int, part: str) -> object:
    """Index into :func:`bank_table`'s array (``layer`` may be traced)."""
    return layer * (2 * max(1, pools)) + (index * 2 + PARTS.index(part))  # type: ignore[operator]
