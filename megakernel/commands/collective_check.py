"""Run the schedule-driven kernel with collectives on N virtual devices against the one-device
reference; print one JSON line.

``python -m megakernel.commands.collective_check --devices 8 [--model kimi-k3-nano] [--layers 4]
[--steps 1] [--schedule published|FILE] [--deployment-model kimi-k3] [--deployment-devices 32] [--seed 0] [--races] [--mode on_wait|eager] [--f32-payloads] [--bug skip_wait:NAME|single_buffer] [--expert-products pairs-fold|fp8-mxu]``

The process sets ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before JAX starts,
draws the one-device weights (:func:`megakernel.layout.random_weights`) and a decode state,
cuts every device's shard (:mod:`megakernel.decode_shards`, the multi-device decode's cut),
packs it into the kernel's HBM streams (:func:`megakernel.hbm.pack_hbm`; the output
projections in the panel order :func:`megakernel.kernel_collectives.pair_matmul` reads), and
runs :class:`megakernel.kernel_collectives.CollectiveMegakernel` in TPU interpret mode under
``shard_map`` (with :mod:`megakernel.interpret_callbacks`' workaround: its arenas and
streams are larger than the interpreter otherwise allocates), step by step beside the
one-device :mod:`megakernel.reference_jnp` fed its own greedy tokens. ``matches_reference``:
the same greedy tokens every step and the gathered logits within the bf16 tolerance of
:mod:`megakernel.tolerance` (the plan's payloads are bf16). Not a TPU timing. Run it under
``timeout``: a wrong semaphore hangs it.

A schedule file with a ``deployment`` (a joint sweep's ``best.json``: plan choice + per-collective
algorithms, searched for ``--deployment-model`` on ``--deployment-devices``) runs that
deployment: :func:`tpusim.workload.kernel_support.map_deployment` maps it onto ``--model`` and
``--devices`` (algorithms and attention TP kept, expert TP scaled by the device ratio, expert
groups the rest), and the JSON's ``deployment`` records the mapping (``null`` without one).
What cannot map or run (a generic plan's collectives, an algorithm the kernel does not run, a
split the nano model does not divide) is one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from megakernel.race_reports import as_json, capturing_races
from tpusim.cli_options import (
    KERNEL_MODEL_HELP,
    add_batch_option,
    add_context_option,
    add_deployment_options,
    add_model_option,
    add_schedule_option,
)
from tpusim.schedule.kernel_layout import LANES
from tpusim.workload.registry.names import KdaTensor, MlaTensor


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    add_model_option(parser, default="kimi-k3-nano", help=KERNEL_MODEL_HELP)
    parser.add_argument("--layers", type=int, default=4, help="0: all of the model's layers")
    parser.add_argument("--steps", type=int, default=1)
    add_batch_option(parser, default=1, type=int)
    add_schedule_option(parser, default="published",
                        help="built-in schedule or schedule JSON; a joint sweep's best.json carries a deployment "
                        "(plan + collective algorithms), mapped onto --model and --devices (map_deployment)")
    add_deployment_options(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plan", default="", help="--plan choice (a SPEC, e.g. base=published,expert_reduce=fused); default: the model's plan")
    add_context_option(parser, default=5, type=int)
    parser.add_argument("--races", action="store_true", help="race detector on (slower)")
    parser.add_argument("--mode", default="on_wait", choices=("on_wait", "eager"), help="interpreter DMA mode")
    parser.add_argument("--f32-payloads", action="store_true",
                        help="payloads in f32, not the plan's bf16 (numerics check: then the f32 tolerance applies)")
    parser.add_argument("--bug", default="", help="skip_wait:COLLECTIVE or single_buffer (planted races)")
    parser.add_argument("--expert-products", default=None, metavar="NAME",
                        help="how the routed experts are multiplied (megakernel.expert_products): pairs-fold, the "
                        "v5e/v6e decoders (default), or fp8-mxu, TPU7x's FP8 to the MXU (what lower_check --compile builds)")
    return parser.parse_args(argv)


def stored_projection(pair: object) -> object:
    """K3's pair-heads x hidden-half projection [n, 2w, C] -> the stored [n, w, 2C]: panel
    ``2p + a`` holds member ``a``'s rows of panel ``p`` (the rule ``pair_matmul`` reads)."""
    import numpy as np

    pair = np.asarray(pair)
    n, rows, cols = pair.shape
    w = rows // 2
    blocks = pair.reshape(n, 2, w, cols // LANES, LANES)  # [n, a, w, p, lane]
    return np.ascontiguousarray(blocks.transpose(0, 2, 3, 1, 4).reshape(n, w, 2 * cols))


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with the JSON line; 2 with one line on stderr for a schedule, deployment or plan
    the kernel cannot run."""
    args = parse(argv)
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"
    from hwmodels.errors import InputError
    from megakernel.collective_plan import UnsupportedPlan
    from megakernel.dims import UnsupportedModel
    from megakernel.dma_plan import UnsupportedSchedule

    try:
        result = run(args)
    except (InputError, UnsupportedPlan, UnsupportedModel, UnsupportedSchedule) as error:
        sys.stderr.write(f"error: {str(error).splitlines()[0]}\n")
        return 2
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


def kernel_plan(args: argparse.Namespace, model: object,
                schedule: object) -> tuple[object, object, dict[str, object] | None]:
    """(model, plan, mapping or None): the schedule's deployment mapped onto ``--model`` and
    ``--devices`` (:func:`tpusim.workload.kernel_support.kernel_deployment`: the model with its
    experts widened when the deployment's split needs it), else ``--model`` and its plan on
    ``--devices``; InputError (one line) for what cannot map or run."""
    from hwmodels.errors import InputError
    from tpusim.workload.kernel_support import (
        KernelDeploymentError,
        kernel_cannot_run,
        kernel_deployment,
    )
    from tpusim.workload.model_catalog import load_model, plan_for

    deployment = schedule.deployment  # type: ignore[attr-defined]
    if deployment is None:
        plan = plan_for(model, args.devices, choice=args.plan or None)  # type: ignore[arg-type]
        why = kernel_cannot_run(model, plan, args.batch)  # type: ignore[arg-type]
        if why:
            raise InputError(why)
        return model, plan, None
    if args.plan:
        raise InputError(f"--plan {args.plan}: --schedule {args.schedule} carries its own deployment (plan "
                         f"{deployment.plan}); give one or the other")
    try:
        mapped = kernel_deployment(deployment.plan, dict(deployment.collectives), load_model(args.deployment_model),
                                   args.deployment_devices, model, args.devices, args.batch)  # type: ignore[arg-type]
    except KernelDeploymentError as error:
        raise InputError(f"--schedule {args.schedule}: {error}") from None
    return mapped.model, mapped.plan, mapped.describe()


def run(args: argparse.Namespace) -> dict[str, object]:
    from tpusim.schedule.schema import load_schedule
    from tpusim.workload.model_catalog import load_model, plan_for

    model = load_model(args.model)
    schedule = load_schedule(args.schedule)
    model, plan, mapping = kernel_plan(args, model, schedule)  # refuses before JAX starts

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpret_impl
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from megakernel import reference_jnp
    from megakernel.decode_shards import cut_of, state_shard, weight_shard
    from megakernel.dims import model_dims
    from megakernel.expert_products import BY_NAME, DECODE
    from megakernel.hbm import pack_hbm
    from megakernel.interpret_callbacks import read_callback_args_in_place
    from megakernel.kernel_collectives import CollectiveMegakernel
    from megakernel.layout import Weights, random_weights
    from megakernel.multi_device import Bugs
    from megakernel.reference import DecodeState, first_tokens, init_state
    from megakernel.tolerance import TOLERANCE, relative_error

    if args.expert_products and args.expert_products not in BY_NAME:
        from hwmodels.errors import InputError

        raise InputError(f"--expert-products {args.expert_products}: one of {', '.join(BY_NAME)}")
    products = BY_NAME[args.expert_products] if args.expert_products else DECODE
    read_callback_args_in_place()
    np.random.seed(args.seed)  # the race detector's interleavings draw from numpy's global RNG
    if args.layers:
        model = model.with_layers(args.layers)
    params = pltpu.InterpretParams(detect_races=args.races, dma_execution_mode=args.mode, random_seed=args.seed)
    max_context = args.context + args.steps + 3
    kernel = CollectiveMegakernel(model, plan, schedule, args.batch, max_context,
                                  interpret=params, bugs=Bugs.parse(args.bug), f32_payloads=args.f32_payloads,
                                  expert_products=products)
    one, dev = model_dims(model, plan_for(model, 1)), kernel.dims
    weights = random_weights(one, seed=args.seed)
    state = init_state(one, args.batch, kernel.max_context, context=args.context, seed=args.seed + 1)
    hbm, states = [], []
    for rank in range(plan.devices):
        cut = cut_of(model, plan, rank)
        shard = weight_shard(weights.arrays, one, dev, cut)
        for name in (KdaTensor.OUT, MlaTensor.OUT):
            shard[name] = stored_projection(shard[name])
        hbm.append(pack_hbm(Weights(dev, shard), kernel.geo, kernel.expert_products))
        states.append(state_shard(*(np.asarray(a) for a in (state.kda_state, state.conv_state, state.kv_cache)),
                                  one, dev, cut))
    stacked = {name: jnp.asarray(np.stack([h[name] for h in hbm])) for name in hbm[0]}
    kda, conv, kv = (jnp.asarray(np.stack([s[i] for s in states])) for i in range(3))
    embedding = jnp.asarray(weights["embedding"])
    routes = jnp.asarray(kernel.routes())
    step = jax.jit(kernel.sharded_step())
    ref = reference_jnp.ReferenceStep(model, plan_for(model, 1), weights.arrays, one.small_offsets)
    ref_state = reference_jnp.RefState(state.kda_state, state.conv_state, state.kv_cache, state.position)
    tokens = ref_tokens = jnp.asarray(first_tokens(args.batch, model.vocab_size))
    # the state where the step leaves it (each device's shard on the mesh, the position
    # replicated): a first state placed otherwise makes the second step another compile of the
    # whole interpreted program (measured 2026-12-07, 2 steps on 8 devices with the race
    # detector: 47 s of CPU with that second compile, 35 s without)
    on_mesh, replicated = NamedSharding(kernel.mesh, P("x")), NamedSharding(kernel.mesh, P())
    dstate = DecodeState(*(jax.device_put(a, on_mesh) for a in (kda, conv, kv)),
                         jax.device_put(jnp.asarray(args.context, jnp.int32), replicated))
    out, races, reports = [], False, []
    for _ in range(args.steps):
        start = time.perf_counter()
        with capturing_races() as found:
            logits, dstate = step(stacked, embedding, dstate, tokens, routes)
            logits = np.asarray(logits)
        reports += found
        seconds = round(time.perf_counter() - start, 2)
        races = races or bool(interpret_impl.races.races_found)
        ref_logits, ref_state, _ = ref(ref_state, ref_tokens)
        want = np.asarray(ref_logits)
        tokens, ref_tokens = jnp.argmax(logits, -1).astype(jnp.int32), jnp.argmax(ref_logits, -1).astype(jnp.int32)
        out.append({"seconds": seconds, "logits_relative_error": relative_error(logits, want),
                    "tokens": np.asarray(tokens).tolist(), "reference_tokens": np.asarray(ref_tokens).tolist()})
    tol = TOLERANCE[np.dtype(np.float32 if args.f32_payloads else jnp.bfloat16)]
    ok = all(s["tokens"] == s["reference_tokens"] and s["logits_relative_error"] <= tol for s in out)
    return {"model": args.model, "plan": plan.name, "devices": plan.devices, "layers": model.num_layers,
            "expert_groups": plan.expert_groups, "expert_tp": plan.expert_tp,
            "collectives": {spec.name: spec.algorithm for spec in plan.collectives_at(args.batch)},
            "deployment": mapping, "schedule": args.schedule, "batch": args.batch, "seed": args.seed, "bug": args.bug,
            "payloads": "f32" if args.f32_payloads else "plan (bf16; router scores f32)", "races": races,
            "race_count": len(reports), "race_reports": as_json(reports[:20]),
            "expert_products": products.name,
            "race_detector": args.races, "matches_reference": ok, "steps": out, "backend": "cpu-interpret",
            "timing_note": "wall time of the Pallas TPU interpreter on virtual CPU devices (first step "
                           "includes the compile); NOT a TPU timing"}


if __name__ == "__main__":
    sys.exit(main())
