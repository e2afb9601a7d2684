"""Run the kernel under Pallas' TPU-interpret race detector; meant for a subprocess.

``python -m megakernel.commands.race_check SCHEDULE[:MODE][,SCHEDULE[:MODE]...] --modes on_wait,eager
[--layers 8] [--batch 2] [--unsafe]`` runs one decode step per (schedule, DMA mode) with
``InterpretParams(detect_races=True, vector_clock_size=256, uninitialized_memory="nan")``
and a fixed seed, and prints one JSON object per line: ``{"schedule", "mode", "races",
"max_abs_error", "race_count", "race_reports"}`` (the reports: :mod:`megakernel.race_reports`). A kernel waiting on a semaphore nobody signals would hang forever,
which is why tests call this in a subprocess with a timeout.

``--unsafe`` builds the kernel with a plan that ignores buffer reuse (copies land in VMEM
rows still being read): the negative control that shows the detector catches it.
``SCHEDULE`` is a built-in name, a JSON file, ``chunked`` or ``ring`` (:mod:`megakernel.examples`);
``SCHEDULE:MODE`` runs that schedule in that mode alone (``--modes`` applies to the others), so one
process can run chosen pairs (``chunked:on_wait,ring:eager``). The runs of one process share the
weights, their packed parameters and the reference step (:func:`_reference`): only the kernel is
built, compiled and run again (measured 2026-12-07 at 8 layers: the chunked and ring runs 73.6 s
of CPU in one process, 77.1 s in two; the kernel's compile and run are most of it).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import cache
from typing import Any

import jax.numpy as jnp
import numpy as np

from megakernel.race_reports import as_json, capturing_races
from tpusim.cli_options import add_batch_option

REPORTS_KEPT = 20  # the first races reported, in the JSON (a planted race is reported many times)


@cache
def _reference(layers: int, batch: int) -> tuple[Any, Any, dict[str, Any], Any, Any, Any]:
    """(dims, weights, device params, state, tokens, reference logits) of kimi-k3-mini cut to
    ``layers`` at ``batch``: the same for every schedule and mode, so made once a process."""
    from megakernel.dims import model_dims
    from megakernel.layout import random_weights
    from megakernel.reference import decode_step, device_params, init_state
    from tpusim.workload.model_catalog import load_model, plan_for

    model = load_model("kimi-k3-mini").with_layers(layers)
    dims = model_dims(model, plan_for(model, 1))
    weights = random_weights(dims, seed=0)
    p = device_params(weights)
    state = init_state(dims, batch, 256, context=130, seed=1)
    tokens = jnp.arange(batch, dtype=jnp.int32) * 37
    ref_logits, _ = decode_step(dims, p, state, tokens)
    return dims, weights, p, state, tokens, ref_logits


def check(schedule_name: str, mode: str, layers: int, batch: int, unsafe: bool) -> dict[str, object]:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpret_impl
    from jax.experimental.pallas import tpu as pltpu

    from megakernel.examples import chunked_schedule, ring_schedule
    from megakernel.hbm import pack_hbm
    from megakernel.kernel import Megakernel
    from tpusim.schedule.schema import load_schedule

    dims, weights, p, state, tokens, ref_logits = _reference(layers, batch)
    np.random.seed(0)  # the detector's vector clocks: repeatable runs (as in a process of its own)
    examples = {"chunked": chunked_schedule, "ring": ring_schedule}
    schedule = examples[schedule_name]() if schedule_name in examples else load_schedule(schedule_name)
    params = pltpu.InterpretParams(detect_races=True, vector_clock_size=256, dma_execution_mode=mode,
                                   uninitialized_memory="nan", random_seed=0)
    kernel = Megakernel(dims, schedule, batch, 256, interpret=params, unsafe_ignore_buffer_reuse=unsafe)
    hbm = {name: jnp.asarray(value) for name, value in pack_hbm(weights, kernel.geo, kernel.expert_products).items()}
    with capturing_races() as found:
        logits, _ = kernel.jitted_step(hbm, p["embedding"], state, tokens)
        logits.block_until_ready()
    races = bool(interpret_impl.races.races_found)  # read before any other kernel call resets it
    error = float(jnp.max(jnp.abs(logits - ref_logits)))
    return {"schedule": schedule.name, "mode": mode, "races": races, "max_abs_error": error,
            "race_count": len(found), "race_reports": as_json(found[:REPORTS_KEPT])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("schedules", help="comma-separated schedule names or files, each optionally :MODE")
    parser.add_argument("--modes", default="on_wait,eager")
    parser.add_argument("--layers", type=int, default=8)
    add_batch_option(parser, default=2, type=int)
    parser.add_argument("--unsafe", action="store_true")
    args = parser.parse_args(argv)
    for item in args.schedules.split(","):
        name, _, own_mode = item.partition(":")
        for mode in own_mode.split(",") if own_mode else args.modes.split(","):
            result = check(name, mode, args.layers, args.batch, args.unsafe)
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
