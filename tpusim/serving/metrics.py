"""What a served workload reports: TTFT, TPOT, throughput, and what bounds each.

:func:`summarize` turns a :class:`~tpusim.serving.simulator.ServingRun` into one record:

- ``ttft_ms`` / ``tpot_ms``: mean, p50, p90, p99 over completed requests (TPOT of a request
  = (last token - first token) / tokens after the first; one-token outputs have none);
- ``output_tokens_per_s``: output tokens / (last finish - first arrival); ``per_chip``
  divides by the system's chips; ``tokens_per_s_per_user``: the mean over requests of
  1 / TPOT (what one user sees while decoding);
- ``ttft_parts_ms``: mean TTFT split into queueing (waiting for admission: a running slot or
  KV room), prefill compute (its own prefill steps), other requests' prefill (their prefill
  steps between its admission and its first token), the first step (the rest: the decode
  step that emits its first token) and the request overhead (its time outside the
  scheduler's steps, ``SchedulerConfig.request_overhead_s``, the same for every request);
- ``tpot_parts_ms``: mean TPOT split into decode steps and prefill stalls (other requests'
  prefill steps while it was decoding);
- ``ttft_bound`` / ``tpot_bound``: the largest part, in words; ``kv_bound`` whether
  requests waited because the KV pool was full;
- Little's law: ``mean_in_system`` (time average of requests arrived and not finished) and
  ``arrival_rate_per_s x mean_time_in_system_s`` (completed requests over the run): equal by
  construction on a run that ends empty and refuses none (a test checks the bookkeeping).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tpusim.serving.simulator import ServingRun

MS_PER_S = 1e3
PERCENTILES = (50, 90, 99)
TTFT_PARTS = {"queue": "queueing (waiting for a running slot or KV room)", "prefill": "prefill compute",
              "other_prefill": "other requests' prefill", "first_step": "the first decode step",
              "overhead": "the request overhead (HTTP, tokenizing, streaming)"}
TPOT_PARTS = {"decode_step": "decode step", "prefill_stall": "prefill steps interrupting decode"}


def stats_ms(values_s: list[float]) -> dict[str, float | None]:
    """Mean and percentiles in ms (None when there are no values)."""
    if not values_s:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    array = np.asarray(values_s) * MS_PER_S
    return {"mean": float(array.mean()), **{f"p{p}": float(np.percentile(array, p)) for p in PERCENTILES}}


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def summarize(run: ServingRun, *, chips: int) -> dict[str, Any]:
    """The record of one run (keys in the module docstring)."""
    done = run.completed
    refused = [r for r in run.requests if r.refused]
    ttft = [r.ttft_s + run.request_overhead_s for r in done]
    tpots = [(r, r.tpot_s) for r in done if r.tpot_s is not None]
    tpot = [t for _, t in tpots]
    output = sum(r.output_tokens for r in done)
    span_s = (max(r.finish_s for r in done) - run.first_arrival_s) if done else 0.0  # type: ignore[type-var]
    per_s = output / span_s if span_s > 0 else 0.0
    ttft_parts = {
        "queue": _mean([r.queue_s for r in done]),
        "prefill": _mean([r.own_prefill_s for r in done]),
        "other_prefill": _mean([r.other_prefill_s for r in done]),
        "first_step": _mean([r.ttft_s - r.queue_s - r.own_prefill_s - r.other_prefill_s for r in done]),
        "overhead": run.request_overhead_s if done else 0.0,
    }
    tpot_parts = {
        "decode_step": _mean([r.decode_s / (r.output_tokens - r.tokens_at_first) for r, _ in tpots]),
        "prefill_stall": _mean([r.stall_s / (r.output_tokens - r.tokens_at_first) for r, _ in tpots]),
    }
    kv_waits = sum(r.waited_for_kv for r in done)
    times = [r.finish_s - r.arrival_s for r in done]  # type: ignore[operator]
    arrival_span = run.end_s
    return {
        "requests": len(run.requests), "completed": len(done), "refused": len(refused),
        "ttft_ms": stats_ms(ttft), "tpot_ms": stats_ms(tpot),
        "ttft_parts_ms": {k: v * MS_PER_S for k, v in ttft_parts.items()},
        "tpot_parts_ms": {k: v * MS_PER_S for k, v in tpot_parts.items()},
        "ttft_bound": TTFT_PARTS[max(ttft_parts, key=ttft_parts.__getitem__)] if done else None,
        "tpot_bound": TPOT_PARTS[max(tpot_parts, key=tpot_parts.__getitem__)] if tpots else None,
        "kv_bound": kv_waits > 0,
        "requests_waiting_for_kv": kv_waits,
        "output_tokens_per_s": per_s,
        "output_tokens_per_s_per_chip": per_s / chips,
        "tokens_per_s_per_user": _mean([1.0 / t for t in tpot if t > 0]),
        "mean_decode_batch": run.mean_decode_batch,
        "peak_running": run.peak_running,
        "decode_steps": run.decode_steps, "prefill_steps": run.prefill_steps,
        "busy_fraction": run.busy_s / run.end_s if run.end_s else 0.0,
        "kv_pool_gb": run.kv_pool_bytes / 1e9 if np.isfinite(run.kv_pool_bytes) else None,
        "kv_peak_gb": run.kv_peak_bytes / 1e9,
        "simulated_s": run.end_s,
        "mean_in_system": run.in_system_integral / run.end_s if run.end_s else 0.0,
        "arrival_rate_per_s": len(done) / arrival_span if arrival_span else 0.0,
        "mean_time_in_system_s": _mean(times),
    }
