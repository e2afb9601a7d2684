"""How far the one-device reference moves under one-ulp f32 noise (:mod:`megakernel.reference_spread`).

``python -m megakernel.commands.reference_spread [--model kimi-k3-nano] [--layers N] [--trials 8]
[--steps 1] [--seed 0] [--context 5] [--max-context 0]`` prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys

from megakernel.reference_spread import spread
from tpusim.cli_options import KERNEL_MODEL_HELP, add_context_option, add_model_option
from tpusim.workload.model_catalog import load_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    add_model_option(parser, default="kimi-k3-nano", help=KERNEL_MODEL_HELP)
    parser.add_argument("--layers", type=int, default=0, help="0: all of the model's layers")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    add_context_option(parser, default=5, type=int)
    parser.add_argument("--max-context", type=int, default=0)
    args = parser.parse_args(argv)
    model = load_model(args.model)
    if args.layers:
        model = model.with_layers(args.layers)
    trials = spread(model, trials=args.trials, steps=args.steps, seed=args.seed, context=args.context,
                    max_context=args.max_context)
    errors = [s["logits_relative_error"] for t in trials for s in t]
    sys.stdout.write(json.dumps({
        "model": args.model, "layers": model.num_layers, "seed": args.seed, "label": "derived (reference only, CPU)",
        "perturbation": "input KDA state, every entry one f32 ulp up or down",
        "max_logits_relative_error": max(errors, default=0.0),
        "trials_with_any_change": sum(any(s["logits_relative_error"] > 0 for s in t) for t in trials),
        "trials": trials}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
