"""`tpusim floor`: analytic per-device bytes and floors of a decode step."""

from __future__ import annotations

import argparse

from hwmodels.units import MIB
from tpusim.app.cli.capacity_gate import check_fit
from tpusim.app.cli.common import add_workload_options, emit_json, resolve_workload
from tpusim.app.tables import TableData, add_format_option, emit, output_format

# The two floors of one workload, named alike in `floor` and `simulate`: the expected device
# (routed experts at their expectation) and the critical device (per layer the expert group
# loading the most experts: the device `simulate` runs, so its floor is `simulate`'s).
EXPECTED_DEVICE = "expected device"
CRITICAL_DEVICE = "critical device (the one simulate runs)"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "floor", help="analytic floors: HBM bytes / bandwidth, FLOPs / peak, collective latency",
        description="Analytic lower bounds of one decode step on one device: the bytes it must read "
        "from HBM over the published bandwidth, its FLOPs over the peak at each op's dtype, and the "
        "latency of its blocking collectives. No simulation: every figure is an analytic floor.")
    add_workload_options(parser)
    add_format_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tpusim.report.floor import floor_report

    model, plan, system, routing = resolve_workload(args)
    fit = check_fit(args, model, plan, system)  # capacity first
    report = floor_report(model, plan, system, batch=args.batch, context_tokens=args.context,
                          routing=routing, seed=args.seed)
    report["capacity"] = fit.as_json()
    report["formats"] = args.formats_choice  # how the weight formats were chosen (one rule for every command)
    fmt = output_format(args)
    if fmt == "json":
        emit_json(report)
        return 0
    gb = 1e9
    table = TableData(title=f"{report['model']} on {report['system']}, batch {report['batch']}, plan "
                      f"{report['plan']} — analytic floor", columns=["quantity", "value", "label"],
                      right_aligned=("value",))
    table.add("HBM needed / available", fit.summary(), fit.label)
    table.add("bytes per device per step (expected device)", f"{report['bytes_per_device'] / gb:.3f} GB", "analytic")
    table.add("bytes, critical device", f"{report['bytes_per_device_critical'] / gb:.3f} GB", "analytic (sampled routing)")
    table.add("routed experts per device per layer", f"{report['routed_experts_per_device_per_layer']:.3f}",
                  "closed form" if report["routed_experts_closed_form"] else "sampled mean")
    table.add("HBM floor", f"{report['hbm_floor_ms']:.3f} ms", "analytic floor")
    table.add("compute floor", f"{report['compute_floor_ms']:.3f} ms", "analytic floor")
    table.add("collective floor", f"{report['collective_floor_ms']:.3f} ms", "analytic floor")
    table.add(f"floor, {EXPECTED_DEVICE}", f"{report['floor_ms']:.3f} ms ({report['bound_by']}-bound)",
              "analytic floor")
    table.add(f"floor, {CRITICAL_DEVICE}", f"{report['floor_ms_critical_device']:.3f} ms", "analytic floor")
    table.add(f"tokens/s at floor, {EXPECTED_DEVICE}", f"{report['tokens_per_s_at_floor']:.1f}", "analytic floor")
    fam = TableData(title="bytes per device by weight family (expected device)",
                    columns=["family", "MiB", "share"], right_aligned=("MiB", "share"))
    total = report["bytes_per_device"]
    for family, size in sorted(report["breakdown"]["bytes_by_family"].items(), key=lambda kv: -kv[1]):
        fam.add(family, f"{size / MIB:.1f}", f"{100 * size / total:.1f} %")
    emit([table, fam], fmt, notes=[f"weight formats: {report['formats']}", f"source: {report['source']}"])
    return 0
