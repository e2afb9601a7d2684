"""``tpusim run-kernel``: run the Pallas megakernel and append a measurement record.

Usage::

    tpusim run-kernel --model kimi-k3-mini --schedule published --batch 1 --steps 2 \\
        --out measurements.jsonl
    tpusim run-kernel --schedule my-sweep-best.json --backend interpret --steps 1

On a TPU (``--backend auto`` finds it) the steps are timed natively after a warm-up. On a
CPU the kernel runs in Pallas TPU interpret mode, is checked against the pure-JAX
reference, and the record says ``backend: cpu-interpret`` with a note that the time is the
interpreter's, not a TPU's. Records are appended, never rewritten (see
:mod:`megakernel.runner`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hwmodels.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "run-kernel",
        help="run the megakernel for N decode steps and record the timing",
        description="Run the Pallas megakernel (TPU natively, or TPU interpret mode on a CPU), check it "
        "against the reference and append a measurement record.",
    )
    parser.add_argument("--model", default="kimi-k3-mini", help="model name (single device; default kimi-k3-mini)")
    parser.add_argument("--schedule", required=True, help="built-in schedule name or schedule JSON file")
    parser.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    parser.add_argument("--steps", type=int, default=2, help="timed decode steps (default 2)")
    parser.add_argument("--context", type=int, default=16, help="tokens already cached per sequence (default 16)")
    parser.add_argument("--backend", choices=("auto", "tpu", "interpret"), default="auto",
                        help="auto: a TPU if JAX sees one, else TPU interpret mode on the CPU; tpu: "
                        "fail without a TPU; interpret: the CPU interpreter (a check, not a TPU time)")
    parser.add_argument("--weights", type=Path, help="folder of safetensors weights (default: seeded random)")
    parser.add_argument("--seed", type=int, default=0, help="weights, state and first tokens (default 0)")
    parser.add_argument("--label", default="measured", help="record label (default measured)")
    parser.add_argument("--out", type=Path, default=Path("measurements.jsonl"), help="JSON-lines file to append to")
    parser.set_defaults(func=run)


# The CPU interpreter holds the weights several times over (host arrays, packed HBM image,
# the reference's copy); a quarter of this host's memory is the largest weight set it is
# given. kimi-k3-mini on one device is 0.39 GB; kimi-k3 is 2,426 GB.
INTERPRETER_MEMORY_FRACTION = 0.25


def check_fits_interpreter(model_name: str, schedule: str) -> None:
    """Raise InputError when ``model_name`` on one device is too large for the CPU
    interpreter, pointing to ``tpusim lower`` (which checks the full-size kernel)."""
    import os

    from tpusim.workload.capacity import resident_weight_bytes
    from tpusim.workload.model_catalog import load_model, plan_for

    model = load_model(model_name)
    weights, _ = resident_weight_bytes(model, plan_for(model, 1))
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if weights > INTERPRETER_MEMORY_FRACTION * host:
        raise InputError(
            f"--model {model_name}: its weights on one device are {weights / 1e9:,.1f} GB, too large for "
            f"the CPU interpreter on this host ({host / 1e9:.0f} GB of memory; it runs models up to "
            f"{INTERPRETER_MEMORY_FRACTION * host / 1e9:.0f} GB, e.g. kimi-k3-mini). To check the "
            f"full-size kernel, lower it for TPU without running it: tpusim lower --model {model_name} "
            f"--schedule {schedule}")


def run(args: argparse.Namespace) -> int:
    from megakernel.runner import RunConfig, resolve_backend
    from megakernel.runner import run as run_kernel

    if resolve_backend(args.backend) == "interpret":
        check_fits_interpreter(args.model, args.schedule)

    config = RunConfig(model=args.model, schedule=args.schedule, batch=args.batch, steps=args.steps,
                       context=args.context, backend=args.backend, seed=args.seed, weights=args.weights,
                       label=args.label)
    record = run_kernel(config, args.out)
    print(
        f"{record['model']} {record['schedule']} b{record['batch']} on {record['backend']}: "
        f"{record['ms_per_step_median']:.1f} ms/step (spread {record['ms_per_step_spread']:.1f} ms, "
        f"{record['steps']} steps), max |kernel - reference| = {record['max_abs_error']:.3g}"
    )
    if record["backend"] == "cpu-interpret":
        print(f"note: {record['timing_note']}")
    print(f"appended to {args.out}")
    return 0
