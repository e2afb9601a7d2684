"""``tpusim plan``: show the sharding plan a model gets, and its collectives.

Usage::

    tpusim plan --model tests/data/deepseek-v3/config.json --plan tp=8,expert_groups=2,expert_tp=4
    tpusim plan --model kimi-k3 --hardware tpu-v7 --chips 16          # the plan simulate would use
    tpusim plan --model qwen3.json --plan tp=4,attention=dp --formats experts=fp8 --json

The device count comes from ``--hardware``/``--chips``, else ``--devices``, else the plan
itself (a SPEC's ``tp``, a plan file's ``devices``). With ``--hardware`` the report includes
the HBM capacity check at ``--batch`` and ``--context``. Every number is derived from the
model file and the plan; nothing is simulated.
"""

from __future__ import annotations

import argparse

from hwmodels.errors import InputError
from tpusim.app.cli.common import add_model_options, emit_report, load_model_with_formats
from tpusim.app.tables import TableData, add_format_option, emit, output_format
from tpusim.cli_options import (
    BATCH_HELP,
    CHIPS_HELP,
    CONTEXT_HELP,
    HARDWARE_HELP,
    add_batch_option,
    add_chips_option,
    add_context_option,
    add_hardware_option,
    add_model_option,
    positive_int,
)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("plan", help="print the sharding plan a model gets and its collectives",
                                   description="Print a deployment plan, its collectives and per-device bytes.")
    add_model_option(parser, required=True)
    add_model_options(parser)
    add_hardware_option(parser, help=f"{HARDWARE_HELP}; adds the HBM capacity check")
    add_chips_option(parser, help=f"{CHIPS_HELP} (with --hardware)")
    parser.add_argument("--devices", type=positive_int, default=None, help="devices, when no --hardware is given")
    add_batch_option(parser, help=f"{BATCH_HELP} (for KV-cache bytes)")
    add_context_option(parser, help=f"{CONTEXT_HELP} (for KV-cache bytes)")
    parser.add_argument("--kernels", action="store_true",
                        help="with a GPU --hardware: list the serving stack's kernels per layer kind "
                        "(the chip's fusion table, e.g. sglang-k3 on b300), main and side stream")
    add_format_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hwmodels.catalog import make_system
    from tpusim.report.plan import plan_report
    from tpusim.workload.model_catalog import plan_devices, plan_for, plan_for_system

    model = load_model_with_formats(args)
    chip = None
    if args.hardware:
        if not args.chips:
            raise InputError("--hardware needs --chips")
        from tpusim.workload.format_choice import formats_for_chip
        from tpusim.workload.model_catalog import load_model

        chip = make_system(args.hardware, args.chips).chip
        model, _ = formats_for_chip(load_model(args.model), args.formats, chip.kind)  # as every command
        plan = plan_for_system(model, chip, args.chips, args.plan)
    else:
        devices = args.devices or plan_devices(args.plan)
        if not devices:
            raise InputError("say how many devices: --hardware H --chips N, --devices N, or tp=N in --plan")
        plan = plan_for(model, devices, choice=args.plan)
    report = plan_report(model, plan, chip, batch=args.batch, context_tokens=args.context)
    if args.kernels:
        report["kernels"] = _kernels(model, plan, chip, args)
    return emit_report(report, output_format(args), _print)


def _kernels(model, plan, chip, args: argparse.Namespace) -> dict:  # type: ignore[no-untyped-def]
    """The stack's kernels per layer kind (:func:`tpusim.engine.gpu_fusion.kernel_lists`)."""
    from tpusim.engine.gpu_fusion import kernel_lists, load_stack
    from tpusim.workload.program import build_program

    if chip is None or chip.execution.gpu is None:
        raise InputError("--kernels lists a GPU serving stack's kernels: give a GPU --hardware and --chips")
    stack = load_stack(chip.execution.gpu.stack)
    program = build_program(model, plan, batch=args.batch, context_tokens=args.context)
    return {"stack": stack.name, "description": stack.description, "source": stack.source,
            "layers": kernel_lists(program, stack)}


def _print(report: dict, fmt: str) -> None:
    plan, params, per_device = report["plan"], report["parameters"], report["per_device"]
    split = TableData(title="split (per device)", columns=["field", "value"], right_aligned=("value",))
    for key in ("devices", "attention_tp", "attention_dp", "attention_heads_per_device", "kv_heads_per_device",
                "expert_groups", "expert_tp"):
        split.add(key, plan[key])
    split.add("experts per group", report["experts_per_group"])
    split.add("expert slice width", report["expert_slice_width"])
    table = TableData(title="collectives per layer (derived)",
                      columns=["name", "phase", "kind", "after op", "bytes/token", "stages"],
                      right_aligned=("bytes/token",))
    for c in report["collectives"]:
        stages = " then ".join(f"{s['peers']} peers over {s['link']}" for s in c["stages"])
        table.add(c["name"], c["phase"], c["kind"], c["after"], c["bytes_per_token"],
                  stages + (" (overlapped)" if c.get("overlapped") else ""))
    formats = ", ".join(f"{k}={v}" for k, v in report["formats"].items())
    notes = [
        f"{report['model']}: {params['total'] / 1e9:.2f} B parameters ({params['routed_experts'] / 1e9:.2f} B in "
        f"routed experts; derived)",
        f"plan {plan['name']}: {plan['description']} (source: {plan['source']})",
        f"per device: weights {per_device['weight_bytes'] / 1e9:.2f} GB (routed experts "
        f"{per_device['routed_expert_bytes'] / 1e9:.2f} GB), KV cache and state "
        f"{per_device['kv_and_state_bytes'] / 1e9:.3f} GB at batch {per_device['batch']}, "
        f"context {per_device['context_tokens']} (derived)",
        f"formats: {formats}",
    ]
    capacity = report.get("capacity")
    if capacity:
        verdict = "fits" if capacity["fits"] else f"does NOT fit: {capacity.get('reason', '')}"
        notes.append(f"capacity on {capacity['chip']}: needs {capacity['needed_bytes_per_device'] / 1e9:.1f} GB of "
                     f"{capacity['hbm_bytes_per_device'] / 1e9:.1f} GB per device: {verdict}")
    tables = [split, table]
    kernels = report.get("kernels")
    if kernels:
        for entry in kernels["layers"]:
            rows = TableData(title=f"{kernels['stack']} kernels, layer {entry['layer']} ({entry['blocks']}): "
                             f"{entry['main']} main + {entry['side']} side stream",
                             columns=["#", "op", "kind", "stream", "what"], right_aligned=("#",))
            for index, k in enumerate(entry["kernels"], 1):
                rows.add(index, k["op"], k["kind"], "side" if k["side"] else "main", k["what"])
            tables.append(rows)
        notes.append(f"kernels: {kernels['description']} (source: {kernels['source']})")
    emit(tables, fmt, notes=notes)
