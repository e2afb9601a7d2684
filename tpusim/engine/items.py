"""The engine's vocabulary: copies, buffers, pools and the lowered program.

Lowering (:mod:`tpusim.engine.build`) turns a program and a schedule into these objects
once per simulation; the event loop only flips their state. Names follow the kernel:

- :class:`Descriptor` — one HBM↔VMEM copy (``dma_start`` / ``dma_wait`` in the kernel): the
  values of one slab, or its block scales, or one KV tile, or a state write-back.
- :class:`Slab` — what one VMEM buffer holds: one row slab of a weight tensor (values and
  scales together), one whole expert slice (an "expert slot"), one KV tile or one KDA state.
  It is *reserved* when its copies are issued and *freed* when its consumer is done with it.
- :class:`Ring` — the ``buffers`` slots of one tensor kind (``kda.qkvgb``, ...; the routed
  experts share one ring: the expert slots). At most ``depth`` of its slabs are resident.
- :class:`Pool` — a VMEM arena (``arena_bytes`` from :func:`tpusim.schedule.vmem.vmem_plan`) that its
  member families time-share; slabs are admitted strictly in consumption order.
- :class:`Piece` — one uninterrupted stretch of the compute stream: wait for some copies,
  compute for ``duration_s`` on one unit, then free / release / write back.
- :class:`OpPlan` — one op: the kernel launches paid before it (per-op launch execution), the
  copies released when it starts or ends, its pieces and the collectives after it.

State lives in plain ``__slots__`` classes (not pydantic): they are created by the thousand
per simulation and mutated in the hot loop. A lowered step is run more than once
(:mod:`tpusim.engine.reuse`), so a copy's and a slab's flags hold the *number of the run* that
set them (``Lowered.runs``; 0: never): a flag is set in this run when it equals this run's
number, and a new run starts with every flag clear without touching the objects.

Compiled (``setup.py``), ``Ring``, ``Pool``, ``Slab`` and ``Descriptor`` take C fields from
``items.pxd``: a new attribute is declared there too (else the compiled build refuses it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

MXU = 0
VPU = 1
UNIT_NAMES = ("mxu", "vpu")


class Ring:
    """The buffer ring of one tensor kind: ``used`` of ``depth`` slots are resident."""

    __slots__ = ("depth", "name", "used")

    def __init__(self, name: str, depth: int) -> None:
        self.name = name
        self.depth = depth
        self.used = 0


class Pool:
    """A VMEM arena of ``capacity_bytes`` shared by the slabs in ``order`` (consumption order).

    ``ptr`` is the first slab not yet admitted: admission is in order, so a later slab never
    overtakes an earlier one in the same arena (a static kernel fills its arena in program
    order too). This also makes the pool deadlock-free: everything resident is consumed
    before the head, so the head always gets room eventually.
    """

    __slots__ = ("capacity_bytes", "members", "name", "order", "ptr", "used_bytes")

    def __init__(self, name: str, capacity_bytes: int, members: tuple[str, ...] = ()) -> None:
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.members = members
        self.order: list[Slab] = []
        self.ptr = 0
        self.used_bytes = 0


class Slab:
    """The contents of one VMEM buffer (see the module docstring)."""

    __slots__ = (
        "descs",
        "family",
        "free_on_land",
        "freed",
        "label",
        "layer",
        "nbytes",
        "op_index",
        "pool",
        "released",
        "ring",
        "seq",
    )

    def __init__(self, seq: int, family: str, label: str, layer: int, op_index: int,
                 pool: Pool, ring: Ring) -> None:
        self.seq = seq
        self.family = family
        self.label = label
        self.layer = layer
        self.op_index = op_index
        self.pool = pool
        self.ring = ring
        self.nbytes = 0
        self.descs: list[Descriptor] = []
        # run numbers (module docstring): released (issuable), freed, and free_on_land (a
        # mispredicted speculative copy: drop it once its copies have landed)
        self.released = 0
        self.freed = 0
        self.free_on_land = 0

    def landed_in(self, run: int) -> bool:
        """Whether every copy of the slab has landed in run ``run``."""
        return all(desc.landed == run for desc in self.descs)


class Descriptor:
    """One copy between HBM and VMEM (a read unless ``write``)."""

    __slots__ = (
        "chunk",
        "family",
        "frees_slab",
        "issue_s",
        "land_s",
        "landed",
        "lane",
        "layer",
        "nbytes",
        "seq",
        "slab",
        "stream",
        "target",
        "tensor",
        "waiter",
        "write",
    )

    def __init__(self, seq: int, family: str, tensor: str, layer: int, chunk: int, nbytes: int,
                 slab: Slab | None, *, write: bool = False, frees_slab: Slab | None = None) -> None:
        self.seq = seq
        self.family = family
        self.tensor = tensor
        self.layer = layer
        self.chunk = chunk
        self.nbytes = nbytes
        self.slab = slab
        self.write = write
        self.frees_slab = frees_slab  # a state write-back frees the state buffer when it lands
        self.landed = 0  # the run it landed in (module docstring)
        self.waiter: Any = None  # the compute stream's Driver.resume (bound) while it waits on this copy
        self.stream: object = None  # its address stream while streaming (dma.contention_unit: stream)
        self.target = 0.0  # while streaming: the HBM server's virtual clock at which it lands (hbm)
        self.lane = -1
        self.issue_s = 0.0
        self.land_s = 0.0


class Piece(NamedTuple):
    """One stretch of the compute stream (see the module docstring)."""

    duration_s: float
    unit: int  # MXU or VPU
    waits: Sequence[Descriptor] = ()  # a slab's own ``descs`` list where it waits for one whole slab
    frees: tuple[Slab, ...] = ()
    releases: tuple[Slab, ...] = ()
    writes: tuple[Descriptor, ...] = ()


class CollectivePlan(NamedTuple):
    """A collective after an op: its stages as (link name, seconds), run in order."""

    name: str
    overlapped: bool
    stages: tuple[tuple[str, float], ...]
    join_op_index: int  # overlapped: the op that must not start before it completes
    launch_s: float = 0.0  # a kernel launch paid on the stream before the call (an NCCL kernel)
    messages: Any = None  # a tpusim.engine.collective_messages.MessageCollective: run as remote copies


class OpPlan:
    """One op of the lowered program."""

    __slots__ = (
        "collectives",
        "end_releases",
        "first_of_layer",
        "index",
        "kernel",
        "kernel_fixed_s",
        "launch_s",
        "launches",
        "layer",
        "name",
        "phase",
        "pieces",
        "resolves",
        "start_releases",
    )

    def __init__(self, index: int, name: str, layer: int, phase: str, first_of_layer: bool) -> None:
        self.index = index
        self.name = name
        self.layer = layer
        self.phase = phase
        self.first_of_layer = first_of_layer
        # lowering appends to the lists; one left empty becomes the shared () (build.lower)
        self.start_releases: list[Slab] | tuple[Slab, ...] = []
        self.end_releases: list[Slab] | tuple[Slab, ...] = []
        self.resolves: list[Slab] | tuple[Slab, ...] = []  # mispredicted speculative slabs, known wrong at op end
        self.pieces: list[Piece] = []
        self.collectives: tuple[CollectivePlan, ...] = ()
        self.launches = 0  # kernel launches paid before the op starts (execution policy)
        self.launch_s = 0.0
        self.kernel_fixed_s = 0.0  # the opened kernels' fixed time and ramp (serving stack)
        self.kernel = ""  # what those launches are (trace label)
