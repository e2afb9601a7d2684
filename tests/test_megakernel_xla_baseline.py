"""The plain-JAX/XLA baseline (:mod:`megakernel.xla_baseline`): it reads only the chosen
experts, yet computes the reference's step (the reference runs every expert densely) at batch 3
on 4 nano layers; its expert cap drops routed experts as it says; and its distinct-expert order
is first appearance (the order the kernel and the reference sum in)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from megakernel.dims import model_dims
from megakernel.layout import random_weights
from megakernel.reference import decode_step, device_params, init_state
from megakernel.xla_baseline import distinct_in_order, xla_decode_step
from tpusim.workload.model_catalog import load_model, plan_for


def test_distinct_in_order_keeps_first_appearances():
    chosen, count = distinct_in_order(jnp.asarray([5, 2, 5, 7, 2, 0], jnp.int32))
    assert int(count) == 4
    np.testing.assert_array_equal(np.asarray(chosen)[:4], [5, 2, 7, 0])


BATCH = 3  # rows 0-2 with tokens 3, 10, 17


@pytest.fixture(scope="module")
def step():
    """One 4-layer nano step's inputs and the uncapped baseline's output, shared by both checks
    (each distinct cap or batch is another XLA compile of the 4-layer decode)."""
    model = load_model("kimi-k3-nano").with_layers(4)
    dims = model_dims(model, plan_for(model, 1))
    params = device_params(random_weights(dims, seed=0))
    state = init_state(dims, BATCH, 32, context=9, seed=1)
    tokens = jnp.arange(BATCH, dtype=jnp.int32) * 7 + 3
    return dims, params, state, tokens, xla_decode_step(dims, params, state, tokens)


@pytest.mark.slow  # XLA compiles of a 4-layer decode, reference and baseline (~20-45 s)
def test_xla_baseline_computes_the_reference_step(step):
    dims, params, state, tokens, (got, got_state) = step
    want, want_state = decode_step(dims, params, state, tokens)
    scale = float(jnp.max(jnp.abs(want)))
    assert float(jnp.max(jnp.abs(got - want))) <= 1e-3 * scale
    np.testing.assert_array_equal(np.argmax(got, -1), np.argmax(want, -1))
    assert float(jnp.max(jnp.abs(got_state.kv_cache.astype(jnp.float32) - want_state.kv_cache.astype(jnp.float32)))) <= 2e-2


def _assert_caps(step, capped) -> None:  # type: ignore[no-untyped-def]
    dims, params, state, tokens, (full, _) = step
    above, _ = capped(10_000)
    np.testing.assert_array_equal(np.asarray(above), np.asarray(full))
    zeroed = {**params, "expert.gate_up.values": jnp.zeros_like(params["expert.gate_up.values"])}
    want, _ = xla_decode_step(dims, zeroed, state, tokens)
    got, _ = capped(0)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-6)
    assert float(jnp.max(jnp.abs(got - full))) > 1e-3 * float(jnp.max(jnp.abs(full)))


@pytest.mark.slow  # one more XLA compile of the 4-layer decode (both caps)
def test_xla_expert_cap_zero_is_the_step_without_routed_experts(step):
    """Cap 0 runs no routed expert: the same step as one whose routed experts' FP8 values
    are all zero (each decodes to 0, so its output is 0); a cap above every layer's distinct
    experts is the uncapped step, bit for bit. Both caps through one compile: the same function
    jitted with the cap traced (``xla_decode_step`` makes it static, a compile per cap; that
    program runs under ``-m heavy``, below; suite time: each compile ~7 s of CPU)."""
    dims, params, state, tokens, _ = step
    traced_cap = jax.jit(xla_decode_step.__wrapped__, static_argnums=0)
    _assert_caps(step, lambda cap: traced_cap(dims, params, state, tokens, jnp.int32(cap)))


@pytest.mark.heavy
def test_xla_expert_cap_zero_is_the_step_without_routed_experts_with_static_caps(step):
    """The same checks through ``xla_decode_step``'s own static caps (as ``xla_run`` compiles them)."""
    dims, params, state, tokens, _ = step
    _assert_caps(step, lambda cap: xla_decode_step(dims, params, state, tokens, cap))


def test_capped_bytes_keep_the_first_experts_of_each_layer():
    from megakernel.xla_run import capped_bytes

    record = {"hbm_bytes_per_step": 1_000 + 6 * 50, "experts_per_layer": [4, 1, 1],
              "hbm_bytes_by_kind": {"weights": 1_000, "routed_experts": 6 * 50}}
    assert capped_bytes(record, 0) == 1_000
    assert capped_bytes(record, 2) == 1_000 + (2 + 1 + 1) * 50
    assert capped_bytes(record, 9) == record["hbm_bytes_per_step"]
