"""The kernel's panel-loop knobs (``panel_unroll``, ``expert_panel_unroll``: panels per
iteration of the streamed tensors' and the routed experts' panel loops) change the schedule
the compiler may make, not the arithmetic: the same step, bit for bit, in interpret mode (on
nano the routed experts' panel loops run unrolled; its dense tensors are small enough to be
multiplied unlooped, so the dense knob is checked on the chip: K3's runs with it are checked
against the reference there); and a run's record names the knobs it moved
(``kernel_variant``) so it is never read as the kernel's."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from megakernel.dims import model_dims
from megakernel.hbm import pack_hbm
from megakernel.kernel import Megakernel
from megakernel.layout import random_weights
from megakernel.reference import device_params, init_state
from megakernel.runner import RunConfig
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for


def _step(dims, weights, params, tokens, **knobs):
    kernel = Megakernel(dims, load_schedule("published"), 1, 32, interpret=pltpu.InterpretParams(), **knobs)
    state = init_state(dims, 1, kernel.max_context, context=5, seed=1)
    hbm = {name: jnp.asarray(v) for name, v in pack_hbm(weights, kernel.geo).items()}
    logits, _ = kernel.jitted_step(hbm, params["embedding"], state, tokens)
    return np.asarray(logits)


@pytest.mark.heavy  # two interpret-mode steps (~25 s); the default run's kernel tests run the unrolled default
def test_unrolled_panel_loops_compute_the_same_step():
    model = load_model("kimi-k3-nano").with_layers(4)
    dims = model_dims(model, plan_for(model, 1))
    weights = random_weights(dims, seed=0)
    params = device_params(weights)
    tokens = jnp.asarray([7], jnp.int32)
    plain = _step(dims, weights, params, tokens)
    unrolled = _step(dims, weights, params, tokens, panel_unroll=3, expert_panel_unroll=2)
    np.testing.assert_array_equal(unrolled, plain)


def test_a_variant_run_says_which_knobs_it_moved():
    assert RunConfig().kernel_variant() is None
    assert RunConfig(panel_unroll=2).kernel_variant() == {"panel_unroll": 2}
    with pytest.raises(ValueError, match="panel unroll"):
        model = load_model("kimi-k3-nano").with_layers(4)
        Megakernel(model_dims(model, plan_for(model, 1)), load_schedule("published"), 1, 32, panel_unroll=0)
