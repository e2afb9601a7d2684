"""The terminal summary of a calibration: what a user must see before trusting an overlay.

``tpusim calibrate`` used to print one error figure while ``report.md`` alone said that the
solver had stopped at its evaluation limit or that a parameter's error bar dwarfed its value.
:func:`summary_lines` puts every such fact on the terminal, in this order:

1. **solver**: converged, or stopped early (and why: scipy's message);
2. **errors**: MAPE before (published figures), after on the calibration points,
   leave-one-out on the calibration points (each point predicted by a fit that did not see
   it; linearised, see :mod:`calibration.sources.step_times`), and on held-out points;
3. **parameters**: published → fitted value, the 95 % interval (value ± 1.96 σ, normal
   approximation) and how well the data pins it (:func:`identifiability_word`);
4. **fitted on**: the points behind the overlay, by dimension, so that every later
   prediction can say where it extrapolates.

:func:`convergence_problem` is the one test of "did the solve finish": a fit that stopped
early is an error (exit 2) unless ``--allow-unconverged``.
"""

from __future__ import annotations

from typing import Any

Z_95 = 1.96  # two-sided 95 % quantile of the normal distribution
WELL_DETERMINED = 0.1  # relative 1σ at or below which a parameter counts as identified
WEAK = 0.5  # relative 1σ above which the data does not pin the parameter at all
LOO_WARNING = 0.25  # leave-one-out MAPE above which the fit does not generalise


def convergence_problem(result: Any) -> str | None:
    """None when the solver converged, else one sentence saying how it stopped."""
    if result.success:
        return None
    return f"the least-squares solve did not converge ({result.message})"


def identifiability_word(parameter: Any) -> str:
    """How well the data pins one fitted parameter, from its relative 1σ."""
    if parameter.at_bound:
        return "at a bound (one-sided; no interval)"
    if parameter.uncertainty is None:
        return "no interval (too few points for an error estimate)"
    scale = abs(parameter.value) or 1.0
    relative = parameter.uncertainty / scale
    if relative <= WELL_DETERMINED:
        return f"identified (±{100 * relative:.1f} %)"
    if relative <= WEAK:
        return f"weakly identified (±{100 * relative:.0f} %)"
    return f"NOT identified (±{100 * relative:.0f} %: the data cannot pin it)"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def _interval(parameter: Any) -> str:
    if parameter.uncertainty is None:
        return "—"
    low = parameter.value - Z_95 * parameter.uncertainty
    high = parameter.value + Z_95 * parameter.uncertainty
    return f"[{low:.4g}, {high:.4g}]"


def _coverage_line(result: Any) -> str:
    overlay = result.overlay()
    coverage = overlay.coverage
    if coverage is None:
        return f"fitted on: {overlay.fitted_on}"
    return (f"fitted on: {overlay.fitted_on}; models {', '.join(coverage.models)}, formats "
            f"{', '.join(coverage.formats)}, chip counts {', '.join(map(str, coverage.chip_counts))}, "
            f"batches {', '.join(map(str, coverage.batches))}")


def summary_lines(result: Any) -> list[str]:
    """The calibration summary as plain lines (see the module docstring)."""
    problem = convergence_problem(result)
    lines = [f"solver: {'converged' if problem is None else 'DID NOT CONVERGE'} ({result.message}; "
             f"{result.engine_calls} engine runs, {result.elapsed_s:.1f} s)"]
    summary = result.summary()
    lines.append(
        f"MAPE: published figures {_pct(summary['mape_before'])}; calibrated: calibration points "
        f"{_pct(summary['mape_calibration'])}, leave-one-out {_pct(summary['mape_loo'])}, "
        f"held out {_pct(summary['mape_holdout'])}"
        + ("" if result.split.holdout else " (nothing held out: use --holdout for an honest test)"))
    loo = summary["mape_loo"]
    if loo is not None and loo > LOO_WARNING:
        lines.append(f"warning: leave-one-out error {_pct(loo)}: the fit does not predict points it "
                     "did not see; treat the calibrated figures with suspicion")
    lines.append("parameters (published -> calibrated, 95 % interval, identifiability):")
    for parameter in result.parameters:
        sigma = "" if parameter.uncertainty is None else f" ± {parameter.uncertainty:.3g}"
        lines.append(f"  {parameter.path}: {parameter.published:.4g} -> {parameter.value:.4g}{sigma} "
                     f"{_interval(parameter)} {identifiability_word(parameter)}")
    if result.identifiability is not None:
        lines.append(f"identifiability: {result.identifiability.summary()}")
    lines.append(_coverage_line(result))
    return lines
