"""The K3-shard kernel's own fixed-cost probe -> per-expert and per-layer figures of tpu-v5e.

The micro-probes (:mod:`calibration.sources.tpu_probes`) time pieces of work outside the
kernel. This probe times the kernel itself with its experts capped: the K3-shard megakernel
at batch 1 running only the first ``c`` of each layer's 16 chosen experts
(``megakernel.runner.RunConfig.expert_cap``; sets ``v5e-k`` (``bytes`` decoders) and ``v5e-p``
(``words32``) of ``calibration/tpu_bench/sets.json``; each run says its ``decoder``),
``published`` at c = 4, 8, 12 and ``naive`` at c = 4, kept apart from the decodes in
``calibration/data/tpu-v5e-fixed-cost.jsonl``. What grows with ``c`` is the experts'
work; what stays is everything else a layer does. Runs at c = 16 (every expert at batch 1)
are the decodes the fit judges and are not read here; no decode step time is.

Two figures follow, each by a rule on the simulator's predictions of these runs (the
programs as they ran: each row's first ``c`` experts, :func:`tpusim` builds them from the
runs' routing traces):

| figure | rule |
| --- | --- |
| ``compute.vpu.dequant_s_per_element.*`` (both formats, one factor) | the published runs' least-squares ms per expert over ``c`` (their expert copies are hidden: the simulator's exposed DMA is the same at every ``c``), against the simulator's at the micro-probe rates and at half of them (the slope is linear in the factor while an expert's compute outlasts its copy): the factor on the micro-probe rates that makes the two slopes equal; 1 where the measured slope is under the one at half the rates (the experts are copy-bound on the chip, their decoders hidden: the slope says nothing of them) |
| ``execution.per_layer_overhead_s`` | with that factor, the per-layer cost at which the simulator's mean error over the four runs is zero (Brent's root on 0 … 1 ms; the error grows with it; 0 if the runs are faster than the simulator without it): the work a layer does that the simulator's ops do not price, paid on the compute stream |

Each figure moves the other a little (a longer layer hides more of the copies), so the two
rules alternate, three rounds, each slope taken at the last per-layer cost.

On the committed runs of the calibration study's kernel (``words32``, the default decoder
:data:`calibration.sources.tpu_probes.CALIBRATION_DECODER`): 22.9 µs a routed expert on the
chip (factor 0.80 on its micro-probe rates), and about 52 µs a layer the ops leave out (67 µs
before the probes' repeat pairs were taken within one session, 2026-12-06; an empty layer loop costs
0.07 µs, the ``layer_loop`` probe; the kernel's top-k 4.5-5 µs, the ``routing`` probe). The
earlier ``bytes`` kernel's runs (``decoder="bytes"``) give 42.7 µs an expert against 46.2
(factor 0.92) and about 60 µs a layer. Both figures are labelled ``derived``: measured runs
read through the simulator. ``tests/test_tpu_fixed_cost.py`` holds both decoders to these.

Any build of the kernel can be refit on its own capped runs (``panel_unroll``; a chip other
than the micro-probes' whose dequant rates the factor scales, :func:`refit_chip`): the kernel
as it is now (``pairs-fold``, panel loops 4/2; set v5e-aa) is copy-bound per expert (9.2 µs an
expert, under the simulator's copy at the pooled streaming rate), so its factor is 1 and its
layer cost about 47 µs (:func:`calibration.reports.tpu_v5e_plan.build_chip`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import brentq

from calibration.core.fitting import fit_line
from calibration.sources.tpu_chip_records import (
    DECODE_CONTEXT,
    KERNEL_PATH,
    ChipRecord,
    load_chip_records,
    record_step,
    simulate_record_ms,
)
from calibration.sources.tpu_probes import (
    CALIBRATION_DECODER,
    DEQUANT_PROBES,
    PER_LAYER,
    PROBES_PATH,
    dequant_path,
    load_probes,
    probe_chip,
    probe_figures,
    record_decoder,
)
from hwmodels.overlay import _figure_slot
from hwmodels.schema import Chip

FIXED_COST_PATH = KERNEL_PATH.parent / "tpu-v5e-fixed-cost.jsonl"  # what calibration.tpu_bench.ingest writes
CAPS = (4, 8, 12)  # below the model's top_k: no capped program is a decode
SLOPE_SCHEDULE = "published"
FIT_SCHEDULES = (SLOPE_SCHEDULE, "naive")  # the fixed-cost probe's design: published at 4/8/12 experts, naive at 4
PER_LAYER_BRACKET_S = (0.0, 1e-3)
ROUNDS = 3
# the second dequant factor the slope is read at: low enough to tell, high enough that an
# expert's compute still outlasts its copy (below, the slope is the copy's, not the compute's)
HALF = 0.5


@dataclass(frozen=True)
class FixedCost:
    dequant_factor: float  # on the micro-probe dequant rates
    per_layer_s: float
    slope_ms_per_expert: float  # measured, published runs
    runs: tuple[str, ...]
    source: str


def capped_runs(path: Path | str = FIXED_COST_PATH, decoder: str = CALIBRATION_DECODER,
                panel_unroll: tuple[int, int] | None = None, batch: int | None = 1,
                expert_list: str | None = None) -> list[ChipRecord]:
    """The fixed-cost probe runs (expert caps in :data:`CAPS`) of ``path`` that ran ``decoder``
    at ``batch`` (None: any batch), and, when given, the panel loops' ``panel_unroll`` and the
    ``expert_list`` build (one build of the kernel)."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    present = {row.get("expert_cap") for row in rows if record_decoder(row) == decoder}
    return [run for cap in CAPS if cap in present
            for run in load_chip_records(path, expert_cap=cap, decoder=decoder)
            if (panel_unroll is None or run.panel_unroll == tuple(panel_unroll))
            and (batch is None or run.batch == batch) and (expert_list is None or run.expert_list == expert_list)]


def capped_series(runs: list[ChipRecord]) -> list[ChipRecord]:
    """The runs of ``runs`` the fixed-cost rules read: the probe's own design, :data:`FIT_SCHEDULES`
    at the decodes' context (:data:`~calibration.sources.tpu_chip_records.DECODE_CONTEXT`). A capped
    run of another schedule or context (set v5e-as's, to locate a gap) is a held-out check, never
    fitted."""
    return [run for run in runs if run.schedule in FIT_SCHEDULES and run.context == DECODE_CONTEXT]


def _with(chip: Chip, factor: float, per_layer_s: float | None) -> Chip:
    data = chip.model_dump(mode="python")
    for format_name in DEQUANT_PROBES.values():
        parent, name = _figure_slot(data, dequant_path(format_name))
        parent[name] = {**parent[name], "value": parent[name]["value"] * factor}
    if per_layer_s is not None:
        parent, name = _figure_slot(data, PER_LAYER)
        parent[name] = {**parent[name], "value": per_layer_s}
    return Chip.model_validate(data)


def refit_chip(chip: Chip, found: FixedCost) -> Chip:
    """``chip`` with ``found``'s two figures, labelled ``derived`` with their source: its dequant
    rates scaled by the factor, the per-layer cost set."""
    data = _with(chip, found.dequant_factor, found.per_layer_s).model_dump(mode="python")
    for path in [dequant_path(f) for f in DEQUANT_PROBES.values()] + [PER_LAYER]:
        parent, name = _figure_slot(data, path)
        note = (f"; x {found.dequant_factor:.3f}" if path != PER_LAYER
                else f"; {found.per_layer_s * 1e6:.1f} µs a layer the simulator's ops leave out")
        parent[name] = {**parent[name], "label": "derived", "source": f"{parent[name].get('source', '')}; "
                        f"refit: {found.source}{note}"}
    return Chip.model_validate(data)


def simulated_ms(runs: list[ChipRecord], chip: Chip) -> list[float]:
    """Each capped run's step (ms) simulated on ``chip``: its program capped as it ran."""
    return [simulate_record_ms(run, chip) for run in runs]


def _ms(runs: list[ChipRecord], chip: Chip) -> np.ndarray:
    return np.array(simulated_ms(runs, chip))


def _slope(runs: list[ChipRecord], ms: np.ndarray) -> float:
    experts = np.array([run.expert_cap for run in runs], dtype=float) * _moe_layers(runs[0])
    return fit_line(experts, ms).slope


def _moe_layers(run: ChipRecord) -> int:
    return len({op.layer for op in record_step(run)[0].ops if op.expert_index is not None})


DECODERS_HIDDEN = 0.01  # the decoders at half their cost move the slope by under 1 %: they are hidden


def fixed_cost(probes: Chip, path: Path | str = FIXED_COST_PATH,
               decoder: str = CALIBRATION_DECODER, panel_unroll: tuple[int, int] | None = None,
               batch: int = 1, expert_list: str | None = None) -> FixedCost | None:
    """The two figures (module docstring) from the runs in ``path`` that ran ``decoder`` at
    ``batch`` (and ``panel_unroll``, ``expert_list`` when given), on the chip ``probes`` (its dequant rates are
    what the factor scales: the micro-probes', or another source's; at a batch above 1 its
    decoders' figures should be that batch's); None when the file holds fewer than two
    published caps of that build at that batch."""
    runs = capped_series(capped_runs(path, decoder, panel_unroll, batch, expert_list))
    slope_runs = [r for r in runs if r.schedule == SLOPE_SCHEDULE]
    if len({r.expert_cap for r in slope_runs}) < 2:
        return None
    measured = _slope(slope_runs, np.array([r.ms_median for r in slope_runs]))
    target = np.array([r.ms_median for r in runs])
    per_layer: float | None = None
    for _ in range(ROUNDS):  # each figure moves the other a little (overlap): alternate
        at_probes = _slope(slope_runs, _ms(slope_runs, _with(probes, 1.0, per_layer)))
        at_half = _slope(slope_runs, _ms(slope_runs, _with(probes, HALF, per_layer)))
        hidden = at_probes - at_half <= DECODERS_HIDDEN * at_probes  # halving them moves no slope
        if measured <= at_half or hidden:  # the chip's slope is under what halved decoders give, or the
            factor = 1.0  # decoders move no slope at all: the experts are copy-bound there, the slope says
            # nothing of the decoders (a ratio over a difference of ~0 would be noise: a negative rate)
        else:
            factor = 1.0 + (measured - at_probes) * (1.0 - HALF) / (at_probes - at_half)
        def error(x: float, factor: float = factor) -> float:
            return float(np.mean(_ms(runs, _with(probes, factor, x)) - target))

        low, high = PER_LAYER_BRACKET_S
        per_layer = low if error(low) >= 0.0 else brentq(error, low, high, xtol=1e-7)
    names = tuple(f"{r.schedule} c={r.expert_cap}" for r in runs)
    source = (f"derived on tpu-v5e (the K3-shard kernel's fixed-cost probe: {', '.join(names)} at batch {batch}, "
              f"read through the simulator): {measured * 1e3:.1f} µs a routed expert")
    return FixedCost(factor, per_layer, measured, names, source)


@functools.cache
def _found(probes_path: str, kernel_path: str, mtimes: tuple[float, float],
           decoder: str = CALIBRATION_DECODER) -> FixedCost | None:
    """:func:`fixed_cost` on the catalog's tpu-v5e with ``decoder``'s micro-probe figures, once
    per pair of files (``mtimes``: a rewritten file is read again)."""
    from hwmodels.catalog import load_chip

    return fixed_cost(probe_chip(load_chip("tpu-v5e", calibrated=False), probes_path, decoder), kernel_path, decoder)


def committed_fixed_cost(decoder: str = CALIBRATION_DECODER) -> FixedCost | None:
    """:func:`fixed_cost` of the committed probe and capped-run files of ``decoder`` (what reports quote)."""
    return _found(str(PROBES_PATH), str(FIXED_COST_PATH),
                  (Path(PROBES_PATH).stat().st_mtime, Path(FIXED_COST_PATH).stat().st_mtime), decoder)


def fixed_cost_figures(probes_path: Path | str = PROBES_PATH, kernel_path: Path | str = FIXED_COST_PATH,
                       decoder: str = CALIBRATION_DECODER) -> dict[str, tuple[float, str]]:
    """The fixed-cost probe's figures for the kernel with ``decoder``, ``path -> (value,
    source)``: its micro-probe dequant rates scaled and the per-layer cost, from its own capped
    runs; without them, the per-layer cost of :data:`CALIBRATION_DECODER`'s runs alone (the
    dequant factor was read on that decoder's rates); empty without any runs."""
    mtimes = (Path(probes_path).stat().st_mtime, Path(kernel_path).stat().st_mtime)
    found = _found(str(probes_path), str(kernel_path), mtimes, decoder)
    own = found is not None
    if not own:
        found = _found(str(probes_path), str(kernel_path), mtimes)
    if found is None:
        return {}
    out: dict[str, tuple[float, str]] = {}
    if own:
        micro = probe_figures(load_probes(probes_path, decoder))
        out = {dequant_path(f): (micro[dequant_path(f)].value * found.dequant_factor,
                                 f"{found.source}; the micro-probe rate x {found.dequant_factor:.3f}")
               for f in DEQUANT_PROBES.values()}
    carried = "" if own else f" (the {CALIBRATION_DECODER} kernel's runs; none with {decoder})"
    out[PER_LAYER] = (found.per_layer_s, f"{found.source}{carried}; {found.per_layer_s * 1e6:.1f} µs a layer "
                      "the simulator's ops leave out")
    return out


def kernel_probe_figures(probes_path: Path | str = PROBES_PATH, kernel_path: Path | str = FIXED_COST_PATH,
                         decoder: str = CALIBRATION_DECODER) -> dict[str, tuple[float, str]]:
    """Every figure of way (b), ``path -> (value, source)``: the micro-probes'
    (:func:`calibration.sources.tpu_probes.probe_figures`), the fixed-cost probe's replacing theirs."""
    figures = {path: (f.value, f.source) for path, f in probe_figures(load_probes(probes_path, decoder)).items()}
    return {**figures, **fixed_cost_figures(probes_path, kernel_path, decoder)}


def kernel_probe_chip(chip: Chip, probes_path: Path | str = PROBES_PATH,
                      kernel_path: Path | str = FIXED_COST_PATH, decoder: str = CALIBRATION_DECODER) -> Chip:
    """``chip`` with every figure of way (b): the micro-probes' labelled ``measured``
    (:func:`probe_chip`), the fixed-cost probe's labelled ``derived``."""
    data = probe_chip(chip, probes_path, decoder).model_dump(mode="python")
    for path, (value, source) in fixed_cost_figures(probes_path, kernel_path, decoder).items():
        parent, name = _figure_slot(data, path)
        parent[name] = {**parent[name], "value": value, "label": "derived", "source": source}
    return Chip.model_validate(data)
