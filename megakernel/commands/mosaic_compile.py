"""Compile the megakernel with libtpu's Mosaic compiler for one chip, in a fresh process; print one JSON line.

``python -m megakernel.commands.mosaic_compile --model kimi-k3-mini --schedule published --hardware tpu-v5e
[--devices 1 | --shard-of k3-tp32] [--batch 1] [--context 1024] [--weight-banks 0]`` prints the lowering report
(:class:`megakernel.tpu_lowering.LoweringReport`) with ``compile``
(:class:`megakernel.mosaic_compile.CompileReport`); a model, schedule or plan the kernel cannot
implement prints ``{"error": KIND, "message": ...}`` and exits 2, a compile failure exits 1.
libtpu's environment is set before JAX starts (:func:`megakernel.mosaic_compile.prepare_environment`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from megakernel.mosaic_compile import (
    compile_for,
    prepare_environment,
    scoped_vmem_bytes,
    topology_for,
)
from tpusim.cli_options import (
    KERNEL_CONTEXT_HELP,
    KERNEL_MODEL_HELP,
    add_batch_option,
    add_context_option,
    add_hardware_option,
    add_model_option,
    add_schedule_option,
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    add_model_option(parser, default="kimi-k3-mini", help=KERNEL_MODEL_HELP)
    add_schedule_option(parser, default="published")
    add_hardware_option(parser, default="tpu-v5e")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--shard-of", default=None, help="one device's program of this plan")
    add_batch_option(parser, default=1, type=int)
    add_context_option(parser, default=1024, type=int, help=KERNEL_CONTEXT_HELP)
    parser.add_argument("--weight-banks", type=int, default=0,
                        help="stacked weights hold this many distinct entries (0: one per layer)")
    parser.add_argument("--scoped-vmem", action="store_true",
                        help="also read the compiler's scoped-VMEM figure for the kernel (one more compile)")
    parser.add_argument("--panel-unroll", type=int, nargs=2, default=None, metavar=("DENSE", "EXPERT"),
                        help="panels per panel-loop iteration, dense and routed experts (default: the kernel's)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    prepare_environment()
    args = parse(argv)
    from megakernel.dims import UnsupportedModel, model_dims
    from megakernel.dma_plan import UnsupportedSchedule
    from megakernel.expert_products import expert_products_for
    from megakernel.kernel import Megakernel
    from megakernel.tpu_lowering import lowering_report
    from megakernel.vmem_limit import vmem_limit_for
    from tpusim.schedule.schema import load_schedule
    from tpusim.workload.model_catalog import load_model, plan_for, shard_plan

    model = load_model(args.model)
    plan = shard_plan(model, args.shard_of) if args.shard_of else plan_for(model, args.devices)
    schedule = load_schedule(args.schedule)
    try:
        dims = dataclasses.replace(model_dims(model, plan), weight_banks=args.weight_banks)
        unroll = {} if args.panel_unroll is None else dict(
            zip(("panel_unroll", "expert_panel_unroll"), args.panel_unroll, strict=True))
        kernel = Megakernel(dims, schedule, args.batch, args.context,
                            vmem_limit_bytes=vmem_limit_for(args.hardware),
                            expert_products=expert_products_for(args.hardware), **unroll)
        report = lowering_report(model, plan, schedule, args.batch, kernel, lowered=True)
    except (UnsupportedModel, UnsupportedSchedule) as error:
        kind = "model" if isinstance(error, UnsupportedModel) else "schedule"
        sys.stdout.write(json.dumps({"error": kind, "message": str(error)}) + "\n")
        return 2
    compiled = compile_for(kernel, topology_for(args.hardware))  # one device's kernel
    result = {**dataclasses.asdict(report), "lowered": compiled.kind != "lowering",
              "compile": dataclasses.asdict(compiled)}
    if args.scoped_vmem:
        result["compiler_scoped_vmem_bytes"] = scoped_vmem_bytes(kernel, topology_for(args.hardware))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if compiled.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
