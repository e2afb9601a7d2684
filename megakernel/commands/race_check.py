"""Run the kernel under Pallas' TPU-interpret race detector; meant for a subprocess.

``python -m megakernel.commands.race_check SCHEDULE[,SCHEDULE...] --modes on_wait,eager [--layers 8]
[--batch 2] [--unsafe]`` runs one decode step per (schedule, DMA mode) with
``InterpretParams(detect_races=True, vector_clock_size=256, uninitialized_memory="nan")``
and a fixed seed, and prints one JSON object per line: ``{"schedule", "mode", "races",
"max_abs_error", "race_count", "race_reports"}`` (the reports: :mod:`megakernel.race_reports`). A kernel waiting on a semaphore nobody signals would hang forever,
which is why tests call this in a subprocess with a timeout.

``--unsafe`` builds the kernel with a plan that ignores buffer reuse (copies land in VMEM
rows still being read): the negative control that shows the detector catches it.
``SCHEDULE`` is a built-in name, a JSON file, ``chunked`` or ``ring`` (:mod:`megakernel.examples`).
"""

from __future__ import annotations

import argparse
import json
import sys

import jax.numpy as jnp
import numpy as np

from megakernel.race_reports import as_json, capturing_races
from tpusim.cli_options import add_batch_option

REPORTS_KEPT = 20  # the first races reported, in the JSON (a planted race is reported many times)


def check(schedule_name: str, mode: str, layers: int, batch: int, unsafe: bool) -> dict[str, object]:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpret_impl
    from jax.experimental.pallas import tpu as pltpu

    from megakernel.dims import model_dims
    from megakernel.examples import chunked_schedule, ring_schedule
    from megakernel.hbm import pack_hbm
    from megakernel.kernel import Megakernel
    from megakernel.layout import random_weights
    from megakernel.reference import decode_step, device_params, init_state
    from tpusim.schedule.schema import load_schedule
    from tpusim.workload.model_catalog import load_model, plan_for

    np.random.seed(0)  # the detector's vector clocks: repeatable runs
    model = load_model("kimi-k3-mini").with_layers(layers)
    dims = model_dims(model, plan_for(model, 1))
    examples = {"chunked": chunked_schedule, "ring": ring_schedule}
    schedule = examples[schedule_name]() if schedule_name in examples else load_schedule(schedule_name)
    params = pltpu.InterpretParams(detect_races=True, vector_clock_size=256, dma_execution_mode=mode,
                                   uninitialized_memory="nan", random_seed=0)
    kernel = Megakernel(dims, schedule, batch, 256, interpret=params, unsafe_ignore_buffer_reuse=unsafe)
    weights = random_weights(dims, seed=0)
    p = device_params(weights)
    hbm = {name: jnp.asarray(value) for name, value in pack_hbm(weights, kernel.geo, kernel.expert_products).items()}
    state = init_state(dims, batch, 256, context=130, seed=1)
    tokens = jnp.arange(batch, dtype=jnp.int32) * 37
    with capturing_races() as found:
        logits, _ = kernel.jitted_step(hbm, p["embedding"], state, tokens)
        logits.block_until_ready()
    races = bool(interpret_impl.races.races_found)  # read before any other kernel call resets it
    ref_logits, _ = decode_step(dims, p, state, tokens)
    error = float(jnp.max(jnp.abs(logits - ref_logits)))
    return {"schedule": schedule.name, "mode": mode, "races": races, "max_abs_error": error,
            "race_count": len(found), "race_reports": as_json(found[:REPORTS_KEPT])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("schedules", help="comma-separated schedule names or files")
    parser.add_argument("--modes", default="on_wait,eager")
    parser.add_argument("--layers", type=int, default=8)
    add_batch_option(parser, default=2, type=int)
    parser.add_argument("--unsafe", action="store_true")
    args = parser.parse_args(argv)
    for name in args.schedules.split(","):
        for mode in args.modes.split(","):
            result = check(name, mode, args.layers, args.batch, args.unsafe)
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
