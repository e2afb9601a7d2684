"""``tpusim lower``: lower the megakernel for TPU at full per-device size, from this machine.

Usage::

    tpusim lower --model kimi-k3 --schedule published            # TP32 per-device sizes
    tpusim lower --model kimi-k3 --schedule best.json --batch 8 --json
    tpusim lower --schedule joint-sweep/best.json   # the joint sweep's winner: its plan + algorithms

Traces the Pallas megakernel with shapes only (nothing is allocated) and lowers it for TPU
(Pallas → Mosaic); on several devices with the plan's collectives inside it, over a mesh of
virtual devices in a fresh process (:mod:`megakernel.commands.lower_check`). It then prints its VMEM scratch beside the simulator's static accounting
(:mod:`tpusim.schedule.vmem`) and the chip's usable VMEM; it exits 1 when the kernel's scratch does not fit (or it does not lower). Lowering proves every op has a
Mosaic lowering rule ("traced to MLIR only: not compiled"). ``--hardware tpu-v5e|tpu-v6e|tpu-v7``
on one device (``--devices 1`` or ``--shard-of PLAN``: one device's program of a plan) with libtpu
installed also compiles it with libtpu's Mosaic compiler for that chip's topology, in a fresh
process (:mod:`megakernel.mosaic_compile`; no TPU needed), and prints the compile seconds or the
compiler's error in one paragraph (exit 1). A model or schedule the kernel cannot implement is reported
in words, exit 2. A schedule with a deployment (a joint sweep's ``best.json``) is lowered on
its plan with its collective algorithms, whose send/receive buffers the VMEM accounting
(``vmem_plan(...).total_bytes``) counts (:mod:`megakernel.commands.lower_check`).
"""

from __future__ import annotations

import argparse
from typing import Any

from hwmodels.errors import InputError
from hwmodels.units import MIB
from tpusim.app.cli.common import emit_json
from tpusim.cli_options import (
    KERNEL_CONTEXT_HELP,
    KERNEL_MODEL_HELP,
    add_batch_option,
    add_context_option,
    add_hardware_option,
    add_model_option,
    add_schedule_option,
    nonnegative_int,
    positive_int,
)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "lower", help="lower the megakernel for TPU at full per-device size; VMEM vs the simulator",
        description="Lower the Pallas megakernel for TPU from this machine (no TPU needed: shapes "
        "only, nothing allocated) at the per-device sizes of the model's published plan (Kimi K3: "
        "TP32), and print its VMEM scratch against the simulator's accounting and the chip's "
        "usable VMEM, or the reason it cannot lower, in words.")
    add_model_option(parser, default="kimi-k3", help=KERNEL_MODEL_HELP)
    add_schedule_option(parser, required=True)
    parser.add_argument("--devices", type=positive_int, default=None,
                        help="devices the model is split over (default: its published plan's, e.g. 32 for "
                        "kimi-k3; 1 when it has none)")
    add_batch_option(parser)
    add_context_option(parser, help=KERNEL_CONTEXT_HELP)
    add_hardware_option(parser,
                        help="TPU chip (tpu-v5e | tpu-v6e | tpu-v7): compile the kernel with libtpu's Mosaic "
                        "compiler for its topology (one device) and check its usable VMEM (default: trace "
                        "only, VMEM checked against tpu-v7)")
    parser.add_argument("--shard-of", default=None, metavar="PLAN",
                        help="one device's program of this plan (e.g. k3-tp32) alone on one chip, no collectives")
    parser.add_argument("--weight-banks", type=nonnegative_int, default=0, metavar="N",
                        help="stacked weights hold N distinct entries read in turn (the HBM bytes per step are "
                        "unchanged; fits the K3 shard's weights on one v5e); 0: one entry per layer")
    parser.add_argument("--scoped-vmem", action="store_true",
                        help="with a Mosaic compile: also read the compiler's own scoped-VMEM figure (scratch as "
                        "it lays it out, spill slots, its own scratch; one more compile, refused on purpose)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def default_devices(model_name: str) -> int:
    """The device count of the model's published plan (kimi-k3 → 32), else 1."""
    from tpusim.workload.model_catalog import PUBLISHED_PLANS

    family = model_name.partition("@")[0]
    return next((devices for (name, devices) in PUBLISHED_PLANS if name == family), 1)


def run(args: argparse.Namespace) -> int:
    from hwmodels.catalog import load_chip
    from megakernel.mosaic_compile import TOPOLOGIES, libtpu_available, vmem_used_bytes
    from tpusim.schedule.schema import load_schedule
    from tpusim.workload.model_catalog import load_model, plan_for, shard_plan

    chip = load_chip(args.hardware or "tpu-v7", calibrated=False)
    if chip.kind != "tpu":
        raise InputError(f"--hardware {args.hardware}: the megakernel lowers for TPU; name a TPU chip")
    model = load_model(args.model)
    if args.weight_banks < 0:
        raise InputError(f"--weight-banks {args.weight_banks}: must be >= 0")
    if args.shard_of and args.devices not in (None, 1):
        raise InputError("--shard-of PLAN lowers one device's program: leave out --devices")
    devices = 1 if args.shard_of else args.devices or default_devices(args.model)
    plan = shard_plan(model, args.shard_of) if args.shard_of else plan_for(model, devices)
    schedule = load_schedule(args.schedule)
    if devices == 1 and schedule.deployment is not None:
        raise InputError(f"--schedule {args.schedule}: it carries a deployment (plan + collectives); lower it "
                         "on the devices it was chosen for (--devices N, default the published plan's)")
    compiling = args.hardware is not None and devices == 1
    if compiling and chip.name.partition("@")[0] not in TOPOLOGIES:
        raise InputError(f"--hardware {args.hardware}: no Mosaic compile topology for it; name one of "
                         + ", ".join(TOPOLOGIES))
    if compiling and libtpu_available():
        report = _compile_fresh(args, chip.name)
    elif devices > 1:
        # the collective kernel compiles on TPU7x's compile-only topologies (8, 16, 32 devices)
        on_v7 = args.hardware is not None and chip.name.partition("@")[0] == "tpu-v7" and devices in (8, 16, 32)
        report = _lower_on_mesh(args, devices, compile=on_v7 and libtpu_available())
    else:
        report = _lower_here(args, model, plan, schedule)
    if "error" in report:
        what = {"model": "the megakernel cannot implement this model",
                "schedule": f"the megakernel cannot follow schedule {schedule.name!r} at {devices} device(s)",
                "plan": f"the megakernel cannot run the collectives of plan {report.get('plan', plan.name)}",
                "deployment": f"the megakernel cannot run the deployment of schedule {schedule.name!r}",
                }[report["error"]]
        raise InputError(f"{what}: {report['message']}")
    usable = chip.staging_memory.usable_bytes
    scratch, accounting = sum(report["scratch_bytes"].values()), sum(report["accounting_bytes"].values())
    data: dict[str, Any] = {
        **{key: report[key] for key in ("model", "plan", "devices", "schedule", "batch", "lowered",
                                        "scratch_bytes", "accounting_bytes", "collectives",
                                        "remote_copies_per_layer")},
        "scratch_tiled_total_bytes": report.get("scratch_tiled_bytes"),
        "deployment": report.get("deployment"), "plan_collectives": report.get("plan_collectives", {}),
        "scratch_total_bytes": scratch, "accounting_total_bytes": accounting,
        "relative_difference": (scratch - accounting) / accounting, "usable_vmem_bytes": usable,
        "tiled_relative_difference": (None if not report.get("scratch_tiled_bytes")
                                      else (accounting - report["scratch_tiled_bytes"]) / report["scratch_tiled_bytes"]),
        "usable_vmem_label": (chip.staging_memory.usable_capacity_bytes or chip.staging_memory.capacity_bytes).label,
        "fits": scratch <= usable, "hardware": chip.name, "compile": report.get("compile"),
        "compiled": "compile" in report, "compiler_scoped_vmem_bytes": report.get("compiler_scoped_vmem_bytes"),
        "vmem_capacity_bytes": chip.staging_memory.capacity_bytes.value,
    }
    refused = vmem_used_bytes((data["compile"] or {}).get("error"))
    if refused is not None and not data["compiler_scoped_vmem_bytes"]:  # the refusal says what it used
        data["compiler_scoped_vmem_bytes"], data["compiler_vmem_from"] = refused[0], "its refusal"
    if args.json:
        emit_json(data)
    else:
        _print(data)
    ok = report["lowered"] and data["fits"] and (data["compile"] is None or data["compile"]["ok"])
    return 0 if ok else 1


def mosaic_report(*, model: str, schedule_path: str, batch: int, context: int, chip_name: str, devices: int,
                  shard_of: str | None = None, weight_banks: int = 0) -> dict[str, Any]:
    """The kernel of (model, schedule file, batch) lowered and compiled with Mosaic in a fresh
    process: one device (or ``shard_of``'s one-device program) for ``chip_name``'s topology,
    several devices on TPU7x's compile-only topology (the caller checks both are possible).
    The report of ``tpusim lower --json``'s source (``compile``: ok, seconds, error, kind)."""
    args = argparse.Namespace(model=model, schedule=schedule_path, batch=batch, context=context,
                              weight_banks=weight_banks, shard_of=shard_of)
    return _lower_on_mesh(args, devices, compile=True) if devices > 1 else _compile_fresh(args, chip_name)


def _compile_fresh(args: argparse.Namespace, chip_name: str) -> dict[str, Any]:
    """One device with libtpu: lower and compile with Mosaic for ``chip_name``'s topology in a
    fresh process (``python -m megakernel.commands.mosaic_compile``): libtpu reads its environment when
    it is first loaded, before this process's JAX may have started."""
    import json
    import os
    import subprocess
    import sys

    from megakernel.mosaic_compile import ENVIRONMENT

    command = [sys.executable, "-m", "megakernel.commands.mosaic_compile", "--model", args.model, "--schedule",
               args.schedule, "--hardware", chip_name, "--batch", str(args.batch), "--context", str(args.context),
               "--weight-banks", str(args.weight_banks)]
    command += ["--shard-of", args.shard_of] if args.shard_of else ["--devices", "1"]
    command += ["--scoped-vmem"] if getattr(args, "scoped_vmem", False) else []
    env = {**os.environ, **ENVIRONMENT}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = done.stdout.strip().splitlines()
    if not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"compiling with Mosaic for {chip_name} failed: {last}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _lower_here(args: argparse.Namespace, model: Any, plan: Any, schedule: Any) -> dict[str, Any]:
    """One device: lower in this process (no collectives, no mesh)."""
    import dataclasses

    from megakernel.dims import UnsupportedModel
    from megakernel.dma_plan import UnsupportedSchedule
    from megakernel.tpu_lowering import lower_schedule

    try:
        report = lower_schedule(model, plan, schedule, batch=args.batch, max_context=args.context)
    except UnsupportedModel as error:
        return {"error": "model", "message": str(error)}
    except UnsupportedSchedule as error:
        return {"error": "schedule", "message": str(error)}
    return dataclasses.asdict(report)


def _lower_on_mesh(args: argparse.Namespace, devices: int, *, compile: bool = False) -> dict[str, Any]:
    """Several devices: a fresh process (``python -m megakernel.commands.lower_check``), because the
    mesh's virtual devices need XLA_FLAGS before JAX starts; ``compile``: also compile with
    Mosaic on compile-only TPU7x devices (``--compile``)."""
    import json
    import subprocess
    import sys

    command = [sys.executable, "-m", "megakernel.commands.lower_check", "--model", args.model, "--devices", str(devices),
               "--schedule", args.schedule, "--batch", str(args.batch), "--context", str(args.context)]
    if compile:
        command += ["--compile", "--scoped-vmem"] if getattr(args, "scoped_vmem", False) else ["--compile"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"lowering on {devices} devices failed: {last}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _print(data: dict[str, Any]) -> None:
    compiled = data.get("compile")
    if not data["lowered"]:
        state = "NOT lowered to a Mosaic call"
    elif compiled is None:
        state = "traced to MLIR only: not compiled (Pallas -> Mosaic tpu_custom_call)"
    else:
        state = "compiled by Mosaic" if compiled["ok"] else "Mosaic compile FAILED"
    print(f"{data['model']} ({data['plan']}, {data['devices']} devices), schedule {data['schedule']}, "
          f"batch {data['batch']}: {state}")
    if compiled is not None:
        verdict = "ok" if compiled["ok"] else f"FAILED ({compiled['kind']})"
        print(f"  Mosaic compile for {data['hardware']} ({compiled['topology']}): {verdict} "
              f"in {compiled['seconds']:.1f} s")
        if not compiled["ok"]:
            print(f"  compiler error: {compiled['error']}")
    print(f"  VMEM scratch of the kernel:         {data['scratch_total_bytes'] / MIB:9.2f} MiB")
    print(f"  VMEM static (simulator accounting): {data['accounting_total_bytes'] / MIB:9.2f} MiB "
          f"({100 * data['relative_difference']:+.2f} %)")
    if data.get("scratch_tiled_total_bytes"):
        print(f"  VMEM scratch as Mosaic tiles it:    {data['scratch_tiled_total_bytes'] / MIB:9.2f} MiB "
              "(derived: Mosaic's tiling rule, before the compiler's own temporaries; the accounting "
              f"{100 * data['tiled_relative_difference']:+.2f} % of it)")
    if data.get("compiler_scoped_vmem_bytes"):
        scoped, accounting = data["compiler_scoped_vmem_bytes"], data["accounting_total_bytes"]
        how = ("its refusal above" if data.get("compiler_vmem_from") else
               "compiled once more under a limit it refuses")
        print(f"  VMEM scoped, the compiler's figure: {scoped / MIB:9.2f} MiB (measured: Mosaic's own, {how}: the "
              f"tiled scratch plus {(scoped - (data.get('scratch_tiled_total_bytes') or accounting)) / MIB:.2f} MiB of "
              f"spill slots and compiler scratch; the accounting {100 * (accounting - scoped) / scoped:+.2f} % of it)")
        modelled = accounting + data["vmem_capacity_bytes"] - data["usable_vmem_bytes"]
        print(f"  VMEM the simulator models in all:   {modelled / MIB:9.2f} MiB (the accounting plus the catalog's "
              f"compiler reserve, capacity less usable: {(modelled - accounting) / MIB:.2f} MiB; "
              f"{100 * (modelled - scoped) / scoped:+.2f} % of the compiler's figure)")
    if data["deployment"]:
        print("  deployment (by " + data["deployment"]["rule"] + "): " + ", ".join(
            f"{name} {algorithm}" for name, algorithm in data["plan_collectives"].items()))
    if data["collectives"]:
        print(f"  collectives in the kernel: yes, {data['remote_copies_per_layer']} remote copies per MoE layer "
              f"(send/receive buffers {data['scratch_bytes'].get('collectives', 0) / MIB:.2f} MiB)")
    else:
        print("  collectives in the kernel: none" + (" (one device)" if data["devices"] == 1 else ""))
    verdict = "fits" if data["fits"] else "DOES NOT FIT"
    print(f"  usable VMEM on {data['hardware']} ({data['usable_vmem_label']}): {data['usable_vmem_bytes'] / MIB:9.2f} MiB: "
          f"{verdict}")
    print("  kernel scratch by group: " + ", ".join(
        f"{name} {size / MIB:.2f}" for name, size in sorted(data["scratch_bytes"].items())) + " MiB")
    if compiled is None:
        print("note: not compiled: every op has a Mosaic lowering rule, but tiling, "
              "alignment and VMEM limits are Mosaic's compiler's to find: --hardware tpu-v5e|tpu-v6e|tpu-v7 "
              "with libtpu installed, one device)")
