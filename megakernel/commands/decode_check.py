"""Run the multi-device K3 decode against the single-device reference; print one JSON line.

``python -m megakernel.commands.decode_check --devices 8 [--layers N] [--steps 4] [--seed S] [--plan SPEC]
[--mode eager|on_wait] [--bug skip_wait:NAME|single_buffer] [--no-races]``

The process sets ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before JAX starts,
draws the full one-device weights (:func:`megakernel.layout.random_weights`, ``--seed``)
and a decode state after a prefill, shards both per the plan
(:mod:`megakernel.decode_shards`), and runs ``--steps`` greedy decode steps of
:class:`megakernel.multi_device_decode.DecodeKernel` in TPU interpret mode (race detector
on unless ``--no-races``), each beside a step of the independent plain-jnp reference
(:mod:`megakernel.reference_jnp`) fed its own greedy tokens. Output: ``steps`` (per step:
seconds, logits relative error, tokens equal), ``races``, ``matches_reference``,
``log_matches_plan`` and per-device ``records`` (``matches_reference``: same greedy tokens
every step and the device's vocabulary rows of the logits within :mod:`megakernel.tolerance`'s
bf16 tolerance, error relative to the largest reference logit: every sublayer output crosses
devices as bf16, the plan's payload bytes, where the one-device reference adds it in f32;
each step also says whether the f32 tolerance held, the largest difference of device 0's router
keys from the reference's (``router_key_deviation``), and lists ``routing_flips``: rows whose
chosen experts differ from the reference's, each classified by :mod:`megakernel.decode_ties`;
``matches_reference_up_to_near_ties`` is that module's labelled rule). An unsupported
plan exits 1 with one line on stderr. A wrong semaphore can hang the interpreter: run it under a
timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING

from megakernel.race_reports import as_json, capturing_races
from tpusim.cli_options import (
    BATCH_HELP,
    KERNEL_MODEL_HELP,
    add_batch_option,
    add_context_option,
    add_model_option,
)

if TYPE_CHECKING:  # JAX is imported only after XLA_FLAGS is set (main)
    import numpy as np

    from megakernel.multi_device_decode import DecodeKernel


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    add_model_option(parser, default="kimi-k3-nano", help=KERNEL_MODEL_HELP)
    parser.add_argument("--layers", type=int, default=0, help="0: all of the model's layers")
    parser.add_argument("--steps", type=int, default=4)
    add_batch_option(parser, default=1, type=int, help=f"{BATCH_HELP} (batch >= 6: the reduce-scatter variant)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plan", default="", help="--plan choice (a SPEC, e.g. base=published,expert_reduce=fused); default: the model's plan")
    add_context_option(parser, default=5, type=int)
    parser.add_argument("--mode", default="on_wait", choices=("on_wait", "eager"))
    parser.add_argument("--no-races", action="store_true", help="race detector off (faster)")
    parser.add_argument("--f32-payloads", action="store_true",
                        help="payloads in f32, not the plan's bf16 (numerics check: then the f32 tolerance applies)")
    parser.add_argument("--bug", default="", help="skip_wait:COLLECTIVE or single_buffer (planted races)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"
    import numpy as np

    np.random.seed(args.seed)  # the race detector's interleavings draw from numpy's global RNG
    result = run(args)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


def run(args: argparse.Namespace) -> dict[str, object]:
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpret_impl
    from jax.experimental.pallas import tpu as pltpu

    from megakernel import reference_jnp
    from megakernel.collective_plan import UnsupportedPlan
    from megakernel.decode_ties import NEAR_TIE_RULE, matches_up_to_near_ties
    from megakernel.layout import random_weights
    from megakernel.multi_device import Bugs
    from megakernel.multi_device_decode import DecodeKernel
    from megakernel.reference import first_tokens, init_state
    from megakernel.tolerance import TOLERANCE, relative_error, within_rounding
    from tpusim.workload.model_catalog import load_model, plan_for

    model = load_model(args.model)
    plan = plan_for(model, args.devices, choice=args.plan or None)
    if args.layers:
        model = model.with_layers(args.layers)
    bugs = Bugs.parse(args.bug)
    params = pltpu.InterpretParams(detect_races=not args.no_races, vector_clock_size=256,
                                   dma_execution_mode=args.mode, random_seed=args.seed)
    max_context = args.context + args.steps + 3
    try:
        kernel = DecodeKernel(model, plan, args.batch, max_context, interpret=params, bugs=bugs,
                              f32_payloads=args.f32_payloads)
    except UnsupportedPlan as error:
        raise SystemExit(f"plan {plan.name}: {error}") from None
    one = kernel.one
    weights = random_weights(one, seed=args.seed)
    state = init_state(one, args.batch, max_context, context=args.context, seed=args.seed + 1)
    ref = reference_jnp.ReferenceStep(model, plan_for(model, 1), weights.arrays, one.small_offsets)
    ref_state = reference_jnp.RefState(state.kda_state, state.conv_state, state.kv_cache, state.position)
    embedding = np.asarray(weights["embedding"], np.float32)
    payload_dtype = np.float32 if args.f32_payloads else ml_dtypes.bfloat16
    tokens = ref_tokens = first_tokens(args.batch, model.vocab_size)
    inputs = kernel.device_inputs(weights.arrays, tuple(np.asarray(a) for a in (state.kda_state, state.conv_state, state.kv_cache)),
                                  embedding[tokens], args.context)
    steps, races, logs, errors, reports = [], False, None, np.zeros(plan.devices), []
    rows = kernel.dims.vocab_rows
    for step in range(args.steps):
        inputs["x0"] = np.broadcast_to(embedding[tokens], inputs["x0"].shape).copy()
        inputs["position"] = np.full_like(inputs["position"], args.context + step)
        start = time.perf_counter()
        with capturing_races() as found:
            logits, states, log, routing, keys = kernel.run(inputs)
        reports += found
        seconds = round(time.perf_counter() - start, 2)
        races = races or bool(interpret_impl.races.races_found)  # read before the next call resets it
        logs = log if logs is None else logs
        inputs.update(states)
        ref_logits, ref_state, ref_routing = ref(ref_state, jnp.asarray(ref_tokens))
        want = np.asarray(ref_logits)
        scale = max(float(np.abs(want).max()), 1e-6)
        for rank in range(plan.devices):  # each device's vocabulary rows, against the reference's
            cols = slice(rank * rows, (rank + 1) * rows)
            errors[rank] = max(errors[rank], float(np.abs(logits[:, cols] - want[:, cols]).max()) / scale)
        tokens = np.argmax(logits, -1).astype(np.int32)
        ref_tokens = np.asarray(jnp.argmax(ref_logits, -1), np.int32)
        steps.append({"seconds": seconds, "logits_relative_error": relative_error(logits, want),
                      "within_tolerance": within_rounding(logits, want, rounded_to=payload_dtype),
                      "within_f32_tolerance": within_rounding(logits, want),
                      "tokens": tokens.tolist(), "reference_tokens": ref_tokens.tolist(),
                      "tokens_equal": bool(np.array_equal(tokens, ref_tokens)),
                      **_routing_record(routing, keys, np.asarray(ref_routing), np.asarray(ref.router_keys),
                                        payload_dtype)})
    tol = TOLERANCE[np.dtype(payload_dtype)]  # the payloads' dtype: see megakernel.tolerance
    records = _records(kernel, logs, errors, all(s["tokens_equal"] for s in steps), tol)
    ok = all(r["matches_reference"] for r in records)
    return {"model": args.model, "plan": plan.name, "devices": plan.devices, "layers": model.num_layers,
            "batch": args.batch, "payloads": "f32" if args.f32_payloads else "plan (bf16; router scores f32)",
            "algorithms": {c.name: c.algorithm for c in kernel.colls},
            "seed": args.seed, "backend": "cpu-interpret", "races": races, "matches_reference": ok,
            "race_count": len(reports), "race_reports": as_json(reports[:20]),
            "log_matches_plan": all(r["log_matches_plan"] for r in records), "steps": steps,
            "matches_reference_up_to_near_ties": matches_up_to_near_ties(steps), "near_tie_rule": NEAR_TIE_RULE,
            "reference": "megakernel.reference_jnp on one device (full weights); logits gathered over devices",
            "timing_note": "wall time of the Pallas TPU interpreter on virtual CPU devices (the first step "
                           "includes the compile); NOT a TPU timing",
            "records": records}


def _records(kernel: DecodeKernel, logs: np.ndarray, errors: np.ndarray, tokens_ok: bool,
             tolerance: float) -> list[dict[str, object]]:
    """Per device: ``matches_reference`` (tokens every step and its vocabulary rows within
    ``tolerance``), whether its recorded log (``logs`` i32[ranks, events, 5]) equals the
    plan's, its logits error (``errors`` f64[ranks])."""
    from megakernel.multi_device import planned_log

    records = []
    for rank in range(kernel.plan.devices):
        recorded = [tuple(int(v) for v in row) for row in logs[rank] if row[0] >= 0]
        records.append({"rank": rank, "matches_reference": bool(tokens_ok and errors[rank] <= tolerance),
                        "log_matches_plan": recorded == planned_log(kernel, rank),
                        "logits_relative_error": float(errors[rank])})
    return records


def _routing_record(routing: np.ndarray, keys: np.ndarray, ref_routing: np.ndarray, ref_keys: np.ndarray,
                    payload_dtype: object) -> dict[str, object]:
    """One step's routing against the reference's: ``routing`` i32[ranks, MoE layers, B, k],
    ``keys`` f32[ranks, MoE layers, B, E] (every device's), the reference's without ``ranks``."""
    import numpy as np

    from megakernel.decode_ties import routing_flips

    return {"routing_same_on_every_device": bool((routing == routing[:1]).all()),
            "routing_differs_in_layers": [layer + 1 for layer in range(routing.shape[1])
                                          if not np.array_equal(routing[0, layer], ref_routing[layer])],
            "routing_flips": routing_flips(routing[0], keys[0], ref_routing, ref_keys, payload_dtype),
            "router_key_deviation": float(np.abs(keys[0] - ref_keys).max())}


if __name__ == "__main__":
    sys.exit(main())
