"""The GPU execution model: a serving stack, eager launches, or a GPU megakernel, in one engine.

Same program, same schedule schema, same SimPy engine as the TPU megakernel; what differs is
how the step is dispatched (:class:`~tpusim.engine.execution.ExecutionPolicy`). Three stacks,
chosen by ``chip.execution.mode`` (``tpusim compare`` switches them with
:func:`gpu_variant`: ``gb200:16`` / ``gb200:16:eager`` / ``gb200:16:megakernel``). Every
figure below is in the chip's catalog entry (``execution.gpu``, with its source and label).

**Serving stack** (``serving_stack``, the default: CUDA graphs + fused kernels, as vLLM /
SGLang / TensorRT-LLM deploy decode): the conventional stack below with a graph gap instead
of a launch, a fixed time and bandwidth ramp per kernel, activation-quantize kernels and a
one-shot all-reduce for small payloads — :mod:`tpusim.engine.gpu_stack`.

**Eager stack** (``per_op_launch``: the serving stack's kernels, each launched from the host
at ``launch_overhead_s`` instead of the graph gap, NCCL for every collective)::

    step:  host per-step cost                                  (per_step_overhead_s)
    for each kernel of the fusion table (gpu_fusion):          (launch_overhead_s each)
        launch
        request every weight the kernel reads                  (no cross-op prefetch: the
        compute on each slab as it lands, at                    next kernel's weights are not
        per_op_efficiency x peak                                in flight while this one runs)
    after an op with a collective:
        launch an NCCL kernel; one per-call latency            (collective_stage_latency_s)
        + bytes / NVLink bandwidth; the stream waits           (blocking, even the latent
                                                                all-gather a megakernel overlaps)

- HBM rate ``sustained x per_op_efficiency``, compute ``peak x per_op_efficiency``. The 0.8
  of AIConfigurator is applied once: ``per_op_efficiency`` carries it, ``sustained`` is the
  rate of a long copy stream (H200: 4.3 TB/s measured; the others at that 0.9 of peak).
- Tensor-core rows pad to the MMA M (``tile_rows`` 64): a batch-1 GEMV costs a 64-row MMA.
- Inside a kernel, compute follows its own weight stream slab by slab (``kernel_slab_bytes``,
  ``kernel_copies_in_flight``): a GEMM pipelines its loads and MMAs; what it cannot do is
  load the next kernel's weights.
- A fused-MoE grouped GEMM is launched once per layer for every routed expert and requests
  all their weights when it starts (``FUSED_MOE_EXPERT_SLOTS`` expert slots).
- The attention kernel streams its KV cache split over SMs (``KV_TILES_IN_FLIGHT`` tiles).

**GPU megakernel** (``megakernel`` on a GPU chip)::

    step:  host per-step cost + ONE launch of a persistent kernel
    for each layer: grid barrier                               (per_layer_overhead_s, set by
                                                                gpu_variant to grid_barrier_s)
        for each op: the user's schedule, as on a TPU          (cross-op prefetch, expert
                                                                issue points, slots)
        collectives in the kernel: device-initiated puts       (no launch; per stage
                                                                in_kernel_stage_latency_s)

- Copies are TMA bulk copies (``dma.issue_latency_s``) at the sustained HBM rate; compute
  at peak.
- **Staging tier: L2.** The schedule's buffers live in L2 (``Chip.staging_memory`` picks L2
  on GPUs; capacity = the catalog's ``usable_capacity_bytes`` of L2): the kernel prefetches
  with ``cp.async.bulk.prefetch.L2`` as far ahead as the schedule says, and SMs pull tiles
  from L2 into their shared-memory rings as they compute. Shared memory is not the tier
  because the schema's unit of an expert slot is a whole expert slice (26.7 MiB for K3 on
  16 GPUs), and every SM's shared memory together (148 x 228 KiB ≈ 33 MiB on GB200) cannot
  hold one next to the attention buffers. *Not modelled:* the SMs' reads from L2 (L2
  bandwidth is a few times HBM's; the reads overlap the copy stream) — an optimistic
  simplification to calibrate.
- Ops inside a layer hand off through per-tile flags that overlap the copy stream (as
  published GPU megakernels do); only the per-layer grid barrier is charged.

**Collectives** (both modes; :func:`price_collective`): each stage names a link; inside one
NVLink domain (``nvlink.domain_devices``: 72 on GB200 NVL72, 8 on HGX boards) it runs over
NVLink. A system larger than the domain sends the stages that leave it — every stage after
the first of a hierarchical collective, and any stage with more peers than the domain
holds — over the scale-out link (``SCALE_OUT_LINK``: a 400 Gb/s NIC per GPU in the
catalog), or fails with a clear error when the chip has none. NCCL pays one latency per
call per link; in-kernel collectives pay one per stage (they follow the plan's algorithm,
as the TPU kernel does).

**Where the time goes** (:func:`gpu_breakdown`): compute, launches, collectives, exposed
copies, other fixed overheads and drain, summing to the step — enough to show why a
per-kernel stack loses to a megakernel at batch 1 (launches and NCCL latency, and copies
exposed because nothing is prefetched across kernels).

The constants this module once held (slab size, copies in flight, grid barrier, in-kernel
stage latency) are catalog figures now (``execution.gpu``), labelled *assumed* — priors,
some chosen by running this engine — with their reasoning in ``source``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from hwmodels.errors import InputError
from hwmodels.schema import Chip, Figure, GpuExecution, LinkSpec
from tpusim.engine.execution import (
    ExecutionPolicy,
    KernelPlan,
    base_policy,
)
from tpusim.engine.gpu_batch import BATCH_TERMS, batch_terms
from tpusim.engine.gpu_stack import chip_stack, stack_kernel_plan
from tpusim.engine.result import SimResult
from tpusim.schedule.schema import SCHEDULE_FAMILIES, FamilySchedule, Schedule
from tpusim.workload.floors import link_for
from tpusim.workload.program import CollectiveCall, Program
from tpusim.workload.registry.names import Family
from tpusim.workload.sharding import CollectiveStage

GPU_EXECUTIONS = ("stack", "eager", "megakernel")
STACK_LABELS = {
    "serving_stack": "serving stack (CUDA graphs, fused kernels, one-shot all-reduce)",
    "per_op_launch": "eager (one host launch per kernel, NCCL)",
    "megakernel": "GPU megakernel (one persistent kernel)",
}
SCALE_OUT_LINK = "pcie"
DERIVED_PREFIX = "derived from calibrated "  # a stack figure carried from another chip's fit  # the schema's name for the PCIe-attached NIC (GPUDirect RDMA)

# Conventional kernels admit every slab of their weights when they start, up to the
# schema's 64 buffers per tensor kind; the slab size and the copies in flight are catalog
# figures (execution.gpu.kernel_slab_bytes, kernel_copies_in_flight).
KERNEL_SLABS_BUFFERED = 64
# A fused-MoE grouped GEMM requests every routed expert of the layer when it starts: as many
# expert slots as the schema allows (more than a 16-way expert-parallel K3 device gets at
# batch 8; at larger batches the 65th expert waits for a slot, a mild pessimism).
FUSED_MOE_EXPERT_SLOTS = 64
# A split-KV decode attention kernel streams its cache from many SMs at once (schema max).
KV_TILES_IN_FLIGHT = 16
# l2_schedule: one pool for every family, two expert slots (see its docstring).
L2_POOL = "main"
L2_EXPERT_SLOTS = 2

GPU_BREAKDOWN_KEYS = ("compute", "launches", "kernel_fixed", *BATCH_TERMS, "collectives", "exposed_dma",
                      "other_overheads", "drain")
NOT_COMPUTE = ("collectives", "fixed_overheads", "exposed_dma", "drain")  # the rest are compute phases


# --------------------------------------------------------------------------- schedules


def gpu_conventional_schedule(gpu: GpuExecution, schedule: Schedule) -> Schedule:
    """The copies of a conventional GPU stack (the user's schedule does not apply).

    Every family: issued when the kernel reading it starts (nothing is prefetched across
    kernels), in ``gpu.kernel_slab_bytes`` slabs the kernel computes on as they land (its own
    load/MMA pipeline). Routed experts: ``FUSED_MOE_EXPERT_SLOTS`` whole-slice slots, so the
    grouped GEMM streams every expert of the layer. KV: the user's tile size,
    ``KV_TILES_IN_FLIGHT`` tiles (a split-KV attention kernel).
    """
    families = {name: FamilySchedule(prefetch_distance_ops=0, chunk_bytes=int(gpu.kernel_slab_bytes.value),
                                     buffers=KERNEL_SLABS_BUFFERED) for name in SCHEDULE_FAMILIES}
    families[Family.ROUTED_EXPERT] = FamilySchedule(prefetch_distance_ops=0, buffers=FUSED_MOE_EXPERT_SLOTS)
    return Schedule(
        name=f"{schedule.name} (GPU per-kernel stack)",
        description="conventional GPU stack: each kernel streams its own weights; fused-MoE grouped GEMM",
        families=families,
        max_dmas_in_flight=int(gpu.kernel_copies_in_flight.value),
        expert_issue="after_routing",
        kv_tile_tokens=schedule.kv_tile_tokens,
        kv_buffers=KV_TILES_IN_FLIGHT,
    )


def l2_schedule(base: Schedule, *, expert_slots: int = L2_EXPERT_SLOTS) -> Schedule:
    """``base`` adapted to a GPU megakernel's L2: every family in one pool, fewer expert slots.

    The TPU's ``published`` schedule needs ≈ 130 MiB for K3 on 16 GPUs (four 26.7 MiB
    expert slots beside the attention buffers), more than GB200's 94.5 MiB of usable L2.
    Sharing one pool and keeping two slots fits (≈ 60 MiB at batch 1, 65 MiB at batch 8).
    Measured on the engine, K3 on 16 GB200: ``l2_schedule(published)`` is the sweep's best
    at batch 1 (3.50 ms a step; ``naive``, the only built-in that fits, 5.70 ms) and within
    4 % of it at batch 8 (7.77 vs 7.50 ms; naive 11.71 ms) — 24-simulation sweeps, seed 0.
    """
    families = {name: base.family(name).model_copy(update={"pool": L2_POOL}) for name in SCHEDULE_FAMILIES}
    families[Family.ROUTED_EXPERT] = families[Family.ROUTED_EXPERT].model_copy(update={"buffers": expert_slots})
    return base.with_changes(
        name=f"{base.name}-l2",
        description=f"{base.name} adapted to a GPU megakernel's L2: one pool, {expert_slots} expert slots",
        families={name: family.model_dump() for name, family in families.items()},
    )


def one_persistent_kernel(program: Program) -> KernelPlan:
    """A GPU megakernel: one launch before the first op; every op runs inside it."""
    count = len(program.ops)
    launches = (1,) + (0,) * (count - 1) if count else ()
    names = ("1 kernel: the persistent megakernel",) + ("",) * (count - 1) if count else ()
    return KernelPlan(launches=launches, kernel_start=(0,) * count, kernel_names=names)


# --------------------------------------------------------------------------- collectives


def _scale_out(chip: Chip, devices: int, nvlink: LinkSpec) -> LinkSpec:
    for link in chip.links:
        if link.name == SCALE_OUT_LINK and link is not nvlink:
            if devices > link.domain_devices:
                raise InputError(
                    f"{chip.name}: {devices} GPUs exceed the {link.name} scale-out fabric "
                    f"({link.domain_devices} devices)")
            return link
    raise InputError(
        f"{chip.name}: a system of {devices} GPUs spans more than one NVLink domain "
        f"({nvlink.domain_devices} GPUs) and the catalog entry has no scale-out link "
        f"({SCALE_OUT_LINK!r}) to reach the others; use at most {nvlink.domain_devices} GPUs")


def stage_link(chip: Chip, stage: CollectiveStage, index: int, devices: int) -> LinkSpec | None:
    """The link one collective stage runs over, NVLink domain considered (None: no link).

    Inside the domain the plan's link (NVLink). In a system larger than the domain, the
    stages that leave it go over the scale-out link: every stage after the first (a
    hierarchical collective reduces inside the domain first) and any stage with more peers
    than the domain holds.
    """
    link = link_for(chip, stage.link)
    if link is None or devices <= link.domain_devices:
        return link
    if index > 0 or stage.peers + 1 > link.domain_devices:
        return _scale_out(chip, devices, link)
    return link


def price_collective(chip: Chip, call: CollectiveCall, devices: int, *,
                     per_call: bool) -> tuple[tuple[str, float], ...]:
    """A collective's stages as ``(link name, seconds)``.

    Each stage moves ``payload x peers / bandwidth`` over its link. Latency: ``per_call``
    (NCCL) pays the link's ``collective_stage_latency_s`` once for consecutive stages on one
    link — one call, however the library splits it; otherwise (in-kernel) once per stage.
    """
    out: list[tuple[str, float]] = []
    for index, stage in enumerate(call.spec.stages):
        link = stage_link(chip, stage, index, devices)
        if link is None:
            continue
        transfer_s = call.payload_bytes_per_peer * stage.peers / link.bandwidth_bytes_per_s_per_direction.value
        if per_call and out and out[-1][0] == link.name:
            out[-1] = (link.name, out[-1][1] + transfer_s)
        else:
            out.append((link.name, link.collective_stage_latency_s.value + transfer_s))
    return tuple(out)


nccl_collective = partial(price_collective, per_call=True)
in_kernel_collective = partial(price_collective, per_call=False)


def stack_collective(chip: Chip, call: CollectiveCall, devices: int) -> tuple[tuple[str, float], ...]:
    """A serving stack's collective: a small all-reduce inside the NVLink domain is one
    one-shot kernel (every GPU reads each peer's buffer over NVLink: ``oneshot_allreduce_
    latency_s + payload x peers / bandwidth``, all stages flattened into one); anything else
    (large payloads, other kinds, a system beyond the domain) goes to NCCL. A collective the
    stack file runs itself (``collectives:``, :data:`tpusim.engine.gpu_fusion.STACK_COLLECTIVE_MODES`)
    is not priced here."""
    gpu = _gpu(chip)
    if chip_stack(chip).runs_inside(call.spec.name):
        return ()  # the stack runs it on a side stream or inside an op's kernel (its stack file)
    nvlink = link_for(chip, call.spec.stages[0].link)
    small = call.payload_bytes_per_peer <= gpu.oneshot_allreduce_max_bytes.value
    if call.spec.kind != "all_reduce" or not small or nvlink is None or devices > nvlink.domain_devices:
        return nccl_collective(chip, call, devices)
    group = 1
    for stage in call.spec.stages:
        group *= stage.peers + 1
    peers = group - 1
    transfer_s = call.payload_bytes_per_peer * peers / nvlink.bandwidth_bytes_per_s_per_direction.value
    return ((nvlink.name, gpu.oneshot_allreduce_latency_s.value + transfer_s),)


def _gpu(chip: Chip) -> GpuExecution:
    if chip.execution.gpu is None:
        raise InputError(f"{chip.name}: the catalog entry has no execution.gpu figures (GPU stacks)")
    return chip.execution.gpu


# --------------------------------------------------------------------------- policies


def gpu_policy(chip: Chip) -> ExecutionPolicy:
    """The execution policy of a GPU chip (see the module docstring): the base policy of its
    execution mode with the GPU's kernel plan, launches and collective pricing."""
    base = base_policy(chip)
    gpu = _gpu(chip)
    if chip.execution.mode == "serving_stack":
        return replace(
            base,
            mode="serving_stack",
            launch_overhead_s=gpu.kernel_gap_s.value,
            kernel_plan=partial(stack_kernel_plan, chip),
            collective_launches=True,
            collectives_block=True,
            collective_pricer=stack_collective,
            conventional=partial(gpu_conventional_schedule, gpu),
            description=STACK_LABELS["serving_stack"],
            step_terms=partial(batch_terms, chip),
        )
    if chip.execution.mode == "megakernel":
        return replace(
            base,
            launch_overhead_s=chip.execution.launch_overhead_s.value,
            kernel_plan=one_persistent_kernel,
            collective_pricer=in_kernel_collective,
            description="GPU megakernel: one persistent kernel, TMA prefetch into L2, in-kernel collectives",
        )
    return replace(
        base,
        kernel_plan=partial(stack_kernel_plan, chip),
        collective_launches=True,
        collectives_block=True,
        collective_pricer=nccl_collective,
        conventional=partial(gpu_conventional_schedule, gpu),
        description=STACK_LABELS["per_op_launch"],
    )


# --------------------------------------------------------------------------- chip variants


def gpu_variant(chip: Chip, execution: str) -> Chip:
    """``chip`` switched to one GPU stack; every switched figure keeps its catalog source.

    - ``stack``: ``mode = serving_stack`` (the catalog default: CUDA graphs, fused kernels);
    - ``eager``: ``mode = per_op_launch``, one host launch (``launch_overhead_s``) per kernel;
    - ``megakernel``: ``mode = megakernel``, ``per_layer_overhead_s`` = the catalog's
      ``execution.gpu.grid_barrier_s`` and every NVLink's ``collective_stage_latency_s`` =
      ``execution.gpu.in_kernel_stage_latency_s`` (the scale-out link keeps its figure). The
      one launch per step stays ``launch_overhead_s``.
    """
    if chip.kind != "gpu":
        raise InputError(f"{chip.name} is not a GPU: GPU execution variants do not apply")
    gpu = _gpu(chip)
    updates: dict[str, Any] = {}
    links = chip.links
    if execution == "stack":
        updates["mode"] = "serving_stack"
    elif execution == "eager":
        updates["mode"] = "per_op_launch"
    elif execution == "megakernel":
        updates["mode"] = "megakernel"
        updates["per_layer_overhead_s"] = gpu.grid_barrier_s
        links = [link.model_copy(update={"collective_stage_latency_s": gpu.in_kernel_stage_latency_s})
                 if link.name == "nvlink" else link for link in chip.links]
    else:
        raise InputError(f"unknown GPU execution {execution!r}; known: {', '.join(GPU_EXECUTIONS)}")
    return chip.model_copy(update={"execution": chip.execution.model_copy(update=updates), "links": links})


# --------------------------------------------------------------------------- results


def derived_origin(chip: Chip) -> str:
    """``"derived from calibrated <chip>"`` when ``chip``'s execution figures were carried from
    another chip's fit (``execution.gpu.stack_figures_from``), else ``""``."""
    figures = [chip.execution.per_op_efficiency]
    if chip.execution.gpu is not None:
        figures += [getattr(chip.execution.gpu, name) for name in type(chip.execution.gpu).model_fields]
    origins = sorted({figure.source.split(":", 1)[0] for figure in figures
                      if isinstance(figure, Figure) and figure.label == "derived"
                      and figure.source.startswith(DERIVED_PREFIX)})
    return ", ".join(origins)


def stack_source(chip: Chip) -> str:
    """One line saying which of a GPU's stack figures (``execution.gpu``) are priors, derived
    or calibrated — for the ``source`` of every simulated GPU number ("" for other chips)."""
    gpu = chip.execution.gpu
    if chip.kind != "gpu" or gpu is None:
        return ""
    by_label: dict[str, list[str]] = {}
    for name in type(gpu).model_fields:
        figure = getattr(gpu, name)
        if isinstance(figure, Figure):
            by_label.setdefault(figure.label, []).append(name)
    words = {"assumed": "priors (assumed)"}
    parts = [f"{words.get(label, label)}: {', '.join(names)}" for label, names in sorted(by_label.items())]
    stack = f" ({gpu.stack} fusion table)" if gpu.stack != "generic" else ""
    derived = f"; {derived_origin(chip)}" if derived_origin(chip) else ""
    return f"{STACK_LABELS[chip.execution.mode]}{stack}{derived}; stack figures " + "; ".join(parts)


def gpu_breakdown(result: SimResult) -> dict[str, float]:
    """Where a GPU step's time goes, seconds; the values sum to ``result.step_s``.

    ``compute`` (all phases), ``launches`` (kernel and NCCL launches, a megakernel's one; in a
    graph, the per-kernel gap), ``kernel_fixed`` (a serving stack's fixed time and ramp),
    the batch-growth terms of :mod:`tpusim.engine.gpu_batch` (``expert_groups``,
    ``attention_seqs``, ``sampling_sched``, ``graph_padding``; 0 without their figures),
    ``collectives`` (on the stream: NCCL calls, in-kernel stages, waits for overlapped
    ones), ``exposed_dma`` (waiting for weight/KV copies), ``other_overheads`` (per step,
    per layer: host work, grid barriers) and ``drain``.
    """
    breakdown = result.breakdown_s
    compute = sum(value for key, value in breakdown.items() if key not in NOT_COMPUTE)
    grows = {key: result.batch_terms_s.get(key, 0.0) for key in BATCH_TERMS}  # 0 without the figures
    return {
        "compute": compute,
        "launches": result.launch_s,
        "kernel_fixed": result.kernel_fixed_s,
        **grows,
        "collectives": breakdown.get("collectives", 0.0),
        "exposed_dma": breakdown.get("exposed_dma", 0.0),
        "other_overheads": (breakdown.get("fixed_overheads", 0.0) - result.launch_s - result.kernel_fixed_s
                            - sum(grows.values())),
        "drain": breakdown.get("drain", 0.0),
    }
