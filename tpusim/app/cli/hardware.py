"""``tpusim hardware``: list, show and probe catalog chips.

Usage::

    tpusim hardware                         # one row per chip: the headline figures
    tpusim hardware show tpu-v7             # every figure with value, unit, label, source
    tpusim hardware show h200 --json        # the chip as JSON (calibrated overlay applied)
    tpusim hardware show tpu-v7 --uncalibrated   # the published figures only
    tpusim hardware probe [--quick] [--json]     # measure this host, save host-cpu.yaml

All values are per device (one TensorCore on TPU v7, one GPU on NVIDIA parts); the list's
"dev" column says how many devices a chip holds. Units are converted for display
only, from the unit each field name states: off-chip memory in decimal GB (as vendors
publish HBM), on-chip memory in KiB/MiB (as they publish SRAM), rates in GB/s or TB/s.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from hwmodels.catalog import display_path, list_chips, load_chip
from hwmodels.overlay import iter_figures
from hwmodels.probe import probe_host, write_host_entry
from hwmodels.schema import Chip, Figure
from hwmodels.units import KIB, MIB
from tpusim.app.tables import TableData, add_format_option, emit, output_format


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "hardware",
        help="list, show and probe catalog chips",
        description="List the catalog chips with their headline figures per device, each labelled "
        "(published, measured, derived, assumed, calibrated); show one chip's every figure with its "
        "unit, label and source; or probe this host and save it as host-cpu. Source tags are "
        "expanded by `tpusim sources`.",
    )
    parser.set_defaults(func=run_list)
    add_format_option(parser, json_flag=False)
    actions = parser.add_subparsers(dest="hardware_command", metavar="ACTION",
                                    help="list (the default), show NAME, or probe")

    listing = actions.add_parser(
        "list", help="one row per chip (the same as plain `tpusim hardware`)",
        description="One row per catalog chip with its headline figures, per device.")
    add_format_option(listing, json_flag=False)
    listing.set_defaults(func=run_list)

    show = actions.add_parser(
        "show", help="every figure of one chip, with unit, label and source",
        description="Every figure of one chip with its value, unit, label (published, measured, "
        "derived, assumed, calibrated) and source; source tags such as [INF] are expanded by "
        "`tpusim sources`.")
    show.add_argument("name", help="catalog chip name (see `tpusim hardware`)")
    add_format_option(show, json_flag=False)
    show.add_argument("--json", action="store_true", help="print the chip as JSON (the catalog's fields)")
    show.add_argument(
        "--uncalibrated",
        action="store_true",
        help="ignore any calibrated overlay (published figures)",
    )
    show.set_defaults(func=run_show)

    probe = actions.add_parser(
        "probe", help="measure this host and save it as host-cpu",
        description="Measure this host's memory bandwidth and matmul rate and save them as the "
        "host-cpu chip in the local folder (every figure labelled measured).")
    probe.add_argument("--quick", action="store_true", help="small sizes, few repeats (~2 s)")
    add_format_option(probe, json_flag=False)
    probe.add_argument("--json", action="store_true", help="print the probed chip as JSON")
    probe.set_defaults(func=run_probe)


# --------------------------------------------------------------------------- formatting


def format_figure_value(path: str, value: float) -> tuple[str, str]:
    """(number, unit) for display, chosen from the unit suffix of the field path."""
    if "_bytes_per_s" in path:
        if value >= 1e12:
            return f"{value / 1e12:.3g}", "TB/s"
        return f"{value / 1e9:.4g}", "GB/s"
    if ".peak_flops_per_s." in path:
        return f"{value / 1e12:.4g}", "TFLOP/s"
    if path.endswith("_bytes"):
        if value >= 1e9:  # off-chip memory: decimal GB, as vendors publish HBM
            return f"{value / 1e9:.4g}", "GB"
        if value >= MIB:  # on-chip memory: binary units, as vendors publish SRAM
            return f"{value / MIB:.4g}", "MiB"
        return f"{value / KIB:.4g}", "KiB"
    if path.endswith("_s") or path.endswith("_s_per_tile"):
        if value == 0.0:
            return "0", "s"
        if value < 1e-6:
            return f"{value * 1e9:.4g}", "ns"
        if value < 1e-3:
            return f"{value * 1e6:.4g}", "µs"
        return f"{value * 1e3:.4g}", "ms"
    if path.endswith("_w"):
        return f"{value:.4g}", "W"
    return f"{value:.4g}", ""


def _onchip_mib(chip: Chip) -> float:
    """Device-wide staging memory: per-device tiers plus per-SM tiers times the SM count."""
    tier = chip.staging_memory
    if tier.per == "sm":
        return tier.capacity_bytes.value * (chip.sm_count or 1) / MIB
    return tier.capacity_bytes.value / MIB


LABEL_LETTERS = {"published": "P", "measured": "M", "derived": "D", "assumed": "A", "prior": "R", "calibrated": "C"}
LABEL_LEGEND = "labels: P published, M measured, D derived, A assumed, R prior, C calibrated (sources: `tpusim hardware show NAME`)"


def _labelled(text: str, figure: Figure) -> str:
    return f"{text} ({LABEL_LETTERS[figure.label]})"


def chip_summary_row(chip: Chip) -> list[str]:
    """One list row; every figure carries its label's letter (:data:`LABEL_LETTERS`)."""
    bf16 = chip.matrix_unit.peak_flops_per_s.get("bf16")
    staging = chip.staging_memory
    return [
        chip.name,
        chip.kind,
        str(chip.devices_per_chip),
        _labelled(f"{chip.hbm.capacity_bytes.value / 1e9:.1f}", chip.hbm.capacity_bytes),
        _labelled(f"{chip.hbm.peak_bandwidth_bytes_per_s.value / 1e12:.2f}", chip.hbm.peak_bandwidth_bytes_per_s),
        _labelled(f"{bf16.value / 1e12:.4g}", bf16) if bf16 else "—",
        _labelled(f"{_onchip_mib(chip):.4g} {staging.display_name}", staging.capacity_bytes),
        "yes" if chip.is_calibrated else "no",
    ]


def figures_table(chip: Chip, title: str) -> TableData:
    table = TableData(title=title, columns=["field", "value", "unit", "label", "source"],
                      right_aligned=("value",), records=[])
    for path, figure in iter_figures(chip):
        number, unit = format_figure_value(path, figure.value)
        if figure.uncertainty is not None:
            spread, _ = format_figure_value(path, figure.uncertainty)
            number = f"{number} ± {spread}"
        table.add(path, number, unit, figure.label, figure.source)
        table.records.append({"field": path, "value": figure.value, "uncertainty": figure.uncertainty,
                              "label": figure.label, "source": figure.source})
    return table


def _structure_lines(chip: Chip) -> list[str]:
    """Non-figure facts (counts, tiles, topology) that the figure table does not show."""
    lines = [f"devices per chip: {chip.devices_per_chip}"]
    if chip.sm_count:
        lines.append(f"SMs: {chip.sm_count}")
    for unit in chip.compute:
        if unit.tile_rows > 1 or unit.tile_cols > 1:
            lines.append(f"{unit.name} tile: {unit.tile_rows} x {unit.tile_cols}")
    if chip.dma.service == "in_order":
        lines.append(f"dma: {chip.dma.engines} engine(s), copies served one at a time in issue order "
                     f"({chip.dma.service_source})")
    else:
        lines.append(
            f"dma: {chip.dma.engines} engine(s), {chip.dma.efficient_in_flight} "
            f"{'streams' if chip.dma.contention_unit == 'stream' else 'copies'} in flight before contention, "
            f"shared round-robin ({chip.dma.service_source})"
        )
    for link in chip.links:
        domain = "" if link.domain_devices >= 1 << 30 else f", domain {link.domain_devices} devices"
        lines.append(f"link {link.name}: {link.topology}, {link.links_per_device} link(s){domain}")
    lines.append(f"execution: {chip.execution.mode}")
    return lines


def _print_figure(chip: Chip, title: str, fmt: str) -> None:
    notes = [] if fmt == "json" else [f"  {line}" for line in _structure_lines(chip)]
    emit(figures_table(chip, title), fmt, notes=notes)


# --------------------------------------------------------------------------- commands


def run_list(args: argparse.Namespace) -> int:
    columns = ["name", "kind", "dev", "HBM GB", "HBM TB/s", "bf16 TFLOP/s", "staging MiB", "calibrated"]
    table = TableData(title="Catalog chips (values per device)", columns=columns,
                      right_aligned=columns[2:-1])
    for name in list_chips():
        table.add(*chip_summary_row(load_chip(name)))
    fmt = output_format(args)
    emit(table, fmt, notes=[] if fmt == "json" else [LABEL_LEGEND])
    return 0


def run_show(args: argparse.Namespace) -> int:
    chip = load_chip(args.name, calibrated=not args.uncalibrated)
    fmt = output_format(args)
    if fmt == "json":
        print(json.dumps(chip.model_dump(mode="json", exclude_none=True), indent=2, ensure_ascii=False))
        return 0
    state = chip.calibration.note() if chip.calibration is not None else "published figures"
    _print_figure(chip, f"{chip.name}: {chip.description} ({state}; values per device)", fmt)
    return 0


def run_probe(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    console.print("probing this host" + (" (quick)" if args.quick else "") + " ...")
    chip = probe_host(quick=args.quick)
    path = write_host_entry(chip)
    fmt = output_format(args)
    if fmt == "json":
        print(json.dumps(chip.model_dump(mode="json", exclude_none=True), indent=2, ensure_ascii=False))
        return 0
    _print_figure(chip, f"{chip.name}: {chip.description}", fmt)
    print(f"saved {display_path(path)}")
    return 0
