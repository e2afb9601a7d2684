"""Shared pieces of the TPU probes: the probe description, timing, records, compile-only.

A :class:`Probe` is one Pallas kernel at one set of static parameters (its compile unit),
with one or more :class:`Point` s — the runtime parameters (SMEM scalars) it is timed at —
so a family of measurements that differ only in a loop count or an in-flight depth shares
one compile.

Timing (:func:`time_compiled`, the record layer's recipe and summary,
:mod:`hwmodels.records.timing`): the executable is compiled before any timing, called
``warmup`` times untimed, then ``repeats`` times, each sample the wall time of one call
from dispatch to :func:`jax.block_until_ready` of its result. The record keeps the median
and half the inter-quartile range (``spread_kind: iqr/2``). Every sample therefore includes
one executable launch; the ``empty_call`` probe measures that launch alone.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hwmodels.records.timing import Timing, sample_seconds, summarise

INTERPRET_NOTE = "interpreter wall time, NOT a TPU timing"


@dataclass(frozen=True)
class Point:
    """One measurement of a probe: the SMEM scalars it runs with and what it moves/computes."""

    params: dict[str, Any]  # recorded as the record's "params" (merged over the probe's own)
    scalars: tuple[int, ...]  # the int32 SMEM input of the kernel
    bytes: int | None = None
    flops: int | None = None
    elements: int | None = None
    name: str | None = None  # the record's "probe" when it differs from the compile unit's


@dataclass
class Probe:
    """One compile unit: ``fn(scalars, *arrays)`` (a ``pallas_call``), its array inputs and
    the points it is timed at. ``make_inputs()`` builds the arrays on the default device;
    ``check(point, inputs, output)`` returns None when the output is right, else what is
    wrong (run after the timing, on the last output)."""

    name: str
    params: dict[str, Any]
    fn: Callable[..., Any]
    input_shapes: list[jax.ShapeDtypeStruct]
    make_inputs: Callable[[], list[jax.Array]]
    points: list[Point]
    n_scalars: int
    check: Callable[[Point, list[jax.Array], Any], str | None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    repeats: int | None = None  # timed calls per point on a TPU (None: the run's default)


def time_compiled(call: Callable[[], Any], *, warmup: int, repeats: int, max_s: float = 4.0,
                  min_repeats: int = 3) -> tuple[Timing, Any]:
    """Time ``call()`` (an already compiled executable on fixed inputs): ``warmup`` untimed
    calls, then ``repeats`` samples of one call each, dispatch to ready
    (:func:`hwmodels.records.timing.sample_seconds`). When the last warm-up says the samples
    would take over ``max_s``, fewer are taken (not below ``min_repeats``); the record's
    ``repeats`` says how many. Returns the summary and the last call's output."""
    last: list[Any] = [None]

    def one(_i: int) -> Any:
        last[0] = call()
        return last[0]

    samples = sample_seconds(one, warmup=warmup, repeats=repeats, wait=jax.block_until_ready, max_s=max_s,
                             min_repeats=min_repeats)
    return summarise(samples), last[0]


def scalars_array(values: tuple[int, ...], n: int) -> np.ndarray:
    padded = list(values) + [0] * (n - len(values))
    return np.asarray(padded, dtype=np.int32)


def libtpu_version() -> str | None:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def backend_name(interpret: bool) -> str:
    return "cpu-interpret" if interpret else jax.default_backend()


def make_record(probe: Probe, point: Point, timing: Timing, *, interpret: bool,
                compile_s: float, check: str | None) -> dict[str, Any]:
    """One JSON-able record (the lead's ``kind: probe`` schema)."""
    record: dict[str, Any] = {
        "kind": "probe",
        "probe": point.name or probe.name,
        "params": {**probe.params, **point.params},
        "seconds_median": timing.median_s,
        "seconds_spread": timing.spread_s,
        "spread_kind": "iqr/2",
        "seconds_min": timing.min_s,
        "repeats": timing.repeats,
        "bytes": point.bytes,
        "flops": point.flops,
        "elements": point.elements,
        "device_kind": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "libtpu": libtpu_version(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "backend": backend_name(interpret),
        "compile_s": compile_s,
        "check": "ok" if check is None else check,
        **probe.extra,
    }
    if point.bytes:  # rates over the whole call (launch included), as labelled
        record["bytes_per_s_whole_call"] = point.bytes / timing.median_s
    if point.flops:
        record["flop_per_s_whole_call"] = point.flops / timing.median_s
    if interpret:
        record["note"] = INTERPRET_NOTE
    return record


# ------------------------------------------------------------------ compile without a TPU


def topology_device(topology_name: str) -> jax.Device:
    """Device 0 of a compile-only TPU topology (needs libtpu; ``TPU_SKIP_MDS_QUERY=1`` set
    before JAX starts on a machine without a TPU)."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    # a CPU machine shared by several compiling processes: libtpu's lockfile would refuse all
    # but the first (no chip is opened for a compile-only topology)
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(platform="tpu", topology_name=topology_name)
    return topo.devices[0]


def compile_for(probe: Probe, device: jax.Device) -> float:
    """Run the whole Mosaic pipeline for ``device`` on ``probe``; seconds it took (raises
    the compiler's error)."""
    sh = jax.sharding.SingleDeviceSharding(device)
    args = [jax.ShapeDtypeStruct((probe.n_scalars,), jnp.int32, sharding=sh)]
    args += [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh) for s in probe.input_shapes]
    t0 = time.perf_counter()
    jax.jit(probe.fn).lower(*args).compile()
    return time.perf_counter() - t0
