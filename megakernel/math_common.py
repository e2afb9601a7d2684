"""Small math shared by every phase of the reference and the kernel (pure jnp, lowerable).

Conventions: activations are f32 ``[B, n]`` (B = batch rows, one decode token per row);
matmuls take bf16 operands and accumulate in f32 (:func:`mm`), as the TPU MXU does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def mm(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x`` [B, K] (any float), ``w`` bf16[K, N] -> f32[B, N] (bf16 operands, f32 acc)."""
    return jnp.dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)


def mm_t(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x`` [B, N], ``w`` bf16[K, N] -> f32[B, K] = x @ w.T (contract the minor dims)."""
    return jax.lax.dot_general(
        x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), (((1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32)


def rmsnorm(x: jax.Array, weight: jax.Array | None, eps: float) -> jax.Array:
    """``x`` f32[..., n], ``weight`` f32[1, n] or None -> f32[..., n]."""
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * weight


def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """Normalise the last axis to unit length (KDA's q/k normalisation)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def situ(gate: jax.Array, up: jax.Array) -> jax.Array:
    """K3's "situ" activation ``4 tanh(g/4) sigmoid(g) * 25 tanh(v/25)`` (f32)."""
    return 4.0 * jnp.tanh(gate * 0.25) * jax.nn.sigmoid(gate) * (25.0 * jnp.tanh(up * 0.04))


def silu(x: jax.Array) -> jax.Array:
    return x * jax.nn.sigmoid(x)


def softplus(x: jax.Array) -> jax.Array:
    """Numerically safe softplus built from exp/log only (lowers on TPU)."""
    return jnp.maximum(x, 0.0) + jnp.log(1.0 + jnp.exp(-jnp.abs(x)))
