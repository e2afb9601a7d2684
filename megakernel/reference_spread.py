"""How far the one-device reference moves under one-ulp f32 noise: the yardstick for f32 checks.

Its command line: :mod:`megakernel.commands.reference_spread` (one JSON line).

Every matmul of the model (:mod:`megakernel.reference_jnp`, and the kernels) takes bf16
operands. A sharded kernel sums the same f32 products in another order (per-device partials
added in rank order), so its f32 values differ from the reference's by an ulp or so; almost
always the next bf16 cast absorbs that, and the two stay bit-identical. Rarely a value sits
within an ulp of a bf16 rounding boundary and rounds the other way: one element then moves by
2^-8 of itself, and the KDA recurrence and the residual mixture carry that through every later
layer. How much a deep random model amplifies such a flip is a property of the model and its
weights, not of any kernel, so it is measured here on the reference alone: the same greedy
decode (``--seed`` picks the weights and state as ``decode_check`` and ``collective_check``
do) is run once as is and ``--trials`` times with every entry of the input KDA state moved one
f32 ulp up or down at random (trial ``t``: ``numpy.random.default_rng(t)``). Per trial and step:
the logits' difference relative to the largest clean logit
(:func:`megakernel.tolerance.relative_error`), whether routing and the greedy tokens are equal.
A kernel whose f32-payload logits differ from the reference's by no more than this spread has
shown nothing beyond summation order. ``--max-context`` sets the KV cache length the state is
drawn for (0: ``context + steps + 3``, as ``decode_check``; the collective kernel rounds it up
to the schedule's KV tile, 128 for ``published``), because it changes the random state.
Reference-only, CPU, labelled ``derived`` (no kernel runs).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from megakernel import reference_jnp
from megakernel.dims import model_dims
from megakernel.layout import random_weights
from megakernel.reference import first_tokens, init_state
from megakernel.tolerance import relative_error
from tpusim.workload.model_catalog import plan_for
from tpusim.workload.modelconfig import ModelConfig


def nudge_one_ulp(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Every element of f32 ``values`` moved to its next f32 neighbour up or down (random)."""
    values = np.asarray(values, np.float32)
    direction = rng.choice(np.array([-np.inf, np.inf], np.float32), size=values.shape)
    return np.nextafter(values, direction).astype(np.float32)


def _decode(ref: reference_jnp.ReferenceStep, state: reference_jnp.RefState, tokens: np.ndarray,
            steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Greedy decode: per step (logits f32[B, V], routing i32[MoE layers, B, k])."""
    out, current = [], jnp.asarray(tokens)
    for _ in range(steps):
        logits, state, routing = ref(state, current)
        out.append((np.asarray(logits), np.asarray(routing)))
        current = jnp.argmax(logits, -1).astype(jnp.int32)
    return out


def spread(model: ModelConfig, *, trials: int, steps: int = 1, seed: int = 0, context: int = 5,
           max_context: int = 0, batch: int = 1) -> list[list[dict[str, object]]]:
    """Per trial, per step: ``logits_relative_error``, ``routing_equal``, ``tokens_equal``
    of the nudged decode against the clean one (see the module docstring)."""
    plan = plan_for(model, 1)
    dims = model_dims(model, plan)
    weights = random_weights(dims, seed=seed)
    state = init_state(dims, batch, max_context or context + steps + 3, context=context, seed=seed + 1)
    ref = reference_jnp.ReferenceStep(model, plan, weights.arrays, dims.small_offsets)
    tokens = first_tokens(batch, model.vocab_size)  # as the checkers start

    def run(kda: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        start = reference_jnp.RefState(jnp.asarray(kda), state.conv_state, state.kv_cache, state.position)
        return _decode(ref, start, tokens, steps)

    clean = run(np.asarray(state.kda_state))
    records = []
    for trial in range(trials):
        nudged = run(nudge_one_ulp(np.asarray(state.kda_state), np.random.default_rng(trial)))
        records.append([{"logits_relative_error": relative_error(got, want),
                         "routing_equal": bool(np.array_equal(got_routes, want_routes)),
                         "tokens_equal": bool(np.array_equal(got.argmax(-1), want.argmax(-1)))}
                        for (got, got_routes), (want, want_routes) in zip(nudged, clean, strict=True)])
    return records
