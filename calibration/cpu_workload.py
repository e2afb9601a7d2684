"""A jitted per-op replay of a :class:`~tpusim.workload.program.Program` on the JAX CPU backend.

The CPU closed loop needs a real decode step whose bytes, FLOPs and op count are exactly
the ones the simulator prices. :func:`build_cpu_step` walks the program op by op and emits,
for each op, JAX code with the program's shapes (one XLA kernel or a few per op; the whole
step is one ``jax.jit`` executable, as a served model is):

| program op | replayed as | bytes read |
| --- | --- | --- |
| weight matmul ``(rows, K, N)`` on tensor ``W[K, N]`` | ``x[rows, K] @ W`` (bf16 or f32 as the tensor's format) | the tensor |
| attention core, pairs ``(m, k, s), (m, s, n)`` | per sequence: ``q[g, k] · K[s, k]ᵀ``, ``exp``, ``· V[s, n]`` with ``K``/``V`` caches of ``s`` tokens (MLA: ``V`` is the first ``n`` latent columns of ``K``) | the KV cache |
| KDA core (recurrent state) | ``S' = 0.99 S + k vᵀ``, ``o = S' q`` on an f32 ``[batch, heads, d, d]`` state | state in and out |
| vector op (norms, combine) | an RMS norm of a ``[batch, hidden]`` row block | its small parameters |
| ``moe.topk`` | ``lax.top_k`` over ``[batch, experts]`` scores | — |

Every op's input is scaled by a scalar ``carry`` reduced from the previous op's output, so
the ops run in program order (XLA's CPU runtime would otherwise run independent ops
concurrently) and nothing is dead code. The numerics are not a model's (weights are random,
activations are fresh inputs): the replay reproduces the *cost* of the program, not its
values. Routed experts are the program's (the routing draw is baked in), and only those
experts' weights are allocated.

Weight formats must be ones the CPU stores natively (``bf16``, ``f32``);
``resolve_model("...[formats=bf16]")`` rewrites a model's formats to bf16 for this.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpusim.workload.program import Op, Program

NATIVE_DTYPES = ("bf16", "f32")
CARRY_SCALE = 1e-6  # keeps the carry ≈ 1 so values stay finite over thousands of ops


def _dtype(format_name: str) -> Any:
    import jax.numpy as jnp

    if format_name not in NATIVE_DTYPES:
        raise ValueError(
            f"weight format {format_name!r} has no native CPU dtype; use a model with "
            "[formats=bf16] for the CPU loop"
        )
    return jnp.bfloat16 if format_name == "bf16" else jnp.float32


@dataclass
class CpuStep:
    """A compiled per-op replay: ``run()`` executes one step and waits for it."""

    program: Program
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    compile_s: float
    weight_bytes: int
    cache_bytes: int

    def run(self) -> None:
        import jax

        jax.block_until_ready(self.fn(*self.args))

    def time_steps(self, *, warmup: int = 2, repeats: int = 7) -> list[float]:
        """Wall seconds of ``repeats`` steps after ``warmup`` untimed ones."""
        for _ in range(warmup):
            self.run()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            self.run()
            samples.append(time.perf_counter() - start)
        return samples


def _pairs(op: Op) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    matmuls = list(op.matmuls)
    return [(matmuls[i], matmuls[i + 1]) for i in range(0, len(matmuls) - 1, 2)]


def build_cpu_step(program: Program, *, seed: int = 0) -> CpuStep:
    """Allocate the program's weights and caches and jit its per-op replay."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    batch = program.batch
    weights: list[Any] = []
    caches: list[Any] = []
    inputs: dict[int, Any] = {}

    def weight(rows: int, cols: int, dtype: Any) -> int:
        scale = 1.0 / np.sqrt(max(rows, 1))
        weights.append(jnp.asarray(rng.standard_normal((rows, cols), dtype=np.float32) * scale, dtype=dtype))
        return len(weights) - 1

    def cache(shape: tuple[int, ...], dtype: Any) -> int:
        caches.append(jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * 0.1, dtype=dtype))
        return len(caches) - 1

    def input_width(width: int, rows: int = batch) -> None:
        current = inputs.get(width)
        if current is None or current < rows:
            inputs[width] = rows

    plans: list[tuple[str, Op, list[int]]] = []
    hidden = program.model.hidden_size
    for op in program.ops:
        if op.name == "moe.topk":
            input_width(program.model.moe.num_experts)
            plans.append(("topk", op, []))
        elif op.name == "kda.core":
            kda = program.model.kda
            assert kda is not None
            heads = program.plan.attention_heads_per_device
            plans.append(("state", op, [cache((batch, heads, kda.head_dim, kda.head_dim), jnp.float32)]))
            input_width(heads * kda.head_dim)
        elif op.unit == "mxu" and op.tensors:
            ids = []
            for tensor, (rows, k, n) in zip(op.tensors, op.matmuls, strict=True):
                ids.append(weight(k, n, _dtype(tensor.format_name)))
                input_width(k, rows)
            plans.append(("matmul", op, ids))
        elif op.unit == "mxu":  # attention core over the KV cache
            ids = []
            shares_latent = op.name.startswith("mla")
            for (m, k, span), (_, _, n) in _pairs(op):
                key = cache((batch, span, k), jnp.bfloat16)
                value = key if shares_latent else cache((batch, span, n), jnp.bfloat16)
                ids += [key, value]
                input_width(k, m)
            plans.append(("attention", op, ids))
        else:
            ids = [weight(1, t.cols, _dtype(t.format_name)) for t in op.tensors]
            input_width(hidden)
            plans.append(("vector", op, ids))
    xin = {width: jnp.asarray(rng.standard_normal((rows, width), dtype=np.float32)) for width, rows in inputs.items()}

    def step(weights: list[Any], caches: list[Any], xin: dict[int, Any]) -> tuple[Any, list[Any]]:
        carry = jnp.float32(1.0)
        new_states = []
        for kind, op, ids in plans:
            if kind == "matmul":
                total = jnp.float32(0.0)
                for index, (rows, k, _) in zip(ids, op.matmuls, strict=True):
                    w = weights[index]
                    x = (xin[k][:rows] * carry).astype(w.dtype)
                    total += jnp.sum(jnp.dot(x, w, preferred_element_type=jnp.float32))
                carry = 1.0 + CARRY_SCALE * total
            elif kind == "attention":
                total = jnp.float32(0.0)
                for (keys, values), ((m, k, _), (_, _, n)) in zip(zip(ids[::2], ids[1::2], strict=True), _pairs(op), strict=True):
                    group = max(1, m // batch)
                    q = (xin[k][: group * batch] * carry).reshape(batch, group, k).astype(jnp.bfloat16)
                    scores = jnp.einsum("bgk,bsk->bgs", q, caches[keys], preferred_element_type=jnp.float32)
                    probs = jnp.exp(scores - scores.max(axis=-1, keepdims=True)).astype(jnp.bfloat16)
                    cache_v = caches[values][..., :n]
                    out = jnp.einsum("bgs,bsn->bgn", probs, cache_v, preferred_element_type=jnp.float32)
                    total += jnp.sum(out)
                carry = 1.0 + CARRY_SCALE * total
            elif kind == "state":
                state = caches[ids[0]]
                heads, dim = state.shape[1], state.shape[2]
                kv = (xin[heads * dim][:batch] * carry).reshape(batch, heads, dim)
                updated = 0.99 * state + kv[..., :, None] * kv[..., None, :]
                out = jnp.einsum("bhij,bhj->bhi", updated, kv)
                new_states.append(updated)
                carry = 1.0 + CARRY_SCALE * jnp.sum(out)
            elif kind == "topk":
                experts = program.model.moe.num_experts
                values, _ = jax.lax.top_k(xin[experts][:batch] * carry, program.model.moe.top_k)
                carry = 1.0 + CARRY_SCALE * jnp.sum(values)
            else:
                x = xin[hidden][:batch] * carry
                normed = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
                for index in ids:
                    w = weights[index].astype(jnp.float32)[0]
                    normed = normed * w[: normed.shape[-1]].sum()
                carry = 1.0 + CARRY_SCALE * jnp.sum(normed)
        return carry, new_states

    jitted = jax.jit(step)
    args = (weights, caches, xin)
    start = time.perf_counter()
    jax.block_until_ready(jitted(*args))
    compile_s = time.perf_counter() - start
    return CpuStep(
        program=program, fn=jitted, args=args, compile_s=compile_s,
        weight_bytes=int(sum(w.nbytes for w in weights)),
        cache_bytes=int(sum(c.nbytes for c in caches)),
    )


def median_and_spread(samples: list[float]) -> tuple[float, float]:
    """Median and half the inter-quartile range of ``samples``."""
    if len(samples) < 2:
        return samples[0], 0.0
    quartiles = statistics.quantiles(samples, n=4, method="inclusive")
    return statistics.median(samples), (quartiles[2] - quartiles[0]) / 2.0
