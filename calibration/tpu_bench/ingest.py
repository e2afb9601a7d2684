"""Commit what a TPU device call brought back: kernel records, their routing traces, probes.

``python -m calibration.tpu_bench.ingest FILES_AT [--data calibration/data]``

- ``FILES_AT/records.jsonl`` -> ``DATA/tpu-v5e-kernel.jsonl`` (appended; a record already
  there, same schedule hash, model, shard, batch and provenance, is not added twice). Each
  record's embedded ``routing_layers`` becomes ``DATA/tpu-v5e-routing/<name>.json`` (a
  :mod:`tpusim.workload.routing` trace) and the record's ``routing`` names it relative to the
  records file, so ``tpusim simulate --routing`` can replay the routing the run used (a
  trace that differs from one already under its name gets the name plus its digest: an
  earlier record's trace is never overwritten);
  A run with ``expert_cap`` set (the kernel's fixed-cost probe, not a decode) goes to
  ``DATA/tpu-v5e-fixed-cost.jsonl`` instead (:mod:`calibration.sources.tpu_fixed_cost`);
- ``FILES_AT/probes.jsonl`` -> ``DATA/tpu-v5e-probes.jsonl`` (appended likewise);
- ``FILES_AT/numerics.jsonl`` -> ``DATA/tpu-v5e-numerics.jsonl`` (:mod:`megakernel.chip_numerics`
  records, appended likewise);
- ``FILES_AT/xla.jsonl`` -> ``DATA/tpu-v5e-xla.jsonl`` (:mod:`megakernel.xla_run` records, the
  plain-JAX/XLA baseline timed next to a kernel run; their routing names the kernel run's trace);
  with ``expert_cap`` set (0: no routed expert) -> ``DATA/tpu-v5e-xla-capped.jsonl``;
- a kernel record with ``kernel_variant`` (knobs away from the kernel's defaults) ->
  ``DATA/tpu-v5e-kernel-variants.jsonl``, out of the files the calibration reads.

Every file is written through a temporary file and renamed (nothing half-written).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from hwmodels.atomic import write_text_atomic
from hwmodels.records.jsonl import record_line, write_lines

KERNEL_FILE, PROBE_FILE, ROUTING_DIR = "tpu-v5e-kernel.jsonl", "tpu-v5e-probes.jsonl", "tpu-v5e-routing"
NUMERICS_FILE, XLA_FILE = "tpu-v5e-numerics.jsonl", "tpu-v5e-xla.jsonl"
# kernel runs with knobs away from the kernel's defaults (``kernel_variant``: e.g. the panel
# loops unrolled), and the plain-XLA step with its experts capped (0: its non-expert work):
# studies beside the kernel, kept out of the files the calibration reads
VARIANTS_FILE, XLA_CAPPED_FILE = "tpu-v5e-kernel-variants.jsonl", "tpu-v5e-xla-capped.jsonl"
FIXED_COST_FILE = "tpu-v5e-fixed-cost.jsonl"


def _key(record: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(json.dumps(record.get(k), sort_keys=True) for k in
                 ("kind", "probe", "params", "model", "shard_of", "schedule_hash", "batch", "layers", "expert_cap", "provenance",
                  "date"))


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _append(path: Path, new: list[dict[str, Any]]) -> int:
    old = _read(path)
    seen = {_key(r) for r in old}
    fresh = [r for r in new if _key(r) not in seen]
    if fresh:
        write_lines(path, (record_line(r) for r in old + fresh))  # the whole file, atomically
    return len(fresh)


def _trace_name(routing_dir: Path, name: str, text: str) -> str:
    """Write a routing trace as ``name``, unless a different trace already has that name (an
    earlier run's, which its records replay): then as ``name`` + its content's digest."""
    path = routing_dir / name
    if path.exists() and path.read_text() != text:
        name = f"{path.stem}-{hashlib.sha256(text.encode()).hexdigest()[:12]}{path.suffix}"
        path = routing_dir / name
    if not path.exists():
        write_text_atomic(path, text)
    return name


def ingest(files_at: Path, data: Path) -> dict[str, int]:
    records = _read(files_at / "records.jsonl")
    routing_dir = data / ROUTING_DIR
    routing_dir.mkdir(parents=True, exist_ok=True)
    for record in records:
        layers = record.pop("routing_layers", None)
        name = record["routing"].removeprefix("trace:")
        if layers is not None:
            name = _trace_name(routing_dir, name, json.dumps({"layers": layers}))
            record["routing"] = f"trace:{ROUTING_DIR}/{name}"
    xla = _read(files_at / "xla.jsonl")
    for record in xla:
        name = (record.get("routing") or "").removeprefix("trace:")
        if name and "/" not in name:
            record["routing"] = f"trace:{ROUTING_DIR}/{name}"
    variants = [r for r in records if r.get("kernel_variant")]
    decodes = [r for r in records if r.get("expert_cap") is None and not r.get("kernel_variant")]
    probes = [r for r in records if r.get("expert_cap") is not None and not r.get("kernel_variant")]
    return {"kernel": _append(data / KERNEL_FILE, decodes), "fixed_cost": _append(data / FIXED_COST_FILE, probes),
            "variants": _append(data / VARIANTS_FILE, variants),
            "xla": _append(data / XLA_FILE, [r for r in xla if r.get("expert_cap") is None]),
            "xla_capped": _append(data / XLA_CAPPED_FILE, [r for r in xla if r.get("expert_cap") is not None]),
            "probes": _append(data / PROBE_FILE, _read(files_at / "probes.jsonl")),
            "numerics": _append(data / NUMERICS_FILE, _read(files_at / "numerics.jsonl"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("files_at", type=Path)
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "data")
    args = parser.parse_args(argv)
    if not args.files_at.is_dir():
        sys.stderr.write(f"error: {args.files_at}: not a folder\n")
        return 2
    counts = ingest(args.files_at, args.data)
    sys.stdout.write(f"added {counts['kernel']} kernel records, {counts['fixed_cost']} fixed-cost probe runs, "
                     f"{counts['probes']} probe records "
                     f", {counts['numerics']} numerics records and {counts['xla']} XLA-baseline records to {args.data}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
