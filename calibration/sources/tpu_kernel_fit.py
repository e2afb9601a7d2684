"""TPU v5e calibrated from its own kernel runs, judged on runs the fit never saw (issue 34).

The source of ``tpusim calibrate --hardware tpu-v5e --measurements <kernel records>``: the
K3-shard step times the megakernel measured on a v5e (:mod:`calibration.sources.tpu_chip_records`,
every ``shard_of`` row the file holds of one expert decoder, by default
:data:`calibration.sources.tpu_probes.CALIBRATION_DECODER`, whatever schedules and batches), fitted through the one
calibration core (:func:`calibration.core.fit`, :func:`calibration.core.leave_one_group_out`,
:func:`calibration.core.coverage`).

Three ways to predict each record:

- **(a) catalog**: ``tpu-v5e`` as published (assumed figures included);
- **(b) probes**: the catalog with every figure the chip probes measured
  (:func:`calibration.sources.tpu_probes.probe_chip`) and the two the kernel's fixed-cost
  probe gives (:func:`calibration.sources.tpu_fixed_cost.kernel_probe_chip`: the kernel run
  with its experts capped, kept in their own file), both of the records' decoder; no decode
  step time is read;
- **(c) fitted**: :data:`FITTED` fitted on kernel step times, starting from (b), in log space.
  Every point is predicted by a refit that never saw it, in two splits (:func:`splits`):
  the schedules in two halves (alternating in name order: fit on one half, predict the
  other, then swap) and the batch sizes in two halves (the smaller half vs the larger).

**Intervals.** A held-out point's 90 % interval is ``predicted · (1 ± t)`` with
``t = √((1.645 · sd / predicted)² + q²)`` (:func:`tpusim.report.intervals.half_width_rel`, the
rule every calibration uses). ``q`` is the model error: the split-conformal 90 % quantile of
the out-of-sample relative residuals ``(measured − predicted) / predicted`` of the *other*
fold of the same split (:func:`calibration.core.coverage`; never the point's own fold), so it
is made of what the fitted figures cannot absorb, measured on records outside each refit.
``sd`` is the parameter spread from a refit's covariance; :data:`OPTIONS` asks for none
(``uncertainty="none"``, so ``sd = 0`` and ``t = q``): each residual behind ``q`` already
comes from a refit on other records and so carries the parameter error once, and a
covariance would cost two more engine passes per refit. The coverage is the fraction of
held-out records inside their interval, the width the mean of ``2 t``. The overlay saved
from the full fit stores the model error over every fold (:func:`calibration.core.model_error`).

Ranking: per batch, the schedules ordered by prediction vs by measurement (Kendall τ) and the
regret of the simulator's pick (measured ms of the predicted best / measured best - 1).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from calibration.core import (
    CalibrationResult,
    Coverage,
    Fold,
    ModelError,
    Problem,
    SetErrors,
    Solution,
    SolverOptions,
    coverage,
    fit,
    leave_one_group_out,
    model_error,
    parameters,
)
from calibration.core.overlay_builder import build_overlay, fitted_figure
from calibration.sources.tpu_chip_records import ChipRecord, ChipRecordPredictor, load_chip_records
from calibration.sources.tpu_fixed_cost import kernel_probe_chip, kernel_probe_figures
from calibration.sources.tpu_probes import CALIBRATION_DECODER, PROBES_PATH
from hwmodels.catalog import load_chip
from hwmodels.errors import InputError
from hwmodels.overlay import CalibrationOverlay
from hwmodels.schema import Chip

CHIP = "tpu-v5e"
FITTED = ("hbm.sustained_bandwidth_bytes_per_s",)
OPTIONS = SolverOptions(max_nfev=4, diff_step=1e-2, uncertainty="none", drop_at_bound=False)
LABEL = "calibrated on tpu-v5e kernel records"
SPLITS = ("schedule", "batch")


def splits(records: Sequence[ChipRecord]) -> dict[str, tuple[str, ...]]:
    """Fold labels per record: schedule halves (A/B, alternating in name order) and batch
    halves (the smaller half of the batch sizes vs the rest), from whatever records exist."""
    names = sorted({r.schedule for r in records})
    half = {name: "AB"[i % 2] for i, name in enumerate(names)}
    batches = sorted({r.batch for r in records})
    low = batches[: (len(batches) + 1) // 2]
    high = [b for b in batches if b not in low]

    def batch_label(b: int) -> str:
        return "b" + "+".join(str(x) for x in (low if b in low else high))

    return {"schedule": tuple(half[r.schedule] for r in records),
            "batch": tuple(batch_label(r.batch) for r in records)}


def kernel_problem(records: Sequence[ChipRecord], predictor: ChipRecordPredictor, catalog: Chip,
                   probes: Chip, fitted: Sequence[str] = FITTED) -> Problem:
    def predict(chip: Chip, indices: Sequence[int]) -> np.ndarray:
        return np.array(predictor.predict_many(chip, list(indices)), dtype=float)

    return Problem(name="tpu-v5e K3-shard kernel step times", base=probes, published=catalog,
                   parameters=parameters(*fitted), predict=predict,
                   measured=np.array([r.ms_median for r in records], dtype=float),
                   groups=splits(records), start=probes, transform="log")


def ranking(records: Sequence[ChipRecord], predicted: dict[int, float], batch: int) -> dict[str, Any] | None:
    """Kendall τ and regret over the schedules measured at ``batch`` (None with < 2)."""
    at = [i for i, r in enumerate(records) if r.batch == batch and i in predicted]
    if len(at) < 2:
        return None
    measured = [records[i].ms_median for i in at]
    guess = [predicted[i] for i in at]
    tau = float(kendalltau(guess, measured).statistic)
    pick = at[int(np.argmin(guess))]
    best = at[int(np.argmin(measured))]
    resolved = resolved_tau([records[i] for i in at], guess)
    return {"batch": batch, "schedules": len(at), "tau": tau, "pick": records[pick].schedule,
            "best": records[best].schedule, "regret": records[pick].ms_median / records[best].ms_median - 1.0,
            "tau_resolved": resolved[0], "pairs_resolved": resolved[1], "pairs": len(at) * (len(at) - 1) // 2}


def resolved_tau(records: Sequence[ChipRecord], predicted: Sequence[float]) -> tuple[float | None, int]:
    """Kendall's τ over the *resolved* pairs only: those whose measured steps differ by more
    than the sum of their spreads (half-IQRs): (C - D) / resolved pairs (a predicted tie
    counts as neither), and how many pairs are resolved. Pairs inside the measurement's own
    spread have no measured order, so plain τ, which counts their swaps in full, understates
    a simulator that orders everything resolvable."""
    concordant = discordant = counted = 0
    for i in range(len(records)):
        for j in range(i + 1, len(records)):
            gap = records[i].ms_median - records[j].ms_median
            if abs(gap) <= records[i].ms_spread + records[j].ms_spread:
                continue
            counted += 1
            guessed = predicted[i] - predicted[j]
            concordant += gap * guessed > 0
            discordant += gap * guessed < 0
    return ((concordant - discordant) / counted if counted else None), counted


@dataclass
class KernelFit:
    """Everything one calibration on kernel records produced (module docstring)."""

    path: str
    records: list[ChipRecord]
    fitted: list[str]
    ways: dict[str, dict[int, float]]  # a, b, c:<split> (held out), c:fit (in sample) -> index -> ms
    solution: Solution
    folds: list[Fold]
    coverage: dict[str, Coverage]  # per split
    model_error: ModelError | None
    probe_figures: dict[str, Any]
    engine_runs: int
    seconds: float
    intervals: dict[str, dict[int, float]] = field(default_factory=dict)  # c:<split> -> index -> half-width t
    decoder: str = CALIBRATION_DECODER  # the expert decoder the records, probes and fixed-cost runs ran

    def mape(self, way: str) -> float:
        values = self.ways[way]
        return float(np.mean([abs(v - self.records[i].ms_median) / self.records[i].ms_median
                              for i, v in values.items()]))

    def rankings(self, way: str) -> list[dict[str, Any]]:
        out = [ranking(self.records, self.ways[way], b) for b in sorted({r.batch for r in self.records})]
        return [r for r in out if r is not None]

    def values(self) -> dict[str, float]:
        return self.solution.value_map()

    def sigma(self) -> dict[str, float | None]:
        return {p: (None if not np.isfinite(s) else float(s))
                for p, s in zip(self.solution.problem.paths, self.solution.sigma, strict=True)}

    def result(self) -> CalibrationResult:
        """The one result type (:class:`calibration.core.result.CalibrationResult`)."""
        held = [self.mape(f"c:{s}") for s in SPLITS if f"c:{s}" in self.ways]
        errors = {self.path: SetErrors(points=len(self.records), priors_only=self.mape("a"),
                                       parts_only=self.mape("b"), fitted=self.mape("c:fit"),
                                       held_out=float(np.mean(held)) if held else None)}
        pooled = self.pooled_coverage()
        return CalibrationResult(procedure="tpu kernel records", chip=CHIP, errors=errors,
                                 model_error=None if self.model_error is None else self.model_error.to_json(),
                                 coverage=None if pooled is None else pooled.to_json(),
                                 details=self.to_json())

    def pooled_coverage(self) -> Coverage | None:
        return coverage(self.folds, ms_per_unit=1.0) if self.folds else None

    def overlay(self) -> CalibrationOverlay:
        """The probe figures and the fitted ones as the tpu-v5e overlay, with the model error."""
        figures = {p: fitted_figure(f["value"], fitted_on=f["source"]) for p, f in self.probe_figures.items()}
        sigma = self.sigma()
        for path, value in self.values().items():
            figures[path] = fitted_figure(value, sigma[path], f"{LABEL}: {len(self.records)} K3-shard step times")
        return build_overlay(CHIP, f"tpu-v5e kernel records ({Path(self.path).name}) on the probe figures", figures,
                             model_error=self.model_error, measurements=Path(self.path).name)

    def to_json(self) -> dict[str, Any]:
        return {
            "chip": CHIP, "label": LABEL, "decoder": self.decoder, "records": [r.__dict__ for r in self.records],
            "fitted": self.fitted,
            "values": self.values(), "sigma": self.sigma(),
            "mape": {w: self.mape(w) for w in self.ways},
            "ways": {w: {str(i): v for i, v in p.items()} for w, p in self.ways.items()},
            "intervals": {w: {str(i): t for i, t in p.items()} for w, p in self.intervals.items()},
            "rankings": {w: self.rankings(w) for w in self.ways},
            "coverage": {s: c.to_json() for s, c in self.coverage.items()},
            "folds": [{"split": f.dimension, "fold": f.value, "points": f.points, "values": f.values,
                       "predicted_ms": f.predicted} for f in self.folds],
            "model_error": None if self.model_error is None else self.model_error.to_json(),
            "probe_figures": self.probe_figures, "engine_runs": self.engine_runs, "seconds": self.seconds,
        }


def calibrate_kernel_records(path: Path | str, *, probes_path: Path | str = PROBES_PATH,
                             fitted: Sequence[str] = FITTED, options: SolverOptions = OPTIONS,
                             holdout: Sequence[str] = SPLITS, progress: Callable[[str], None] | None = None,
                             jobs: int | None = None, decoder: str = CALIBRATION_DECODER) -> KernelFit:
    """Ways (a), (b), the fit on every record and the held-out refits over the splits in
    ``holdout`` (default both; fewer splits, fewer refits: each split costs about one full fit).
    ``jobs``: engine worker processes (default: one per CPU core, at most 8). ``decoder``: the
    expert decoder whose decode records are fitted and whose dequant probes and fixed-cost
    runs make way (b) (the earlier kernel's study: ``"bytes"``)."""
    unknown = [split for split in holdout if split not in SPLITS]
    if unknown:
        raise InputError(f"held-out split {', '.join(unknown)}: the kernel records split by {' or '.join(SPLITS)}")
    started = time.perf_counter()
    say = progress or (lambda _line: None)
    records = load_chip_records(path, decoder=decoder)
    predictor = ChipRecordPredictor(records, jobs=jobs or min(os.cpu_count() or 1, 8))
    try:
        return _calibrate(path, records, predictor, probes_path, fitted, options, holdout, say, started, decoder)
    finally:
        predictor.close()


def _calibrate(path: Path | str, records: list[ChipRecord], predictor: ChipRecordPredictor, probes_path: Path | str,
               fitted: Sequence[str], options: SolverOptions, holdout: Sequence[str], say: Callable[[str], None],
               started: float, decoder: str) -> KernelFit:
    catalog = load_chip(CHIP, calibrated=False)
    probes = kernel_probe_chip(catalog, probes_path, decoder=decoder)
    ways: dict[str, dict[int, float]] = {}
    for name, chip in (("a", catalog), ("b", probes)):
        say(f"way ({name}): {len(records)} records")
        ways[name] = dict(enumerate(predictor.predict_many(chip, range(len(records)))))
    problem = kernel_problem(records, predictor, catalog, probes, fitted)
    say(f"fit on all {len(records)} records: {', '.join(fitted)}")
    solution = fit(problem, options)
    ways["c:fit"] = dict(enumerate(problem.predict(solution.chip(), range(len(records))).tolist()))
    folds: list[Fold] = []
    covered: dict[str, Coverage] = {}
    intervals: dict[str, dict[int, float]] = {}
    for split in holdout:
        labels = sorted(set(problem.groups[split]))
        if len(labels) < 2:
            continue
        say(f"held out by {split}: {' / '.join(labels)}")
        split_folds = leave_one_group_out(problem, options, folds=[(split, label) for label in labels],
                                          spread=options.uncertainty == "central")
        folds += split_folds
        ways[f"c:{split}"] = {p: v for f in split_folds for p, v in zip(f.points, f.predicted, strict=True)}
        found = coverage(split_folds, ms_per_unit=1.0)
        if found is not None:
            covered[split] = found
            intervals[f"c:{split}"] = _half_widths(split_folds)
    figures = {p: {"value": v, "source": src}
               for p, (v, src) in kernel_probe_figures(probes_path, decoder=decoder).items()}
    return KernelFit(path=str(path), records=records, fitted=list(fitted), ways=ways, solution=solution, folds=folds,
                     coverage=covered, model_error=model_error(folds), probe_figures=figures,
                     engine_runs=predictor.runs, seconds=time.perf_counter() - started, intervals=intervals,
                     decoder=decoder)


def _half_widths(folds: Sequence[Fold]) -> dict[int, float]:
    """Each held point's interval half-width ``t`` (the rule :func:`calibration.core.coverage` judges)."""
    from calibration.core.model_error import conformal_quantile
    from tpusim.report.intervals import half_width_rel

    out = {}
    for fold in folds:
        others = [f for f in folds if f.dimension == fold.dimension and f is not fold]
        q = conformal_quantile(np.concatenate([f.residuals for f in others]))[0]
        sd = fold.param_sd or [0.0] * len(fold.points)
        for point, predicted, sd_i in zip(fold.points, fold.predicted, sd, strict=True):
            out[point] = half_width_rel(sd_i / predicted, q)
    return out
