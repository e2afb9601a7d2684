"""Run the megakernel for N decode steps, time it honestly and append a measurement record.

Backends:

- ``tpu``: compile ahead (not timed), one warm-up step, then ``steps`` timed steps, each
  ended by ``block_until_ready``; the record's backend is the device kind.
- ``interpret``: Pallas TPU interpret mode on the CPU. Every step is checked against the
  pure-JAX reference (``max_abs_error``); the wall time is recorded with backend
  ``cpu-interpret`` and ``timing_note`` saying it is **not** a TPU timing.
- ``auto``: ``tpu`` when JAX sees a TPU, else ``interpret``.

Tokens are fed greedily (each step's argmax is the next input). The record
(:class:`hwmodels.records.kernel.KernelRecord`) is one JSON line in the format of
:mod:`calibration.sources.measurements` (``ms_per_step_spread`` = half the inter-quartile
range, :func:`hwmodels.records.timing.summarise`), appended by the record layer's one writer
(:func:`hwmodels.records.jsonl.append_record`: a single ``O_APPEND`` write and ``fsync``):
the file is never truncated and concurrent runners never interleave within a line. The routing the
model's own router chose in the first step is saved as a ``tpusim.workload.routing`` trace file next
to the records, and the record's ``routing`` is ``trace:<that file>``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hwmodels.errors import InputError
from hwmodels.records.jsonl import append_record
from hwmodels.records.kernel import KernelRecord
from hwmodels.records.timing import summarise
from megakernel.dims import model_dims
from megakernel.dma_plan import UnsupportedSchedule
from megakernel.events import save_routing_trace
from megakernel.expert_products import DECODE, ExpertProducts, expert_products_for
from megakernel.hbm import pack_hbm
from megakernel.kernel import Megakernel
from megakernel.kernel_moe import EXPERT_LIST_BUILD
from megakernel.layout import load_safetensors, random_weights
from megakernel.math_moe import distinct_experts as distinct_experts_in_order
from megakernel.reference import (
    DecodeState,
    decode_step,
    decode_step_with_routing,
    device_params,
    init_state,
)
from megakernel.step_bytes import step_hbm_bytes
from megakernel.tolerance import F32, REORDERED, TOLERANCES
from megakernel.vmem_limit import PUBLISHED_KERNEL_CHIP, vmem_limit_for
from tpusim.progress_notes import note
from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, PANEL_UNROLL
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for

NOT_TPU_NOTE = "Pallas TPU interpret mode on a CPU: wall time of the interpreter, NOT a TPU timing"


# f32 x f32 products inside the kernel (attention scores, the KDA recurrence) at full precision:
# XLA/Mosaic's TPU default is one bf16 pass. Weight products are bf16 x bf16 either way.
KERNEL_PRECISION = "default"  # "highest" made Mosaic refuse bf16 x bf16 products (fp32 contract precision)


@dataclass(frozen=True)
class RunConfig:
    model: str = "kimi-k3-mini"
    schedule: str = "published"
    batch: int = 1
    steps: int = 2  # timed steps (a TPU); checked steps in interpret mode
    context: int = 16
    backend: str = "auto"  # auto | tpu | interpret
    seed: int = 0
    weights: Path | None = None  # a safetensors folder; None = seeded random weights
    label: str = "measured"
    shard_of: str | None = None  # a plan name: run one device's program of it on this chip
    weight_banks: int = 0  # >0: stacked weights hold this many distinct entries (dims.weight_banks)
    check_steps: int = 8  # greedy steps checked against the reference before timing (a TPU)
    layers: int = 0  # >0: only the model's first N layers (numerics by depth); 0: all of them
    # a fixed-cost probe: at most this many of each layer's experts (batch 1; not a decode, so
    # nothing is checked against the reference); None: a decode
    expert_cap: int | None = None
    # panels per panel-loop iteration (streamed tensors, routed experts' parts); other than the
    # kernel's defaults (tpusim.schedule.kernel_layout) the record says so as ``kernel_variant``
    panel_unroll: int = PANEL_UNROLL
    expert_panel_unroll: int = EXPERT_PANEL_UNROLL

    def kernel_variant(self) -> dict[str, int] | None:
        """The knobs this run sets away from the kernel's defaults (None: the kernel as it is)."""
        variant = {name: value for name, value, default in (
            ("panel_unroll", self.panel_unroll, PANEL_UNROLL),
            ("expert_panel_unroll", self.expert_panel_unroll, EXPERT_PANEL_UNROLL)) if value != default}
        return variant or None


@dataclass
class Prepared:
    """What a run needs besides the schedule: dims, weights and their device copies. Built
    once per (model, shard, banks, seed, weights) and shared by every schedule and batch."""

    dims: Any
    weights: Any
    params: Any


_PREPARED: dict[tuple[Any, ...], Prepared] = {}


def resolve_backend(backend: str) -> str:
    if backend not in ("auto", "tpu", "interpret"):
        raise InputError(f"--backend {backend}: use auto, tpu or interpret")
    if backend == "auto":
        return "tpu" if jax.default_backend() == "tpu" else "interpret"
    if backend == "tpu" and jax.default_backend() != "tpu":
        raise InputError("--backend tpu: JAX sees no TPU on this host (use --backend interpret)")
    return backend


def run_plan(config: RunConfig) -> Any:
    """The plan the run's program is one device of (a shard of ``shard_of``, else one device)."""
    from tpusim.workload.model_catalog import shard_plan

    model = load_model(config.model)
    plan = shard_plan(model, config.shard_of) if config.shard_of else plan_for(model, 1)
    return (model.with_layers(config.layers) if config.layers else model), plan


def max_context_for(config: RunConfig, backend: str) -> int:
    """KV cache length of a run: its context, the checked and timed steps, and the warm-up."""
    check_steps = config.steps if backend == "interpret" else max(config.check_steps, 0)
    return config.context + check_steps + config.steps + 1


def vmem_limit_on(backend: str) -> int:
    """The VMEM limit Mosaic gets where the kernel runs: the chip's catalog VMEM on a TPU (a
    v5e's 128 MiB, not TPU v7's 64 MiB), the published kernel's chip's in interpret mode."""
    if backend != "tpu":
        return vmem_limit_for(PUBLISHED_KERNEL_CHIP)
    try:
        return vmem_limit_for(device_chip(backend))
    except (KeyError, ValueError):  # a TPU the catalog does not name: the published kernel's limit
        return vmem_limit_for(PUBLISHED_KERNEL_CHIP)


def expert_products_on(backend: str) -> ExpertProducts:
    """How the routed experts are multiplied where the kernel runs: the chip's way on a TPU
    (:func:`megakernel.expert_products.expert_products_for`: a v5e decodes), the decoders in
    interpret mode and on a TPU the catalog does not name."""
    if backend != "tpu":
        return DECODE
    try:
        return expert_products_for(device_chip(backend))
    except (KeyError, ValueError):  # a TPU the catalog does not name
        return DECODE


def build_kernel(config: RunConfig, dims: Any, backend: str) -> Megakernel:
    """The kernel a run compiles, built in one place for the run and for compiles ahead of it
    (same shapes and limits, so a compile ahead is the one the run finds in the cache)."""
    interpret = None
    if backend == "interpret":
        from jax.experimental.pallas import tpu as pltpu

        interpret = pltpu.InterpretParams()
    return Megakernel(dims, load_schedule(config.schedule), config.batch, max_context_for(config, backend),
                      interpret=interpret, vmem_limit_bytes=vmem_limit_on(backend), expert_cap=config.expert_cap,
                      panel_unroll=config.panel_unroll, expert_panel_unroll=config.expert_panel_unroll,
                      expert_products=expert_products_on(backend))


def prepare(config: RunConfig) -> Prepared:
    key = (config.model, config.shard_of, config.weight_banks, config.seed, config.weights, config.layers)
    if key not in _PREPARED:
        _PREPARED.clear()  # one model's weights on the chip at a time
        model, plan = run_plan(config)
        dims = dataclasses.replace(model_dims(model, plan), weight_banks=config.weight_banks)
        weights = load_safetensors(dims, config.weights) if config.weights else random_weights(dims, config.seed)
        _PREPARED[key] = Prepared(dims, weights, device_params(weights))
    return _PREPARED[key]


def run(config: RunConfig, out: Path | None = None) -> dict[str, Any]:
    """Run ``config``; append the record to ``out`` (when given) and return it.

    On a TPU: compile (timed, not part of the step time), ``check_steps`` greedy steps where
    the kernel and the reference (``megakernel.reference``, computed on the same chip) each
    feed their own argmax back (tokens must be identical; logits within tolerance while they
    are), one warm-up step, then ``steps`` timed steps. In interpret mode: ``steps`` checked
    steps (the time is the interpreter's)."""
    if config.batch < 1 or config.steps < 1 or config.context < 1:
        raise InputError("--batch, --steps and --context must be >= 1")
    if config.weight_banks < 0:
        raise InputError(f"--weight-banks {config.weight_banks}: must be >= 0")
    backend = resolve_backend(config.backend)
    check_steps = config.steps if backend == "interpret" else max(config.check_steps, 0)
    if config.expert_cap is not None:
        check_steps = 0  # not the model's decode: there is no reference to check against
    try:
        note(f"{config.model}: weights and the kernel")
        prepared = prepare(config)
        schedule = load_schedule(config.schedule)
        kernel = build_kernel(config, prepared.dims, backend)
    except (UnsupportedSchedule, ValueError) as error:
        if isinstance(error, InputError):
            raise
        raise InputError(str(error)) from None
    dims, params = prepared.dims, prepared.params
    hbm = {name: jnp.asarray(value) for name, value in pack_hbm(prepared.weights, kernel.geo, kernel.expert_products).items()}
    state = init_state(dims, config.batch, kernel.max_context, context=config.context, seed=config.seed)
    tokens = jnp.asarray(np.random.default_rng(config.seed).integers(0, dims.vocab_rows, config.batch), jnp.int32)
    started = time.perf_counter()
    note(f"{config.model}: compiling the kernel ({'TPU interpret mode' if backend == 'interpret' else backend})")
    with jax.default_matmul_precision(KERNEL_PRECISION):  # the kernel's own f32 products (scores, ...)
        step = jax.jit(kernel.step).lower(hbm, params["embedding"], state, tokens).compile()
    compile_s = time.perf_counter() - started
    with jax.default_matmul_precision("highest"):
        _, _, routing = decode_step_with_routing(dims, params, state, tokens)
    routing = np.asarray(routing)
    if config.expert_cap is not None:
        routing = capped_routing(routing, config.expert_cap)
    experts_per_layer = distinct_experts(routing, dims.moe.local_experts)
    note(f"{config.model}: {check_steps} checked step(s), kernel against the reference")
    check = greedy_check(step, dims, params, hbm, state, tokens, check_steps)
    times_ms = (timed_steps(step, hbm, params["embedding"], state, tokens, config.steps)
                if backend == "tpu" or config.expert_cap is not None else check["times_ms"])
    hbm_bytes = step_hbm_bytes(kernel, experts_per_layer, config.context)
    timing = summarise(times_ms)  # milliseconds in, milliseconds out
    variant = config.kernel_variant()
    record = KernelRecord(
        model=config.model,
        system={"chip": device_chip(backend), "chips": 1},
        batch=config.batch,
        context=config.context,
        routing="identical",  # replaced by the trace file below when recording
        schedule=schedule.name,
        schedule_hash=schedule.content_hash(),
        backend="cpu-interpret" if backend == "interpret" else jax.devices()[0].device_kind,
        ms_per_step_median=timing.median_s,
        ms_per_step_spread=timing.spread_s,
        steps=config.steps,
        provenance=provenance(),
        label=config.label,
        **check_fields(check, check_steps),
        compile_s=compile_s,
        shard_of=config.shard_of,
        weight_banks=config.weight_banks,
        hbm_bytes_per_step=sum(hbm_bytes.values()),
        hbm_bytes_by_kind=hbm_bytes,
        effective_bandwidth_bytes_per_s=sum(hbm_bytes.values()) / (timing.median_s / 1e3),
        experts_per_layer=experts_per_layer,
        versions=versions(),
        expert_cap=config.expert_cap,
        kernel_variant=variant,
        # panels a panel loop's iteration issues (dense, routed experts); records before it: 1, 1
        panel_unroll=[config.panel_unroll, config.expert_panel_unroll],
        decoder=kernel.expert_products.name,
        expert_list=EXPERT_LIST_BUILD,  # how moe.topk builds the expert list (megakernel.kernel_moe)  # how the expert weights were multiplied (megakernel.expert_products)
        timing_note=NOT_TPU_NOTE if backend == "interpret" else "native TPU, block_until_ready per step, "
                    "warm-up excluded, compile timed separately",
    ).to_dict()
    if out is not None:
        routing_file = Path(f"{out}.routing") / f"{routing_key(config, schedule)}.json"
        routing_file.parent.mkdir(parents=True, exist_ok=True)
        save_routing_trace(np.asarray(routing), routing_file)
        record["routing"] = f"trace:{routing_file}"
        append_record(out, record)
    return record


def check_fields(check: dict[str, Any], check_steps: int) -> dict[str, Any]:
    """The record's fields of a :func:`greedy_check` (the kernel's and the XLA baseline's)."""
    relative = check["relative_error"]
    return {"max_abs_error": check["max_abs_error"], "relative_error": relative,
            "within_tolerance": None if relative is None else relative <= TOLERANCES[REORDERED][F32],
            "tokens_identical": check["tokens_identical"], "step_relative_errors": check["step_relative_errors"],
            "checked_steps": check_steps}


def timed_steps(step: Any, hbm: Any, embedding: Any, state: DecodeState, tokens: jax.Array, steps: int) -> list[float]:
    """One warm-up step, then ``steps`` greedy steps, each ended by ``block_until_ready``:
    wall milliseconds per step (the chip's timing, shared by the kernel and the XLA baseline)."""
    jax.block_until_ready(step(hbm, embedding, state, tokens))  # warm-up
    times_ms: list[float] = []
    for _ in range(steps):
        start = time.perf_counter()
        logits, state = step(hbm, embedding, state, tokens)
        jax.block_until_ready(logits)
        times_ms.append((time.perf_counter() - start) * 1e3)
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return times_ms


def routing_key(config: RunConfig, schedule: Any) -> str:
    shard = f"-{config.shard_of}" if config.shard_of else ""
    cap = f"-cap{config.expert_cap}" if config.expert_cap is not None else ""
    return f"{config.model}{shard}-{schedule.content_hash()}-b{config.batch}{cap}-s{config.seed}"


def capped_routing(routing: np.ndarray, cap: int) -> np.ndarray:
    """Routing ``[layers, B, k]`` -> ``[layers, B, cap]``: what a kernel capped at ``cap`` experts
    a layer runs. The kernel keeps the first ``cap`` entries of its expert list (distinct ids in
    first-appearance, round-major order: :func:`megakernel.math_moe.distinct_experts`) and
    multiplies each for every row of the batch, so every row is written as picking exactly
    those. At batch 1 this is the row's first ``cap`` picks in rank order."""
    layers = []
    for index, layer in enumerate(routing):
        first = distinct_experts_in_order(layer)[:cap]
        if len(first) < cap:
            raise InputError(f"--expert-cap {cap}: MoE layer {index} routes only {len(first)} distinct experts")
        layers.append(np.broadcast_to(np.asarray(first, dtype=routing.dtype), (layer.shape[0], cap)))
    return np.stack(layers) if layers else routing[:, :, :cap]


def distinct_experts(routing: np.ndarray, local_experts: int) -> list[int]:
    """Distinct local experts per MoE layer of a routing ``[layers, B, k]`` (what the kernel loads)."""
    return [len({int(e) for e in layer.reshape(-1) if 0 <= int(e) < local_experts}) for layer in routing]


def greedy_check(step: Any, dims: Any, params: Any, hbm: Any, state: DecodeState, tokens: jax.Array,
                 steps: int) -> dict[str, Any]:
    """``steps`` greedy steps of the kernel and of the reference, each fed its own argmax:
    whether the tokens stay identical, and the largest logits difference while they do."""
    kernel_state, ref_state, kernel_tokens, ref_tokens = state, state, tokens, tokens
    errors, scale, times_ms, identical = [], [], [], True
    for _ in range(steps):
        start = time.perf_counter()
        logits, kernel_state = step(hbm, params["embedding"], kernel_state, kernel_tokens)
        jax.block_until_ready(logits)
        times_ms.append((time.perf_counter() - start) * 1e3)
        # f32 products at full precision: on a TPU, XLA's default runs them as one bf16 pass,
        # which over 93 layers drifts further from exact than the kernel does
        with jax.default_matmul_precision("highest"):
            ref_logits, ref_state = decode_step(dims, params, ref_state, ref_tokens)
        if identical:
            errors.append(float(jnp.max(jnp.abs(logits - ref_logits))))
            scale.append(float(jnp.max(jnp.abs(ref_logits))))
        kernel_tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        ref_tokens = jnp.argmax(ref_logits, axis=-1).astype(jnp.int32)
        identical = identical and bool(jnp.all(kernel_tokens == ref_tokens))
    return {"max_abs_error": max(errors) if errors else None, "tokens_identical": identical if steps else None,
            "relative_error": max(errors) / max(scale) if errors and max(scale) > 0 else None,
            "step_relative_errors": [e / max(s, 1e-6) for e, s in zip(errors, scale, strict=True)],
            "times_ms": times_ms}


def versions() -> dict[str, str | None]:
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {"jax": jax.__version__, "jaxlib": version("jaxlib"), "libtpu": version("libtpu"),
            "python": platform.python_version()}


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
