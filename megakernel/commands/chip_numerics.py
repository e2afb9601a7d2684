"""Where the megakernel's logits leave the reference on a TPU (:mod:`megakernel.chip_numerics`).

``python -m megakernel.commands.chip_numerics --model kimi-k3-mini [--schedule published] [--batch 1]
[--layers 4,13,0] [--steps 8] [--context 64] [--out FILE]`` prints (and appends to ``FILE``)
one JSON line per depth; ``python -m megakernel.commands.chip_numerics --verdicts FILE`` judges
committed records (one line each; exit 1 if any fails, 2 on bad input).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from megakernel.chip_numerics import depth_record, verdict
from megakernel.runner import RunConfig, append_record, resolve_backend
from tpusim.cli_options import (
    KERNEL_MODEL_HELP,
    add_batch_option,
    add_context_option,
    add_model_option,
    add_schedule_option,
)


def print_verdicts(path: Path) -> int:
    """One line per record of ``path``; 0 if every record passes, 1 otherwise, 2 on bad input."""
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as error:
        sys.stderr.write(f"error: --verdicts {path}: {error}\n")
        return 2
    failed = 0
    for record in records:
        ok, why = verdict(record)
        failed += not ok
        sys.stdout.write(f"{'pass' if ok else 'FAIL'}  {record['model']} {record['schedule']} "
                         f"b{record['batch']} on {record['backend']}: {why}\n")
    return 1 if failed else 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    add_model_option(parser, default="kimi-k3-mini", help=KERNEL_MODEL_HELP)
    add_schedule_option(parser, default="published")
    add_batch_option(parser, default=1, type=int)
    parser.add_argument("--layers", default="4,13,0", help="comma-separated depths (0: all layers)")
    parser.add_argument("--steps", type=int, default=8, help="teacher-forced steps")
    add_context_option(parser, default=64, type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="auto", choices=("auto", "tpu", "interpret"))
    parser.add_argument("--out", type=Path, default=None, help="append each record to this JSONL file")
    parser.add_argument("--verdicts", type=Path, default=None,
                        help="print the verdict of every record in this JSONL file and exit (runs nothing)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.verdicts is not None:
        return print_verdicts(args.verdicts)
    backend = resolve_backend(args.backend)
    for layers in (int(v) for v in args.layers.split(",")):
        config = RunConfig(model=args.model, schedule=args.schedule, batch=args.batch, steps=args.steps,
                           context=args.context, backend=backend, seed=args.seed, layers=layers,
                           check_steps=args.steps)
        record = depth_record(config, backend)
        if args.out is not None:
            append_record(args.out, record)
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
