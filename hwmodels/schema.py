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

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


class Figure(BaseModel):
    """One number with where it came from.

    ``value`` is in the unit the field name states (``_bytes``, ``_s``, ``_bytes_per_s``,
    ``_flops_per_s``). ``source`` is a citation key or a sentence ("[TI] jax tpu_info.py",
    "assumed: 90 % of peak, to be calibrated"). ``label`` is ``published`` for catalog
    values, ``measured`` for probe results, ``assumed`` for priors without a measurement and
    ``calibrated`` for fitted overlays.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float = Field(ge=0.0, description="the value, in the unit named by the field")
    source: str = Field(min_length=1, description="where the value comes from")
    label: Literal["published", "measured", "assumed", "derived", "calibrated"] = Field(
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
    weight_push_dtypes_as: Dtype | None = Field(
        default=None,
        description="narrow weight dtypes (int8/int4/fp4) run at this dtype's rate "
        "(TPU7x pushes int8/int4 weights at the bf16 rate [INF])",
    )

    @model_validator(mode="after")
    def _check(self) -> ComputeUnit:
        if not self.peak_flops_per_s:
            raise ValueError(f"{self.name}.peak_flops_per_s needs at least one dtype")
        for dtype, figure in self.peak_flops_per_s.items():
            _positive(figure, f"{self.name}.peak_flops_per_s.{dtype}")
        return self

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
    """The copy engine(s) between HBM and on-chip memory.

    Concurrency: the engine serves outstanding descriptors round-robin; beyond
    ``efficient_in_flight`` concurrent DMAs the aggregate throughput falls by a factor
    ``1 / (1 + concurrency_penalty_per_dma * (n - efficient_in_flight))``. TPU7x: 4 expert
    slots in flight beat 8 (653 vs 824 µs) [INF], hence penalty ≈ 0.0655 past 4.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    issue_latency_s: Figure = Field(description="fixed issue-to-first-byte cost per DMA, seconds")
    engines: int = Field(default=1, ge=1, description="independent DMA queues per device")
    efficient_in_flight: int = Field(default=4, ge=1, description="DMAs in flight before contention")
    concurrency_penalty_per_dma: Figure = Field(
        description="fractional throughput loss per DMA in flight beyond efficient_in_flight"
    )

    def efficiency(self, in_flight: int) -> float:
        """Aggregate-throughput factor with ``in_flight`` concurrent DMAs (1.0 = no loss)."""
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


class ExecutionModel(BaseModel):
    """How a decode step is dispatched on this chip."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["megakernel", "per_op_launch"] = Field(
        description="one persistent kernel per step, or one kernel launch per op"
    )
    launch_overhead_s: Figure = Field(description="dispatch cost of one kernel launch, seconds")
    graph_launch_overhead_s: Figure | None = Field(
        default=None, description="per-kernel cost inside a captured graph (CUDA graphs)"
    )
    per_step_overhead_s: Figure = Field(
        description="fixed cost per decode-step call (dispatch, glue, barrier), seconds"
    )
    per_layer_overhead_s: Figure = Field(description="fixed cost per layer inside the step, seconds")
    per_op_efficiency: Figure | None = Field(
        default=None,
        description="fraction of HBM/compute peak a standalone kernel reaches (per_op_launch)",
    )


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

    @model_validator(mode="after")
    def _check(self) -> Chip:
        names = [unit.name for unit in self.compute]
        if len(set(names)) != len(names):
            raise ValueError("compute units must have distinct names")
        return self

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
