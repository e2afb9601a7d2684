"""Run the megakernel for N decode steps, time it honestly and append a measurement record.

Backends:

- ``tpu``: compile ahead (not timed), one warm-up step, then ``steps`` timed steps, each
  ended by ``block_until_ready``; the record's backend is the device kind.
- ``interpret``: Pallas TPU interpret mode on the CPU. Every step is checked against the
  pure-JAX reference (``max_abs_error``); the wall time is recorded with backend
  ``cpu-interpret`` and ``timing_note`` saying it is **not** a TPU timing.
- ``auto``: ``tpu`` when JAX sees a TPU, else ``interpret``.

Tokens are fed greedily (each step's argmax is the next input). The record is one JSON line
in the format of :mod:`calibration.sources.measurements` (``ms_per_step_spread`` = half the
inter-quartile range), appended with a single ``O_APPEND`` write and ``fsync``: the file is
never truncated and concurrent runners never interleave within a line. The routing the
model's own router chose in the first step is saved as a ``tpusim.workload.routing`` trace file next
to the records, and the record's ``routing`` is ``trace:<that file>``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hwmodels.errors import InputError
from megakernel.dims import model_dims
from megakernel.dma_plan import UnsupportedSchedule
from megakernel.events import save_routing_trace
from megakernel.hbm import pack_hbm
from megakernel.kernel import Megakernel
from megakernel.layout import load_safetensors, random_weights
from megakernel.reference import decode_step, decode_step_with_routing, device_params, init_state
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for

NOT_TPU_NOTE = "Pallas TPU interpret mode on a CPU: wall time of the interpreter, NOT a TPU timing"


@dataclass(frozen=True)
class RunConfig:
    model: str = "kimi-k3-mini"
    schedule: str = "published"
    batch: int = 1
    steps: int = 2
    context: int = 16
    backend: str = "auto"  # auto | tpu | interpret
    seed: int = 0
    weights: Path | None = None  # a safetensors folder; None = seeded random weights
    label: str = "measured"


def resolve_backend(backend: str) -> str:
    if backend not in ("auto", "tpu", "interpret"):
        raise InputError(f"--backend {backend}: use auto, tpu or interpret")
    if backend == "auto":
        return "tpu" if jax.default_backend() == "tpu" else "interpret"
    if backend == "tpu" and jax.default_backend() != "tpu":
        raise InputError("--backend tpu: JAX sees no TPU on this host (use --backend interpret)")
    return backend


def half_iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / 2


def run(config: RunConfig, out: Path | None = None) -> dict[str, Any]:
    """Run ``config``; append the record to ``out`` (when given) and return it."""
    if config.batch < 1 or config.steps < 1 or config.context < 1:
        raise InputError("--batch, --steps and --context must be >= 1")
    backend = resolve_backend(config.backend)
    model = load_model(config.model)
    plan = plan_for(model, 1)
    try:
        dims = model_dims(model, plan)
        schedule = load_schedule(config.schedule)
        interpret = None
        if backend == "interpret":
            from jax.experimental.pallas import tpu as pltpu

            interpret = pltpu.InterpretParams()
        kernel = Megakernel(dims, schedule, config.batch, config.context + config.steps, interpret=interpret)
    except (UnsupportedSchedule, ValueError) as error:
        if isinstance(error, InputError):
            raise
        raise InputError(str(error)) from None
    weights = load_safetensors(dims, config.weights) if config.weights else random_weights(dims, config.seed)
    params = device_params(weights)
    hbm = {name: jnp.asarray(value) for name, value in pack_hbm(weights, kernel.geo).items()}
    state = init_state(dims, config.batch, kernel.max_context, context=config.context, seed=config.seed)
    tokens = jnp.asarray(np.random.default_rng(config.seed).integers(0, dims.vocab_rows, config.batch), jnp.int32)
    step = jax.jit(kernel.step).lower(hbm, params["embedding"], state, tokens).compile()  # not timed
    ref_state = state
    _, _, routing = decode_step_with_routing(dims, params, state, tokens)
    times_ms, errors = [], []
    if backend == "tpu":
        jax.block_until_ready(step(hbm, params["embedding"], state, tokens))  # warm-up
    for _ in range(config.steps):
        start = time.perf_counter()
        logits, state = step(hbm, params["embedding"], state, tokens)
        jax.block_until_ready(logits)
        times_ms.append((time.perf_counter() - start) * 1e3)
        ref_logits, ref_state = decode_step(dims, params, ref_state, tokens)
        errors.append(float(jnp.max(jnp.abs(logits - ref_logits))))
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    record = {
        "model": config.model,
        "system": {"chip": device_chip(backend), "chips": 1},
        "batch": config.batch,
        "context": config.context,
        "routing": "identical",  # replaced by the trace file below when recording
        "schedule": schedule.name,
        "schedule_hash": schedule.content_hash(),
        "backend": "cpu-interpret" if backend == "interpret" else jax.devices()[0].device_kind,
        "ms_per_step_median": statistics.median(times_ms),
        "ms_per_step_spread": half_iqr(times_ms),
        "spread_kind": "iqr/2",
        "steps": config.steps,
        "provenance": provenance(),
        "label": config.label,
        "max_abs_error": max(errors),
        "timing_note": NOT_TPU_NOTE if backend == "interpret" else "native TPU, block_until_ready per step",
    }
    if out is not None:
        routing_file = Path(f"{out}.routing") / f"{schedule.content_hash()}-b{config.batch}-s{config.seed}.json"
        routing_file.parent.mkdir(parents=True, exist_ok=True)
        save_routing_trace(np.asarray(routing), routing_file)
        record["routing"] = f"trace:{routing_file}"
        append_record(out, record)
    return record


def device_chip(backend: str) -> str:
    """Catalog chip name of where it ran (``host-cpu`` for the interpreter)."""
    if backend == "interpret":
        return "host-cpu"
    kind = jax.devices()[0].device_kind.lower()  # e.g. "tpu v7", "tpu v5 lite"
    return {"tpu v5 lite": "tpu-v5e", "tpu v6 lite": "tpu-v6e"}.get(kind, kind.replace(" ", "-"))


def provenance() -> str:
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return (f"megakernel.runner host={platform.node()} date={now} jax={jax.__version__} "
            f"python={platform.python_version()}")


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line: one ``O_APPEND`` write, then ``fsync``; a file
    whose last line is partial is refused rather than extended."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as handle:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                raise InputError(f"{path}: last line is partial (an interrupted write?); not appending")
    line = (json.dumps(record, separators=(", ", ": ")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
