"""Pallas micro-benchmark probes for a TPU v5e chip: what the simulator's v5e model needs.

:func:`run_probes` compiles and times every probe on the default JAX device and appends one
JSON-able record per measurement to a list as it goes; :func:`compile_all_for` compiles
every probe at full size for a named TPU topology from any machine (libtpu installed).

The probes (details, units and assumptions in :mod:`calibration.tpu_bench.probes_dma`,
:mod:`calibration.tpu_bench.probes_order` and :mod:`calibration.tpu_bench.probes_compute`),
in run order:

1. ``empty_call``: launch + dispatch + sync of a ``pallas_call`` that does nothing (s);
   timed again after everything else (``params.position``: first, last).
1a. ``dma_order``: a 64 KiB copy issued behind 0, 2 or 8 copies of 1 MiB: does it wait for
   them (issue order) or share the rate; ``routing``: the kernel's own top-k selection at
   K3's TP32 widths, batch 1 … 16; ``mla_core``: the kernel's own KV-tile loop
   (:mod:`calibration.tpu_bench.probes_attention`) at 1 … 16 rows and 1 … 8 tiles, and
   ``mla_core_env``: that loop at 16 rows in a kernel padded to the megakernel's size.
2. ``dma_stream`` / ``dma_issue`` / ``dma_latency``: HBM→VMEM async copies, 4 KiB … 16 MiB
   per copy, 1/2/4/8 (16 at 4 KiB) in flight: whole-call seconds and bytes moved.
3. ``layer_loop``: L ∈ {0, 1, 8, 32, 93} empty layers (SMEM read, 4 KiB DMA, tile op).
3a. ``code_size``: the same VALU rounds written out or looped (:mod:`calibration.tpu_bench.probes_code`):
   does a long straight-line body issue as fast as a short loop.
4. ``matmul`` (``panel_loop``): K3 TP32 projection shapes × rows {8 … 128}, bf16 → f32.
5. ``rmsnorm_silu`` over f32[8, 7168].
6. ``dequant_fp8_gate_up`` / ``dequant_mxfp4_down`` per panel (the quant.py decoders).
7. ``matmul`` (``dot``, one jnp.dot) at rows 8 and 128.
8. the two dequantisations as one whole-slice expression (as ``expert_loop`` writes them;
   the slowest compiles, so last).

Each record: ``kind: probe``, ``probe``, ``params``, ``seconds_median``, ``seconds_spread``
(``spread_kind: iqr/2``), ``repeats``, ``bytes``, ``flops``, ``elements``, ``device_kind``,
``jax``, ``libtpu``, ``date``, ``backend`` (``tpu`` or ``cpu-interpret``, the latter with
``note``: interpreter wall time, NOT a TPU timing), plus ``compile_s`` and ``check`` (``ok``
or what was wrong with the kernel's output). All seconds are whole-call wall times; the
caller subtracts ``empty_call`` or differences two loop counts. A probe that fails to
compile or run gives one ``kind: probe_error`` record and the run goes on.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from calibration.tpu_bench import (
    probes_attention,
    probes_code,
    probes_compute,
    probes_dma,
    probes_order,
    probes_overlap,
    probes_products,
)
from calibration.tpu_bench.common import (
    Probe,
    compile_for,
    make_record,
    scalars_array,
    time_compiled,
    topology_device,
)
from megakernel.quant_pairs import KERNEL_DECODER

WARMUP, REPEATS = 3, 15
QUICK_WARMUP, QUICK_REPEATS = 1, 2


def all_probes(interpret: Any, quick: bool) -> list[Probe]:
    """Every probe, in run (priority) order."""
    dequant = probes_compute.dequant_probes(interpret, quick)
    per_panel = [p for p in dequant if p.params["form"] == "per_panel_loop"]
    whole = [p for p in dequant if p.params["form"] != "per_panel_loop"]
    return [
        probes_dma.empty_probe(interpret, "first"),
        probes_products.subnormal_probe(interpret),
        *probes_products.product_probes(interpret, quick),
        probes_order.dma_order_probe(interpret, quick),
        *probes_order.routing_probes(interpret, quick),
        *probes_attention.core_probes(interpret, quick),
        *probes_attention.core_env_probes(interpret, quick),
        *probes_attention.kda_core_probes(interpret, quick),
        *probes_dma.dma_probes(interpret, quick),
        *probes_overlap.overlap_probes(interpret, quick),
        probes_dma.layer_probe(interpret, quick),
        *probes_code.code_size_probes(interpret, quick),
        *probes_compute.matmul_probes(interpret, quick, "panel_loop"),
        probes_compute.norm_probe(interpret, quick),
        *per_panel,
        *probes_compute.matmul_probes(interpret, quick, "dot"),
        *whole,
        probes_dma.empty_probe(interpret, "last"),  # the launch cost again: drift over the run
    ]


def _compile(probe: Probe) -> tuple[Any, float]:
    args = [jax.ShapeDtypeStruct((probe.n_scalars,), jnp.int32), *probe.input_shapes]
    t0 = time.perf_counter()
    compiled = probe.fn.lower(*args).compile()
    return compiled, time.perf_counter() - t0


def _error_record(probe: Probe, stage: str, exc: BaseException) -> dict[str, Any]:
    return {"kind": "probe_error", "probe": probe.name, "params": probe.params, "stage": stage,
            "error": f"{type(exc).__name__}: {exc}"[:4000], "traceback": traceback.format_exc()[-4000:],
            "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__}


def _measure(probe: Probe, compiled: Any, compile_s: float, interpret: bool, quick: bool,
             out_records: list[dict[str, Any]], time_left: Callable[[], float]) -> None:
    inputs = jax.block_until_ready(probe.make_inputs())
    warmup, repeats = (QUICK_WARMUP, QUICK_REPEATS) if quick or interpret else (WARMUP, probe.repeats or REPEATS)
    for point in probe.points:
        if time_left() <= 0:
            return
        scalars = jax.device_put(scalars_array(point.scalars, probe.n_scalars))
        timing, out = time_compiled(lambda s=scalars: compiled(s, *inputs), warmup=warmup, repeats=repeats)
        try:
            check = probe.check(point, inputs, out) if probe.check is not None else None
        except Exception as exc:  # keep the timing; say the check itself failed
            check = f"check raised {type(exc).__name__}: {exc}"[:2000]
        out_records.append(make_record(probe, point, timing, interpret=interpret, compile_s=compile_s, check=check))


def run_probes(budget_s: float, out_records: list[dict[str, Any]], *, quick: bool = False,
               compile_workers: int = 4, only: Callable[[Probe], bool] | None = None,
               interpret: bool | None = None) -> None:
    """Compile and time every probe on the default device, appending records as they come.

    No new probe or point starts once ``budget_s`` seconds have passed since the call (a
    point under way finishes). Off a TPU the kernels run in Pallas TPU interpret mode
    (``backend: cpu-interpret``; ``interpret=True`` forces it anywhere); ``quick`` picks
    tiny sizes for that. Compiles run up to
    ``compile_workers`` probes ahead of the timing, in threads (XLA's compile releases the
    GIL); timing itself is one probe at a time. ``only`` selects probes (e.g. by name).
    Compiles still running when the budget ends are abandoned, but the interpreter waits for
    them at exit (at most ``compile_workers`` of them)."""
    t_start = time.perf_counter()

    def time_left() -> float:
        return budget_s - (time.perf_counter() - t_start)

    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    params = pltpu.InterpretParams() if interpret else None
    probes = [p for p in all_probes(params, quick) if only is None or only(p)]
    pool = ThreadPoolExecutor(max_workers=max(1, compile_workers))
    futures: dict[int, Future[tuple[Any, float]]] = {}
    try:
        for idx, probe in enumerate(probes):
            if time_left() <= 0:
                break
            for ahead in range(idx, min(len(probes), idx + max(1, compile_workers))):
                if ahead not in futures:
                    futures[ahead] = pool.submit(_compile, probes[ahead])
            try:
                compiled, compile_s = futures.pop(idx).result(timeout=max(0.0, time_left()))
            except FuturesTimeout:  # the budget ran out while this probe compiled
                break
            except Exception as exc:
                out_records.append(_error_record(probe, "compile", exc))
                continue
            try:
                _measure(probe, compiled, compile_s, interpret, quick, out_records, time_left)
            except Exception as exc:
                out_records.append(_error_record(probe, "run", exc))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def compile_all_for(topology_name: str = "v5e:2x2", *, only: Callable[[Probe], bool] | None = None
                    ) -> dict[str, float]:
    """Compile every probe at full size for device 0 of ``topology_name`` (e.g. ``v5e:2x2``)
    with libtpu's Mosaic compiler, from any machine; compile seconds by probe label (the
    compiler's error is raised as is)."""
    device = topology_device(topology_name)
    out: dict[str, float] = {}
    for probe in all_probes(None, quick=False):
        if only is None or only(probe):
            out[probe_label(probe)] = compile_for(probe, device)
    return out


def slow_compile(probe: Probe) -> bool:
    """The single-dot matmuls and whole-slice dequantisations: 4-70 s of compile each on a
    2-core machine (the other probes take under 2.5 s)."""
    return probe.params.get("form") in ("dot", "whole_slice")


def representative(probe: Probe) -> bool:
    """The compile-test subset: one probe of each kernel, the fast-compiling sizes."""
    p = probe.params
    if probe.name in ("empty_call", "layer_loop", "rmsnorm_silu"):
        return True
    if probe.name == "dma_stream":
        return p["tile_rows"] in (16, 65536)  # 4 KiB (16 slots) and 16 MiB (2 slots, 32 MiB VMEM)
    if probe.name == "matmul":
        return p["form"] == "panel_loop" and p["shape"] == "expert_down" and p["rows"] == 8
    return (probe.name == "dequant_mxfp4_down" and p["form"] == "per_panel_loop"
            and p["decoder"] == KERNEL_DECODER)


def probe_label(probe: Probe) -> str:
    """``name[k=v,...]``: one compile unit's unique label."""
    inner = ",".join(f"{k}={v}" for k, v in probe.params.items() if k not in ("dtype", "accumulate"))
    return f"{probe.name}[{inner}]"
