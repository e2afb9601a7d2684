"""Pydantic schemas for accelerator chips and systems.

A chip is data. Every number in a catalog YAML is a :class:`Figure`: a value in SI base
units (bytes, seconds, FLOP/s, bytes/s) together with the source it came from. Values are
**per device**, where a device is what JAX sees as one device: one TensorCore on TPU v7
(two per chip), one chip on v5e/v5p/v6e, one GPU on NVIDIA parts. ``devices_per_chip``
says how many devices a chip holds, so a system of N chips has ``N * devices_per_chip``
devices.

The schema keeps published values apart from fitted ones: a :class:`Chip` holds the
published figures; calibration writes a separate overlay (see :mod:`hwmodels.overlay`)
that :func:`hwmodels.catalog.load_chip` applies on top, marking every replaced figure
``calibrated`` while the published file stays untouched.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from hwmodels.provenance import Calibration

# The field's words for each tier and unit, as a user of that chip would say them.
TIER_WORDS = {"vmem": "VMEM", "smem": "SMEM", "shared_memory": "shared memory", "l2": "L2",
              "tmem": "tensor memory"}
UNIT_WORDS = {"mxu": "MXU", "vpu": "VPU", "tensor_core": "tensor cores", "cuda_core": "CUDA cores",
              "cpu": "CPU cores"}


class Figure(BaseModel):
    """One number with where it came from.

    ``value`` is in the unit the field name states (``_bytes``, ``_s``, ``_bytes_per_s``,
    ``_flops_per_s``). ``source`` is a citation key or a sentence ("[TI] jax tpu_info.py",
    "assumed: 90 % of peak, to be calibrated"). ``label`` is ``published`` for catalog
    values, ``measured`` for probe results, ``assumed`` for priors without a measurement,
    ``prior`` for a documented prior a calibration fits (a spec sheet, another system's
    measurement or first principles, never the data it is fitted or judged on) and
    ``calibrated`` for fitted overlays.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float = Field(ge=0.0, description="the value, in the unit named by the field")
    source: str = Field(min_length=1, description="where the value comes from")
    label: Literal["published", "measured", "assumed", "prior", "derived", "calibrated"] = Field(
        default="published", description="what kind of figure this is"
    )
    uncertainty: float | None = Field(
        default=None, ge=0.0, description="one-sigma uncertainty (calibrated figures)"
    )


def _positive(figure: Figure, name: str) -> None:
    if figure.value <= 0.0:
        raise ValueError(f"{name} must be > 0 (got {figure.value})")


class HbmSpec(BaseModel):
    """Off-chip memory of one device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    capacity_bytes: Figure = Field(description="usable HBM per device, bytes")
    peak_bandwidth_bytes_per_s: Figure = Field(description="published peak read bandwidth per device")
    sustained_bandwidth_bytes_per_s: Figure = Field(
        description="bandwidth a stream of large DMAs achieves (measured or assumed); the "
        "engine's HBM server runs at this rate"
    )

    @model_validator(mode="after")
    def _check(self) -> HbmSpec:
        _positive(self.capacity_bytes, "hbm.capacity_bytes")
        _positive(self.peak_bandwidth_bytes_per_s, "hbm.peak_bandwidth_bytes_per_s")
        _positive(self.sustained_bandwidth_bytes_per_s, "hbm.sustained_bandwidth_bytes_per_s")
        if self.sustained_bandwidth_bytes_per_s.value > self.peak_bandwidth_bytes_per_s.value * 1.0001:
            raise ValueError("hbm.sustained_bandwidth_bytes_per_s exceeds the published peak")
        return self


class OnChipMemory(BaseModel):
    """A software-managed or cache tier: TPU VMEM/SMEM, GPU shared memory, L2."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Literal["vmem", "smem", "shared_memory", "l2", "tmem"]
    capacity_bytes: Figure = Field(description="capacity per device (per SM for shared_memory)")
    usable_capacity_bytes: Figure | None = Field(
        default=None,
        description="what explicit buffers may use (capacity less compiler reserve); "
        "defaults to the capacity",
    )
    per: Literal["device", "sm"] = Field(default="device", description="what one capacity covers")

    @model_validator(mode="after")
    def _check(self) -> OnChipMemory:
        _positive(self.capacity_bytes, f"{self.name}.capacity_bytes")
        if self.usable_capacity_bytes is not None and (
            self.usable_capacity_bytes.value > self.capacity_bytes.value
        ):
            raise ValueError(f"{self.name}.usable_capacity_bytes exceeds capacity_bytes")
        return self

    @property
    def display_name(self) -> str:
        """The tier in the field's words: ``VMEM``, ``shared memory``, ``L2``."""
        return TIER_WORDS[self.name]

    @property
    def usable_bytes(self) -> float:
        figure = self.usable_capacity_bytes or self.capacity_bytes
        return figure.value


Dtype = Literal["bf16", "fp8", "int8", "fp4", "f32", "int4"]


class ComputeUnit(BaseModel):
    """A matrix or vector unit with peak rates per operand dtype."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Literal["mxu", "vpu", "tensor_core", "cuda_core", "cpu"]
    peak_flops_per_s: dict[Dtype, Figure] = Field(
        description="peak FLOP/s (or OP/s for integers) per device, by operand dtype"
    )
    tile_rows: int = Field(default=1, ge=1, description="rows of the systolic tile; batch rows pad to it")
    tile_cols: int = Field(default=1, ge=1, description="columns of the systolic tile")
    row_pad: int | None = Field(
        default=None,
        ge=1,
        description="batch rows pad to a multiple of this for the FLOP term (TPU MXU: 8, the "
        "sublane tile, since LHS rows stream through a loaded weight tile; GPU tensor cores: "
        "the MMA M dimension); defaults to tile_rows",
    )
    weight_push_s_per_tile: Figure | None = Field(
        default=None,
        description="time to push one tile_rows x tile_cols weight tile into the array; "
        "bounds a matmul at small batch",
    )
    weight_push_s_per_tile_by_dtype: dict[Dtype, Figure] = Field(
        default_factory=dict,
        description="push cost per tile for weight dtypes that differ from weight_push_s_per_tile "
        "(TPU7x int8 dense weights: converted to bf16 on the way in, ≈ 2x the bf16 cost)",
    )
    dequant_s_per_element: dict[str, Figure] = Field(
        default_factory=dict,
        description="seconds this unit spends per weight element converting a stored format the "
        "matrix unit cannot take natively to its MXU dtype, by weight format name (tpu-v5e: "
        "fp8_e4m3_b256 and mxfp4 -> bf16 on the VPU); absent: the format costs no conversion here "
        "(native, or not modelled)",
    )
    native_weight_dtypes: list[Dtype] = Field(
        default_factory=list,
        description="narrow weight dtypes the array takes as they are stored, pushed with no "
        "conversion on the vector unit (TPU7x: fp8, e4m3 weights against bf16 activations); a "
        "kernel for this chip feeds such weights to it directly, scales applied after the product",
    )
    native_weight_dtypes_source: str | None = Field(
        default=None, description="where ``native_weight_dtypes`` comes from (required when it is set)")
    weight_push_dtypes_as: Dtype | None = Field(
        default=None,
        description="narrow weight dtypes (int8/int4/fp4) run at this dtype's rate "
        "(TPU7x pushes int8/int4 weights at the bf16 rate [INF])",
    )
    dot_overhead_s: Figure | None = Field(
        default=None,
        description="fixed seconds of every matmul the unit is handed, besides its pushes and "
        "FLOPs (the array's fill and drain and the loop step that issues it): a megakernel that "
        "multiplies a streamed tensor panel by panel and chunk by chunk pays it per product "
        "(tpusim.schedule.kernel_layout.matmul_dots); None: not modelled (0)",
    )

    @model_validator(mode="after")
    def _check(self) -> ComputeUnit:
        if not self.peak_flops_per_s:
            raise ValueError(f"{self.name}.peak_flops_per_s needs at least one dtype")
        for dtype, figure in self.peak_flops_per_s.items():
            _positive(figure, f"{self.name}.peak_flops_per_s.{dtype}")
        if self.native_weight_dtypes and not self.native_weight_dtypes_source:
            raise ValueError(f"{self.name}.native_weight_dtypes needs native_weight_dtypes_source")
        return self

    def takes_weights(self, dtype: str) -> bool:
        """Whether the array takes ``dtype`` weights as stored (no vector-unit conversion)."""
        return dtype in self.native_weight_dtypes

    def dequant_for(self, format_name: str) -> float:
        """Seconds per element to dequantise weights stored as ``format_name`` (0: none)."""
        figure = self.dequant_s_per_element.get(format_name)
        return figure.value if figure is not None else 0.0

    def push_for(self, dtype: str | None) -> float:
        """Seconds to push one weight tile of ``dtype`` into the array (0 if not modelled)."""
        if dtype is not None and dtype in self.weight_push_s_per_tile_by_dtype:
            return self.weight_push_s_per_tile_by_dtype[dtype].value  # type: ignore[index]
        return self.weight_push_s_per_tile.value if self.weight_push_s_per_tile is not None else 0.0

    def peak_for(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``, falling back to the slowest listed rate."""
        if dtype in self.peak_flops_per_s:
            return self.peak_flops_per_s[dtype].value  # type: ignore[index]
        if self.weight_push_dtypes_as and self.weight_push_dtypes_as in self.peak_flops_per_s:
            return self.peak_flops_per_s[self.weight_push_dtypes_as].value
        return min(f.value for f in self.peak_flops_per_s.values())


class DmaSpec(BaseModel):
    """The copy engine(s) between HBM and on-chip memory, and how it shares its rate.

    The engine serves its outstanding copies round-robin: ``n`` copies moving at once each
    get ``1 / n`` of the aggregate rate. The aggregate falls once more than
    ``efficient_in_flight`` *contenders* are in flight::

        efficiency(k) = 1 / (1 + concurrency_penalty_per_dma * max(0, k - efficient_in_flight))

    What a contender is (``contention_unit``):

    - ``copy``: every copy in flight (``k = n``; the rule for a chip with no data that says
      otherwise);
    - ``stream``: every distinct *address stream* in flight. A stream is what the kernel
      refills in order: the copies of one buffer ring (the banks of a dense ring, the row
      slabs of one tensor kind, the KV tiles) are one stream; an expert slot reads one
      expert's weights, a region of its own, so each occupied expert slot is a stream.
      Interleaving more independent streams at the engine's round-robin granularity costs
      HBM row-buffer locality; more copies in flight along one stream do not.

    TPU7x [INF] (``shared/reference/tpu7x-components.json``): the dense ring of 12 x 2 MiB
    banks reaches 3.0–3.05 TB/s of 3.2 TB/s per core with 12 banks + 4 expert slots in
    flight, while at batch 1 8 expert slots are 26 % slower than 4 (824 vs 653 µs per 8
    layers) for the same bytes, "because the DMA engine round-robins among outstanding
    transfers". Counting copies cannot fit both (16 copies at full rate, yet the 8-slot run
    slows): by copy, a penalty large enough for the slot sweep also slows the ring whenever
    KV tiles or small parameters join it. Counting streams can: 1 ring + 4 slots = 5 streams
    at full rate, 1 + 8 = 9 past it. (Serving each stream in order as a queue, with the
    round-robin among queues, was tried and rejected: it lets the ring run so far ahead
    that the Muse steps come out 18 % below the measured ones at the published figures.)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    issue_latency_s: Figure = Field(description="fixed issue-to-first-byte cost per DMA, seconds")
    engines: int = Field(default=1, ge=1, description="independent DMA queues per device")
    efficient_in_flight: int = Field(default=4, ge=1, description="contenders (copies or streams, as "
                                     "contention_unit says) in flight before the aggregate rate falls")
    concurrency_penalty_per_dma: Figure = Field(
        description="fractional throughput loss per contender in flight beyond efficient_in_flight"
    )
    contention_unit: Literal["copy", "stream"] = Field(
        default="copy", description="what the penalty counts: every copy in flight, or every distinct "
        "address stream in flight (one buffer ring, or one occupied expert slot)")
    service: Literal["shared", "in_order"] = Field(
        default="shared", description="how issued copies move: 'shared', all at once, each at 1/n of the "
        "aggregate (the round-robin above); 'in_order', one at a time at the whole rate in the order they "
        "were issued, each copy's issue latency overlapping the transfers ahead of it (a later, more urgent "
        "copy waits for every copy issued before it)")
    service_source: str = Field(default="assumed: copies in flight share the rate round-robin",
                                description="where ``service`` comes from (measured / published / assumed)")

    def efficiency(self, in_flight: int) -> float:
        """Aggregate-throughput factor with ``in_flight`` contenders (1.0 = no loss)."""
        extra = max(0, in_flight - self.efficient_in_flight)
        return 1.0 / (1.0 + self.concurrency_penalty_per_dma.value * extra)


class LinkSpec(BaseModel):
    """Chip-to-chip interconnect (ICI, NVLink) as seen by one device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Literal["ici", "nvlink", "pcie", "sibling"]
    bandwidth_bytes_per_s_per_direction: Figure = Field(
        description="per-device, per-direction bandwidth one transfer stream can use"
    )
    latency_s: Figure = Field(description="one-way latency of a small message")
    collective_stage_latency_s: Figure = Field(
        description="latency floor of one collective stage on small payloads"
    )
    message_issue_s: Figure | None = Field(
        default=None, description="sender-side cost of issuing one remote copy (a DMA "
        "descriptor) on this link, seconds; None: not modelled (0)"
    )
    links_per_device: int = Field(default=1, ge=1, description="links usable in parallel")
    topology: Literal["torus2d", "torus3d", "switch", "pair", "none"] = "none"
    domain_devices: int = Field(
        default=1 << 30, ge=1, description="devices reachable over this link (NVL72: 72)"
    )

    @model_validator(mode="after")
    def _check(self) -> LinkSpec:
        _positive(self.bandwidth_bytes_per_s_per_direction, f"{self.name}.bandwidth")
        return self


class GpuExecution(BaseModel):
    """The figures of a GPU's three execution stacks (see :mod:`tpusim.engine.gpu_stack`).

    Serving stack (CUDA graphs, vLLM / SGLang / TensorRT-LLM class), per kernel::

        time = kernel_gap_s + fixed(kind) - pdl_overlap_s + bytes / achieved_bandwidth
        achieved_bandwidth = min(sustained x per_op_efficiency,
                                 per_sm_bandwidth_bytes_per_s x min(sm_count, CTAs))

    ``fixed(kind)`` is ``small_kernel_s`` (norms, RoPE, activation quantize, top-k, permute),
    ``gemm_fixed_s`` (a dense or grouped GEMM) or ``attention_fixed_s`` (decode attention, a
    linear-attention recurrence). A GEMM's CTAs are its output tiles times its K splits
    (``ceil(cols / gemm_tile_cols) x max(1, floor(rows / gemm_split_k_rows))``, summed over
    the experts of a grouped GEMM): a small GEMM occupies few SMs and does not reach the
    bandwidth of a long copy.
    Conventional stacks (serving stack and eager) stream each kernel's weights in
    ``kernel_slab_bytes`` slabs with ``kernel_copies_in_flight`` copies outstanding; a GPU
    megakernel pays ``grid_barrier_s`` per layer and ``in_kernel_stage_latency_s`` per
    collective stage. Small all-reduces (payload per device up to
    ``oneshot_allreduce_max_bytes``) run as a one-shot kernel at
    ``oneshot_allreduce_latency_s`` instead of NCCL's per-call latency.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kernel_gap_s: Figure = Field(description="GPU-side gap between two kernels inside a CUDA graph, seconds")
    small_kernel_s: Figure = Field(description="fixed time of a kernel that moves few bytes, seconds")
    gemm_fixed_s: Figure = Field(description="fixed time of a GEMM kernel beyond its bytes, seconds")
    attention_fixed_s: Figure = Field(description="fixed time of a decode-attention / recurrence kernel, seconds")
    per_sm_bandwidth_bytes_per_s: Figure = Field(description="HBM bandwidth one SM (one CTA) pulls")
    gemm_tile_cols: Figure = Field(description="output columns per CTA of a decode GEMM (count)")
    gemm_split_k_rows: Figure = Field(description="contraction rows per CTA down to which a decode GEMM "
                                      "splits K (split-K / stream-K) to occupy more SMs (count)")
    pdl_overlap_s: Figure = Field(description="programmatic dependent launch: a kernel's prologue hidden "
                                  "under the previous kernel's tail, seconds (0 = off)")
    oneshot_allreduce_max_bytes: Figure = Field(description="largest all-reduce payload per device run "
                                                "as a one-shot kernel, bytes")
    oneshot_allreduce_latency_s: Figure = Field(description="latency of a one-shot all-reduce kernel, seconds")
    kernel_slab_bytes: Figure = Field(description="bytes a conventional kernel's load pipeline lands at a time")
    kernel_copies_in_flight: Figure = Field(description="copies a conventional kernel keeps outstanding (count)")
    grid_barrier_s: Figure = Field(description="a GPU megakernel's grid-wide barrier, once per layer, seconds")
    in_kernel_stage_latency_s: Figure = Field(description="one stage of a device-initiated collective "
                                              "inside a GPU megakernel, seconds")
    stack: str = Field(default="generic", pattern=r"^[a-z0-9][a-z0-9.\-]*$",
                       description="the serving stack's fusion table: generic (tpusim.engine.gpu_fusion) "
                       "or a stack file tpusim/stacks/<name>.yaml (e.g. sglang-k3)")
    single_cta_router_s: Figure | None = Field(default=None, description="fixed time of a routing kernel "
                                               "that runs on one CTA (a fused MoE's in-op top-k at small "
                                               "batch), seconds; stacks that name one need it")
    radix_router_s: Figure | None = Field(default=None, description="fixed time of a multi-CTA fused "
                                          "route + pack + activation-quantize kernel, seconds")
    # What grows with the decode batch beyond bytes and FLOPs (tpusim.engine.gpu_batch); None: no term
    grouped_gemm_expert_s: Figure | None = Field(default=None, description="fixed time of one more distinct "
                                                 "expert in a fused-MoE grouped GEMM (its tiles' prologue and "
                                                 "epilogue), per grouped GEMM, seconds")
    attention_sequence_s: Figure | None = Field(default=None, description="fixed time of one more sequence "
                                                "in a decode-attention kernel (split, metadata, merge), per "
                                                "attention layer, seconds")
    sampling_sequence_s: Figure | None = Field(default=None, description="sampler, scheduler and output "
                                               "processing time of one more running request, per step, seconds")
    eager_host_op_s: Figure | None = Field(default=None, description="host time to issue one kernel of a step "
                                           "that runs without a CUDA graph (a prefill: Python, framework dispatch "
                                           "and launch), seconds; the step takes at least its kernels x this")
    # A served request's time outside the engine's steps (tpusim.serving.first_token); None: not priced
    request_overhead_s: Figure | None = Field(default=None, description="a request's time to first token beyond "
                                              "its prefill at an idle server (HTTP, tokenizing, the scheduler's "
                                              "receipt, streaming the token), seconds")
    request_turnaround_s: Figure | None = Field(default=None, description="closed loop: from a request's last "
                                                "token leaving the scheduler to the same client's next request "
                                                "reaching it (detokenize, HTTP, the client's send, tokenizing), "
                                                "seconds")
    stack_figures_from: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9.\-]*$",
                                           description="another chip (same SM architecture) whose calibrated "
                                           "execution figures this chip takes, labelled derived, when it has "
                                           "no overlay of its own (hwmodels.catalog.load_chip)")


class ExecutionModel(BaseModel):
    """How a decode step is dispatched on this chip."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["megakernel", "per_op_launch", "serving_stack"] = Field(
        description="one persistent kernel per step, one kernel launch per op (eager), or a GPU "
        "serving stack (CUDA graphs, fused kernels; GPU chips with a `gpu` block)"
    )
    launch_overhead_s: Figure = Field(description="dispatch cost of one kernel launch, seconds")
    per_step_overhead_s: Figure = Field(
        description="fixed cost per decode-step call (dispatch, glue, barrier), seconds"
    )
    per_layer_overhead_s: Figure = Field(description="fixed cost per layer inside the step, seconds")
    per_layer_overhead_at: Literal["layer_start", "each_op"] = Field(
        default="layer_start",
        description="where the stream pays per_layer_overhead_s: in one block as a layer starts (a "
        "barrier), or in equal shares at the start of each of the layer's ops (code spread through "
        "the layer, which copies in flight overlap)")
    attention_core_s_per_token: Figure | None = Field(
        default=None,
        description="megakernel: what the attention core's code takes per cached token it folds, the batch's "
        "rows together, its products included (the kernel's KV loop from the compiler's schedule), seconds; "
        "None: the core is priced by its products and vector work")
    attention_core_s_per_tile: Figure | None = Field(
        default=None, description="with attention_core_s_per_token: a KV tile's code beyond its tokens', seconds")
    per_op_efficiency: Figure | None = Field(
        default=None,
        description="fraction of HBM/compute peak a standalone kernel reaches (per_op_launch)",
    )
    gpu: GpuExecution | None = Field(
        default=None, description="GPU stack figures (serving stack, eager, megakernel); GPU chips only"
    )

    @model_validator(mode="after")
    def _check(self) -> ExecutionModel:
        if self.mode == "serving_stack" and self.gpu is None:
            raise ValueError("execution.mode serving_stack needs the execution.gpu figures")
        return self


class Chip(BaseModel):
    """One accelerator chip, described per device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", description="catalog key, e.g. tpu-v7")
    vendor: Literal["google", "nvidia", "host"]
    kind: Literal["tpu", "gpu", "cpu"]
    description: str = ""
    devices_per_chip: int = Field(ge=1, description="JAX devices per chip (TPU v7: 2 TensorCores)")
    hbm: HbmSpec
    on_chip: list[OnChipMemory] = Field(description="on-chip memory tiers")
    compute: list[ComputeUnit]
    dma: DmaSpec
    links: list[LinkSpec] = Field(default_factory=list)
    execution: ExecutionModel
    power_w: Figure | None = Field(default=None, description="board power per chip, watts")
    sm_count: int | None = Field(default=None, ge=1, description="GPU streaming multiprocessors")
    calibration: SkipJsonSchema[Calibration | None] = Field(
        default=None,
        description="set by hwmodels.overlay.apply_overlay: which figures were fitted and on "
        "what; None for published figures (never written in a catalog file)",
    )

    @model_validator(mode="after")
    def _check(self) -> Chip:
        names = [unit.name for unit in self.compute]
        if len(set(names)) != len(names):
            raise ValueError("compute units must have distinct names")
        return self

    @property
    def words(self) -> dict[str, str]:
        """Display words for the engine's generic resources: ``staging`` (the tier weights
        land in), ``mxu`` (the matrix unit) and ``vpu`` (the vector unit) on this chip."""
        return {"staging": self.staging_memory.display_name, "mxu": UNIT_WORDS[self.matrix_unit.name],
                "vpu": UNIT_WORDS[self.vector_unit.name]}

    @property
    def is_calibrated(self) -> bool:
        """Whether a calibrated overlay was applied (the one answer every label reads)."""
        return self.calibration is not None

    def memory(self, name: str) -> OnChipMemory:
        for tier in self.on_chip:
            if tier.name == name:
                return tier
        raise KeyError(f"chip {self.name} has no on-chip memory {name!r}")

    def unit(self, name: str) -> ComputeUnit:
        for unit in self.compute:
            if unit.name == name:
                return unit
        raise KeyError(f"chip {self.name} has no compute unit {name!r}")

    def link(self, name: str) -> LinkSpec:
        for link in self.links:
            if link.name == name:
                return link
        raise KeyError(f"chip {self.name} has no link {name!r}")

    @property
    def matrix_unit(self) -> ComputeUnit:
        for name in ("mxu", "tensor_core", "cpu"):
            for unit in self.compute:
                if unit.name == name:
                    return unit
        return self.compute[0]

    @property
    def vector_unit(self) -> ComputeUnit:
        for name in ("vpu", "cuda_core", "cpu"):
            for unit in self.compute:
                if unit.name == name:
                    return unit
        return self.compute[-1]

    @property
    def staging_memory(self) -> OnChipMemory:
        """The tier prefetched weights land in: VMEM on TPU, shared memory/L2 on GPU."""
        for name in ("vmem", "l2", "shared_memory"):
            for tier in self.on_chip:
                if tier.name == name:
                    return tier
        return self.on_chip[0]


class System(BaseModel):
    """``chips`` copies of one chip joined by its links."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    chip: Chip
    chips: int = Field(ge=1, description="number of chips")
    hosts: int = Field(default=1, ge=1, description="hosts the chips hang off")

    @property
    def devices(self) -> int:
        return self.chips * self.chip.devices_per_chip

    @property
    def name(self) -> str:
        return f"{self.chip.name}x{self.chips}"
