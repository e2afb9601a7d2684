"""Format contrasts: where the model's *structure*, not its parameters, misses the data.

A fit can only move the figures it has. When two measured configurations differ in one
factor (here the weight format: ``muse-spark@nvfp4+bf16`` against ``muse-spark@int4+bf16``,
same system, context, routing, schedule and backend), the difference of their step times at
each batch isolates what that factor costs, and the simulator predicts the same difference.
Set side by side::

    measured delta   = t(other, b) - t(base, b)
    simulated delta  = T(other, b) - T(base, b)       (the calibrated chip)
    missed           = measured delta - simulated delta

A miss that stays put over the batch sizes is a constant the fitted figures can absorb; a
miss that **varies with batch** is a cost the model lacks. Any figure that moves both formats'
step times alike leaves the miss unchanged, so a spread ``S`` of the misses (max − min over
batch) puts at least one of the pair's points ``S / 4`` off whatever such figures are fitted
to (the best constant leaves ``S / 2`` on the difference, shared by its two terms). The pair
is flagged when ``S`` exceeds ``TOLERANCE`` (5 %, the calibration's target) of the pair's
mean measured step: a heuristic scale, named as one, not a statistical test (published
points carry no spread).

Labels: measured deltas are differences of published/measured times; simulated deltas are
differences of calibrated simulations; both are *derived*.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from calibration.sources.measurements import MS_PER_S, Measurement, measured_label

TOLERANCE = 0.05  # of the mean measured step


@dataclass(frozen=True)
class FormatContrast:
    """One pair of formats of one configuration, over the batches both were measured at."""

    configuration: str  # what the two share: "muse-spark on tpu-v7x4, ctx215, identical routing, ..."
    base: str  # the format subtracted (alphabetically first)
    other: str
    batches: tuple[int, ...]
    measured_delta_s: tuple[float, ...]
    simulated_delta_s: tuple[float, ...]
    mean_step_s: float  # the pair's mean measured step time
    measured_label: str = "measured"  # where the step times come from: "published tpu7x", "measured cpu-xla"

    @property
    def missed_s(self) -> tuple[float, ...]:
        return tuple(m - s for m, s in zip(self.measured_delta_s, self.simulated_delta_s, strict=True))

    @property
    def miss_spread_s(self) -> float:
        """max − min of the misses over batch (0 for a single batch)."""
        return max(self.missed_s) - min(self.missed_s)

    @property
    def error_floor_s(self) -> float:
        """The least worst-point error any figure moving both formats alike can leave (S / 4)."""
        return self.miss_spread_s / 4

    def varies_with_batch(self, tolerance: float = TOLERANCE) -> bool:
        """The miss spread exceeds ``tolerance`` of the mean step (module docstring)."""
        return self.miss_spread_s > tolerance * self.mean_step_s

    def to_json(self) -> dict[str, Any]:
        def ms(values: tuple[float, ...]) -> list[float]:
            return [round(v * MS_PER_S, 4) for v in values]

        return {"configuration": self.configuration, "base": self.base, "other": self.other,
                "batches": list(self.batches), "measured_delta_ms": ms(self.measured_delta_s),
                "simulated_delta_ms": ms(self.simulated_delta_s), "missed_ms": ms(self.missed_s),
                "error_floor_ms": round(self.error_floor_s * MS_PER_S, 4), "measured_label": self.measured_label,
                "varies_with_batch": self.varies_with_batch(), "tolerance": TOLERANCE,
                "label": f"derived: differences of {self.measured_label} and of calibrated simulated step times"}


def _configuration(record: Measurement) -> tuple[str, ...]:
    """Everything but the format (bracketed model overrides stay part of the model)."""
    name, _, rest = record.model.partition("@")
    overrides = rest.partition("[")[2]
    return (name + (f"[{overrides}" if overrides else ""), record.system.name, str(record.context),
            record.routing, record.schedule or "", record.backend)


def format_contrasts(records: Sequence[Measurement], simulated_s: Mapping[str, float]) -> list[FormatContrast]:
    """Every pair of formats measured on one configuration at two or more common batches.

    ``simulated_s`` maps :meth:`Measurement.key` to the calibrated simulation (seconds).
    """
    groups: dict[tuple[str, ...], dict[str, dict[int, Measurement]]] = {}
    for record in records:
        if record.key() in simulated_s:
            groups.setdefault(_configuration(record), {}).setdefault(record.format, {})[record.batch] = record
    out = []
    for config, by_format in groups.items():
        for base, other in combinations(sorted(by_format), 2):
            batches = tuple(sorted(set(by_format[base]) & set(by_format[other])))
            if len(batches) < 2:
                continue
            pairs = [(by_format[base][b], by_format[other][b]) for b in batches]
            out.append(FormatContrast(
                configuration=f"{config[0]} on {config[1]}, ctx{config[2]}, {config[3]} routing",
                base=base or "default", other=other or "default", batches=batches,
                measured_delta_s=tuple(o.step_s - b.step_s for b, o in pairs),
                simulated_delta_s=tuple(simulated_s[o.key()] - simulated_s[b.key()] for b, o in pairs),
                mean_step_s=sum(r.step_s for pair in pairs for r in pair) / (2 * len(pairs)),
                measured_label=" / ".join(sorted({measured_label(r) for pair in pairs for r in pair}))))
    return out


def contrasts_json(records: Sequence[Measurement], simulated_s: Mapping[str, float]) -> list[dict[str, Any]]:
    """The ``contrasts`` list of a calibration's JSON (held-out points included)."""
    return [c.to_json() for c in format_contrasts(records, simulated_s)]


def contrast_lines(pairs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Human lines for a ``contrasts`` list (empty when no pair was measured)."""
    def row(values: list[float]) -> str:
        return " ".join(f"{v:+.2f}" for v in values)

    lines = []
    for pair in pairs:
        batches = "/".join(str(b) for b in pair["batches"])
        verdict = (f"varies with batch: a cost the model lacks; >= {pair['error_floor_ms']:.2f} ms off at some "
                   "point whatever figure moves both formats alike" if pair["varies_with_batch"]
                   else "steady over batch")
        lines.append(f"format contrast {pair['other']} − {pair['base']} (ms at b{batches}): {pair['measured_label']} "
                     f"{row(pair['measured_delta_ms'])}, simulated (calibrated) {row(pair['simulated_delta_ms'])}, "
                     f"missed {row(pair['missed_ms'])} ({verdict})")
    return lines
