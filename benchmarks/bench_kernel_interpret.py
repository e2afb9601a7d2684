"""Benchmark: one kimi-k3-mini decode step (all 93 layers) of the megakernel in Pallas TPU
interpret mode on this CPU. Target: <= 60 s per step.

    .venv/bin/python benchmarks/bench_kernel_interpret.py [--schedule published] [--batch 1] [--steps 3]

Prints the compile time (XLA compile of the interpreter program, once per kernel) and the
median / min / max wall time of the timed steps. These are interpreter timings on a CPU,
NOT TPU timings: the interpreter pays ~0.3-0.5 ms per simulated memory access or DMA.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from megakernel.dims import model_dims
from megakernel.hbm import pack_hbm
from megakernel.kernel import Megakernel
from megakernel.layout import random_weights
from megakernel.reference import device_params, init_state
from tpusim.cli_options import add_batch_option, add_schedule_option
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    add_schedule_option(parser, default="published")
    add_batch_option(parser, default=1, type=int)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    model = load_model("kimi-k3-mini")
    dims = model_dims(model, plan_for(model, 1))
    weights = random_weights(dims, seed=0)
    params = device_params(weights)
    kernel = Megakernel(dims, load_schedule(args.schedule), args.batch, 256, interpret=pltpu.InterpretParams())
    hbm = {name: jnp.asarray(value) for name, value in pack_hbm(weights, kernel.geo).items()}
    state = init_state(dims, args.batch, 256, context=130, seed=1)
    tokens = jnp.arange(args.batch, dtype=jnp.int32)
    start = time.perf_counter()
    step = jax.jit(kernel.step).lower(hbm, params["embedding"], state, tokens).compile()
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        logits, state = step(hbm, params["embedding"], state, tokens)
        jax.block_until_ready(logits)
        times.append(time.perf_counter() - start)
        tokens = jnp.argmax(logits, -1).astype(jnp.int32)
    print(f"kimi-k3-mini, 93 layers, schedule {args.schedule}, batch {args.batch} (cpu-interpret, NOT a TPU timing)")
    print(f"compile: {compile_s:.1f} s")
    print(f"step: median {statistics.median(times):.2f} s, min {min(times):.2f} s, max {max(times):.2f} s "
          f"over {args.steps} steps (target <= 60 s)")


if __name__ == "__main__":
    main()
