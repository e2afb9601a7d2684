"""Served workloads on several systems: the library behind ``tpusim serving``.

:func:`serving_rows` resolves each system once (its plan and the engine pricer,
:func:`tpusim.serving.engine_steps.engine_pricer`), shares one grid-cached
:class:`~tpusim.serving.steps.StepTable` across every traffic level of that system, runs
one :class:`~tpusim.serving.simulator.ServingSim` per traffic level and returns one record
per (system, traffic) with :func:`tpusim.serving.metrics.summarize`'s keys plus
``system, chips, plan, plan_choice, execution, traffic, concurrency, rate_per_s,
input_tokens, output_tokens, label, source, step_model, assumptions``.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any

from hwmodels.catalog import load_chip
from hwmodels.schema import Chip
from tpusim.compare.rows import SystemSpec, _drafter, execution_label
from tpusim.report.intervals import interval_terms
from tpusim.serving.config import SchedulerConfig, Traffic
from tpusim.serving.engine_steps import EnginePricer, engine_pricer
from tpusim.serving.metrics import summarize
from tpusim.serving.simulator import ServingSim
from tpusim.serving.steps import DEFAULT_CONTEXT_BUCKET_TOKENS, StepTable
from tpusim.workload.format_choice import formats_for_chip
from tpusim.workload.model_catalog import load_model
from tpusim.workload.prefill import PREFILL_ROW_TILE
from tpusim.workload.routing import RoutingModel
from tpusim.workload.speculative import SpeculativeConfig

ASSUMPTIONS = (
    "prefill runs as its own steps that interrupt decoding (SGLang's default: prefill first, mixed chunk off); "
    "how the TPU megakernel prefills is not published: assumed the same way, under the decode plan",
    f"a prefill chunk keeps {PREFILL_ROW_TILE} rows of activations on chip (sizes the schedule); activation "
    "traffic between row tiles and HBM is not priced",
    "prefill runs under the decode plan and its collectives (a disaggregated or prefill-specific plan would differ)",
    "each request reserves KV for input + output tokens at admission (no preemption, no prefix cache)",
    "the first output token comes from the first decode step after the prompt (TTFT = prefill + one step) "
    "unless first_token_from_prefill; a closed-loop request lands while a step runs and waits for it, which with "
    "the default matches SGLang's overlap loop for a GPU-bound prefill (tpusim.serving.first_token: the step in "
    "flight, the step launched before the prefill, the prefill)",
    "a GPU chip's calibrated execution.gpu.request_overhead_s (HTTP, tokenizing, streaming) is added to every TTFT",
    "routing uniform (the routing draw sets the distinct experts each step loads)",
)


def serving_rows(
    model_name: str,
    systems: list[SystemSpec],
    traffics: list[Traffic],
    *,
    scheduler: SchedulerConfig | None = None,
    routing: RoutingModel | None = None,
    seed: int = 0,
    calibrated: bool = True,
    formats: str | None = None,
    plan_choice: str | None = None,
    context_bucket_tokens: int = DEFAULT_CONTEXT_BUCKET_TOKENS,
    drafter: str | None = None,
    draft_tokens: int | None = None,
    jobs: int = 1,
) -> list[dict[str, Any]]:
    """One record per (system, traffic) (see the module docstring). With
    ``scheduler.acceptance_length > 1`` decode steps are speculative (the drafter of
    `tpusim compare`, ``draft_tokens`` proposed, that many accepted on average). ``jobs > 1``
    serves the systems in that many processes (each system's engine runs are independent;
    the records are the same as with one)."""
    run = partial(_system_rows, model_name, traffics=traffics, scheduler=scheduler or SchedulerConfig(),
                  routing=routing or RoutingModel("uniform"), seed=seed, calibrated=calibrated, formats=formats,
                  plan_choice=plan_choice, context_bucket_tokens=context_bucket_tokens, drafter=drafter,
                  draft_tokens=draft_tokens)
    if jobs > 1 and len(systems) > 1:
        with ProcessPoolExecutor(max_workers=min(jobs, len(systems))) as pool:
            per_system = list(pool.map(run, systems))
    else:
        per_system = [run(spec) for spec in systems]
    return [row for rows in per_system for row in rows]


def _system_rows(model_name: str, spec: SystemSpec, *, traffics: list[Traffic], scheduler: SchedulerConfig,
                 routing: RoutingModel, seed: int, calibrated: bool, formats: str | None, plan_choice: str | None,
                 context_bucket_tokens: int, drafter: str | None, draft_tokens: int | None) -> list[dict[str, Any]]:
    """The records of one system (:func:`serving_rows`)."""
    # the formats every command chooses (K3 on GPUs: the model file's GPU variant), said in each record
    model, formats_how = formats_for_chip(load_model(model_name), formats, load_chip(spec.chip, calibrated=False).kind)
    speculative, chosen_drafter = None, None
    if scheduler.acceptance_length > 1.0:
        chosen_drafter = _drafter(model, model_name, drafter, draft_tokens)
        speculative = SpeculativeConfig(kind=chosen_drafter.spec.kind, draft_tokens=chosen_drafter.draft_tokens,
                                        acceptance_length=scheduler.acceptance_length)
    context = max(t.max_context_tokens for t in traffics)
    levels = [t.concurrency or 1 for t in traffics]
    reference = 1 << (max(levels).bit_length() - 1)
    rows: list[dict[str, Any]] = []
    pricer, how = engine_pricer(model, spec, context_tokens=context, reference_batch=reference, routing=routing,
                                seed=seed, calibrated=calibrated, speculative=speculative, drafter=chosen_drafter,
                                plan_choice=plan_choice)
    table = StepTable(pricer, context_bucket_tokens)
    # The decode batch the step model can run (on-chip memory caps a megakernel's batch).
    cap = pricer.max_batch(max(max(levels), scheduler.max_running_requests or 1, 256), context)
    limits = scheduler.model_copy(update={"max_running_requests": min(scheduler.max_running_requests or cap, cap),
                                          "request_overhead_s": _request_overhead_s(pricer.chip, scheduler)})
    label = "calibrated" if pricer.chip.is_calibrated else "simulated"
    for traffic in traffics:
        sim = ServingSim(table, traffic, limits, kv_pool_bytes=pricer.kv_pool_bytes(),
                         kv_bytes_of=pricer.kv_request_bytes)
        record: dict[str, Any] = {
            "system": spec.label, "chips": spec.chips, "plan": pricer.plan.name, "plan_choice": how,
            "execution": execution_label(pricer.chip), "traffic": traffic.label,
            "concurrency": traffic.concurrency, "rate_per_s": traffic.rate_per_s,
            "input_tokens": traffic.input_tokens if traffic.mode != "trace" else None,
            "output_tokens": traffic.output_tokens if traffic.mode != "trace" else None,
            "lengths": traffic.lengths_label, "arrivals": traffic.arrivals_label, "formats": formats_how,
            "acceptance_length": scheduler.acceptance_length,
            "label": f"simulated (request-level SimPy over {label} engine step times)",
        }
        record.update(summarize(sim.run(), chips=spec.chips))
        record["max_running_requests"] = limits.max_running_requests
        record["max_batch_on_chip"] = cap
        if record["peak_running"] >= cap and cap < (traffic.concurrency or 0):
            record["batch_bound"] = (f"on-chip memory: no schedule fits a decode batch above {cap} "
                                     f"(requests beyond it queue)")
        record["step_model"] = {"engine_points": table.priced, "interpolation": table.interpolation,
                                "label": label}
        record.update(_gpu_fields(pricer, traffic, record, cap))
        record["assumptions"] = list(ASSUMPTIONS)
        rows.append(record)
    return rows


def _request_overhead_s(chip: Chip, scheduler: SchedulerConfig) -> float:
    """The scheduler's request overhead, or a GPU chip's calibrated ``execution.gpu.request_overhead_s``
    (fitted on the published TTFTs of the public SGLang sweeps, calibration.sources.gpu_batch_ttft)."""
    gpu = chip.execution.gpu
    if scheduler.request_overhead_s or gpu is None or gpu.request_overhead_s is None:
        return scheduler.request_overhead_s
    return gpu.request_overhead_s.value


def _gpu_fields(pricer: EnginePricer, traffic: Traffic, record: dict[str, Any], cap: int) -> dict[str, Any]:
    """A GPU row's decode-step breakdown at its concurrency (the batch-growth mechanisms
    named) and the 90 % TPOT interval from the model error its calibration measured on
    held-out public sweeps (the chip's own overlay or the one its figures derive from); other
    rows say why they have none."""
    none = {"interval": "none: served workloads carry no interval yet (per-step intervals: "
                        "tpusim compare / simulate on a calibrated chip)"}
    if pricer.chip.kind != "gpu" or traffic.mode != "concurrency" or not record.get("tpot_ms"):
        return none
    batch = max(1, min(traffic.concurrency or 1, cap))
    out: dict[str, Any] = {"decode_breakdown_ms": {
        "batch": batch, **pricer.decode_breakdown_ms(batch, traffic.input_tokens + traffic.output_tokens // 2)}}
    error = interval_terms(pricer.chip).model_error
    mean = record["tpot_ms"].get("mean")
    if error is None or mean is None:
        return out | none
    q = error.extrapolated_rel
    out |= {"tpot_ms_low": mean * (1 - q), "tpot_ms_high": mean * (1 + q),
            "interval": f"90 % (TPOT, calibrated model error ±{100 * q:.1f} % from {error.points} held-out "
                        f"public-sweep points: {error.method})"}
    return out
