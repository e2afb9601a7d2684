"""Component measurements: one part of the chip measured on its own, and how to predict it.

An end-to-end step time mixes every figure of a chip; a fit on step times alone can be
right for the wrong reasons. The public TPU7x release also measured parts
(``calibration/data/tpu7x-components.json``, a copy of the shared reference, sources in
its ``source`` key). :func:`load_components` turns it into :class:`ComponentRecord`\\ s,
one per measured number, each naming the part of the model it exercises:

| part | records | predicted by | pins |
| --- | --- | --- | --- |
| ``links`` | 4 collective microbenchmarks on 8 cores, the all-gather range, the phase-latency range, 2 sibling copies, 2 cross-chip rates | :func:`tpusim.engine.collectives.collective_time_s` / ``isolated_time_s`` on idle links | link latencies, per-copy issue costs, bandwidths |
| ``hbm`` | the dense DMA ring's achieved rate (3.0–3.05 TB/s) | the figure itself | ``hbm.sustained_bandwidth_bytes_per_s`` |
| ``host`` | fixed cost per decode-step call (70 µs) | the figure itself | ``execution.per_step_overhead_s`` |
| ``slot_sweep`` | Muse int4+bf16 b1 with 4 vs 8 expert slots (653 vs 824 µs per 8 layers) | the ratio of the simulated per-layer times | ``dma.concurrency_penalty_per_dma`` |
| ``breakdown`` | Muse nvfp4+int8 b1 per layer (55 µs, collectives 14 µs) and per step (195 µs fixed) | the engine's per-layer stream times and breakdown | ``execution.per_layer_overhead_s`` |

Choices the mapping makes (each stated where the record is built):

- ``1σ``: half a published range when one is given (3.5–4.7 µs → 4.1 ± 0.6 µs); else an
  assumed 5 % for a single published number (``sigma_note`` says which).
- The slot sweep's absolute times belong to a kernel version whose step time is not
  published (8 × 62 / 8 layers of 653 µs is more than the 3.59 ms step), so only the
  8-slot / 4-slot ratio (1.262) is used.
- The 64×4096 "chip-hierarchical" all-reduce is not one of the plan algorithms; it is kept
  as a record with ``algorithm: null`` and reported, not fitted.
- The ring's achieved rate is taken as the sustained rate itself: on tpu-v7 the DMA
  contention counts address streams (``dma.contention_unit: stream``), and the ring (one stream of 12
  banks) with 4 expert slots is 5 streams, the catalog's ``efficient_in_flight`` (derived
  from this very measurement), so no contention penalty applies.
- The all-gather's payload is not published ("direct copies to every peer", 3.67–4.94 µs):
  it is taken as one bf16 row of 8192 per core (16 KiB), the microbenchmarks' row width.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hwmodels.catalog import display_path
from hwmodels.errors import InputError
from hwmodels.schema import Chip
from hwmodels.textfile import read_user_json
from tpusim.workload.formats import dtype_bytes

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
COMPONENT_DATASETS = {"tpu7x-components": "tpu7x-components.json"}
PARTS = ("links", "hbm", "host", "slot_sweep", "breakdown")
ASSUMED_SIGMA = 0.05  # relative 1σ of a single published number without a range
MUSE_CORES = {"devices": 8, "devices_per_host": 8, "devices_per_chip": 2}
US = 1e-6
GB = 1e9
TB = 1e12


class ComponentRecord(BaseModel):
    """One measured number of one part of the chip (see the module table)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    part: Literal["links", "hbm", "host", "slot_sweep", "breakdown"]
    measurement_set: str = Field(default="", description="which published set it comes from "
                                 "(collective_microbenchmarks, link_copies, ...); default: the part")
    name: str = Field(min_length=1, description="what was measured, human words")
    quantity: Literal["time_s", "rate_bytes_per_s", "ratio", "figure"]
    value: float = Field(gt=0.0, description="measured value in the quantity's unit (seconds, bytes/s, ratio)")
    sigma_rel: float = Field(gt=0.0, description="relative 1σ of the value")
    sigma_note: str = ""
    algorithm: str | None = Field(default=None, description="collective algorithm (collectives)")
    group: str = "all"
    payload_bytes: int = Field(default=0, ge=0, description="collective payload per core, bytes")
    topology: dict[str, int] = Field(default_factory=dict, description="devices, devices_per_host, devices_per_chip")
    copies: list[list[tuple[str, int, int]]] = Field(
        default_factory=list, description="link copies per phase: (link kind, bytes per copy, copies)")
    moved_bytes: int = Field(default=0, ge=0, description="bytes a rate divides by the time")
    figure_path: str | None = Field(default=None, description="figure a 'figure' record measures directly")
    measurement: dict[str, Any] = Field(default_factory=dict, description="end-to-end point a simulated part "
                                        "runs (model, batch, context, routing, schedule, chips)")
    slots: tuple[int, int] | None = Field(default=None, description="slot sweep: (reference, compared) slots")
    phase: str | None = Field(default=None, description="breakdown: layer_total, collectives or fixed_total")
    source: str = ""
    label: str = "published"

    @property
    def modelled(self) -> bool:
        """False for records the model has no algorithm for (reported, not fitted)."""
        return not (self.quantity == "time_s" and self.part == "links" and not self.copies
                    and self.algorithm is None)


def components_path(name: str = "tpu7x-components") -> Path:
    if name not in COMPONENT_DATASETS:
        raise InputError(f"unknown component dataset {name!r}; known: {', '.join(sorted(COMPONENT_DATASETS))}")
    return DATA_DIR / COMPONENT_DATASETS[name]


def _range(values: list[float]) -> tuple[float, float, str]:
    low, high = float(values[0]), float(values[1])
    middle = (low + high) / 2
    return middle, (high - low) / 2 / middle, f"half the published range {low:g}–{high:g}"


def _collective_records(data: dict[str, Any], where: str) -> list[ComponentRecord]:
    records = []
    for index, row in enumerate(data.get("collective_microbenchmarks_8_cores", [])):
        at = f"{where}: collective_microbenchmarks_8_cores[{index}]"
        text = str(row.get("algorithm", ""))
        if row.get("op") == "all_gather":
            value, sigma, note = _range(row["us_range"])
            records.append(ComponentRecord(
                part="links", measurement_set="collective_microbenchmarks", name="all-gather, direct copies to 7 peers (16 KiB each, assumed)",
                quantity="time_s", value=value * US, sigma_rel=sigma, sigma_note=note,
                algorithm="direct_all_gather", payload_bytes=8192 * dtype_bytes("bf16"), topology=MUSE_CORES,
                source=at))
            continue
        rows, cols = row["shape"]
        payload = rows * cols * dtype_bytes(row["transfer_dtype"])
        algorithm = "reduce_scatter_all_gather" if text.startswith(("reduce-scatter", "flat")) else None
        records.append(ComponentRecord(
            part="links", measurement_set="collective_microbenchmarks", name=f"all-reduce {row['transfer_dtype']}[{rows},{cols}] ({text})",
            quantity="time_s", value=row["us"] * US, sigma_rel=ASSUMED_SIGMA,
            sigma_note="assumed 5 %: one published number", algorithm=algorithm,
            payload_bytes=payload, topology=MUSE_CORES, source=at))
    phase = data.get("collective_phase_latency_us")
    if phase:
        value, sigma, note = _range(phase["range"])
        records.append(ComponentRecord(
            part="links", measurement_set="collective_microbenchmarks", name="one latency-bound phase: small copies to the 7 other cores (1 KiB each, assumed)",
            quantity="time_s", value=value * US, sigma_rel=sigma, sigma_note=note,
            copies=[[("sibling", 1024, 1), ("same_host", 1024, 6)]], source=f"{where}: collective_phase_latency_us"))
    return records


def _link_records(data: dict[str, Any], where: str) -> list[ComponentRecord]:
    links = data["link_copies"]
    at = f"{where}: link_copies"
    records = []
    for row in links["sibling_core_same_chip"]:
        size = int(row["bytes"])
        if "us" in row:
            records.append(ComponentRecord(
                part="links", measurement_set="link_copies", name=f"sibling-core copy of {size} B", quantity="time_s",
                value=row["us"] * US, sigma_rel=ASSUMED_SIGMA, sigma_note="assumed 5 %",
                copies=[[("sibling", size, 1)]], source=at))
        else:
            records.append(ComponentRecord(
                part="links", measurement_set="link_copies", name=f"sibling-core copy of {size} B (rate)", quantity="rate_bytes_per_s",
                value=row["gb_per_s"] * GB, sigma_rel=ASSUMED_SIGMA, sigma_note="assumed 5 %",
                copies=[[("sibling", size, 1)]], moved_bytes=size, source=at))
    big = 16 << 20  # the rates are for large copies: 16 MiB, as for the sibling figure
    records.append(ComponentRecord(
        part="links", measurement_set="link_copies", name="cross-chip copy to one peer (16 MiB, rate)", quantity="rate_bytes_per_s",
        value=links["cross_chip_peer_gb_per_s_per_core_per_direction"] * GB, sigma_rel=ASSUMED_SIGMA,
        sigma_note="assumed 5 % ('~45 GB/s')", copies=[[("same_host", big, 1)]], moved_bytes=big,
        source=f"{at}.cross_chip_peer_gb_per_s_per_core_per_direction", label="derived from published"))
    records.append(ComponentRecord(
        part="links", measurement_set="link_copies", name="cross-chip copies to three peers in parallel (16 MiB each, rate)",
        quantity="rate_bytes_per_s", value=134 * GB, sigma_rel=ASSUMED_SIGMA, sigma_note="assumed 5 %",
        copies=[[("same_host", big, 3)]], moved_bytes=3 * big, source=f"{at}.note_cross_chip",
        label="derived from published"))
    return records


def _simulated_records(data: dict[str, Any], where: str, muse: dict[str, Any]) -> list[ComponentRecord]:
    records = []
    sweep = data["expert_slot_sweep_b1"]["points_us_per_8_layers"]
    ratio = float(sweep["8"]) / float(sweep["4"])
    records.append(ComponentRecord(
        part="slot_sweep", name="8 vs 4 expert slots, time per layer (ratio)", quantity="ratio",
        value=ratio, sigma_rel=ASSUMED_SIGMA * 2 ** 0.5, sigma_note="two numbers of assumed 5 % each",
        measurement={**muse, "model": "muse-spark@int4+bf16"}, slots=(4, 8),
        source=f"{where}: expert_slot_sweep_b1 ({sweep['8']} / {sweep['4']} µs)"))
    return records


def _breakdown_records(muse_data: dict[str, Any], muse: dict[str, Any], where: str) -> list[ComponentRecord]:
    breakdown = muse_data.get("breakdown_b1_nvfp4_int8", {})
    per_layer = breakdown.get("per_layer_us", {})
    fixed = breakdown.get("fixed_per_step_us", {})
    point = {**muse, "model": "muse-spark@nvfp4+int8"}
    at = f"{where}: breakdown_b1_nvfp4_int8"
    records = []
    for phase, value in (("layer_total", per_layer.get("total")), ("collectives", per_layer.get("collectives"))):
        if value:
            records.append(ComponentRecord(
                part="breakdown", name=f"Muse nvfp4+int8 b1 per layer: {phase}", quantity="time_s",
                value=value * US, sigma_rel=ASSUMED_SIGMA, sigma_note="assumed 5 %", measurement=point,
                phase=phase, source=at))
    if fixed.get("total"):
        records.append(ComponentRecord(
            part="breakdown", name="Muse nvfp4+int8 b1 per step: fixed (head, dispatch, glue)",
            quantity="time_s", value=fixed["total"] * US, sigma_rel=ASSUMED_SIGMA, sigma_note="assumed 5 %",
            measurement=point, phase="fixed_total", source=at))
    return records


COMPONENT_CHIPS = {"tpu7x-components": "tpu-v7"}  # component data set -> the chip it was measured on


def has_components(chip_name: str, spec: str) -> bool:
    """Whether ``spec`` (``published:<name>``) is component data measured on ``chip_name``."""
    return spec.startswith("published:") and COMPONENT_CHIPS.get(spec.removeprefix("published:")) == chip_name


def load_components(name: str = "tpu7x-components") -> list[ComponentRecord]:
    """The component records of dataset ``name`` (see the module table)."""
    from calibration.sources.tpu7x_published import load_published, read_published

    path = components_path(name)
    where = display_path(path)
    data = read_user_json(path, shown=where)  # package data, read with the same one-line errors
    try:
        hbm = data["hbm_to_vmem_dma"]
        host = data["host"]
        first = load_published()[0]
        muse = {"batch": 1, "context": first.context, "routing": first.routing,
                "schedule": first.schedule, "chips": first.system.chips}
        records = _collective_records(data, where) + _link_records(data, where)
        value, sigma, note = _range(hbm["dense_ring_achieved_tb_per_s"])
        records.append(ComponentRecord(
            part="hbm", name="dense DMA ring, achieved HBM->VMEM rate per core", quantity="figure",
            value=value * TB, sigma_rel=sigma, sigma_note=note,
            figure_path="hbm.sustained_bandwidth_bytes_per_s", source=f"{where}: hbm_to_vmem_dma"))
        records.append(ComponentRecord(
            part="host", name="fixed cost per decode-step call", quantity="figure",
            value=host["fixed_per_step_us"] * US, sigma_rel=ASSUMED_SIGMA * 2, sigma_note="assumed 10 % ('≈ 70 µs')",
            figure_path="execution.per_step_overhead_s", source=f"{where}: host.fixed_per_step_us"))
        records += _simulated_records(data, where, muse)
        records += _breakdown_records(read_published(), muse, where)
    except (KeyError, TypeError, IndexError, ValueError) as error:
        raise InputError(f"{where}: unexpected component data ({error})") from None
    return records


def topology_of(record: ComponentRecord) -> Any:
    from tpusim.workload.collectives import Topology

    return Topology(**record.topology)


def predict_isolated(chip: Chip, record: ComponentRecord) -> float:
    """Prediction of a ``links``, ``hbm`` or ``host`` record (no engine run needed)."""
    from calibration.core.parameters import figure_value
    from tpusim.engine.collectives import collective_time_s, isolated_time_s

    if record.quantity == "figure":
        assert record.figure_path is not None
        return figure_value(chip, record.figure_path)
    if record.copies:
        time_s = isolated_time_s(chip, [list(phase) for phase in record.copies])
    elif record.algorithm is not None:
        time_s = collective_time_s(chip, record.algorithm, record.group, record.payload_bytes, topology_of(record))
    else:
        raise ValueError(f"component {record.name}: nothing to predict (no algorithm)")
    return record.moved_bytes / time_s if record.quantity == "rate_bytes_per_s" else time_s
