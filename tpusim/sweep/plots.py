"""``pareto.png`` and ``sensitivity.png`` (matplotlib, Agg backend, written atomically).

Pareto: tokens/s against VMEM peak. Simulated candidates are the coloured points (engine
numbers), estimated-only ones light grey (estimate tokens/s against static VMEM), the
frontier (no other simulated candidate is both faster and smaller) is a step line, and the
built-ins and the chosen schedule are labelled.

Sensitivity: for each knob varied alone around the refine seed, the spread of step time
across its values, as % of the seed's (see :func:`tpusim.sweep.report.knob_spreads`).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from hwmodels.units import MIB
from tpusim.sweep.outputs import write_bytes_atomic
from tpusim.sweep.report import knob_spreads

if TYPE_CHECKING:
    from tpusim.sweep.evaluate import Workload
    from tpusim.sweep.result import SweepResult


def pareto_frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points (vmem, tokens/s) not dominated by one with ≤ VMEM and ≥ tokens/s, by VMEM."""
    frontier: list[tuple[float, float]] = []
    best = float("-inf")
    for vmem, tps in sorted(points, key=lambda p: (p[0], -p[1])):
        if tps > best:
            frontier.append((vmem, tps))
            best = tps
    return frontier


def _save(fig: Any, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    write_bytes_atomic(path, buffer.getvalue())
    return path


def pareto_plot(result: SweepResult, path: Path, workload: Workload) -> Path:
    w = workload.describe()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    est = [r for r in result.rows if r["status"] == "estimated" and r.get("vmem_static_mib") is not None]
    if est:
        ax.scatter([r["vmem_static_mib"] for r in est], [r["tokens_per_s"] for r in est], s=8, c="0.8",
                   label=f"estimate only ({len(est)}; static VMEM)")
    sim = [r for r in result.rows if r["status"] == "simulated"]
    vmem_of = {r["hash"]: (r.get("vmem_peak_mib") or r.get("vmem_static_mib") or 0.0) for r in sim}
    if sim:
        ax.scatter([vmem_of[r["hash"]] for r in sim], [r["tokens_per_s"] for r in sim], s=22, c="tab:blue",
                   label=f"simulated ({len(sim)})", zorder=3)
        frontier = pareto_frontier([(vmem_of[r["hash"]], r["tokens_per_s"]) for r in sim])
        ax.step([p[0] for p in frontier], [p[1] for p in frontier], where="post", c="tab:red", lw=1.2,
                label="Pareto frontier (simulated)", zorder=2)
    for r in result.rows:
        if r["source"] == "builtin" and r.get("tokens_per_s"):
            x = vmem_of.get(r["hash"], r.get("vmem_static_mib") or 0.0)
            ax.annotate(r["name"], (x, r["tokens_per_s"]), textcoords="offset points", xytext=(5, -10), fontsize=8)
            ax.scatter([x], [r["tokens_per_s"]], marker="s", s=40, facecolors="none", edgecolors="k", zorder=4)
    best = result.best_row
    bx = vmem_of.get(best["hash"], best.get("vmem_static_mib") or 0.0)
    ax.scatter([bx], [best["tokens_per_s"]], marker="*", s=160, c="gold", edgecolors="k", zorder=5,
               label=f"chosen ({best['predicted_by']})")
    capacity = workload.chip.staging_memory.usable_bytes / MIB
    ax.axvline(capacity, ls="--", c="0.5", lw=0.8, label=f"usable VMEM {capacity:.1f} MiB")
    ax.set_xlabel("VMEM peak, MiB (simulated; static for estimate-only points)")
    ax.set_ylabel("tokens/s (aggregate over the batch)")
    ax.set_title(f"{w['model']} on {w['hardware']} x{w['chips']}, batch {w['batch']}: tokens/s vs VMEM")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def sensitivity_plot(result: SweepResult, path: Path, top: int = 16) -> Path:
    spreads = knob_spreads(result.sensitivity)[:top][::-1]
    fig, ax = plt.subplots(figsize=(8.5, 0.36 * max(len(spreads), 4) + 1.6))
    ys = list(range(len(spreads)))
    values = [t["spread_pct"] or 0.0 for t in spreads]
    ax.barh(ys, values, color="tab:blue")
    for y, t, value in zip(ys, spreads, values, strict=True):
        ax.annotate(f" best {t['best_value']} (seed {t['seed_value']})", (value, y), va="center", fontsize=7)
    ax.set_yticks(ys, [t["knob"] for t in spreads], fontsize=8)
    ax.set_xlabel(f"spread of step time across the knob's values, % ({result.sensitivity_label})")
    ax.set_title(f"Which knobs matter most: each varied alone around\n{result.sensitivity_seed}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlim(0, max(values, default=1.0) * 1.45 or 1.0)
    return _save(fig, path)
