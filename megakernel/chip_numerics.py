"""Where the megakernel's logits leave the reference on a TPU: by depth, by step, next to yardsticks.

Its command line (a record per depth, or the verdicts on committed records):
:mod:`megakernel.commands.chip_numerics`.

The greedy check of :mod:`megakernel.runner` says *whether* kernel and reference agree over N
steps; when they do not, it cannot say why: each feeds back its own argmax, so one flipped
token makes everything after it differ. Here every program is **teacher-forced** with the
same tokens (the full-precision reference's greedy choices), so each step's difference is the
programs' own, and it is measured for the model cut to its first ``L`` layers
(``ModelSpec.with_layers``; 0 = all) to see whether it starts in one layer or grows with depth.
Per step, each relative to the largest logit of the reference at ``precision=highest`` on the
chip (:func:`megakernel.tolerance.relative_error`):

- ``kernel``: the megakernel on the chip;
- ``reference_default``: the same reference at XLA's default TPU precision (an f32 x f32 product
  as one bf16 pass): how far the model moves when only the f32 products are rounded, the
  yardstick for a kernel whose f32 products Mosaic may run the same way;
- ``reference_cpu``: the same reference on the host CPU (exact f32 products): whether the chip's
  ``highest`` is exact;
- ``kernel_kda_state``: the kernel's recurrent KDA state after the step against the reference's;
- ``kernel_token_equal``: the kernel's argmax equals the reference's (it is fed the reference's).

Labelled ``measured`` on the chip's kind (``derived`` numbers: errors, no timing).

**Verdict** (:func:`verdict`; the command's ``--verdicts FILE`` prints one per committed record,
exit 1 if any fails). Up to :data:`INDEPENDENT_DEPTH` layers, where rounding has not yet grown chaotic,
every step's kernel error must be within the independent-reference tolerance and every
teacher-forced token equal. Deeper, a random-weight model amplifies rounding chaotically: an
exact-f32 evaluation of the *same* reference on the host CPU already lands 10-60 % away from
the chip's reference. There the kernel passes when its median step error is no larger than
the largest ``reference_cpu`` error of the same record: it is no further from the chip's
reference than another correct evaluation of the same model is. A kernel bug (a wrong expert,
a stale buffer) puts every step far outside both (tests plant one).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from megakernel.hbm import pack_hbm
from megakernel.reference import decode_step, init_state
from megakernel.runner import (
    KERNEL_PRECISION,
    RunConfig,
    build_kernel,
    prepare,
    provenance,
    versions,
)
from megakernel.tolerance import F32, INDEPENDENT, REORDERED, TOLERANCES, relative_error


def reference_run(dims: Any, params: Any, state: Any, tokens: list[np.ndarray], precision: str,
                  device: Any = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The reference fed ``tokens`` (one array per step) at ``precision``, on ``device`` (None:
    the default one): each step's logits and KDA state (host arrays)."""
    jax.clear_caches()  # the jitted step must be traced again under this precision
    if device is not None:
        params, state = jax.device_put((params, state), device)
    logits_out, kda_out = [], []
    with jax.default_matmul_precision(precision):
        for step_tokens in tokens:
            fed = jnp.asarray(step_tokens) if device is None else jax.device_put(jnp.asarray(step_tokens), device)
            logits, state = decode_step(dims, params, state, fed)
            logits_out.append(np.asarray(logits, np.float32))
            kda_out.append(np.asarray(state.kda_state, np.float32))
    return logits_out, kda_out


def depth_record(config: RunConfig, backend: str) -> dict[str, Any]:
    """Teacher-forced kernel and reference variants for ``config`` (its ``layers``, ``check_steps``)."""
    prepared = prepare(config)
    dims, params = prepared.dims, prepared.params
    kernel = build_kernel(config, dims, backend)
    hbm = {name: jnp.asarray(value) for name, value in pack_hbm(prepared.weights, kernel.geo, kernel.expert_products).items()}
    state = init_state(dims, config.batch, kernel.max_context, context=config.context, seed=config.seed)
    first = np.random.default_rng(config.seed).integers(0, dims.vocab_rows, config.batch).astype(np.int32)
    # the reference's own greedy tokens at full precision are everyone's inputs
    tokens, ref_state = [first], state
    jax.clear_caches()
    ref_logits, ref_kda = [], []
    with jax.default_matmul_precision("highest"):
        for _ in range(config.check_steps):
            logits, ref_state = decode_step(dims, params, ref_state, jnp.asarray(tokens[-1]))
            ref_logits.append(np.asarray(logits, np.float32))
            ref_kda.append(np.asarray(ref_state.kda_state, np.float32))
            tokens.append(np.asarray(jnp.argmax(logits, -1), np.int32))
    tokens = tokens[:-1]
    with jax.default_matmul_precision(KERNEL_PRECISION):
        step = jax.jit(kernel.step).lower(hbm, params["embedding"], state, jnp.asarray(first)).compile()
    kernel_logits, kernel_kda, kernel_state = [], [], state
    for step_tokens in tokens:
        logits, kernel_state = step(hbm, params["embedding"], kernel_state, jnp.asarray(step_tokens))
        kernel_logits.append(np.asarray(logits, np.float32))
        kernel_kda.append(np.asarray(kernel_state.kda_state, np.float32))
    default_logits, _ = reference_run(dims, params, state, tokens, "default")
    cpu_logits, _ = reference_run(dims, params, state, tokens, "highest", jax.devices("cpu")[0])
    steps = []
    for i, want in enumerate(ref_logits):
        steps.append({"kernel": relative_error(kernel_logits[i], want),
                      "reference_default": relative_error(default_logits[i], want),
                      "reference_cpu": relative_error(cpu_logits[i], want),
                      "kernel_kda_state": relative_error(kernel_kda[i], ref_kda[i]),
                      "kernel_token_equal": bool(np.array_equal(kernel_logits[i].argmax(-1), want.argmax(-1)))})
    return {"model": config.model, "schedule": kernel.schedule.name, "batch": config.batch,
            "layers": dims.num_layers, "context": config.context, "seed": config.seed,
            "backend": jax.devices()[0].device_kind if backend == "tpu" else "cpu-interpret",
            "teacher_forced_steps": len(steps), "steps": steps,
            "tolerances": {"independent_f32": TOLERANCES[INDEPENDENT][F32], "reordered_f32": TOLERANCES[REORDERED][F32]},
            "label": "measured numerics (errors, not timings)", "provenance": provenance(), "versions": versions()}


INDEPENDENT_DEPTH = 16  # the independent tolerance's scope (megakernel.tolerance)


def verdict(record: dict[str, Any]) -> tuple[bool, str]:
    """Whether a :func:`depth_record` shows a correct kernel (module docstring), and why."""
    kernel = [s["kernel"] for s in record["steps"]]
    if not kernel:
        return False, "no teacher-forced steps"
    if record["layers"] <= INDEPENDENT_DEPTH:
        limit = TOLERANCES[INDEPENDENT][F32]
        tokens = all(s["kernel_token_equal"] for s in record["steps"])
        ok = max(kernel) <= limit and tokens
        return ok, (f"{record['layers']} layers: max kernel error {max(kernel):.2e} vs independent tolerance "
                    f"{limit:.0e}, tokens {'all equal' if tokens else 'DIFFER'}")
    spread = max(s["reference_cpu"] for s in record["steps"])
    middle = float(np.median(kernel))
    return middle <= spread, (f"{record['layers']} layers: median kernel error {middle:.2e} vs the largest "
                              f"exact-f32 (CPU) reference error {spread:.2e}")
