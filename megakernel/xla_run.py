"""Time the plain-JAX/XLA baseline (:mod:`megakernel.xla_baseline`) on the chip, in the same
process and on the same weights, state and tokens as a kernel run, and record it.

The record has the kernel record's fields (:func:`megakernel.runner.run`), with
``implementation: "xla"``: compile seconds (XLA's, timed apart), greedy steps checked against
the reference computed on the same chip (same tolerance rule), one warm-up step, then
``steps`` timed steps ended by ``block_until_ready``. ``hbm_bytes_per_step`` is the kernel's
count for the same routing (same dense weights, same distinct chosen experts): the baseline
reads those bytes too; ``xla_bytes_accessed`` is XLA's own cost analysis of the program where
it gives one (a static count: a loop body counted once, so it is not the step's traffic).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hwmodels.records.jsonl import append_record
from hwmodels.records.kernel import KernelRecord
from hwmodels.records.timing import summarise
from megakernel.reference import init_state
from megakernel.runner import (
    KERNEL_PRECISION,
    RunConfig,
    check_fields,
    device_chip,
    greedy_check,
    max_context_for,
    prepare,
    provenance,
    resolve_backend,
    timed_steps,
    versions,
)
from megakernel.xla_baseline import xla_decode_step

LABEL = "measured (plain JAX/XLA baseline: same weights, same chosen experts, one jax.jit)"


def run_xla(config: RunConfig, kernel_record: dict[str, Any], out: Path | None = None,
            expert_cap: int | None = None) -> dict[str, Any]:
    """The XLA baseline of ``config`` (its kernel's record gives the routing, bytes, schedule
    it stands next to); appended to ``out`` when given. ``expert_cap`` (0 allowed: no routed
    expert, the step's non-expert work): at most this many experts a layer, as the kernel's
    fixed-cost probe; nothing checked (not the model's decode), bytes counted for the cap."""
    backend = resolve_backend(config.backend)
    prepared = prepare(config)
    dims, params = prepared.dims, prepared.params
    state = init_state(dims, config.batch, max_context_for(config, backend), context=config.context,
                       seed=config.seed)
    tokens = jnp.asarray(np.random.default_rng(config.seed).integers(0, dims.vocab_rows, config.batch), jnp.int32)
    started = time.perf_counter()
    with jax.default_matmul_precision(KERNEL_PRECISION):
        compiled = xla_decode_step.lower(dims, params, state, tokens, expert_cap).compile()
    compile_s = time.perf_counter() - started

    def step(_hbm: Any, _embedding: Any, st: Any, tk: jax.Array) -> Any:
        return compiled(params, st, tk)

    check_steps = max(config.check_steps, 0) if backend == "tpu" else config.steps
    if expert_cap is not None:
        check_steps = 0
    check = greedy_check(step, dims, params, None, state, tokens, check_steps)
    times_ms = (timed_steps(step, None, None, state, tokens, config.steps)
                if backend == "tpu" or expert_cap is not None else check["times_ms"])
    timing = summarise(times_ms)  # milliseconds in, milliseconds out
    hbm_bytes = kernel_record["hbm_bytes_per_step"] if expert_cap is None else capped_bytes(kernel_record, expert_cap)
    record = KernelRecord(
        model=config.model, system={"chip": device_chip(backend), "chips": 1},
        batch=config.batch, context=config.context, routing=kernel_record.get("routing"),
        implementation="xla", stands_next_to={"schedule": kernel_record["schedule"],
                                              "schedule_hash": kernel_record["schedule_hash"],
                                              "ms_per_step_median": kernel_record["ms_per_step_median"]},
        backend="cpu-interpret" if backend == "interpret" else jax.devices()[0].device_kind,
        ms_per_step_median=timing.median_s, ms_per_step_spread=timing.spread_s,
        steps=config.steps, provenance=provenance(), label=LABEL,
        **check_fields(check, check_steps),
        expert_cap=expert_cap, compile_s=compile_s, shard_of=config.shard_of, weight_banks=config.weight_banks,
        hbm_bytes_per_step=hbm_bytes, hbm_bytes_by_kind=kernel_record.get("hbm_bytes_by_kind"),
        effective_bandwidth_bytes_per_s=hbm_bytes / (timing.median_s / 1e3),
        versions=versions(),
        timing_note="native TPU, block_until_ready per step, warm-up excluded, compile timed separately"
                    if backend == "tpu" else "CPU: wall time of XLA:CPU, NOT a TPU timing",
        extra={"xla_bytes_accessed": _bytes_accessed(compiled)},
    ).to_dict()
    if out is not None:
        append_record(out, record)
    return record


def capped_bytes(kernel_record: dict[str, Any], expert_cap: int) -> int:
    """HBM bytes of the step with at most ``expert_cap`` routed experts a layer: the kernel
    record's bytes less the routed experts it did not keep (every expert part the same size)."""
    by_kind, per_layer = kernel_record["hbm_bytes_by_kind"], kernel_record["experts_per_layer"]
    routed = by_kind["routed_experts"]
    kept = sum(min(n, expert_cap) for n in per_layer)
    return kernel_record["hbm_bytes_per_step"] - routed + (routed * kept // sum(per_layer) if per_layer else 0)


def _bytes_accessed(compiled: Any) -> float | None:
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # not every backend gives one
        return None
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else {}
    value = (analysis or {}).get("bytes accessed")
    return None if value is None else float(value)
