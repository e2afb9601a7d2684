"""Replay a decode step's *description* as one ``jax.jit`` executable (jax + numpy only).

A step description is plain JSON written on the simulator's side
(:func:`calibration.sources.step_description.describe_program` walks a
:class:`~tpusim.workload.program.Program`), so this module needs neither pydantic nor
tpusim: it runs on the lent GPU machine's bare Python, and the CPU loop uses it too. The
description is::

    {"batch": B, "hidden": H, "ops": [op, ...]}

with one entry per program op (or per group of routed experts), replayed as:

| ``kind`` | fields | replayed as | bytes read |
| --- | --- | --- | --- |
| ``matmul`` | ``mats: [[rows, K, N, dtype], ...]`` | ``x[rows, K] @ W[K, N]`` per tensor | the weights |
| ``experts`` | ``count, rows, mats: [[K, N, dtype], ...]`` | one batched ``einsum`` over ``W[count, K, N]`` (a grouped GEMM, ``rows`` rows per expert) | the routed experts' weights |
| ``attention`` | ``pairs: [[m, k, s, n], ...]``, ``shares_latent`` | per sequence ``q·Kᵀ``, ``exp``, ``·V`` over an ``s``-token bf16 cache | the KV cache |
| ``state`` | ``heads, dim`` | ``S' = 0.99 S + k vᵀ``, ``o = S' q`` on an f32 state | the state |
| ``topk`` | ``experts, k`` | ``lax.top_k`` over ``[batch, experts]`` | — |
| ``vector`` | ``cols: [...]`` | an RMS norm of a ``[batch, hidden]`` block scaled by each parameter row | the parameters |

Every op's input is scaled by a scalar ``carry`` reduced from the previous op's output, so the
ops run in order and none is dead code. Weights are random: the replay reproduces the
program's bytes, FLOPs and op count (its *cost*), not a model's values. ``dtype`` is
``bf16`` or ``f32`` (stored natively on every backend; the fp8 matmul is measured by
:mod:`calibration.gpu_bench.micro`, not replayed).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hwmodels.records.timing import sample_seconds

CARRY_SCALE = 1e-6  # keeps the carry ≈ 1 so values stay finite over thousands of ops
DTYPES = ("bf16", "f32")


def jnp_dtype(name: str) -> Any:
    """The JAX dtype of a description dtype name (ValueError for any other name)."""
    import jax.numpy as jnp

    table = {"bf16": jnp.bfloat16, "f32": jnp.float32}
    if name not in table:
        raise ValueError(f"dtype {name!r}: the replay stores only {', '.join(DTYPES)}")
    return table[name]


@dataclass
class ReplayStep:
    """A compiled replay: ``run()`` executes one step and waits for it."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    compile_s: float
    weight_bytes: int
    cache_bytes: int
    ops: int

    def run(self) -> None:
        import jax

        jax.block_until_ready(self.fn(*self.args))

    def time_steps(self, *, warmup: int = 2, repeats: int = 7) -> list[float]:
        """Wall seconds of ``repeats`` steps after ``warmup`` untimed ones (each step waited
        for: :meth:`run` blocks)."""
        return sample_seconds(lambda _i: self.run(), warmup=warmup, repeats=repeats)


@functools.cache
def _normal_fn(shape: tuple[int, ...], dtype: str, scale: float) -> Callable[[Any], Any]:
    """A jitted ``scale * N(0, 1)`` of ``shape`` in ``dtype``, one compile per distinct shape."""
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda key: (jax.random.normal(key, shape, jnp.float32) * scale).astype(jnp_dtype(dtype)))


class _Arrays:
    """Random weights, caches and inputs allocated for one description.

    On an accelerator values are drawn on the device (``jax.random``): a replay of
    Qwen3-30B-A3B at batch 32 allocates ≈ 53 GB of weights, minutes of host-side random
    numbers and transfers. On a CPU backend (CI sizes) numpy draws them, which avoids one
    compile per distinct shape.
    """

    def __init__(self, seed: int) -> None:
        import jax

        self.key = jax.random.PRNGKey(seed)
        self.rng = np.random.default_rng(seed)  # the small activation inputs
        self.weights: list[Any] = []
        self.caches: list[Any] = []
        self.inputs: dict[int, int] = {}  # width -> rows needed
        self.drawn = 0
        self.on_host = jax.default_backend() == "cpu"

    def _draw(self, shape: tuple[int, ...], dtype: str, scale: float) -> Any:
        import jax
        import jax.numpy as jnp

        self.drawn += 1
        if self.on_host:  # cast on the host: no per-shape compile for CI-sized arrays
            values = self.rng.standard_normal(shape, dtype=np.float32) * scale
            return jnp.asarray(values.astype(jnp_dtype(dtype)))
        return _normal_fn(tuple(shape), dtype, float(scale))(jax.random.fold_in(self.key, self.drawn))

    def weight(self, shape: tuple[int, ...], dtype: str) -> int:
        self.weights.append(self._draw(shape, dtype, 1.0 / np.sqrt(max(shape[-2], 1))))
        return len(self.weights) - 1

    def cache(self, shape: tuple[int, ...], dtype: str) -> int:
        self.caches.append(self._draw(shape, dtype, 0.1))
        return len(self.caches) - 1

    def need(self, width: int, rows: int) -> None:
        self.inputs[width] = max(rows, self.inputs.get(width, 0))


def _allocate(description: dict[str, Any], arrays: _Arrays) -> list[tuple[dict[str, Any], list[int]]]:
    batch, hidden = int(description["batch"]), int(description["hidden"])
    plans = []
    for op in description["ops"]:
        kind, ids = op["kind"], []
        if kind == "matmul":
            for rows, k, n, dtype in op["mats"]:
                ids.append(arrays.weight((k, n), dtype))
                arrays.need(k, rows)
        elif kind == "experts":
            for k, n, dtype in op["mats"]:
                ids.append(arrays.weight((op["count"], k, n), dtype))
                arrays.need(k, op["rows"])
        elif kind == "attention":
            for m, k, span, n in op["pairs"]:
                key = arrays.cache((batch, span, k), "bf16")
                value = key if op.get("shares_latent") else arrays.cache((batch, span, n), "bf16")
                ids += [key, value]
                arrays.need(k, m)
        elif kind == "state":
            ids.append(arrays.cache((batch, op["heads"], op["dim"], op["dim"]), "f32"))
            arrays.need(op["heads"] * op["dim"], batch)
        elif kind == "topk":
            arrays.need(op["experts"], batch)
        elif kind == "vector":
            ids = [arrays.weight((1, cols), "f32") for cols in op["cols"]]
            arrays.need(hidden, batch)
        else:
            raise ValueError(f"step description: unknown op kind {kind!r}")
        plans.append((op, ids))
    return plans


def _op_value(op: dict[str, Any], ids: list[int], weights: list[Any], caches: list[Any],
              xin: dict[int, Any], carry: Any, batch: int, hidden: int) -> tuple[Any, Any]:
    """One op's scalar summary (the next carry's source) and its new state, if any."""
    import jax
    import jax.numpy as jnp

    kind, total, state = op["kind"], jnp.float32(0.0), None
    if kind == "matmul":
        for index, (rows, k, _n, _dtype) in zip(ids, op["mats"], strict=True):
            w = weights[index]
            x = (xin[k][:rows] * carry).astype(w.dtype)
            total += jnp.sum(jnp.dot(x, w, preferred_element_type=jnp.float32))
    elif kind == "experts":
        for index, (k, _n, _dtype) in zip(ids, op["mats"], strict=True):
            w = weights[index]
            x = (xin[k][: op["rows"]] * carry).astype(w.dtype)
            xs = jnp.broadcast_to(x, (op["count"], *x.shape))
            total += jnp.sum(jnp.einsum("erk,ekn->ern", xs, w, preferred_element_type=jnp.float32))
    elif kind == "attention":
        for (keys, values), (m, k, _span, n) in zip(zip(ids[::2], ids[1::2], strict=True), op["pairs"], strict=True):
            group = max(1, m // batch)
            q = (xin[k][: group * batch] * carry).reshape(batch, group, k).astype(jnp.bfloat16)
            scores = jnp.einsum("bgk,bsk->bgs", q, caches[keys], preferred_element_type=jnp.float32)
            probs = jnp.exp(scores - scores.max(axis=-1, keepdims=True)).astype(jnp.bfloat16)
            out = jnp.einsum("bgs,bsn->bgn", probs, caches[values][..., :n], preferred_element_type=jnp.float32)
            total += jnp.sum(out)
    elif kind == "state":
        old = caches[ids[0]]
        heads, dim = old.shape[1], old.shape[2]
        kv = (xin[heads * dim][:batch] * carry).reshape(batch, heads, dim)
        state = 0.99 * old + kv[..., :, None] * kv[..., None, :]
        total = jnp.sum(jnp.einsum("bhij,bhj->bhi", state, kv))
    elif kind == "topk":
        values, _ = jax.lax.top_k(xin[op["experts"]][:batch] * carry, op["k"])
        total = jnp.sum(values)
    else:  # vector
        x = xin[hidden][:batch] * carry
        normed = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
        for index in ids:
            normed = normed * weights[index][0].sum()
        total = jnp.sum(normed)
    return total, state


def build_step(description: dict[str, Any], *, seed: int = 0) -> ReplayStep:
    """Allocate ``description``'s weights and caches and jit its replay (compiled here)."""
    import jax
    import jax.numpy as jnp

    arrays = _Arrays(seed)
    plans = _allocate(description, arrays)
    batch, hidden = int(description["batch"]), int(description["hidden"])
    xin = {width: jnp.asarray(arrays.rng.standard_normal((rows, width), dtype=np.float32))
           for width, rows in arrays.inputs.items()}

    def step(weights: list[Any], caches: list[Any], xin: dict[int, Any]) -> tuple[Any, list[Any]]:
        carry = jnp.float32(1.0)
        states = []
        for op, ids in plans:
            total, state = _op_value(op, ids, weights, caches, xin, carry, batch, hidden)
            if state is not None:
                states.append(state)
            carry = 1.0 + CARRY_SCALE * total
        return carry, states

    jitted = jax.jit(step)
    args = (arrays.weights, arrays.caches, xin)
    start = time.perf_counter()
    jax.block_until_ready(jitted(*args))
    return ReplayStep(
        fn=jitted, args=args, compile_s=time.perf_counter() - start,
        weight_bytes=int(sum(w.nbytes for w in arrays.weights)),
        cache_bytes=int(sum(c.nbytes for c in arrays.caches)), ops=len(plans),
    )
