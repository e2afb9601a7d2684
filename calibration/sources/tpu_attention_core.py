"""What the MLA core's KV loop costs on the v5e, measured: the ``mla_core`` probe.

libtpu's static schedule of the megakernel's KV-tile loop (``kernel_attention._attend_cache``)
holds 259 bundles a 16-token part at one row and 1,982 at sixteen
(:func:`calibration.sources.tpu_layer_static.kv_loops`); the decodes' context cost was 2–4x
what those bundles issue. The ``mla_core`` probe (:mod:`calibration.tpu_bench.probes_attention`)
runs that loop alone — the kernel's own function at Kimi K3's TP32 per-device MLA widths — at
1, 4, 8 and 16 rows and 1–8 tiles of 128 tokens, and measures what a tile costs on the chip.

Rule (:func:`core_tiles`): per build (rows, KV buffers) with no copies ahead of the core and
per tile count, one repetition's seconds is the slope of the whole-call time over ``R``
(:func:`calibration.core.fitting.fit_line` over every record with ``R ≥ 2``, all sessions);
then a line over the tile counts: its slope is what a 128-token tile costs, its intercept what
the core costs beyond its tiles. Measured on tpu-v5e from probe records only, never from a
kernel step. :func:`attention_core_probe` turns the slope at a batch (linear between the
probed rows; the nearest two beyond them) into the engine's
``execution.attention_core_s_per_token`` (the tile's seconds less the static schedule's code a
tile beyond its parts, over its tokens: the kernel folds every part of a tile, so the cost
scales with the tile's tokens) and ``_per_tile`` (that static remainder). The intercept is left
to the engine (the first tile's wait, priced by its DMA model).

The ``kda_core`` probe (the KDA layer's delta rule with its recurrent state copied in, waited,
and written back; :func:`kda_cores`) is read beside libtpu's bundles for the same code
(``static_counts --kda-core``) and the state's bytes at the stream rate: where the batch-16
decodes' per-row time goes, or does not (docs/megakernel-on-tpu.md). Not priced from it: the
engine already prices the core's code (the layer loop's bundles) and its state copies.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration.core.fitting import fit_line
from calibration.sources.tpu_layer_static import STATIC_PATH
from calibration.sources.tpu_probes import PROBES_PATH, _date, load_probes

PROBE = "mla_core"
BUFFERS = 2  # the schedule's default KV buffers: the builds the engine's figure is read from


@dataclass(frozen=True)
class CoreBuild:
    """One (rows, KV buffers, 1 MiB copies ahead) build: seconds a tile and beyond the tiles."""

    batch: int
    buffers: int
    large_copies: int
    tile_tokens: int
    tile_s: float
    core_s: float
    per_tiles: tuple[tuple[int, float], ...]  # (tiles, seconds a repetition)


def core_tiles(probe_path: Path | str = PROBES_PATH) -> list[CoreBuild]:
    """Every build with two or more tile counts, each measured at two or more ``R ≥ 2``."""
    points: dict[tuple[int, int, int, int], dict[int, list[tuple[int, float]]]] = {}
    for record in load_probes(probe_path):
        p = record["params"] if record["probe"] == PROBE else None
        if p is None or p["repeats_in_kernel"] < 2:
            continue
        key = (p["batch"], p["kv_buffers"], p["large_copies"], p["kv_tile_tokens"])
        points.setdefault(key, {}).setdefault(p["tiles"], []).append((p["repeats_in_kernel"], record["seconds_median"]))
    builds = []
    for (batch, buffers, ahead, tokens), by_tiles in sorted(points.items()):
        per = [(t, fit_line([r for r, _ in pts], [s for _, s in pts]).slope)
               for t, pts in sorted(by_tiles.items()) if len({r for r, _ in pts}) >= 2]
        if len(per) < 2:
            continue
        line = fit_line([t for t, _ in per], [s for _, s in per])
        builds.append(CoreBuild(batch, buffers, ahead, tokens, line.slope, line.intercept, tuple(per)))
    return builds


def tile_seconds(batch: int, probe_path: Path | str = PROBES_PATH) -> tuple[float, int, str] | None:
    """(seconds a tile at ``batch`` rows, the tile's tokens, date) from the default-buffer builds
    with no copies ahead: linear in the rows between the two probed batches around ``batch`` (the
    nearest two beyond the probed range); None without two such builds. Remembered per file."""
    path = Path(probe_path)
    return _tile_seconds(batch, (str(path), path.stat().st_mtime_ns, path.stat().st_size))


@functools.lru_cache(maxsize=32)
def _tile_seconds(batch: int, stamp: tuple[str, int, int]) -> tuple[float, int, str] | None:
    builds = [b for b in core_tiles(stamp[0]) if b.buffers == BUFFERS and b.large_copies == 0]
    if len(builds) < 2:
        return None
    builds.sort(key=lambda b: b.batch)
    upper = next((i for i, b in enumerate(builds) if b.batch >= batch), len(builds) - 1)
    lo, hi = builds[max(0, upper - 1)], builds[max(1, upper)]
    value = lo.tile_s + (hi.tile_s - lo.tile_s) * (batch - lo.batch) / (hi.batch - lo.batch)
    dates = [r for r in load_probes(stamp[0]) if r["probe"] == PROBE]
    return value, lo.tile_tokens, _date(dates)


def attention_core_probe(batch: int, static_tile_s: float = 0.0, probe_path: Path | str = PROBES_PATH
                         ) -> tuple[float, float, str] | None:
    """(seconds a cached token, seconds a tile beyond its tokens', source) of the MLA core at
    ``batch`` rows from the probe (module docstring); ``static_tile_s`` is the static schedule's
    code a tile beyond its parts (kept per tile). None without the probe's records."""
    found = tile_seconds(batch, probe_path)
    if found is None:
        return None
    tile_s, tokens, date = found
    token_s = max(0.0, tile_s - static_tile_s) / tokens
    return token_s, static_tile_s, (
        f"measured on tpu-v5e (probe {PROBE}, {date}): the megakernel's KV-tile loop alone at K3 TP32 widths, "
        f"{tile_s * 1e6:.2f} us a {tokens}-token tile at {batch} rows (slope over 1-8 tiles, 2 buffers, linear "
        f"in the rows between the probed 1/4/8/16), less the static schedule's {static_tile_s * 1e9:.0f} ns a "
        "tile beyond its parts, over its tokens")


@dataclass(frozen=True)
class KernelContextCost:
    """What the kernel itself pays for its cache, from capped runs of one (schedule, rows, expert
    cap, build) at two or more contexts: the slope of the measured step over the cached tokens,
    per MLA layer and per 128 tokens (derived from measured steps; a location, not an input)."""

    schedule: str
    build: str  # the kernel build: panel loops and expert list
    batch: int
    expert_cap: int
    contexts: tuple[int, ...]
    kv_tile_tokens: int
    kernel_s: float  # seconds a 128 tokens a MLA layer, in the kernel
    probe_s: float | None  # the mla_core probe's at the same rows (linear between probed rows)


def kernel_context_costs(runs: list[Any], probe_path: Path | str = PROBES_PATH) -> list[KernelContextCost]:
    """:class:`KernelContextCost` of every group of ``runs`` (capped
    :class:`calibration.sources.tpu_chip_records.ChipRecord`s) measured at two or more contexts.
    The MLA layers are counted in the record's own program (ops named ``mla.core``), the tile
    from its schedule; the probe's figure is :func:`tile_seconds` scaled to 128 tokens."""
    from calibration.sources.tpu_chip_records import record_step
    from tpusim.workload.registry.names import MlaOp

    groups: dict[tuple[Any, ...], list[Any]] = {}
    for run in runs:
        key = (run.schedule, run.batch, run.expert_cap, run.panel_unroll, run.expert_list)
        groups.setdefault(key, []).append(run)
    out = []
    for (schedule, batch, cap, unroll, listed), group in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        contexts = sorted({r.context for r in group})
        if len(contexts) < 2:
            continue
        program, plan = record_step(group[0])
        mla_layers = len({op.layer for op in program.ops if op.name == MlaOp.CORE})
        slope = fit_line([r.context for r in group], [r.ms_median * 1e-3 for r in group]).slope
        probe = tile_seconds(batch, probe_path)
        out.append(KernelContextCost(schedule, f"u{unroll[0]}x{unroll[1]} {listed} list", batch, int(cap or 0), tuple(contexts), plan.kv_tile_tokens,
                                     slope * 128 / mla_layers,
                                     probe[0] * 128 / probe[1] if probe is not None else None))
    return out


def context_table(costs: list[KernelContextCost]) -> list[str]:
    """The kernel's context cost beside the probe's, as markdown lines."""
    lines = ["| schedule | build | rows | expert cap | contexts | KV tile tokens | µs a 128 tokens a MLA layer in the kernel "
             "(derived: slope of the measured capped steps over the context) | the `mla_core` probe's µs (measured on "
             "tpu-v5e, the same code alone) | kernel − probe µs |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|"]
    for c in costs:
        probe = f"{c.probe_s * 1e6:.2f}" if c.probe_s is not None else "—"
        gap = f"{(c.kernel_s - c.probe_s) * 1e6:+.2f}" if c.probe_s is not None else "—"
        lines.append(f"| {c.schedule} | {c.build} | {c.batch} | {c.expert_cap} | {' / '.join(map(str, c.contexts))} | "
                     f"{c.kv_tile_tokens} | {c.kernel_s * 1e6:.2f} | {probe} | {gap} |")
    return lines


@dataclass(frozen=True)
class KdaCore:
    """One batch of the ``kda_core`` probe: measured seconds a layer, static bundles, state bytes."""

    batch: int
    seconds: float
    bundles: int | None
    state_bytes: int


def kda_cores(probe_path: Path | str = PROBES_PATH, static_path: Path | str = STATIC_PATH) -> list[KdaCore]:
    """Per batch with no copies ahead: one repetition's seconds (the slope over ``R ≥ 2``, all
    sessions) and the repetition's static bundles where counted."""
    import json

    static = {}
    if Path(static_path).is_file():
        for line in Path(static_path).read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("probe") == "kda_core" and row.get("chip") == "tpu-v5e":
                static[row["params"]["batch"]] = row["repetition_bundles"]
    points: dict[int, list[tuple[int, float]]] = {}
    sizes: dict[int, int] = {}
    for record in load_probes(probe_path):
        p = record["params"] if record["probe"] == "kda_core" else None
        if p is None or p["repeats_in_kernel"] < 2 or p["large_copies"]:
            continue
        points.setdefault(p["batch"], []).append((p["repeats_in_kernel"], record["seconds_median"]))
        sizes[p["batch"]] = p["state_bytes"]
    return [KdaCore(b, fit_line([r for r, _ in pts], [t for _, t in pts]).slope, static.get(b), sizes[b])
            for b, pts in sorted(points.items()) if len({r for r, _ in pts}) >= 2]


def kda_table(cores: list[KdaCore], s_per_bundle: float, stream_bytes_per_s: float) -> list[str]:
    """The KDA cores beside their bundles and their state's copies at the stream rate."""
    lines = ["| rows | µs a layer (measured on tpu-v5e) | static bundles | bundles µs (derived: the code_size "
             "probe's rate) | state in + out µs (derived: bytes / measured stream rate) | measured − both µs |",
             "|---:|---:|---:|---:|---:|---:|"]
    for c in cores:
        code = c.bundles * s_per_bundle if c.bundles is not None else float("nan")
        copies = 2 * c.state_bytes / stream_bytes_per_s
        lines.append(f"| {c.batch} | {c.seconds * 1e6:.2f} | {c.bundles if c.bundles is not None else '—'} | "
                     f"{code * 1e6:.2f} | {copies * 1e6:.2f} | {(c.seconds - code - copies) * 1e6:+.2f} |")
    return lines


def table(builds: list[CoreBuild]) -> list[str]:
    """The builds, as markdown lines."""
    lines = ["| rows | KV buffers | 1 MiB copies ahead | µs a repetition at 1 / 2 / 4 / 8 tiles (measured on tpu-v5e) | "
             "µs a tile (slope) | µs beyond the tiles (intercept) |",
             "|---:|---:|---:|---|---:|---:|"]
    for b in builds:
        reps = " / ".join(f"{s * 1e6:.1f}" for _, s in b.per_tiles)
        lines.append(f"| {b.batch} | {b.buffers} | {b.large_copies} | {reps} | {b.tile_s * 1e6:.2f} | {b.core_s * 1e6:.2f} |")
    return lines


def main() -> int:
    """``python -m calibration.sources.tpu_attention_core``: the MLA builds' figures, then the KDA
    cores beside their bundles (at the ``code_size`` probe's rate) and state copies (at the
    micro-probe chip's stream rate)."""
    from calibration.sources.tpu_code_issue import code_issue
    from calibration.sources.tpu_probes import probe_chip
    from hwmodels.catalog import load_chip

    builds = core_tiles()
    if not builds:
        sys.stderr.write(f"no {PROBE} records with two tile counts at two R\n")
        return 1
    sys.stdout.write("\n".join(table(builds)) + "\n\n")
    from calibration.sources.tpu_fixed_cost import FIXED_COST_PATH, capped_runs
    from megakernel.quant_pairs import KERNEL_DECODER

    costs = kernel_context_costs(capped_runs(FIXED_COST_PATH, KERNEL_DECODER, batch=None))
    if costs:
        sys.stdout.write("\n".join(context_table(costs)) + "\n\n")
    issue = code_issue()
    stream = probe_chip(load_chip("tpu-v5e", calibrated=False)).hbm.sustained_bandwidth_bytes_per_s.value
    if issue is not None:
        sys.stdout.write("\n".join(kda_table(kda_cores(), issue.s_per_bundle, stream)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
