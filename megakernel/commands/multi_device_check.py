"""Run the multi-device collective kernel once in a fresh process and print one JSON line.

``python -m megakernel.commands.multi_device_check --devices 8 [--layers N] [--seed S]
[--mode eager|on_wait] [--bug skip_wait:NAME|single_buffer]``

The process sets ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before JAX starts
(virtual CPU devices exist only if the flag is set first), runs in TPU interpret mode with
the race detector on (``vector_clock_size=256``, the given seed and DMA mode) and prints
one JSON object: ``devices``, ``layers``, ``seconds``, ``races``, ``matches_expected``,
``log_matches_plan`` and per-device ``records`` (``rank``, ``matches_reference``,
``log_matches_plan``, ``max_abs_error``; the reference is the numpy lockstep run of
:func:`megakernel.multi_device.expected_accumulators`). A wrong semaphore can hang the
interpreter forever, so callers run this under a timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from megakernel.race_reports import as_json, capturing_races
from tpusim.cli_options import KERNEL_MODEL_HELP, add_model_option


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    add_model_option(parser, default="kimi-k3-nano", help=KERNEL_MODEL_HELP)
    parser.add_argument("--layers", type=int, default=0, help="0: all of the model's layers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", default="on_wait", choices=("on_wait", "eager"))
    parser.add_argument("--repeat", type=int, default=1, help="calls; the first compiles (default 1)")
    parser.add_argument("--lower", action="store_true",
                        help="only lower for TPU (ShapeDtypeStructs, no run): prints the custom-call count")
    parser.add_argument("--bug", default="", help="skip_wait:COLLECTIVE or single_buffer (planted races)")
    args = parser.parse_args(argv)
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"

    import numpy as np
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpret_impl
    from jax.experimental.pallas import tpu as pltpu

    from megakernel.collective_plan import UnsupportedPlan
    from megakernel.multi_device import Bugs, CollectiveKernel, expected_accumulators, planned_log
    from tpusim.workload.model_catalog import load_model, plan_for

    model = load_model(args.model)
    plan = plan_for(model, args.devices)
    if args.layers:
        model = model.with_layers(args.layers)
    bugs = Bugs.parse(args.bug)
    if args.lower:
        return lower(model, plan)
    np.random.seed(args.seed)  # the race detector's interleavings draw from numpy's global RNG
    params = pltpu.InterpretParams(detect_races=True, vector_clock_size=256, dma_execution_mode=args.mode,
                                   random_seed=args.seed)
    try:
        kernel = CollectiveKernel(model, plan, 1, interpret=params, bugs=bugs)
    except UnsupportedPlan as error:
        sys.stderr.write(f"plan {plan.name}: {error}\n")
        return 2
    acc0 = np.random.default_rng(args.seed).integers(0, 251, (plan.devices, kernel.width)).astype(np.float32)
    seconds, reports = [], []
    for _ in range(max(1, args.repeat)):
        start = time.perf_counter()
        with capturing_races() as found:
            out, log = kernel.run(acc0)
        reports += found
        seconds.append(round(time.perf_counter() - start, 2))
        races = bool(interpret_impl.races.races_found)  # read before the next call resets it
    want = expected_accumulators(kernel, acc0)
    records = []
    for rank in range(plan.devices):
        recorded = [tuple(int(v) for v in row) for row in log[rank] if row[0] >= 0]
        records.append({"rank": rank, "matches_reference": bool(np.array_equal(out[rank], want[rank])),
                        "log_matches_plan": recorded == planned_log(kernel, rank),
                        "max_abs_error": float(np.abs(out[rank] - want[rank]).max())})
    sys.stdout.write(json.dumps({
        "model": args.model, "plan": plan.name, "devices": plan.devices, "layers": model.num_layers,
        "backend": "cpu-interpret", "seconds": seconds[0], "seconds_per_call": seconds, "races": races,
        "race_count": len(reports), "race_reports": as_json(reports[:20]),
        "matches_expected": all(r["matches_reference"] for r in records),
        "log_matches_plan": all(r["log_matches_plan"] for r in records),
        "reference": "numpy lockstep run of the same collective program (exact integers)",
        "timing_note": "wall time of the Pallas TPU interpreter on virtual CPU devices (first call includes "
                       "the compile); NOT a TPU timing",
        "records": records}) + "\n")
    return 0


def lower(model: object, plan: object) -> int:
    """Lower the collective program for TPU on the plan's mesh from this CPU (no TPU, no
    weights: ``ShapeDtypeStruct`` arguments) and print what came out."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from megakernel.multi_device import CollectiveKernel

    kernel = CollectiveKernel(model, plan, 1, interpret=False)  # type: ignore[arg-type]
    mesh, fn = kernel.mesh_fn
    sharding = NamedSharding(mesh, P("x"))
    routes = jax.ShapeDtypeStruct(kernel.tables()["routes"].shape, jnp.int32, sharding=sharding)
    acc = jax.ShapeDtypeStruct((kernel.plan.devices, kernel.width), jnp.float32, sharding=sharding)
    text = fn.trace(routes, acc).lower(lowering_platforms=("tpu",)).as_text()
    sys.stdout.write(json.dumps({"model": kernel.model.name, "plan": kernel.plan.name, "devices": kernel.plan.devices,
                                 "tpu_custom_calls": text.count("tpu_custom_call"),
                                 "messages_per_layer": sum(sum(c.counts) for c in kernel.colls),
                                 "payload_bytes": {c.name: 2 * c.elems for c in kernel.colls}}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
