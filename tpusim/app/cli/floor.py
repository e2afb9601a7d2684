"""`tpusim floor`: analytic per-device bytes and floors of a decode step."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from tpusim.app.cli.common import add_workload_options, emit_json, resolve_workload


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "floor", help="analytic floors: HBM bytes / bandwidth, FLOPs / peak, collective latency",
        description="Analytic lower bounds of one decode step on one device: the bytes it must read "
        "from HBM over the published bandwidth, its FLOPs over the peak at each op's dtype, and the "
        "latency of its blocking collectives. No simulation: every figure is an analytic floor.")
    add_workload_options(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tpusim.report.floor import floor_report

    model, plan, system, routing = resolve_workload(args)
    report = floor_report(model, plan, system, batch=args.batch, context_tokens=args.context,
                          routing=routing, seed=args.seed)
    if args.json:
        emit_json(report)
        return 0
    console = Console()
    gb, mib = 1e9, float(1 << 20)
    table = Table(title=f"{report['model']} on {report['system']}, batch {report['batch']}, plan {report['plan']} — analytic floor")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("label")
    table.add_row("bytes per device per step (expected device)", f"{report['bytes_per_device'] / gb:.3f} GB", "analytic")
    table.add_row("bytes, critical device", f"{report['bytes_per_device_critical'] / gb:.3f} GB", "analytic (sampled routing)")
    table.add_row("routed experts per device per layer", f"{report['routed_experts_per_device_per_layer']:.3f}",
                  "closed form" if report["routed_experts_closed_form"] else "sampled mean")
    table.add_row("HBM floor", f"{report['hbm_floor_ms']:.3f} ms", "analytic floor")
    table.add_row("compute floor", f"{report['compute_floor_ms']:.3f} ms", "analytic floor")
    table.add_row("collective floor", f"{report['collective_floor_ms']:.3f} ms", "analytic floor")
    table.add_row("floor", f"{report['floor_ms']:.3f} ms ({report['bound_by']}-bound)", "analytic floor")
    table.add_row("tokens/s at floor", f"{report['tokens_per_s_at_floor']:.1f}", "analytic floor")
    console.print(table)
    fam = Table(title="bytes per device by weight family (expected device)")
    fam.add_column("family")
    fam.add_column("MiB", justify="right")
    fam.add_column("share", justify="right")
    total = report["bytes_per_device"]
    for family, size in sorted(report["breakdown"]["bytes_by_family"].items(), key=lambda kv: -kv[1]):
        fam.add_row(family, f"{size / mib:.1f}", f"{100 * size / total:.1f} %")
    console.print(fam)
    console.print(f"source: {report['source']}")
    return 0
