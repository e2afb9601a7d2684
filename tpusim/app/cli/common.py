"""Options shared by the subcommands that take a model, a system and a batch."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_workload_options(parser: argparse.ArgumentParser, *, batch: bool = True) -> None:
    parser.add_argument("--model", required=True, help="model name (kimi-k3, muse-spark@int4+bf16, ...) or a YAML/config.json path")
    parser.add_argument("--hardware", required=True, help="chip name from the catalog (tpu-v7, gb200, ...)")
    parser.add_argument("--chips", type=positive_int, required=True, help="number of chips")
    if batch:
        parser.add_argument("--batch", type=positive_int, default=1, help="sequences decoded per step")
    parser.add_argument("--context", type=positive_int, default=1024, help="tokens already in each sequence's cache")
    parser.add_argument("--routing", default="uniform", help="uniform | identical | zipf[:s] | trace:PATH")
    parser.add_argument("--seed", type=int, default=0, help="routing draw seed")
    parser.add_argument("--uncalibrated", action="store_true", help="use published figures only, ignoring calibrated overlays")
    add_model_options(parser)


def add_model_options(parser: argparse.ArgumentParser, *, plan: bool = True) -> None:
    """``--formats`` (weight format per family) and ``--plan`` (deployment plan)."""
    parser.add_argument("--formats", default=None, metavar="FAMILY=FORMAT,...",
                        help="weight format per family, e.g. experts=nvfp4,shared_expert=fp8,attention=bf16,kv=fp8 "
                        "(formats: bf16 fp8 int8 int4 nvfp4 mxfp4 ...; default: the model file / quantization_config)")
    if plan:
        parser.add_argument("--plan", default=None, metavar="NAME|FILE|SPEC",
                            help="sharding plan: a published name (k3-tp32, muse-tp8), generic, a plan YAML, or "
                            "a SPEC like tp=8,expert_groups=2,expert_tp=4[,attention=dp] (default: published if one "
                            "matches, else generic)")


def load_model_with_formats(args: argparse.Namespace) -> Any:
    """The ``--model`` with ``--formats`` applied."""
    from tpusim.workload.format_choice import apply_formats
    from tpusim.workload.model_catalog import load_model

    return apply_formats(load_model(args.model), getattr(args, "formats", None))


def resolve_workload(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """(model, plan, system, routing) from the parsed options."""
    from hwmodels.catalog import make_system
    from tpusim.workload.model_catalog import plan_for_system
    from tpusim.workload.routing import parse_routing

    model = load_model_with_formats(args)
    system = make_system(args.hardware, args.chips, calibrated=not args.uncalibrated)
    plan = plan_for_system(model, system.chip, system.chips, getattr(args, "plan", None))
    routing = parse_routing(args.routing)
    return model, plan, system, routing


def emit_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=float)
    sys.stdout.write("\n")
