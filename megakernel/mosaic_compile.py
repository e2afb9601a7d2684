"""Compile the megakernel with libtpu's Mosaic compiler from a machine without a TPU.

Lowering (:mod:`megakernel.tpu_lowering`) proves every op has a Mosaic lowering rule; this
runs Mosaic itself, so tiling, alignment and VMEM limits fail here exactly as on the chip.
libtpu builds compile-only devices for a named topology
(``jax.experimental.topologies.get_topology_desc``); the step is lowered with inputs placed on
one of them and ``.compile()``d. Nothing is allocated and nothing runs.

libtpu reads its environment when it is first loaded: :data:`ENVIRONMENT` (no metadata-server
query, several libtpu loads allowed, JAX on the CPU) must be set before that, which
:func:`prepare_environment` does (``setdefault``: what a caller set wins). In a process whose
JAX backends may already be up with other settings, run ``python -m megakernel.commands.mosaic_compile``
(a fresh process, one JSON line, as ``tpusim lower --hardware`` does).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hwmodels.units import MIB

ENVIRONMENT = {"TPU_SKIP_MDS_QUERY": "1", "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}

# the catalog's TPU chips and the compile-only topology Mosaic targets for each
TOPOLOGIES = {"tpu-v5e": "v5e:2x2", "tpu-v6e": "v6e:2x2", "tpu-v7": "tpu7x:2x2x1"}
TPU7X_32 = "tpu7x:2x2x4"
# TPU7x topologies by device count (two devices per chip): 4, 8 and 16 chips
TPU7X = {8: "tpu7x:2x2x1", 16: "tpu7x:2x2x2", 32: TPU7X_32}


def libtpu_available() -> bool:
    """libtpu is importable (the ``tpu-compile`` / test extra), so Mosaic can compile here."""
    return importlib.util.find_spec("libtpu") is not None


def prepare_environment() -> None:
    """Set :data:`ENVIRONMENT` (without overriding) before libtpu is first loaded."""
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def topology_for(chip_name: str, devices: int = 1) -> str:
    """The compile-only topology for ``chip_name`` (tpu-v5e → v5e:2x2, tpu-v6e → v6e:2x2,
    tpu-v7 → tpu7x:2x2x1 (8 devices), tpu7x:2x2x2 for 16 devices, tpu7x:2x2x4 for 32)."""
    name = chip_name.partition("@")[0]
    if name not in TOPOLOGIES:
        raise ValueError(f"no Mosaic compile topology for {chip_name!r}; known: {', '.join(TOPOLOGIES)}")
    if name == "tpu-v7" and devices in TPU7X:
        return TPU7X[devices]
    return TOPOLOGIES[name]


@dataclass(frozen=True)
class CompileReport:
    """One Mosaic compile: ok, its seconds, and on failure the compiler's error in one paragraph."""

    topology: str
    ok: bool
    seconds: float  # lowering + Mosaic compile
    error: str | None = None  # first line of the message, the MLIR op line, the kernel's source line
    kind: str | None = None  # "lowering" | "mosaic" | "vmem" | "hbm" | "other" on failure


def describe_error(error: BaseException) -> str:
    """The compiler's error in one paragraph: the first line of its message (from the
    ``Mosaic failed`` line when there is one), the MLIR operation involved, and the first
    ``megakernel/...py:LINE`` frame of the failing op's source location (the innermost; else the
    first frame outside JAX)."""
    message = str(error)
    start = message.find("Mosaic failed")
    lines = [line.strip() for line in message[max(start, 0):].splitlines() if line.strip()]
    parts = [lines[0] if lines else type(error).__name__]
    op = next((line for line in lines if line.startswith("%") or '"tpu.' in line or ("= " in line and "(" in line)), None)
    if op is not None and op != parts[0]:
        parts.append(f"MLIR op: {op[:400]}")
    frames = traceback.extract_tb(error.__traceback__)
    # the innermost kernel frame: Pallas appends the failing op's source location, call chain last
    where = next((f for f in reversed(frames) if "megakernel/" in f.filename.replace(os.sep, "/")
                  and f.filename != __file__), None)
    if where is None:
        where = next((f for f in frames if "/jax/" not in f.filename and "site-packages" not in f.filename
                      and f.filename != __file__), None)
    if where is not None:
        path = where.filename.replace(os.sep, "/")
        cut = path.rfind("megakernel/")
        parts.append(f"at {path[cut:] if cut >= 0 else path}:{where.lineno}")
    return "; ".join(parts)


def _kind(error: BaseException) -> str:
    message = str(error)
    if "RESOURCE_EXHAUSTED" in message:
        return "hbm" if "on HBM" in message else "vmem"
    return "mosaic" if "Mosaic" in message or type(error).__name__ == "MosaicError" else "other"


def compile_function(function: Callable[..., Any], inputs: Any, topology_name: str, *,
                     raw_errors: bool = False) -> CompileReport:
    """Lower ``jax.jit(function)`` for ``inputs`` (a pytree of ``jax.ShapeDtypeStruct``) placed on
    one compile-only device of ``topology_name`` and compile it with Mosaic (``raw_errors``:
    the compiler's whole message, not :func:`describe_error`'s paragraph)."""
    prepare_environment()
    import jax
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(platform="tpu", topology_name=topology_name)
    sharding = jax.sharding.SingleDeviceSharding(topology.devices[0])
    placed = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), inputs)
    return _lower_and_compile(jax.jit(function), placed, topology_name, raw_errors=raw_errors)


def _lower_and_compile(jitted: Any, placed: Any, topology_name: str, *, raw_errors: bool = False) -> CompileReport:
    """Lower ``jitted`` for the placed inputs and compile it: the report, seconds for both."""
    start = time.perf_counter()
    try:
        lowered = jitted.lower(*placed)
    except Exception as error:
        return CompileReport(topology_name, False, time.perf_counter() - start, describe_error(error), "lowering")
    try:
        lowered.compile()
    except Exception as error:
        message = str(error) if raw_errors else describe_error(error)
        return CompileReport(topology_name, False, time.perf_counter() - start, message, _kind(error))
    return CompileReport(topology_name, True, time.perf_counter() - start)


def compile_sharded(build: Callable[[Any], Callable[..., Any]], inputs: Any, specs: Any, topology_name: str,
                    devices: int, axis_name: str = "x", raw_errors: bool = False) -> CompileReport:
    """Lower ``jax.jit(build(mesh))`` over a 1-D mesh ``(axis_name,)`` of the first ``devices``
    compile-only devices of ``topology_name`` and compile it with Mosaic (every device's kernel,
    remote copies and semaphores included). ``inputs``: a pytree of ``jax.ShapeDtypeStruct``
    (global shapes); ``specs``: a matching pytree of ``PartitionSpec`` (the ``shard_map``'s
    ``in_specs``), each input placed with ``NamedSharding(mesh, spec)``. Raises ``ValueError``
    when the topology has fewer than ``devices`` devices."""
    prepare_environment()
    import jax
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    topology = topologies.get_topology_desc(platform="tpu", topology_name=topology_name)
    if len(topology.devices) < devices:
        raise ValueError(f"topology {topology_name} has {len(topology.devices)} devices, {devices} needed")
    mesh = Mesh(np.array(topology.devices[:devices]), (axis_name,))
    shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                             is_leaf=lambda x: isinstance(x, PartitionSpec))
    placed = jax.tree.map(lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                          inputs, shardings)
    return _lower_and_compile(jax.jit(build(mesh)), placed, topology_name, raw_errors=raw_errors)


def compile_collective(kernel: Any, topology_name: str, raw_errors: bool = False) -> CompileReport:
    """Compile one decode step of ``kernel`` (a
    :class:`megakernel.kernel_collectives.CollectiveMegakernel`) over ``kernel.plan.devices``
    compile-only devices of ``topology_name``: :meth:`sharded_step` on that mesh, inputs
    placed as its ``in_specs`` (per-device operands split on the leading axis, embedding and
    tokens replicated)."""
    from jax.sharding import PartitionSpec as P

    from megakernel.reference import DecodeState

    def build(mesh: Any) -> Callable[..., Any]:
        kernel.__dict__["mesh"] = mesh  # the kernel's mesh (a cached property): the compile-only devices
        return kernel.sharded_step()

    hbm, embedding, state, tokens, routes = kernel.global_shapes()
    specs = ({name: P("x") for name in hbm}, P(), DecodeState(P("x"), P("x"), P("x"), P()), P(), P("x"))
    before = kernel.__dict__.get("mesh")
    try:
        return compile_sharded(build, (hbm, embedding, state, tokens, routes), specs, topology_name,
                               kernel.plan.devices, raw_errors=raw_errors)
    finally:  # the kernel's own mesh again (or built on next use)
        if before is None:
            kernel.__dict__.pop("mesh", None)
        else:
            kernel.__dict__["mesh"] = before


def step_inputs(kernel: Any) -> tuple[Any, ...]:
    """The shapes of one decode step's arguments (hbm words, embedding, state, tokens)."""
    import jax
    import jax.numpy as jnp

    from megakernel.reference import DecodeState

    sds = jax.ShapeDtypeStruct
    hbm = {name: sds(shape, jnp.uint16) for name, shape in kernel.hbm_shapes().items()}
    states = kernel.state_shapes()
    state = DecodeState(*(sds(states[n].shape, states[n].dtype) for n in ("state.kda", "state.conv", "state.kv")),
                        sds((), jnp.int32))
    return hbm, sds((kernel.dims.vocab_rows, kernel.dims.hidden), jnp.bfloat16), state, sds((kernel.batch,), jnp.int32)


def compile_for(kernel: Any, topology_name: str) -> CompileReport:
    """Compile one decode step of ``kernel`` (a :class:`megakernel.kernel.Megakernel`) with Mosaic
    for ``topology_name`` (:func:`topology_for`)."""
    return compile_function(kernel.step, step_inputs(kernel), topology_name)


SCOPED = re.compile(r"Scoped allocation with size ([0-9.]+)M and limit")
USED = re.compile(r"Used ([0-9.]+)M of ([0-9.]+)M vmem")  # XLA's VMEM refusal (M: MiB)


def vmem_used_bytes(error: str | None) -> tuple[int, int] | None:
    """(used, capacity) in bytes from a refusal on VMEM ("Used 66.10M of 64.00M vmem": the whole
    program's VMEM, the kernel's scratch and spill slots and the compiler's own), else None."""
    found = USED.search(error or "")
    return None if found is None else (round(float(found[1]) * MIB), round(float(found[2]) * MIB))


def scoped_vmem_bytes(kernel: Any, topology_name: str) -> int | None:
    """The compiler's own scoped-VMEM figure for ``kernel`` (bytes, to its 0.01 MiB): compiled
    once with a limit half its scratch, Mosaic refuses and names the scoped allocation it
    needed (scratch as tiled plus its internal scratch). None when the refusal names no
    allocation: from batch 2 on the K3 shard's refusal reports the whole program's VMEM
    (``Used X of Y``) instead, which is not the kernel's alone."""
    probe = copy.copy(kernel)
    probe.vmem_limit_bytes = max(sum(kernel.scratch_bytes().values()) // 2, MIB)
    if getattr(kernel, "link", None) is not None:  # the collective kernel: every device's program
        probe.__dict__.pop("mesh", None)
        report = compile_collective(probe, topology_name, raw_errors=True)
    else:
        report = compile_function(probe.step, step_inputs(probe), topology_name, raw_errors=True)
    found = SCOPED.search(report.error or "")
    return None if found is None else round(float(found.group(1)) * MIB)
