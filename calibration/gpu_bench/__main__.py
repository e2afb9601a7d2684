"""``python -m calibration.gpu_bench --out DIR``: run the harness (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from calibration.gpu_bench import WORKLOADS_PATH
from calibration.gpu_bench.micro import (
    COPY_MAX_BYTES,
    GAP_OPS,
    bench_copies,
    bench_gaps,
    bench_matmuls,
)
from calibration.gpu_bench.records import RecordWriter, RunInfo
from calibration.gpu_bench.steps import bench_steps

PARTS = ("copy", "gap", "matmul", "steps")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="python -m calibration.gpu_bench", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder for records.jsonl, traces/, run.json")
    parser.add_argument("--set", default="auto", help="workload set of workloads.json: h200, cpu, or auto "
                        "(cpu on a CPU backend, else h200)")
    parser.add_argument("--chip", default=None,
                        help="catalog chip the records calibrate (default: the set's, checked against "
                        "the device name)")
    parser.add_argument("--workloads", type=Path, default=WORKLOADS_PATH, help="step descriptions and shapes")
    parser.add_argument("--max-bytes", type=int, default=None,
                        help="largest copy in bytes (default: the set's, 4 GiB for h200)")
    parser.add_argument("--rotate-bytes", type=int, default=None,
                        help="cycle operands until this many bytes are touched (defeats the cache; "
                        "default: the set's)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls before timing")
    parser.add_argument("--repeats", type=int, default=9, help="timed samples per measurement")
    parser.add_argument("--gap-ops", default=",".join(map(str, GAP_OPS)),
                        help="tiny ops per compiled gap executable, comma list")
    parser.add_argument("--trace-steps", type=int, default=3, help="profiled steps per model (0: no traces)")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="stop starting new work after this many seconds (records so far are kept)")
    parser.add_argument("--matmul-share", type=float, default=0.4,
                        help="fraction of --budget-s the matmuls may use, so the whole steps (the "
                        "held-out targets) still run when compiles are slow")
    return parser.parse_args(argv)


def run_info(chip: str) -> RunInfo:
    import jax

    device = jax.devices()[0]
    platform = device.platform
    return RunInfo(
        chip=chip, label="measured-on-cpu" if platform == "cpu" else f"measured-on-{chip}",
        backend=f"{platform}-xla", device=str(device.device_kind), jax_version=jax.__version__,
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), host=socket.gethostname(),
    )


def choose_set(workloads: dict[str, Any], name: str) -> tuple[str, dict[str, Any]]:
    import jax

    if name == "auto":
        name = "cpu" if jax.default_backend() == "cpu" else "h200"
    if name not in workloads["sets"]:
        raise SystemExit(f"gpu_bench: error: --set {name}: not in the workloads file "
                         f"(has {', '.join(workloads['sets'])})")
    return name, workloads["sets"][name]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    deadline = began + args.budget_s
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        raise SystemExit(f"gpu_bench: error: --parts: unknown {unknown[0]!r}; use {', '.join(PARTS)}")
    workloads = json.loads(args.workloads.read_text(encoding="utf-8"))
    set_name, chosen = choose_set(workloads, args.set)
    out: Path = args.out
    records_path = out / "records.jsonl"
    if records_path.exists() and records_path.stat().st_size:
        raise SystemExit(f"gpu_bench: error: {records_path} exists; use an empty --out folder")
    info = run_info(args.chip or chosen["chip"])
    if args.chip is None and info.backend != "cpu-xla" and info.chip not in info.device.lower().replace(" ", ""):
        raise SystemExit(f"gpu_bench: error: the device is {info.device!r}, not a {info.chip}; pass --chip "
                         "NAME to say which catalog chip its records calibrate")
    writer = RecordWriter(records_path)
    max_bytes = min(args.max_bytes or int(chosen["copy_max_bytes"]), COPY_MAX_BYTES)
    rotate = args.rotate_bytes if args.rotate_bytes is not None else int(chosen["rotate_bytes"])
    skipped: list[str] = []
    traces: list[dict[str, Any]] = []
    timing = {"warmup": args.warmup, "repeats": args.repeats}

    def emit(records: Any, part: str, until: float = deadline) -> None:
        for record in records:
            writer.write(record)
            if time.monotonic() > until:
                skipped.append(f"{part}: stopped at its time budget after {writer.count} records in all")
                return

    for part in parts:
        if time.monotonic() > deadline:
            skipped.append(f"{part}: not started, time budget spent")
            continue
        sys.stderr.write(f"gpu_bench: {part} ...\n")
        if part == "copy":
            emit(bench_copies(info, max_bytes=max_bytes, rotate_bytes=rotate, **timing), part)
        elif part == "gap":
            emit(bench_gaps(info, op_counts=tuple(int(n) for n in args.gap_ops.split(",")), **timing), part)
        elif part == "matmul":
            until = min(deadline, time.monotonic() + args.matmul_share * args.budget_s)
            emit(bench_matmuls(info, chosen["matmuls"], dtypes=tuple(chosen["dtypes"]), rows_list=tuple(chosen["rows"]),
                               rotate_bytes=rotate, skipped=skipped, **timing), part, until)
        else:
            emit(bench_steps(info, chosen, out, trace_steps=args.trace_steps, traces=traces,
                             deadline=deadline, skipped=skipped, **timing), part)
    (out / "traces.json").write_text(json.dumps(traces, indent=1) + "\n", encoding="utf-8")
    summary = {"set": set_name, "chip": info.chip, "label": info.label, "device": info.device,
               "jax_version": info.jax_version, "date": info.date, "host": info.host,
               "records": writer.count, "traces": len(traces), "parts": parts, "skipped": skipped,
               "elapsed_s": round(time.monotonic() - began, 1), "max_bytes": max_bytes, "rotate_bytes": rotate}
    (out / "run.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
