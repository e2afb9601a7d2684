"""Micro-benchmarks: copy bandwidth, per-kernel gaps, and matmuls at decode shapes.

Each one is a single ``jax.jit`` executable timed by :func:`calibration.gpu_bench.records.time_call`
(warm-ups, repeats, median and spread), so every sample pays one executable dispatch, as a
decode step does. What each measures and the model the fit (:mod:`calibration.sources.gpu_micro`)
puts on it:

- **copy** of ``B`` bytes (``y = x * 2`` over ``uint32``: one elementwise kernel that reads
  ``B`` and writes ``B``): ``t = dispatch + gap + 2B / sustained_bandwidth`` (read + write
  bytes, the catalog's convention for ``hbm.sustained_bandwidth_bytes_per_s``).
- **gap, compiled**: one executable of ``N`` chained tiny matmuls (``y = y @ I`` on an 8x8
  matrix, which XLA cannot fuse or remove); the kernels actually launched are counted in the
  compiled HLO (``extra.kernels``): ``t = dispatch + kernels x gap``, the per-kernel gap a
  compiled or graph-captured step pays between kernels.
- **gap, eager**: the same tiny op dispatched from Python one call at a time
  (``inner`` calls back to back, one wait): the per-op cost of eager, launch-per-op
  execution.
- **matmul** ``x[rows, K] @ W[K, N]`` at the decode shapes of the shipped models (bf16, and
  fp8 ``float8_e4m3fn`` where the backend compiles it; f32 in the CPU set, whose bf16
  matrix-vector code runs far below the memory rate): weight-streaming at small ``rows``.
  The fp8 record times whatever XLA makes of a plain fp8 x fp8 dot (an fp8 GEMM where its
  rewriter matches the pattern, an upcast and a bf16 GEMM where not): the trace of a step
  or ``XLA_FLAGS=--xla_dump_to`` says which.

Buffers smaller than ``rotate_bytes`` are cycled through enough copies that consecutive
calls do not find their operands in the last-level cache (H200's L2 is 50 MiB), so the
copy and matmul rates are HBM rates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from calibration.gpu_bench.records import RunInfo, measurement, time_call
from hwmodels.records.timing import Timing

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
COPY_MIN_BYTES = 64 * KIB
COPY_MAX_BYTES = 4 * GIB
MATMUL_ROWS = (1, 8, 64, 256)
GAP_OPS = (1, 4, 16, 64, 256)
EAGER_INNER = 200
MAX_ROTATING_COPIES = 4096
# Bytes per weight value of each matmul dtype: a mirror of tpusim.workload.formats.DTYPE_BYTES
# (the one table), kept here because this harness runs where pydantic is not installed;
# tests/test_dtype_bytes.py checks that the two agree.
ITEMSIZE = {"fp8": 1, "bf16": 2, "f32": 4}
NO_KERNEL_OPS = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "opt-barrier", "after-all")


def copy_sizes(max_bytes: int, min_bytes: int = COPY_MIN_BYTES) -> list[int]:
    """Sizes 64 KiB, 128 KiB, ... doubling up to ``min(max_bytes, 4 GiB)``."""
    sizes, size = [], min_bytes
    while size <= min(max_bytes, COPY_MAX_BYTES):
        sizes.append(size)
        size *= 2
    return sizes


def rotation(nbytes: int, rotate_bytes: int) -> int:
    """How many copies of an ``nbytes`` operand to cycle so the set exceeds ``rotate_bytes``."""
    return max(1, min(MAX_ROTATING_COPIES, math.ceil(rotate_bytes / max(nbytes, 1))))


def _instruction(line: str) -> tuple[str, str] | None:
    """``(op, attributes)`` of one HLO instruction line, or None for any other line."""
    if "=" not in line or not line.lstrip().startswith(("%", "ROOT")):
        return None
    rhs = line.split("=", 1)[1].strip()
    if rhs.startswith("("):  # a tuple-shaped result: skip its type to reach the op name
        depth = 0
        for index, char in enumerate(rhs):
            depth += char == "("
            depth -= char == ")"
            if depth == 0:
                rhs = rhs[index + 1:].strip()
                break
    head = rhs.split("(", 1)[0].split()
    return (head[-1], rhs) if head else None


def hlo_kernel_count(compiled_text: str) -> int:
    """Kernels one execution of a compiled HLO module launches, counted from its text.

    Counted: every instruction of the ENTRY computation that launches work (fusions, dots,
    custom calls such as cuBLAS GEMMs, copies), recursing into ``call`` instructions (XLA's
    GPU command buffers wrap runs of kernels in a called computation). Not counted:
    parameters, constants, tuples, bitcasts, ``*-done`` halves of async pairs, and the bodies
    of fusions and reducers (they run inside the kernel that calls them).
    """
    computations: dict[str, list[tuple[str, str]]] = {}
    entry, current = "", None
    for raw in compiled_text.splitlines():
        line = raw.strip()
        if line.endswith("{") and " = " not in line:  # a computation header
            name = line.removeprefix("ENTRY").split()[0]
            current = computations.setdefault(name, [])
            if line.startswith("ENTRY"):
                entry = name
            continue
        if line.startswith("}"):
            current = None
            continue
        parsed = _instruction(line)
        if current is not None and parsed is not None:
            current.append(parsed)

    def count(name: str, seen: frozenset[str]) -> int:
        total = 0
        for op, rhs in computations.get(name, []):
            if op == "call":
                target = rhs.split("to_apply=", 1)[1].split(",")[0].split()[0] if "to_apply=" in rhs else ""
                total += count(target, seen | {name}) if target and target not in seen else 0
            elif op not in NO_KERNEL_OPS and not op.endswith(("-done", "-update")):
                total += 1
        return total

    if not entry:
        raise ValueError("compiled HLO text without an ENTRY computation")
    return count(entry, frozenset())


def _cycle(items: list[Any]) -> Callable[[int], Any]:
    return lambda i: items[i % len(items)]


def bench_copies(info: RunInfo, *, max_bytes: int, rotate_bytes: int, warmup: int,
                 repeats: int) -> Iterator[dict[str, Any]]:
    """One record per copy size (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    kernel = jax.jit(lambda x: x * jnp.uint32(2))
    for size in copy_sizes(max_bytes):
        count = rotation(2 * size, rotate_bytes)
        buffers = [jnp.full((size // 4,), i, dtype=jnp.uint32) for i in range(count)]
        pick = _cycle(buffers)
        timing = time_call(lambda i, pick=pick: kernel(pick(i)), warmup=warmup, repeats=repeats)
        del buffers
        yield measurement(
            info, model=f"bench:copy[bytes={size}]", batch=1, timing=timing, kind="copy",
            what=f"y = x * 2 over {size} bytes of uint32 (reads and writes {size} bytes), "
                 f"{count} rotating buffers",
            extra={"bytes": size, "bytes_moved": 2 * size, "rotating_buffers": count},
        )


def _tiny_chain(ops: int) -> Callable[[Any, Any], Any]:
    import jax.numpy as jnp

    def chain(y: Any, m: Any) -> Any:
        for _ in range(ops):
            y = jnp.dot(y, m)
        return y

    return chain


def bench_gaps(info: RunInfo, *, warmup: int, repeats: int,
               op_counts: tuple[int, ...] = GAP_OPS) -> Iterator[dict[str, Any]]:
    """The eager per-op cost and the compiled per-kernel gap (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    y0, eye = jnp.ones((1, 8), jnp.float32), jnp.eye(8, dtype=jnp.float32)
    eager = jax.jit(_tiny_chain(1))
    state = {"y": y0}

    def one_eager(_: int) -> Any:
        state["y"] = eager(state["y"], eye)
        return state["y"]

    timing = time_call(one_eager, warmup=warmup * EAGER_INNER, repeats=repeats, inner=EAGER_INNER)
    yield measurement(info, model="bench:gap-eager", batch=1, timing=timing, kind="gap_eager",
                      what=f"one tiny matmul (1x8 @ 8x8) dispatched per call, {EAGER_INNER} calls per sample",
                      extra={"ops": 1, "kernels": 1})
    for ops in op_counts:
        lowered = jax.jit(_tiny_chain(ops)).lower(y0, eye)
        compiled = lowered.compile()
        kernels = hlo_kernel_count(compiled.as_text())
        timing = time_call(lambda _i, c=compiled: c(y0, eye), warmup=warmup, repeats=repeats)
        yield measurement(
            info, model=f"bench:gap-compiled[ops={ops}]", batch=1, timing=timing, kind="gap_compiled",
            what=f"one executable of {ops} chained tiny matmuls ({kernels} kernels in the compiled HLO)",
            extra={"ops": ops, "kernels": kernels},
        )


def _matmul() -> Callable[[Any, Any], Any]:
    import jax.numpy as jnp

    return lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16)


def _store(dtype: str) -> Any:
    import jax.numpy as jnp

    return {"bf16": jnp.bfloat16, "fp8": jnp.float8_e4m3fn, "f32": jnp.float32}[dtype]


def _weights(k: int, n: int, dtype: str, count: int, rng: np.random.Generator) -> list[Any]:
    """``count`` distinct ``[k, n]`` weights (cast on the host, so no eager op compiles)."""
    import jax.numpy as jnp

    base = rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k)
    return [jnp.asarray((base + 0.01 * i).astype(_store(dtype))) for i in range(count)]


def bench_matmuls(info: RunInfo, shapes: list[dict[str, Any]], *, dtypes: tuple[str, ...], rows_list: tuple[int, ...],
                  rotate_bytes: int, warmup: int, repeats: int, skipped: list[str]) -> Iterator[dict[str, Any]]:
    """One record per (shape, rows, dtype); a dtype the backend cannot compile is skipped
    once, with the reason appended to ``skipped``."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    failed: set[str] = set()
    for shape in shapes:
        k, n = int(shape["k"]), int(shape["n"])
        for dtype in dtypes:
            if dtype in failed:
                continue
            itemsize = ITEMSIZE[dtype]
            count = rotation(k * n * itemsize, rotate_bytes)
            kernel = jax.jit(_matmul())
            weights = _weights(k, n, dtype, count, rng)
            for rows in rows_list:
                x = jnp.asarray(rng.standard_normal((rows, k), dtype=np.float32).astype(_store(dtype)))
                pick = _cycle(weights)
                try:
                    timing: Timing = time_call(lambda i, x=x, pick=pick, kernel=kernel: kernel(x, pick(i)),
                                               warmup=warmup, repeats=repeats)
                except Exception as error:  # a backend without fp8 raises its own error types
                    failed.add(dtype)
                    skipped.append(f"matmul {dtype}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
                    break
                yield measurement(
                    info, model=f"bench:matmul@{dtype}[k={k},n={n}]", batch=rows, timing=timing, kind="matmul",
                    what=f"x[{rows},{k}] @ W[{k},{n}] in {dtype} (f32 accumulate, bf16 out), {count} rotating weights; "
                         f"shape of {shape.get('source', '?')}",
                    extra={"rows": rows, "k": k, "n": n, "dtype": dtype, "weight_bytes": k * n * itemsize,
                           "rotating_buffers": count, "source": shape.get("source", "")},
                )
