"""Predicted against measured: a markdown table, a scatter plot, MAPE and max error.

Every number carries its label (the project's honest-labels rule):

- **measured** — the record's ``backend`` says where: ``published tpu7x`` for the public
  release's numbers, ``cpu-xla`` for a jitted step timed on this host, ``cpu-interpret`` for
  the Pallas interpreter (never a TPU timing);
- **simulated, uncalibrated** — the engine with the chip's published catalog figures;
- **simulated, calibrated** — the engine with the fitted overlay applied, and which
  parameters it replaced, fitted on what.

Two entry points: :func:`fit_report` (after :func:`calibration.sources.step_times.fit_chip`: before/after,
calibration vs held-out, fitted parameters) and :func:`comparison_report` (``tpusim report``:
no fit, the current overlay against the published figures on a measurement file). Both
build :class:`Row` lists; :func:`scatter_plot` draws either with matplotlib's Agg backend.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from calibration.sources.measurements import MS_PER_S, US_PER_S, Measurement, measured_label
from calibration.sources.predict import Predictor
from calibration.sources.step_times import FitResult, mape, max_error
from hwmodels.atomic import write_bytes_atomic, write_text_atomic
from hwmodels.schema import Chip
from hwmodels.units import MIB

US_PER_MS = US_PER_S / MS_PER_S


@dataclass(frozen=True)
class Row:
    """One point: measured, and simulated before/after calibration, in seconds."""

    record: Measurement
    subset: str  # calibration | holdout | evaluated
    before_s: float
    after_s: float | None

    @property
    def err_before(self) -> float:
        return (self.before_s - self.record.step_s) / self.record.step_s

    @property
    def err_after(self) -> float | None:
        if self.after_s is None:
            return None
        return (self.after_s - self.record.step_s) / self.record.step_s


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.1f} %"


def _abs_pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * MS_PER_S:.3f}"


def rows_from_fit(result: FitResult) -> list[Row]:
    held = {r.key() for r in result.split.holdout}
    return [
        Row(r, "holdout" if r.key() in held else "calibration",
            result.before_s[r.key()], result.after_s[r.key()])
        for r in result.records
    ]


def markdown_table(rows: Sequence[Row], *, calibrated: bool = True) -> str:
    """One line per point; columns say what each number is."""
    sources = sorted({measured_label(row.record) for row in rows})
    header = [
        "point", "set", f"measured ms ({', '.join(sources)})",
        "simulated uncalibrated ms", "error",
    ]
    if calibrated:
        header += ["simulated calibrated ms", "error"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        cells = [
            row.record.key(), row.subset, f"{row.record.ms_per_step_median:.3f}",
            _ms(row.before_s), _pct(row.err_before),
        ]
        if calibrated:
            cells += [_ms(row.after_s), _pct(row.err_after)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def error_summary(rows: Sequence[Row]) -> str:
    """MAPE and max |error| before and after, per subset, as a markdown table."""
    lines = [
        "| set | points | MAPE uncalibrated | max uncalibrated | MAPE calibrated | max calibrated |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    subsets = [s for s in ("calibration", "holdout", "evaluated") if any(r.subset == s for r in rows)]
    for subset in [*subsets, "all"]:
        chosen = [r for r in rows if subset in ("all", r.subset)]
        if subset == "all" and len(subsets) == 1:
            continue
        before = [r.err_before for r in chosen]
        after = [r.err_after for r in chosen if r.err_after is not None]
        label = "held out" if subset == "holdout" else subset
        lines.append(
            f"| {label} | {len(chosen)} | {_abs_pct(mape(before))} | {_abs_pct(max_error(before))} "
            f"| {_abs_pct(mape(after))} | {_abs_pct(max_error(after))} |"
        )
    return "\n".join(lines)


def _value(path: str, value: float | None) -> str:
    if value is None:
        return "—"
    if "_bytes_per_s" in path:
        return f"{value / 1e12:.4g} TB/s" if value >= 1e11 else f"{value / 1e9:.4g} GB/s"
    if "flops_per_s" in path:
        return f"{value / 1e12:.4g} TFLOP/s"
    if path.endswith("_s") or path.endswith("_per_tile"):
        return f"{value * 1e9:.4g} ns" if value < 1e-6 else f"{value * 1e6:.4g} µs"
    return f"{value:.4g}"


def parameter_table(result: FitResult) -> str:
    lines = [
        "| parameter | published | calibrated ± 1σ | bounds | note |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in result.parameters:
        sigma = f" ± {_value(p.path, p.uncertainty)}" if p.uncertainty is not None else ""
        note = "at bound" if p.at_bound else ""
        lines.append(
            f"| `{p.path}` | {_value(p.path, p.published)} | {_value(p.path, p.value)}{sigma} "
            f"| {_value(p.path, p.lower)} – {_value(p.path, p.upper)} | {note} |"
        )
    return "\n".join(lines)


def fit_report(result: FitResult, *, title: str | None = None, plot: str | None = None,
               extra: str = "") -> str:
    """The markdown report of a fit: errors, the point table, the fitted parameters."""
    rows = rows_from_fit(result)
    summary = result.summary()
    parts = [
        f"# {title or f'Calibration of {result.chip.name}'}",
        "",
        f"Fitted on {result.fitted_on}"
        + (f"; held out `{result.split.spec}` ({len(result.split.holdout)} points)" if result.split.holdout else "")
        + ". Simulated = tpusim engine; *uncalibrated* uses the published catalog figures, "
        "*calibrated* the fitted overlay.",
        "",
        "## Errors",
        "",
        error_summary(rows),
        "",
        f"Leave-one-out (linearised, calibration points): MAPE {_abs_pct(summary['mape_loo'])}.",
        "",
        "## Points",
        "",
        markdown_table(rows),
        "",
        "## Fitted parameters",
        "",
        parameter_table(result),
        "",
        f"Each fitted on: {result.fitted_on}. Residual variance s² = "
        + (f"{result.residual_s2:.3g}" if result.residual_s2 is not None else "— (n ≤ p)")
        + f"; {result.engine_calls} engine calls in {result.elapsed_s:.1f} s; solver: {result.message}",
    ]
    if result.identifiability is not None:
        parts += ["", f"Identifiability: {result.identifiability.summary()}."]
    if extra:
        parts += ["", extra.rstrip()]
    if plot:
        parts += ["", f"![predicted vs measured]({plot})"]
    return "\n".join(parts) + "\n"


def phase_table(records: Sequence[Measurement], chips: dict[str, Chip], predictor: Predictor) -> str:
    """Published per-phase timings (where a record has them) beside the engine's breakdown.

    Mapping (engine ``SimResult`` → published phase): ``collectives`` / layers → per-layer
    collectives; mean of ``layer_s`` over the layers → per-layer total; ``head`` compute +
    ``fixed_overheads`` − layers x per-layer overhead → fixed per step. A sanity check, not a
    fit target: the engine's phases are what the compute stream was doing, the published
    ones a profile of the kernel.
    """
    lines = ["| point | phase | published µs | " + " | ".join(f"simulated {name} µs" for name in chips) + " |",
             "|" + " --- |" * (3 + len(chips))]
    for record in records:
        published = {(p.name, p.scope): p.ms * US_PER_MS for p in record.phases}
        if not published:
            continue
        simulated: dict[str, dict[str, float]] = {}
        for name, chip in chips.items():
            result = predictor.simulate(chip, record)
            layers = [v for k, v in result.layer_s.items() if k >= 0]
            per_layer = chip.execution.per_layer_overhead_s.value
            simulated[name] = {
                "layer_total": sum(layers) / len(layers) * US_PER_S,
                "collectives": result.breakdown_s["collectives"] / len(layers) * US_PER_S,
                "fixed_total": (result.breakdown_s["head"] + result.breakdown_s["fixed_overheads"]
                                - per_layer * len(layers)) * US_PER_S,
            }
        for (phase, scope), value in published.items():
            cells = [f"{simulated[name][phase]:.1f}" if phase in simulated[name] else "—" for name in chips]
            lines.append(f"| {record.key()} | {phase} ({scope.replace('_', ' ')}) | {value:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def accounting_disagreements(records: Sequence[Measurement], chip: Chip, predictor: Predictor) -> str:
    """Measured points our VMEM accounting says would not fit: they ran, so the measured
    kernel keeps less static scratch than :mod:`tpusim.schedule.vmem` counts for it (for the
    published Muse kernel: its collective receive slots, whose layout is not published). They
    are predicted without the fit check; this section says which, so nobody reads the
    accounting's verdict as a fact about that kernel."""
    lines: list[str] = []
    if chip.kind != "tpu":  # a static VMEM scratch is a megakernel's: GPU stacks have no such check
        return ""
    for record in records:
        result = predictor.simulate(chip, record)
        if result.vmem_static_bytes > result.vmem_capacity_bytes:
            lines.append(f"- {record.key()}: accounting {result.vmem_static_bytes / MIB:.2f} MiB of "
                         f"{result.vmem_capacity_bytes / MIB:.2f} MiB usable (measured: it ran)")
    return "\n".join(lines)


def comparison_rows(
    records: Sequence[Measurement], before_s: Sequence[float], after_s: Sequence[float] | None
) -> list[Row]:
    return [
        Row(r, "evaluated", b, None if after_s is None else after_s[i])
        for i, (r, b) in enumerate(zip(records, before_s, strict=True))
    ]


def comparison_report(rows: Sequence[Row], chip: Chip, *, calibrated_note: str) -> str:
    """``tpusim report``: the measurement file against the simulator, no fitting."""
    has_after = any(row.after_s is not None for row in rows)
    return "\n".join([
        f"# Predicted vs measured on {chip.name}",
        "",
        calibrated_note,
        "",
        error_summary(rows),
        "",
        markdown_table(rows, calibrated=has_after),
    ]) + "\n"


def scatter_plot(rows: Sequence[Row], path: Path | str, *, title: str) -> Path:
    """Measured (x) against simulated (y), uncalibrated hollow, calibrated filled; circles
    for calibration points, squares held out; the y = x line with ±5 % and ±10 % bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 5.6), dpi=120)
    measured = [r.record.ms_per_step_median for r in rows]
    values = measured + [r.before_s * MS_PER_S for r in rows]
    values += [r.after_s * MS_PER_S for r in rows if r.after_s is not None]
    lo, hi = min(values) * 0.9, max(values) * 1.1
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="simulated = measured")
    for band, alpha in ((0.10, 0.08), (0.05, 0.12)):
        ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)],
                        color="tab:green", alpha=alpha, linewidth=0, label=f"±{band:.0%}")
    markers = {"calibration": "o", "holdout": "s", "evaluated": "D"}
    for subset, marker in markers.items():
        chosen = [r for r in rows if r.subset == subset]
        if not chosen:
            continue
        name = "held out" if subset == "holdout" else subset
        xs = [r.record.ms_per_step_median for r in chosen]
        ax.scatter(xs, [r.before_s * MS_PER_S for r in chosen], marker=marker, facecolors="none",
                   edgecolors="tab:red", label=f"simulated uncalibrated ({name})")
        after = [(x, r.after_s * MS_PER_S) for x, r in zip(xs, chosen, strict=True) if r.after_s is not None]
        if after:
            ax.scatter([a[0] for a in after], [a[1] for a in after], marker=marker, color="tab:blue",
                       label=f"simulated calibrated ({name})")
    sources = ", ".join(sorted({measured_label(r.record) for r in rows}))
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured ms per step ({sources})")
    ax.set_ylabel("simulated ms per step (tpusim engine)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return write_bytes_atomic(target, buffer.getvalue())  # never a half-written PNG


def write_fit_report(result: FitResult, out_dir: Path | str, *, title: str | None = None,
                     predictor: Predictor | None = None) -> dict[str, Path]:
    """``report.md`` and ``scatter.png`` in ``out_dir`` (written atomically / whole); with a
    ``predictor``, records that carry published phases get a :func:`phase_table` too."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    heading = title or f"Calibration of {result.chip.name}"
    plot = scatter_plot(rows_from_fit(result), folder / "scatter.png", title=heading)
    extra = ""
    with_phases = [r for r in result.records if r.phases]
    if predictor is not None and with_phases:
        chips = {"uncalibrated": result.published_chip, "calibrated": result.chip}
        extra = "## Phases (sanity check)\n\n" + phase_table(with_phases, chips, predictor)
    over = accounting_disagreements(result.records, result.chip, predictor) if predictor is not None else ""
    if over:
        extra += ("\n\n## Measured points over the VMEM accounting\n\nPredicted without the on-chip memory "
                  "check (the measured kernel keeps less static scratch than we count for it):\n\n" + over)
    text = fit_report(result, title=heading, plot=plot.name, extra=extra)
    report = write_text_atomic(folder / "report.md", text)
    return {"report": report, "plot": plot}
