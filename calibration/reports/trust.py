"""Whether a fit may become the user's overlay: the checks ``tpusim calibrate`` runs before saving.

A saved overlay is applied by every later command and labels its figures *calibrated*, so a
fit that cannot be trusted must be refused, not saved with a footnote. Each check below
returns :class:`Refusal` sentences; ``tpusim calibrate`` writes its report either way and
saves the overlay only when none is left (exit 2 otherwise, the reasons on stderr).

Checks, in the order they are reported
--------------------------------------
1. **Units** (:func:`unit_problem`): the median over the points of
   ``log10(measured / predicted with the published figures)``. Beyond
   :data:`UNIT_ERROR_DECADES` (2.5 decades, i.e. about ×300) the data is almost surely in
   the wrong unit (µs written as ms is ×1000): a simulator off by 300× on a chip whose
   figures are published is far less likely than a unit slip, and no fit can repair it
   (the fitted figures would run to their bounds). No override.
2. **Convergence** (the caller's verdict, :func:`calibration.commands.fit_summary.convergence_problem`;
   ``--allow-unconverged`` keeps it).
3. **Bounds** (:func:`bound_problems`): a parameter within :data:`BOUND_TOLERANCE` (10⁻⁶ of
   its bound range, the tolerance :func:`calibration.sources.step_times.fit_chip` flags ``at_bound`` with)
   of a bound. The bounds are physical (:mod:`calibration.core.parameters`): a fit that pushes against
   one says the model lacks something, not that the chip sits at the limit.
   ``--allow-at-bounds`` keeps it.
4. **Plausibility** (:func:`implausible_figures`): a fitted rate (a path naming
   ``bytes_per_s`` or ``flops_per_s``) above the chip's own ceiling: the published peak HBM
   rate for the sustained HBM rate, the figure's own published value for any other rate. A
   ceiling the probe *measured* (``host-cpu``) is a DRAM copy rate, while small jitted steps
   run from cache; the test of the CPU loop accepts fits up to 30× it, so measured ceilings
   get :data:`MEASURED_CEILING_HEADROOM` = 30 (a 10 TB/s "CPU" on a 20 GB/s host is 500×).
   A figure labelled ``prior`` or ``assumed`` is no ceiling: it is the guess the fit exists
   to correct (tpu-v7's sibling-copy rate prior is 3.0e11; the copies measure 6.6e11).
   No override.
5. **Error on the fitted points** (:func:`error_problem`): the median |relative error| of
   the calibrated prediction on the calibration points above :data:`MAX_MEDIAN_FIT_ERROR`
   (25 %, the leave-one-out warning level of :mod:`calibration.commands.fit_summary`). The legitimate
   fits stay well inside it: the published TPU7x set fits at 6.4 % MAPE (README), the CPU
   loop at a few per cent. No override.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from calibration.core.fitting import median as middle
from calibration.core.parameters import HOST_PEAK_PATH, SUSTAINED_PATH
from calibration.sources.step_times import FitResult, FittedParameter
from hwmodels.schema import Chip

UNIT_ERROR_DECADES = 2.5  # |median log10(measured / predicted)| above which units are suspect
BOUND_TOLERANCE = 1e-6  # fraction of (upper - lower) within which a parameter is at a bound
MEASURED_CEILING_HEADROOM = 30.0  # a probed (DRAM copy) ceiling vs rates from cache
PLAUSIBILITY_SLACK = 1e-9  # relative: rounding on a published ceiling is not a refusal
MAX_MEDIAN_FIT_ERROR = 0.25  # median |relative error| on the fitted points

RATE_MARKERS = ("bytes_per_s", "flops_per_s")
NOT_A_CEILING = ("prior", "assumed")  # a documented guess the fit corrects, not a limit


@dataclass(frozen=True)
class Refusal:
    """One reason not to save a fit, and the flag that keeps it anyway (None: no flag)."""

    reason: str
    override: str | None = None


def unit_problem(measured_s: Sequence[float], predicted_s: Sequence[float]) -> Refusal | None:
    """A likely unit error when the measurements sit orders of magnitude off the prediction."""
    pairs = [(m, p) for m, p in zip(measured_s, predicted_s, strict=True) if m > 0 and p > 0]
    if not pairs:
        return None
    decades = float(middle([math.log10(m / p) for m, p in pairs]))
    if abs(decades) < UNIT_ERROR_DECADES:
        return None
    factor = 10.0 ** round(decades)
    shown = f"×{factor:.0f}" if factor >= 1 else f"×1/{1 / factor:.0f}"
    # records hold milliseconds: 1000x too large is microseconds written as ms, 1000x too small seconds
    hint = " (µs given as ms?)" if round(decades) == 3 else " (seconds given as ms?)" if round(decades) == -3 else ""
    return Refusal(f"the measured step times are {10 ** decades:.3g} times what the published figures "
                   f"predict: likely unit error ({shown}){hint}; fix the file's units")


def bound_problems(parameters: Sequence[FittedParameter]) -> list[Refusal]:
    """One refusal per parameter that stopped at (within :data:`BOUND_TOLERANCE` of) a bound."""
    refusals = []
    for p in parameters:
        tolerance = BOUND_TOLERANCE * (p.upper - p.lower)
        if not (p.at_bound or p.value - p.lower <= tolerance or p.upper - p.value <= tolerance):
            continue
        side = "lower" if p.value - p.lower <= p.upper - p.value else "upper"
        refusals.append(Refusal(f"{p.path} stopped at its {side} bound ({p.value:.4g}; bounds "
                                f"[{p.lower:.4g}, {p.upper:.4g}])", "--allow-at-bounds"))
    return refusals


def ceiling_path(path: str) -> str | None:
    """The figure a fitted rate at ``path`` may not exceed (None: not a rate)."""
    if path == SUSTAINED_PATH:
        return HOST_PEAK_PATH
    return path if any(marker in path for marker in RATE_MARKERS) else None


def implausible_figures(published: Chip, values: Mapping[str, float]) -> list[Refusal]:
    """Fitted rates above the chip's published (or probed, with headroom) ceiling."""
    from hwmodels.overlay import iter_figures

    figures = dict(iter_figures(published))
    refusals = []
    for path, value in values.items():
        ceiling = ceiling_path(path)
        if ceiling is None or ceiling not in figures:
            continue
        figure = figures[ceiling]
        if figure.label in NOT_A_CEILING:
            continue
        headroom = MEASURED_CEILING_HEADROOM if figure.label == "measured" else 1.0
        limit = figure.value * headroom
        if value > limit * (1.0 + PLAUSIBILITY_SLACK):
            where = (f"{headroom:.0f}× the probed {ceiling} {figure.value:.4g}" if headroom != 1.0
                     else f"the {figure.label} {ceiling} {figure.value:.4g}")
            refusals.append(Refusal(f"{path} = {value:.4g} is physically implausible: above {where} "
                                    f"of {published.name}"))
    return refusals


def error_problem(errors: Sequence[float]) -> Refusal | None:
    """The calibrated prediction misses the fitted points by more than the threshold."""
    values = np.abs(np.asarray(errors, dtype=float))
    if not values.size:
        return None
    median = float(middle(values))
    if median <= MAX_MEDIAN_FIT_ERROR:
        return None
    return Refusal(f"the calibrated figures miss the points they were fitted on by {100 * median:.1f} % "
                   f"(median; the limit is {100 * MAX_MEDIAN_FIT_ERROR:.0f} %): the model does not "
                   "describe this data")


def check_fit(result: FitResult, *, convergence: str | None = None,
              values: Mapping[str, float] | None = None,
              parameters: Sequence[FittedParameter] | None = None,
              published: Chip | None = None) -> list[Refusal]:
    """Every refusal for ``result``, in the module docstring's order.

    ``convergence`` is the caller's verdict on the solve (None: converged; the sentence of
    :func:`calibration.commands.fit_summary.convergence_problem` otherwise); ``values`` the figures the
    overlay would save (default: the fitted parameters); ``parameters`` those checked against
    their bounds (default: all fitted); ``published`` the chip whose ceilings apply (default:
    the fit's published chip)."""
    records = result.records
    refusals: list[Refusal] = []
    unit = unit_problem([r.step_s for r in records], [result.before_s[r.key()] for r in records])
    if unit is not None:
        refusals.append(unit)
    if convergence is not None:
        refusals.append(Refusal(convergence, "--allow-unconverged"))
    checked = list(result.parameters if parameters is None else parameters)
    refusals += bound_problems(checked)
    fitted = {p.path: p.value for p in result.parameters} if values is None else dict(values)
    refusals += implausible_figures(published or result.published_chip, fitted)
    error = error_problem(result.errors("after", "calibration"))
    if error is not None:
        refusals.append(error)
    return refusals


def unresolved(refusals: Sequence[Refusal], allowed: set[str]) -> list[Refusal]:
    """The refusals no given flag overrides."""
    return [r for r in refusals if r.override is None or r.override not in allowed]


def refusal_message(refusals: Sequence[Refusal], report: str) -> str:
    """The one-line error ``tpusim calibrate`` exits 2 with."""
    reasons = "; ".join(r.reason + (f" (pass {r.override} to keep it anyway)" if r.override else "")
                        for r in refusals)
    return f"calibration refused, overlay not saved (report: {report}): {reasons}"
