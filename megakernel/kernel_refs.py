"""The kernel's refs and trace-time facts: the base of :class:`megakernel.kernel_dma.Ctx`.

:class:`KernelRefs` holds what one trace of the kernel body works with: the model's dims, the
plan's geometry, the operand refs (``ins``: SMEM tables, ``x0``, HBM weights; ``outs``: logits
and the aliased state) and the scratch groups, and reads the SMEM/VMEM tables (``layer_col``,
``instance``, ``table``). Every SMEM read or VMEM load is an interpreter callback, so values
derived from a traced layer index are cached (:meth:`KernelRefs.memo`, keyed by the owner's
identity) for one trace region (:meth:`KernelRefs.region`: a branch or a loop body, whose
values must not leak out). With tracing on (interpret mode only), :meth:`KernelRefs.event`
appends ``("dma_start"|"dma_wait", family, tensor, layer, chunk)`` or ``("compute", op, layer)``
to the :class:`Recorder`'s list through an ordered ``io_callback``.

The other roles build on it: control flow (:mod:`megakernel.kernel_control`), copies
(:mod:`megakernel.kernel_dma`), streamed products (:mod:`megakernel.kernel_products`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.experimental import pallas as pl

from megakernel.dims import ModelDims
from megakernel.dma_plan import Geometry, Ring, Unit
from megakernel.expert_products import DECODE, ExpertProducts
from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, PANEL_UNROLL
from tpusim.workload.registry.names import expert_op

# Layer table columns (SMEM, flattened [num_layers, LAYER_COLS]).
COL_IS_MLA, COL_KIND_INDEX, COL_TEMPLATE = 0, 1, 2
LAYER_COLS = 4
TEMPLATES = ("kda", "mla", "head")


def idiv(a: Any, b: int) -> Any:
    """``a // b`` for non-negative ``a`` (int or traced i32): truncating ``lax.div``, because
    jnp's floor division lowers through ``sign``, which Mosaic lowering cannot do off-TPU."""
    return a // b if isinstance(a, int) else jax.lax.div(a, jnp.int32(b))


def imod(a: Any, b: int) -> Any:
    """``a % b`` for non-negative ``a`` (see :func:`idiv`)."""
    return a % b if isinstance(a, int) else jax.lax.rem(a, jnp.int32(b))


@dataclass
class Recorder:
    """Collects trace events from ordered io_callbacks (host side)."""

    events: list[tuple[Any, ...]] = field(default_factory=list)

    def callback(self, static: tuple[Any, ...], *values: Any) -> np.ndarray:
        ints = [int(v) for v in values]
        if static[0] == "compute_expert":  # ("compute", "expert[j]", layer)
            self.events.append(("compute", expert_op(ints[1]), ints[0]))
        elif static[0] == "compute":
            self.events.append(("compute", static[1], ints[0]))
        else:  # ("dma_start" | "dma_wait", family, tensor, layer, chunk)
            self.events.append((*static, *ints))
        return np.zeros((), np.int32)


@dataclass
class KernelRefs:
    """Refs and static facts the kernel body works with (one per trace)."""
    dims: ModelDims
    geo: Geometry
    batch: int
    ins: dict[str, Any]  # SMEM tables, x0, HBM weight refs
    outs: dict[str, Any]  # logits (VMEM) and aliased state (HBM)
    scratch: dict[str, Any]
    units: list[Unit]  # table columns
    n_max: int
    recorder: Recorder | None = None
    # The plan's in-kernel collectives (megakernel.kernel_collectives.KernelLink.bind), or None
    # on one device: the ops then use the single-device stand-ins of megakernel.dims.
    link: Any = None
    branch: str | None = None  # the lax.cond branch being traced ("true" | "false"), for trace-time logs
    # A probe of the kernel's fixed costs: run at most this many of each layer's chosen experts
    # (the first in list order; None: all). Not a decode: its logits are not the model's.
    expert_cap: int | None = None
    # panels a panel loop's iteration issues (tpusim.schedule.kernel_layout.PANEL_UNROLL):
    # streamed dense tensors, routed experts' parts
    panel_unroll: int = PANEL_UNROLL
    expert_panel_unroll: int = EXPERT_PANEL_UNROLL
    expert_products: ExpertProducts = DECODE  # how a routed expert's panels are multiplied on this chip
    _memo: dict[tuple[str, Any], tuple[Any, Any]] = field(default_factory=dict)

    def memo(self, key: str, owner: Any, make: Callable[[], Any]) -> Any:
        """Cache a value derived from ``owner`` (a traced layer index or an int). Every SMEM
        read or VMEM load is an interpreter callback, so per-window scalars and a layer's
        small-parameter row are read once per trace region (see :meth:`region`)."""
        slot = (key, ("int", owner)) if isinstance(owner, int) else (key, id(owner))
        hit = self._memo.get(slot)
        if hit is not None and (isinstance(owner, int) or hit[0] is owner):
            return hit[1]
        value = make()
        self._memo[slot] = (owner, value)
        return value

    @contextlib.contextmanager
    def region(self) -> Any:
        """Values traced inside a ``lax.cond`` branch or loop body must not leak out: cache
        entries made inside the region are dropped when it ends."""
        saved = dict(self._memo)
        try:
            yield
        finally:
            self._memo = saved

    # ------------------------------------------------------------------ scalars & tables

    def layer_col(self, layer: Any, col: int) -> jax.Array:
        return self.ins["smem.layers"][layer * LAYER_COLS + col]

    def instance(self, ring: Ring, layer: Any) -> Any:
        """Index of ``layer``'s tensor in ``ring``'s HBM stack."""
        if ring.instances == 1:
            return 0
        if ring.name == "small":
            return layer
        if ring.name.startswith(("kda.", "mla.")):
            if isinstance(layer, int):
                return self.dims.kind_index(layer)
            return self.memo("kind_index", layer, lambda: self.layer_col(layer, COL_KIND_INDEX))
        return layer - 1  # MoE layers are 1..L-1

    def table(self, template: Any, n: Any, unit_index: int) -> jax.Array:
        """The planned issue code of unit ``unit_index`` in window row (template, n).

        The whole row is one VMEM load (a vector), cached per window; a unit's code is then
        extracted with a masked reduction (no further memory access)."""
        def load() -> jax.Array:
            row = template * (self.n_max + 1) + n
            return self.ins["vmem.issue"][pl.ds(row, 1), :]

        row = self.memo(f"issue_row/{id(template)}", n, load)
        lane = jax.lax.broadcasted_iota(jnp.int32, row.shape, 1)
        return jnp.sum(jnp.where(lane == unit_index, row, 0))

    # ------------------------------------------------------------------------- trace

    def event(self, *static: Any, dynamic: tuple[Any, ...] = ()) -> None:
        if self.recorder is None:
            return
        values = [jnp.asarray(v, jnp.int32) for v in dynamic]
        io_callback(functools.partial(self.recorder.callback, static), jax.ShapeDtypeStruct((), jnp.int32),
                    *values, ordered=True)

    def compute(self, op: str, layer: Any) -> None:
        self.event("compute", op, dynamic=(layer,))

def layer_table(dims: ModelDims) -> np.ndarray:
    """int32[L * LAYER_COLS]: is_mla, index in its kind's stack, template of its window."""
    rows = np.zeros((dims.num_layers, LAYER_COLS), np.int32)
    for layer, kind in enumerate(dims.kinds):
        rows[layer, COL_IS_MLA] = kind == "mla"
        rows[layer, COL_KIND_INDEX] = dims.kind_index(layer)
        nxt = dims.kinds[layer + 1] if layer + 1 < dims.num_layers else "head"
        rows[layer, COL_TEMPLATE] = TEMPLATES.index(nxt)
    return rows.reshape(-1)


# SMEM scratch layout (int32): [n_current, n_next]; the expert list has its own SMEM scratch
# (``experts``: whole 128-word rows, the unit of its copy from VMEM)
N_CURRENT, N_NEXT = 0, 1
SMEM_WORDS = 2


