"""Whole decode steps at random weights, and one ``jax.profiler`` trace per model.

The steps are the shipped step descriptions (``workloads.json``, written by
:mod:`calibration.sources.gpu_workloads` from the simulator's own programs) replayed by
:mod:`calibration.gpu_bench.replay`: one ``jax.jit`` executable per step, one process,
weights allocated once per (model, batch) and freed before the next. Each record names the
model exactly as the simulator loads it (``kimi-k3[layers=4,formats=bf16]``), the batch and
context, and in ``extra`` the plan the widths come from (``plan_devices``: 8 for the K3
slice at its TP8 per-device widths, run on one GPU with no collectives).

For the first batch of every model, :func:`trace_step` records ``trace_steps`` steps under
``jax.profiler.trace`` with a ``StepTraceAnnotation("decode")`` each, into
``OUT/traces/<name>-b<batch>/``; ``OUT/traces.json`` lists them with their workload, so
:mod:`calibration.sources.gpu_ingest` can turn them into per-kernel records with
:func:`calibration.sources.profiler.trace_measurement`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from calibration.gpu_bench.records import RunInfo, measurement
from calibration.gpu_bench.replay import ReplayStep, build_step
from hwmodels.records.timing import summarise


def trace_step(step: ReplayStep, folder: Path, *, steps: int) -> None:
    """Record ``steps`` decode steps of ``step`` with the JAX profiler into ``folder``."""
    import jax

    with jax.profiler.trace(str(folder)):
        for index in range(steps):
            with jax.profiler.StepTraceAnnotation("decode", step_num=index):
                step.run()


def bench_steps(info: RunInfo, workload_set: dict[str, Any], out: Path, *, warmup: int, repeats: int,
                trace_steps: int, traces: list[dict[str, Any]], deadline: float,
                skipped: list[str]) -> Iterator[dict[str, Any]]:
    """One record per step description of ``workload_set``; traces appended to ``traces``
    (a profiler that cannot start, e.g. without CUPTI, is noted in ``skipped``).

    Stops (without error) before starting a step once ``time.monotonic()`` passes
    ``deadline``: the records already written stay valid.
    """
    traced: set[str] = set()
    context = int(workload_set["context"])
    for entry in workload_set["steps"]:
        if time.monotonic() > deadline:
            return
        step = build_step(entry["description"])
        samples = step.time_steps(warmup=warmup, repeats=repeats)
        timing = summarise(samples)
        name, batch = entry["name"], int(entry["batch"])
        yield measurement(
            info, model=entry["model"], batch=batch, context=context, timing=timing, kind="decode_step",
            what=(f"jax.jit replay of the simulator's program for {entry['model']} "
                  f"({entry['plan']}), {step.ops} ops, {step.weight_bytes / 1e9:.3f} GB weights, "
                  f"compile {step.compile_s:.1f} s; {entry.get('note', '')}").rstrip("; "),
            extra={"name": name, "plan": entry["plan"], "plan_devices": int(entry["plan_devices"]),
                   "ops": step.ops, "weight_bytes": step.weight_bytes, "cache_bytes": step.cache_bytes,
                   "compile_s": step.compile_s},
        )
        if name not in traced and trace_steps > 0:
            folder = out / "traces" / f"{name}-b{batch}"
            traced.add(name)
            try:
                trace_step(step, folder, steps=trace_steps)
            except Exception as error:  # the profiler's own error types vary by backend
                skipped.append(f"trace {name}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
                continue
            traces.append({"folder": str(folder.relative_to(out)), "model": entry["model"], "batch": batch,
                           "context": context, "chip": info.chip, "backend": info.backend, "label": info.label,
                           "plan_devices": int(entry["plan_devices"]), "name": name})
        del step
