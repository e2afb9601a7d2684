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


def resolve_workload(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """(model, plan, system, routing) from the parsed options."""
    from hwmodels.catalog import make_system
    from tpusim.workload.model_catalog import load_model, plan_for
    from tpusim.workload.routing import parse_routing

    model = load_model(args.model)
    system = make_system(args.hardware, args.chips, calibrated=not args.uncalibrated)
    intra = "nvlink" if system.chip.kind == "gpu" else "ici"
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip, intra_link=intra)
    routing = parse_routing(args.routing)
    return model, plan, system, routing


def emit_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=float)
    sys.stdout.write("\n")
