"""Carry an H200-calibrated figure to another GPU, only through published spec ratios.

A figure calibrated on our own H200 measurements may inform a chip we never measured
(``b200``, ``gb200``) in one way only: scaled by the ratio of the two chips' *published*
specifications of the same quantity, and labelled ``derived from calibrated h200`` — never
``measured`` and never ``calibrated`` (nothing was measured on the target)::

    value_target = value_h200_calibrated x spec_target / spec_h200

:data:`SPEC_RATIOS` says which figure scales with which published spec. A figure with no
such spec (per-kernel gaps, dispatch costs, per-kernel efficiency: software and clock
effects no datasheet states) is refused rather than copied across.
"""

from __future__ import annotations

from hwmodels.errors import InputError
from hwmodels.overlay import iter_figures
from hwmodels.schema import Chip, Figure

SOURCE_CHIP = "h200"
# calibrated figure path -> the published figure whose ratio scales it
SPEC_RATIOS = {
    "hbm.sustained_bandwidth_bytes_per_s": "hbm.peak_bandwidth_bytes_per_s",
    "compute.tensor_core.peak_flops_per_s.bf16": "compute.tensor_core.peak_flops_per_s.bf16",
    "compute.tensor_core.peak_flops_per_s.fp8": "compute.tensor_core.peak_flops_per_s.fp8",
}


def _figure(chip: Chip, path: str) -> Figure:
    for candidate, figure in iter_figures(chip):
        if candidate == path:
            return figure
    raise InputError(f"chip {chip.name}: no figure {path!r}")


def derive_from_h200(target: Chip, calibrated_h200: Chip, path: str) -> Figure:
    """``target``'s figure at ``path`` derived from the calibrated H200's (module docstring).

    Raises InputError when ``path`` has no published spec ratio, when the H200 figure is not
    calibrated, or when either spec is not a published figure.
    """
    if calibrated_h200.name != SOURCE_CHIP:
        raise InputError(f"the source chip must be {SOURCE_CHIP}, not {calibrated_h200.name}")
    if target.kind != "gpu" or target.name == SOURCE_CHIP:
        raise InputError(f"{target.name}: a transfer from {SOURCE_CHIP} goes to another GPU")
    spec_path = SPEC_RATIOS.get(path)
    if spec_path is None:
        raise InputError(
            f"{path}: no published spec relates it between {SOURCE_CHIP} and {target.name}; "
            f"only {', '.join(SPEC_RATIOS)} transfer")
    fitted = _figure(calibrated_h200, path)
    if fitted.label != "calibrated":
        raise InputError(f"{SOURCE_CHIP} {path} is {fitted.label}, not calibrated: nothing to transfer")
    spec_source, spec_target = _figure(calibrated_h200, spec_path), _figure(target, spec_path)
    for chip, spec in ((calibrated_h200.name, spec_source), (target.name, spec_target)):
        if spec.label != "published":
            raise InputError(f"{chip} {spec_path} is {spec.label}: a transfer needs a published spec")
    ratio = spec_target.value / spec_source.value
    return Figure(
        value=fitted.value * ratio,
        uncertainty=None if fitted.uncertainty is None else fitted.uncertainty * ratio,
        label="derived",
        source=(f"derived from calibrated {SOURCE_CHIP}: {fitted.value:.6g} x published {spec_path} ratio "
                f"{spec_target.value:.6g} / {spec_source.value:.6g} = {ratio:.4g} ({fitted.source})"),
    )


def derived_figures(target: Chip, calibrated_h200: Chip) -> dict[str, Figure]:
    """Every transferable figure the H200 has calibrated, derived for ``target``."""
    source = dict(iter_figures(calibrated_h200))
    target_paths = {path for path, _ in iter_figures(target)}
    return {path: derive_from_h200(target, calibrated_h200, path) for path in SPEC_RATIOS
            if path in source and source[path].label == "calibrated" and path in target_paths}
