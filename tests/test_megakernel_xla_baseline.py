"""The plain-JAX/XLA baseline (:mod:`megakernel.xla_baseline`): it reads only the chosen
experts, yet computes the reference's step (the reference runs every expert densely), at a
batch where rows share experts and at one where they do not; and its distinct-expert order is
first appearance (the order the kernel and the reference sum in)."""

from __future__ import annotations

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


@pytest.mark.parametrize("batch", [3])
@pytest.mark.slow  # XLA compiles of a 4-layer decode, reference and baseline (~20-45 s)
def test_xla_baseline_computes_the_reference_step(batch):
    model = load_model("kimi-k3-nano").with_layers(4)
    dims = model_dims(model, plan_for(model, 1))
    params = device_params(random_weights(dims, seed=0))
    state = init_state(dims, batch, 32, context=9, seed=1)
    tokens = jnp.arange(batch, dtype=jnp.int32) * 7 + 3
    want, want_state = decode_step(dims, params, state, tokens)
    got, got_state = xla_decode_step(dims, params, state, tokens)
    scale = float(jnp.max(jnp.abs(want)))
    assert float(jnp.max(jnp.abs(got - want))) <= 1e-3 * scale
    np.testing.assert_array_equal(np.argmax(got, -1), np.argmax(want, -1))
    assert float(jnp.max(jnp.abs(got_state.kv_cache.astype(jnp.float32) - want_state.kv_cache.astype(jnp.float32)))) <= 2e-2
