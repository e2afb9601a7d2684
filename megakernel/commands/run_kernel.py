"""``tpusim run-kernel``: run the Pallas megakernel and append a measurement record.

Usage::

    tpusim run-kernel --model kimi-k3-mini --schedule published --batch 1 --steps 2 \\
        --out measurements.jsonl
    tpusim run-kernel --schedule my-sweep-best.json --backend interpret --steps 1
    tpusim run-kernel --devices 8 --layers 4 --steps 1 --schedule joint-sweep/best.json

On a TPU (``--backend auto`` finds it) the steps are timed natively after a warm-up. On a
CPU the kernel runs in Pallas TPU interpret mode, is checked against the pure-JAX
reference, and the record says ``backend: cpu-interpret`` with a note that the time is the
interpreter's, not a TPU's. Records are appended, never rewritten (see
:mod:`megakernel.runner`).

With ``--devices N`` it runs the schedule-driven collective megakernel
(:mod:`megakernel.commands.collective_check`: ``kimi-k3-nano`` by default, N virtual devices, TPU
interpret mode, race detector on) against the one-device reference and prints its tokens,
logits error and races (exit 1 when it does not match or races). A schedule with a
deployment runs that plan and those collective algorithms, mapped from the size it was
searched on (``--deployment-model``, ``--deployment-devices``) by
:func:`tpusim.workload.kernel_support.map_deployment`; what cannot map is one line, exit 2.
The older per-op multi-device decode (``python -m megakernel.commands.decode_check``) is no longer
behind this command; its module and tests remain (it is the collective kernel's copy logic).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hwmodels.errors import InputError
from tpusim.app.cli.common import jsonl_file
from tpusim.cli_options import (
    SCHEDULE_HELP,
    add_batch_option,
    add_context_option,
    add_deployment_options,
    add_model_option,
    add_schedule_option,
    nonnegative_int,
    positive_int,
    seed_value,
)

SINGLE_DEVICE_MODEL = "kimi-k3-mini"
MULTI_DEVICE_MODEL = "kimi-k3-nano"
GB = 1e9


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "run-kernel",
        help="run the megakernel for N decode steps and record the timing",
        description="Run the Pallas megakernel (TPU natively, or TPU interpret mode on a CPU), check it "
        "against the reference and append a measurement record.",
    )
    add_model_option(parser,
                     help=f"model name (default {SINGLE_DEVICE_MODEL}; with --devices N: {MULTI_DEVICE_MODEL})")
    add_schedule_option(parser, help=f"{SCHEDULE_HELP} (required with one device)")
    add_batch_option(parser)
    parser.add_argument("--steps", type=positive_int, default=2, help="timed decode steps (default 2)")
    add_context_option(parser, default=16)
    parser.add_argument("--backend", choices=("auto", "tpu", "interpret"), default="auto",
                        help="auto: a TPU if JAX sees one, else TPU interpret mode on the CPU; tpu: "
                        "fail without a TPU; interpret: the CPU interpreter (a check, not a TPU time)")
    parser.add_argument("--weights", type=Path, help="folder of safetensors weights (default: seeded random)")
    parser.add_argument("--seed", type=seed_value, default=0, help="weights, state and first tokens (default 0)")
    parser.add_argument("--label", default="measured", help="record label (default measured)")
    parser.add_argument("--out", type=jsonl_file, default=Path("measurements.jsonl"), help="JSON-lines file to append to")
    parser.add_argument("--devices", type=positive_int, default=1,
                        help="N > 1: run the schedule-driven collective megakernel on N virtual devices (interpret "
                        "mode, race detector on, a fresh process), --steps greedy steps against the one-device "
                        "reference; a --schedule with a deployment (a joint sweep's best.json) runs its plan and "
                        "collective algorithms, mapped onto --model and N (default 1: the single-device kernel)")
    parser.add_argument("--layers", type=nonnegative_int, default=4,
                        help="with --devices: run the first N layers (default 4: the dense layer, KDA and MLA MoE "
                        "layers; 0: all, which with the race detector did not finish in 10 minutes on a 2-core host)")
    add_deployment_options(parser, when="with --devices: ")
    parser.add_argument("--shard-of", default=None, metavar="PLAN",
                        help="run one device's program of PLAN (e.g. k3-tp32: K3 at its TP32 per-device widths, "
                        "all 93 layers) alone on this chip, without collectives (tpusim simulate --shard-of "
                        "models the same program)")
    parser.add_argument("--weight-banks", type=nonnegative_int, default=0, metavar="N",
                        help="stacked weights hold N distinct entries, layer i reading entry i %% N from HBM "
                        "(DMA bytes unchanged; lets a program larger than the chip's HBM run; default 0: off)")
    parser.add_argument("--check-steps", type=nonnegative_int, default=8,
                        help="on a TPU: greedy steps checked against the reference on the same chip before "
                        "timing (default 8)")
    parser.add_argument("--json", action="store_true", help="with --devices: print the result as JSON")
    parser.set_defaults(func=run, output_lock="file")


def run(args: argparse.Namespace) -> int:

    if args.devices > 1:
        return run_devices(args)
    args.model = args.model or SINGLE_DEVICE_MODEL
    if not args.schedule:
        raise InputError("--schedule is required with one device")
    from megakernel.runner import RunConfig, resolve_backend
    from megakernel.runner import run as run_kernel

    if args.batch >= 1 and args.steps >= 1 and args.context >= 1 and not args.shard_of:
        # capacity first (the runner checks >= 1); a shard's program is sized by its plan
        try:
            check_kernel_fits(args.model, batch=args.batch, context_tokens=args.context + args.steps,
                              backend=resolve_backend(args.backend))
        except InputError as error:
            raise InputError(f"{error}. To check the full-size kernel without running it, lower it for "
                             f"TPU: tpusim lower --model {args.model} --schedule {args.schedule}") from None

    config = RunConfig(model=args.model, schedule=args.schedule, batch=args.batch, steps=args.steps,
                       context=args.context, backend=args.backend, seed=args.seed, weights=args.weights,
                       label=args.label, shard_of=args.shard_of, weight_banks=args.weight_banks,
                       check_steps=args.check_steps)
    record = run_kernel(config, args.out)
    print(
        f"{record['model']} {record['schedule']} b{record['batch']} on {record['backend']}: "
        f"{record['ms_per_step_median']:.1f} ms/step (spread {record['ms_per_step_spread']:.1f} ms, "
        f"{record['steps']} steps), max |kernel - reference| = {record['max_abs_error']:.3g}, greedy tokens "
        f"{'identical' if record['tokens_identical'] else 'DIFFER'} over {record['checked_steps']} steps; "
        f"compile {record['compile_s']:.1f} s; HBM {record['hbm_bytes_per_step'] / 1e6:.1f} MB/step"
    )
    if record["backend"] == "cpu-interpret":
        print(f"note: {record['timing_note']}")
    print(f"appended to {args.out}")
    return 0


def check_kernel_fits(model_name: str, *, batch: int, context_tokens: int, backend: str) -> None:
    """``run-kernel`` on one device: refuse a model whose weights + cache exceed that device.

    On ``interpret`` (and ``auto`` without a TPU) the device is this host, and the limit is
    half its free memory (the rest is the interpreter's working set); on a TPU it is the
    catalog chip's HBM per device. The bytes are the capacity module's, at one device.
    """
    from hwmodels.catalog import load_chip
    from tpusim.workload.capacity import cache_bytes, resident_weight_bytes
    from tpusim.workload.model_catalog import load_model, plan_for
    from tpusim.workload.routing import available_memory_bytes

    model = load_model(model_name)
    plan = plan_for(model, 1)
    needed = resident_weight_bytes(model, plan)[0] + cache_bytes(model, plan, batch=batch,
                                                                 context_tokens=context_tokens)
    if backend == "tpu":
        from megakernel.runner import device_chip

        chip = load_chip(device_chip("tpu"))
        available, where = chip.hbm.capacity_bytes.value, f"{chip.name} HBM per device"
    else:
        available, where = available_memory_bytes() / 2, "half of this host's free memory (interpret mode)"
    if needed > available:
        raise InputError(f"{model.name} does not fit one device: the kernel needs {needed / GB:.1f} GB "
                         f"(weights + cache at batch {batch}, context {context_tokens}) but has "
                         f"{available / GB:.1f} GB ({where}); run-kernel runs a single device")


def run_devices(args: argparse.Namespace) -> int:
    """The multi-device run: the schedule-driven collective megakernel
    (:mod:`megakernel.commands.collective_check`) in a fresh process (virtual devices need XLA_FLAGS
    before JAX), race detector on; a schedule's deployment is mapped onto the model and
    device count by :func:`tpusim.workload.kernel_support.map_deployment`."""
    import json
    import subprocess
    import sys

    command = [sys.executable, "-m", "megakernel.commands.collective_check", "--devices", str(args.devices),
               "--model", args.model or MULTI_DEVICE_MODEL, "--schedule", args.schedule or "published",
               "--deployment-model", args.deployment_model, "--deployment-devices", str(args.deployment_devices),
               "--seed", str(args.seed), "--layers", str(args.layers), "--steps", str(args.steps),
               "--context", str(args.context), "--batch", str(args.batch), "--races"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1].removeprefix("error: ")
        raise InputError(f"--devices {args.devices}: {last}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(result, indent=2))
        return 0 if result["matches_reference"] and not result["races"] else 1
    mapping = result["deployment"]
    if mapping:
        print(f"deployment: {mapping['source_plan']} on {mapping['source_devices']} devices -> {mapping['plan']} "
              f"(expert groups {mapping['expert_groups']} x expert TP {mapping['expert_tp']}, by {mapping['rule']})")
        if mapping.get("expert_width") != mapping.get("model_expert_width"):
            print(f"expert width {mapping['model_expert_width']} -> {mapping['expert_width']}: the narrowest that "
                  f"expert TP {mapping['expert_tp']} cuts into slices the kernel runs "
                  "(tpusim.workload.kernel_support.kernel_expert_width)")
    print("collectives: " + ", ".join(f"{name} {algorithm}" for name, algorithm in result["collectives"].items()))
    for i, step in enumerate(result["steps"]):
        print(f"step {i}: tokens {step['tokens']} (reference {step['reference_tokens']}), logits relative error "
              f"{step['logits_relative_error']:.3g}, {step['seconds']:.1f} s")
    print(f"{result['model']} on {result['devices']} devices ({result['plan']}), {result['layers']} layers, "
          f"schedule {result['schedule']}: matches_reference={result['matches_reference']} races={result['races']}"
          f"\nnote: {result['timing_note']}")
    return 0 if result["matches_reference"] and not result["races"] else 1
