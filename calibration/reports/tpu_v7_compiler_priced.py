"""TPU7x priced by its compiler (issue 46, item 4): K3 on 16 TPU v7 with an interval from the
v5e first-principles method's own error.

``python -m calibration.reports.tpu_v7_compiler_priced [--batch 1,2,4,8]``

The method is the one :mod:`calibration.reports.tpu_v5e_first_principles` judged on the v5e
(micro-probes and the compiler's static schedule, no kernel run), moved to TPU7x:

1. **Parts** (:func:`parts_chip`): the catalog's ``tpu-v7`` with the component stages of
   :mod:`calibration.sources.tpu_stages` fitted on the TPU7x reference measurements
   (``tpu7x-components``): links (collectives, link copies), hbm (the dense DMA ring), host
   (the per-step cost), slot_sweep (the DMA engine's sharing). Not the ``breakdown`` stage nor
   the end-to-end fit: those fit a per-layer figure and the MXU push on the Muse Spark
   *kernel's* step times — kernel-level figures, which the v5e first-principles chip also
   leaves out (it takes none from the kernel's runs). The MXU's bf16 push is the catalog's
   [INFM] microbenchmark statement, as v5e's is its product probe.
2. **Compute** (:func:`compiler_priced_chip`): each routed-expert part's cost per weight from
   libtpu's static schedule of its panel loop compiled for ``tpu7x`` with the FP8 products
   (``calibration/data/tpu7x-static-schedule.jsonl``, decoder ``fp8-mxu``): panel bundles /
   clock / weights a panel, on ``compute.vpu.dequant_s_per_element.<format>`` (``derived``; tpu-v7 lists none) —
   exactly where the v5e method puts its decoders' static figure, the engine adding the MXU
   stage behind it, so the residuals of step 4 describe this composition.
3. **Clock** (:func:`tpu7x_clock_hz`): the reference set gives no TPU v7 clock and says not
   to derive one from MXU counts. It is derived from the catalog's measured push instead: one
   bf16 256 x 256 weight tile is ``tile bytes / vreg bytes`` = 32 ``vmatpush`` operations, one
   MXU slot each (checked on the static record: the FP8 gate/up panel's MXU slots equal its
   weight vregs), and the compiler issues a push a cycle into an array, so 32 cycles take the
   [INFM] 20 ns: 1.6 GHz (``derived``; were the array to take two pushes a cycle, 0.8 GHz and
   twice the compute; were the 20 ns the kernel's dense panel loop's issue rate, 2.19 GHz). The
   interval of step 4 does not hold this uncertainty.
4. **Interval** (:func:`residual_interval`): the relative residuals ``r = simulated / measured -
   1`` of the v5e first-principles chip on every committed decode of the kernel's builds with
   the expert loop unrolled (:func:`v5e_residuals`), pooled over batches. Under
   exchangeability a new decode's residual falls between the ``floor((n+1) a/2)``-th and the
   ``ceil((n+1)(1 - a/2))``-th smallest of ``n`` (split conformal, level ``1 - a``); with
   ``n`` from 19 to 38 at 90 % that is the minimum and the maximum. Since ``measured = simulated / (1 +
   r)``, the interval is ``[point / (1 + r_high), point / (1 + r_low)]``. **Prior**: that the
   method's v5e error transfers to TPU7x (another chip, another compiler target, another
   model size); no TPU7x run of the kernel exists to check it.

Every figure is labelled: the point ``simulated``, the interval ``derived`` (from the v5e
residuals) under the transfer ``prior``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from calibration.reports.tpu_v5e_plan import FORMAT_OF_PART
from calibration.sources.measurements import Measurement
from calibration.sources.predict import Predictor
from calibration.sources.tpu_code_issue import code_issue
from calibration.sources.tpu_layer_static import (
    attention_core_figures,
    layer_remainder,
    put_attention_core,
)
from calibration.sources.tpu_probes import PER_LAYER
from hwmodels import values
from hwmodels.catalog import load_chip
from hwmodels.errors import InputError
from hwmodels.overlay import _figure_slot
from hwmodels.schema import Chip
from megakernel.kernel_moe import EXPERT_LIST_BUILD
from megakernel.quant_mxu import ROW_EXPANSION_MAX_ROWS
from tpusim.cli_options import add_batch_option, add_schedule_option
from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, PANEL_UNROLL

DATA = Path(__file__).resolve().parents[1] / "data"
TPU7X_STATIC_PATH = DATA / "tpu7x-static-schedule.jsonl"
MXU_DECODER = "fp8-mxu"  # the static records of the FP8-to-the-MXU products (megakernel.quant_mxu)
VREG_BYTES = 8 * 128 * 4  # one vector register: 8 sublanes x 128 lanes of 32-bit words
BF16_BYTES = 2
PANEL_COLS = 128  # an expert part's panel is 128 columns wide (the static records' k x 128)
STAGES = ("links", "hbm", "host", "slot_sweep")  # the component stages (module docstring, step 1)
RANK_TOLERANCE = 1e-9
COMPILED_FOR = ("kimi-k3", 16)  # the program the static records were compiled for (k3-tp32, 32 devices)
LABEL = ("compiler-priced (simulated, TPU7x static schedule; interval from the v5e first-principles "
         "residuals)")


class CompilerPricedConfig(BaseModel):
    """What to predict: K3 on ``chips`` TPU v7 at each batch, one schedule, one context."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "kimi-k3"
    chips: int = Field(default=16, ge=1)
    batches: tuple[int, ...] = (1, 2, 4, 8)
    context_tokens: int = Field(default=1024, ge=1)
    schedule: str = "published"  # the design the kernel implements and was compiled with
    routing: str = "uniform"  # a tpusim.workload.routing.parse_routing spec
    seed: int = Field(default=0, ge=0)  # of the routing draw
    level: float = Field(default=0.90, gt=0.0, lt=1.0)

    @field_validator("batches")
    @classmethod
    def _positive(cls, batches: tuple[int, ...]) -> tuple[int, ...]:
        if not batches or any(b < 1 for b in batches):
            raise ValueError("batches must be a non-empty list of integers >= 1")
        return batches

    @model_validator(mode="after")
    def _compiled_program(self) -> CompilerPricedConfig:
        # the static records are of K3's TP32 shard's panels: another model or device count has others
        if (self.model, self.chips) != COMPILED_FOR:
            raise ValueError(f"the TPU7x static records price {COMPILED_FOR[0]} on {COMPILED_FOR[1]} chips only, "
                             f"not {self.model} on {self.chips}")
        return self


class Interval(BaseModel):
    """A relative-residual interval: ``r_low <= simulated / measured - 1 <= r_high``."""

    model_config = ConfigDict(frozen=True)

    r_low: float
    r_high: float
    level: float
    residuals: int
    rule: str

    def bounds_ms(self, point_ms: float) -> tuple[float, float]:
        """(low, high) ms of the measured step the point ``point_ms`` allows."""
        return point_ms / (1.0 + self.r_high), point_ms / (1.0 + self.r_low)


class PricedRow(BaseModel):
    """One batch: the point (simulated), its interval (derived), and the points it moved from."""

    model_config = ConfigDict(frozen=True)

    batch: int
    step_ms: float  # simulated on the compiler-priced chip
    step_ms_low: float
    step_ms_high: float
    width_rel: float  # (high - low) / point
    catalog_ms: float  # simulated on the catalog chip (priors only), same schedule
    parts_ms: float  # simulated on the parts' chip, catalog compute
    down_rows: int  # which static record priced the down part
    label: str = LABEL
    interval_label: str = "derived from the v5e first-principles residuals; prior: their error transfers to TPU7x"


def residual_interval(residuals: Sequence[float], level: float = 0.90) -> Interval:
    """Split-conformal bounds on a relative residual from ``residuals`` (module docstring, 4).
    Too few residuals for ``level`` is an error, not a narrower interval."""
    ordered = sorted(float(r) for r in residuals)
    if ordered and ordered[0] <= -1.0:
        raise InputError(f"relative residual {ordered[0]:.3f} <= -1: a simulated time of zero or less")
    n, alpha = len(ordered), 1.0 - level
    # ranks rounded with a tolerance: (19 + 1) x 0.95 is 19.000000000000004 in floats
    low_rank = math.floor((n + 1) * alpha / 2 + RANK_TOLERANCE)
    high_rank = math.ceil((n + 1) * (1 - alpha / 2) - RANK_TOLERANCE)
    if low_rank < 1 or high_rank > n:
        need = math.ceil(2 / alpha) - 1
        raise InputError(f"{n} residuals cannot bound a {level:.0%} interval (split conformal needs >= {need})")
    return Interval(r_low=ordered[low_rank - 1], r_high=ordered[high_rank - 1], level=level, residuals=n,
                    rule=f"order statistics {low_rank} and {high_rank} of {n} relative residuals")


@cache
def v5e_residuals() -> tuple[tuple[str, int, float], ...]:
    """(schedule, batch, simulated / measured - 1) of the v5e first-principles chip (its
    decoders' static figures at each batch's rows) on every committed decode of the kernel's
    builds with the expert loop unrolled (the kernel as it is: panel loops 4/2, 8/2 and their
    variants; the one-panel builds' stall is gone from the kernel TPU7x would run), its MLA core
    priced as TPU7x's is, by the KV loop's static bundles (``core_probe=False``: no ``mla_core``
    probe runs on TPU7x, so the static core's error on the v5e belongs in the interval)."""
    from calibration.reports.tpu_v5e_first_principles import errors, fp_chips
    from calibration.sources.tpu_chip_records import build_records
    from megakernel.quant_pairs import KERNEL_DECODER

    builds = sorted({(r.panel_unroll, r.expert_list) for r in build_records(KERNEL_DECODER) if r.panel_unroll[1] > 1})
    rows = [row for build, listed in builds
            for row in errors(fp_chips(build, listed, core_probe=False), build, listed)]
    return tuple((name, batch, sim / ms - 1.0) for name, batch, ms, sim in rows)


def static_records(path: Path | str = TPU7X_STATIC_PATH) -> list[dict[str, Any]]:
    """The TPU7x ``expert_product`` static records of the FP8-to-the-MXU products."""
    found = [r for line in Path(path).read_text().splitlines() if line.strip()
             for r in [json.loads(line)]
             if r.get("chip") == "tpu-v7" and r.get("probe") == "expert_product"
             and r.get("params", {}).get("decoder") == MXU_DECODER]
    if not found:
        raise InputError(f"{path}: no tpu-v7 static record of the {MXU_DECODER} products")
    return found


def record_for(records: Sequence[dict[str, Any]], part: str, batch: int) -> dict[str, Any]:
    """The record that prices ``part`` at ``batch``: the one at ``batch`` rows when the kernel
    multiplies row by row there (:data:`ROW_EXPANSION_MAX_ROWS`), else the smallest recorded
    rows >= batch (one product per block: the same bundles at rows 1-8, quant_mxu), else the
    largest."""
    mine = sorted((r for r in records if r["params"]["part"] == part), key=lambda r: r["params"]["rows"])
    if not mine:
        raise InputError(f"no {MXU_DECODER} static record of the {part} part")
    exact = [r for r in mine if r["params"]["rows"] == batch]
    if exact:
        return exact[0]
    if batch <= ROW_EXPANSION_MAX_ROWS and part == "down":
        raise InputError(f"no down static record at rows {batch}: the kernel multiplies row by row there")
    above = [r for r in mine if r["params"]["rows"] >= batch]
    return above[0] if above else mine[-1]


def tpu7x_clock_hz(chip: Chip, records: Sequence[dict[str, Any]]) -> tuple[float, str]:
    """(clock Hz, source): the catalog's bf16 push per tile over the pushes a tile takes
    (module docstring, 3), after checking on a static record that a push is one vreg."""
    unit = chip.matrix_unit
    if unit.weight_push_s_per_tile is None:
        raise InputError(f"{chip.name}: no compute.mxu.weight_push_s_per_tile to derive a clock from")
    gate_up = record_for(records, "gate_up", 1)
    weight_vregs = gate_up["params"]["k"] * PANEL_COLS // VREG_BYTES  # FP8: one byte a weight
    if gate_up["panel_units"].get("MXU") != weight_vregs:
        raise InputError(f"static record: {gate_up['panel_units'].get('MXU')} MXU slots for {weight_vregs} weight "
                         "vregs; a push is not one vreg, the clock derivation does not hold")
    pushes = unit.tile_rows * unit.tile_cols * BF16_BYTES // VREG_BYTES
    push_s = unit.weight_push_s_per_tile.value
    clock_hz = pushes / push_s
    return clock_hz, (f"derived: {pushes} pushes a bf16 {unit.tile_rows}x{unit.tile_cols} tile (one vreg, one MXU slot "
                      f"each: {weight_vregs} slots for {weight_vregs} vregs in the FP8 gate/up panel) at one a cycle "
                      f"in {push_s * 1e9:.0f} ns ({unit.weight_push_s_per_tile.source})")


@cache
def parts_chip() -> Chip:
    """tpu-v7 with the component stages fitted on the TPU7x reference (module docstring, 1)."""
    from calibration.sources.loaders import load_measurements, usable_for
    from calibration.sources.tpu_calibration import run_stages
    from calibration.sources.tpu_components import load_components

    published = load_chip("tpu-v7", calibrated=False)
    components = load_components("tpu7x-components")
    points = usable_for(load_measurements("published:tpu7x-musespark"), published.name, published.kind)
    return run_stages(STAGES, published, points, components, Predictor())[0]


def loop_iteration_s(clock_hz: float) -> tuple[float, str]:
    """(seconds, source) a taken loop iteration costs beyond its bundles on TPU7x: the v5e's,
    measured by the ``code_size`` probe (:mod:`calibration.sources.tpu_code_issue`), carried in
    cycles (prior: the loop-back costs TPU7x the same cycles); 0 without those records."""
    issue = code_issue()
    if issue is None:
        return 0.0, "none (no code_size records)"
    cycles = issue.loop_iteration_s * issue.bundles_per_s
    return cycles / clock_hz, (f"{cycles:.1f} cycles a loop iteration, the v5e's (code_size probe, {issue.date}: "
                               f"{issue.loop_iteration_s * 1e9:.1f} ns at {issue.bundles_per_s / 1e9:.3f} G bundles/s), "
                               "carried in cycles (prior)")


def compiler_priced_chip(base: Chip, batch: int, path: Path | str = TPU7X_STATIC_PATH) -> tuple[Chip, int]:
    """(``base`` with each expert part's static-schedule cost per weight at ``batch`` and the
    layer's own work from the static schedule of the kernel's layer loop compiled for tpu7x,
    the down record's rows) (module docstring, 2)."""
    records = static_records(path)
    clock_hz, clock_source = tpu7x_clock_hz(base, records)
    loop_s, loop_source = loop_iteration_s(clock_hz)
    data = base.model_dump(mode="python")
    down_rows = 0
    for part, format_name in FORMAT_OF_PART.items():
        record = record_for(records, part, batch)
        weights = record["params"]["k"] * PANEL_COLS
        value = (record["panel_bundles"] / clock_hz + loop_s / EXPERT_PANEL_UNROLL) / weights
        vector = next(unit for unit in data["compute"] if unit["name"] == base.vector_unit.name)
        vector.setdefault("dequant_s_per_element", {})[format_name] = {"value": value, "label": "derived", "source": (
            f"derived from libtpu's static schedule for tpu7x (expert_product {part}/{MXU_DECODER}, rows "
            f"{record['params']['rows']}, {record['date'][:10]}): ({record['panel_bundles']} bundles a panel / "
            f"{clock_hz / 1e9:.2f} GHz + {loop_s * 1e9:.1f} ns a panel-loop iteration of {EXPERT_PANEL_UNROLL}) / "
            f"{weights} weights; clock {clock_source}; loop {loop_source}")}
        if part == "down":
            down_rows = record["params"]["rows"]
    chip = Chip.model_validate(data)
    # the kernel as it is (its expert list); a build of it not yet compiled for tpu7x: the nearest, named
    value, source = layer_remainder(chip, batch, (PANEL_UNROLL, EXPERT_PANEL_UNROLL), path, clock_hz,
                                    expert_list=EXPERT_LIST_BUILD, loop_iteration_s=loop_s)
    parent, name = _figure_slot(data, PER_LAYER)
    parent[name] = {**parent[name], "value": value, "label": "derived", "source": f"{source} (tpu7x); clock {clock_source}; loop {loop_source}"}
    # the MLA core's KV loop, as the v5e method prices it
    put_attention_core(data, attention_core_figures(batch, (PANEL_UNROLL, EXPERT_PANEL_UNROLL), path, clock_hz,
                                                    expert_list=EXPERT_LIST_BUILD, loop_iteration_s=loop_s),
                       f" (tpu7x); clock {clock_source}; loop {loop_source}")
    # paid where the v5e method pays it (the layer's code, through the layer: tpu-v5e's rule), so the
    # v5e residuals of step 4 describe this composition too
    data["execution"]["per_layer_overhead_at"] = load_chip("tpu-v5e", calibrated=False).execution.per_layer_overhead_at
    return Chip.model_validate(data), down_rows


def _point(config: CompilerPricedConfig, batch: int) -> Measurement:
    return Measurement.model_validate({
        "model": config.model, "system": {"chip": "tpu-v7", "chips": config.chips}, "batch": batch,
        "context": config.context_tokens, "schedule": config.schedule, "routing": config.routing,
        "backend": "simulated",
        "ms_per_step_median": 1.0})


def predict(config: CompilerPricedConfig | None = None,
            residuals: Sequence[float] | None = None) -> list[PricedRow]:
    """One :class:`PricedRow` per batch of ``config``; ``residuals`` (default: the v5e
    first-principles method's, :func:`v5e_residuals`) set the interval."""
    config = config or CompilerPricedConfig()
    interval = residual_interval([r for *_, r in v5e_residuals()] if residuals is None else residuals, config.level)
    catalog, parts, predictor = load_chip("tpu-v7", calibrated=False), parts_chip(), Predictor(seed=config.seed)
    rows = []
    for batch in config.batches:
        chip, down_rows = compiler_priced_chip(parts, batch)
        point = _point(config, batch)
        step_ms = predictor.predict(chip, point) * 1e3
        low, high = interval.bounds_ms(step_ms)
        rows.append(PricedRow(batch=batch, step_ms=step_ms, step_ms_low=low, step_ms_high=high,
                              width_rel=(high - low) / step_ms, catalog_ms=predictor.predict(catalog, point) * 1e3,
                              parts_ms=predictor.predict(parts, point) * 1e3, down_rows=down_rows))
    return rows


def interval_note(residuals: Sequence[float] | None = None, level: float = 0.90) -> str:
    """How the interval is formed, in one line (the compare notes print it)."""
    interval = residual_interval([r for *_, r in v5e_residuals()] if residuals is None else residuals, level)
    return (f"{interval.level:.0%} interval: the v5e first-principles method's relative residuals on its "
            f"{interval.residuals} committed decodes ({interval.rule}: {interval.r_low:+.1%} .. "
            f"{interval.r_high:+.1%}), applied as point / (1 + r); prior: that error transfers to TPU7x")


def markdown(rows: Sequence[PricedRow]) -> str:
    out = ["| batch | compiler-priced ms (simulated) | 90 % interval ms (derived) | width | parts' chip ms | "
           "catalog ms (priors) |", "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r.batch} | {r.step_ms:.3f} | {r.step_ms_low:.3f}–{r.step_ms_high:.3f} | {r.width_rel:.1%} | "
                   f"{r.parts_ms:.3f} | {r.catalog_ms:.3f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.reports.tpu_v7_compiler_priced", allow_abbrev=False)
    add_batch_option(parser, default="1,2,4,8", type=None, help="comma-separated batch sizes (default: 1,2,4,8)")
    add_schedule_option(parser, default="published", help="the schedule simulated (default: published)")
    args = parser.parse_args(argv)
    try:
        batches = tuple(values.number_list(args.batch, "--batch", kind=int, minimum=1))
        rows = predict(CompilerPricedConfig(batches=batches, schedule=args.schedule))
    except (InputError, ValidationError) as error:
        sys.stderr.write(f"tpu_v7_compiler_priced: {error}\n")
        return 2
    by_class = {}
    for name, batch, r in v5e_residuals():
        by_class.setdefault("b1" if batch == 1 else "b>=2", []).append((name, batch, r))
    sys.stdout.write(markdown(rows) + "\n\n" + interval_note() + "\n")
    for key, found in by_class.items():
        rs = [r for *_, r in found]
        sys.stdout.write(f"v5e residuals {key}: {len(rs)} decodes, {min(rs):+.1%} .. {max(rs):+.1%}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
