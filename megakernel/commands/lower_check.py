"""Lower the kernel for TPU on a multi-device plan in a fresh process; print one JSON line.

``python -m megakernel.commands.lower_check --model kimi-k3 --devices 32 --schedule published
[--batch 1] [--context 1024] [--log]``

The process sets ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before JAX starts
(the mesh needs ``N`` devices; virtual ones on a CPU), then runs
:func:`megakernel.tpu_lowering.lower_schedule` and prints its report as JSON (``--log``: with
``log``, the kernel's collective issues and waits in step order,
:meth:`megakernel.kernel_collectives.CollectiveMegakernel.unrolled_log`). A model,
schedule or plan the kernel cannot implement prints ``{"error": KIND, "message": ...}`` and
exits 2 (KIND: ``model`` | ``schedule`` | ``plan`` | ``deployment``).

``--scoped-vmem`` (with ``--compile``): the compiler's own scoped-VMEM figure too
(:func:`megakernel.mosaic_compile.scoped_vmem_bytes`, one more compile). ``--compile``: also compile the step with libtpu's Mosaic compiler on compile-only TPU7x
devices (:func:`megakernel.mosaic_compile.topology_for` ``("tpu-v7", N)``: ``tpu7x:2x2x1`` for 8
devices, ``tpu7x:2x2x4`` for 32; no TPU needed): the same sharded program, on a mesh of those
devices, ``.compile()``d. The kernel multiplies its routed experts as TPU7x does (FP8 to the
MXU: :func:`megakernel.expert_products.expert_products_for`). The JSON gains ``compile``
(:class:`megakernel.mosaic_compile.CompileReport`: topology, ok, seconds, error, kind); the
process exits 0 when it compiles, 1 when the compiler refuses (the error in one paragraph,
:func:`megakernel.mosaic_compile.describe_error`), 2 on bad input (also ``{"error":
"topology"}`` for a device count no TPU7x topology has, and ``{"error": "libtpu"}`` without libtpu).

A schedule with a ``deployment`` (a joint sweep's ``best.json``) is lowered on that plan with
its collective algorithms (and their send/receive buffers in the VMEM accounting), mapped
onto ``--model`` / ``--devices`` by :func:`tpusim.workload.kernel_support.map_deployment`
(the identity for K3's winner on 32 devices); the JSON's ``deployment`` records the mapping.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from tpusim.cli_options import (
    KERNEL_CONTEXT_HELP,
    KERNEL_MODEL_HELP,
    add_batch_option,
    add_context_option,
    add_deployment_options,
    add_model_option,
    add_schedule_option,
)

# the chip the multi-device kernel is compiled for (its compile-only topology, its expert products)
COMPILE_CHIP = "tpu-v7"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    add_model_option(parser, default="kimi-k3", help=KERNEL_MODEL_HELP)
    parser.add_argument("--devices", type=int, default=32)
    add_schedule_option(parser, default="published")
    add_batch_option(parser, default=1, type=int)
    add_context_option(parser, default=1024, type=int, help=KERNEL_CONTEXT_HELP)
    parser.add_argument("--log", action="store_true", help="add the kernel's collective event order")
    parser.add_argument("--compile", action="store_true",
                        help="also compile with libtpu's Mosaic compiler on compile-only TPU7x devices")
    parser.add_argument("--scoped-vmem", action="store_true",
                        help="with --compile: also read the compiler's own scoped-VMEM figure (one more compile)")
    add_deployment_options(parser, searched_default=False)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.compile:
        from megakernel.mosaic_compile import libtpu_available, prepare_environment

        if not libtpu_available():
            sys.stdout.write(json.dumps({"error": "libtpu", "message": "libtpu is not installed: "
                                         "Mosaic cannot compile here"}) + "\n")
            return 2
        prepare_environment()  # before JAX and libtpu load
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"
    from megakernel.collective_plan import UnsupportedPlan
    from megakernel.dims import UnsupportedModel
    from megakernel.dma_plan import UnsupportedSchedule
    from megakernel.expert_products import expert_products_for
    from megakernel.kernel_collectives import CollectiveMegakernel
    from megakernel.tpu_lowering import lower_schedule
    from tpusim.schedule.schema import load_schedule
    from tpusim.workload.kernel_support import KernelDeploymentError, kernel_deployment
    from tpusim.workload.model_catalog import load_model, plan_for

    model = load_model(args.model)
    plan = plan_for(model, args.devices)
    schedule = load_schedule(args.schedule)
    kinds = ((UnsupportedModel, "model"), (UnsupportedSchedule, "schedule"), (UnsupportedPlan, "plan"),
             (KernelDeploymentError, "deployment"))
    mapping = None
    try:
        if schedule.deployment is not None:
            source = load_model(args.deployment_model) if args.deployment_model else model
            mapped = kernel_deployment(schedule.deployment.plan, dict(schedule.deployment.collectives), source,
                                       args.deployment_devices or args.devices, model, args.devices, args.batch)
            model, plan, mapping = mapped.model, mapped.plan, mapped.describe()
        kernel = CollectiveMegakernel(model, plan, schedule, args.batch, args.context,
                                      expert_products=expert_products_for(COMPILE_CHIP))
        report = lower_schedule(model, plan, schedule, batch=args.batch, max_context=args.context, kernel=kernel)
    except tuple(kind for kind, _ in kinds) as error:
        kind = next(name for cls, name in kinds if isinstance(error, cls))
        sys.stdout.write(json.dumps({"error": kind, "message": str(error)}) + "\n")
        return 2
    result = {**dataclasses.asdict(report), "deployment": mapping,
              "plan_collectives": {spec.name: spec.algorithm for spec in plan.collectives_at(args.batch)}}
    if args.log:
        result["log"] = kernel.unrolled_log()
    if not args.compile:
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    from megakernel.mosaic_compile import compile_collective, topology_for

    try:
        compiled = compile_collective(kernel, topology_for(COMPILE_CHIP, args.devices))
    except ValueError as error:  # no TPU7x topology with this many devices
        sys.stdout.write(json.dumps({"error": "topology", "message": str(error)}) + "\n")
        return 2
    result["compile"] = dataclasses.asdict(compiled)
    if args.scoped_vmem:
        from megakernel.mosaic_compile import scoped_vmem_bytes

        result["compiler_scoped_vmem_bytes"] = scoped_vmem_bytes(kernel, topology_for(COMPILE_CHIP, args.devices))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if compiled.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
