"""The megakernel's layer loop as libtpu schedules it: bundles one layer issues, on this machine.

Compiles K3's per-device megakernel (``python -m megakernel.commands.mosaic_compile``, in a fresh
process with libtpu's dump on: libtpu reads ``LIBTPU_INIT_ARGS`` once) for a compile-only
topology, reads the kernel's final bundles (:mod:`calibration.sources.compiler_schedule`)
and its loop over layers (:func:`calibration.sources.compiler_loops.layer_loop`): the
bundles one iteration issues, inner loops times their trip counts, the data-dependent loops
(the routed experts, the MLA cache tiles up to the position) left out and listed. One
record per (batch, panel loops) goes to ``calibration/data/tpu-v5e-static-schedule.jsonl``
beside the expert parts' panel counts (:mod:`calibration.tpu_bench.static_counts`); with
``--hardware tpu-v7`` the same single-device program compiled for ``tpu7x`` (its FP8 products),
to ``calibration/data/tpu7x-static-schedule.jsonl``.

``python -m calibration.tpu_bench.static_layer --batch 1 [--batch 8 ...] [--panel-unroll 8 2] [--hardware tpu-v7] [--schedule k3-ring] [--out FILE]``
(one compile a batch: 1.5-5 minutes each on the project's 2-core machine; the dump is ~400 MB
and goes to a temporary folder).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from calibration.sources.compiler_loops import layer_loop
from calibration.sources.compiler_schedule import read_dump
from hwmodels.records.jsonl import append_record, record_line
from megakernel.kernel_moe import EXPERT_LIST_BUILD
from megakernel.mosaic_compile import topology_for
from tpusim.cli_options import add_batch_option, add_hardware_option, add_schedule_option
from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, PANEL_UNROLL

CHIPS = ("tpu-v5e", "tpu-v7")  # the kernel's single-device program compiles for both (tpu7x: its FP8 products)
MODEL, SHARD_OF, CONTEXT, SCHEDULE, WEIGHT_BANKS = "kimi-k3", "k3-tp32", 1024, "published", 2
PROGRAM = "-step.1-"  # the megakernel's own program in the dump (not XLA's jit_step wrapper)


def compile_dump(batch: int, panel_unroll: tuple[int, int], hardware: str, dump: str, schedule: str = SCHEDULE) -> None:
    """Compile the megakernel (module docstring) under ``schedule`` with libtpu's dump written to ``dump``."""
    env = {**os.environ, "TPU_SKIP_MDS_QUERY": "1", "JAX_PLATFORMS": "cpu", "LIBTPU_INIT_ARGS": f"--xla_jf_dump_to={dump}"}
    command = [sys.executable, "-m", "megakernel.commands.mosaic_compile", "--model", MODEL, "--shard-of", SHARD_OF,
               "--weight-banks", str(WEIGHT_BANKS), "--hardware", hardware, "--batch", str(batch),
               "--context", str(CONTEXT), "--schedule", schedule,
               "--panel-unroll", str(panel_unroll[0]), str(panel_unroll[1])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"compile of {schedule} batch {batch}, panel loops {panel_unroll} failed: {done.stderr[-2000:]}")


def record_of(dump: str | Path, batch: int, panel_unroll: tuple[int, int], hardware: str = "tpu-v5e",
              expert_list: str = EXPERT_LIST_BUILD, schedule: str = SCHEDULE) -> dict[str, Any]:
    """The layer-loop record of a dump folder of the megakernel compiled at ``batch`` with
    ``panel_unroll`` for ``hardware`` (its ``moe.topk`` building the list as ``expert_list``:
    the kernel's own build unless the dump is of an older one). The if/else's arms are named by what they hold: the
    MLA arm holds the KV-cache tile loop (data-dependent: its count is the position), the KDA
    arm none."""
    compiled = read_dump(dump, PROGRAM)
    loop = layer_loop(compiled)
    if len(loop.arms) != 2 or sorted(bool(a.data_dependent) for a in loop.arms) != [False, True]:
        raise ValueError(f"{dump}: the layer loop's if/else is not one MLA arm (with the cache-tile loop) and one KDA arm")
    return {
        "kind": "static_schedule", "probe": "layer_body", "topology": topology_for(hardware), "chip": hardware,
        "params": {"model": MODEL, "shard_of": SHARD_OF, "batch": batch, "context": CONTEXT,
                   "schedule": Path(schedule).stem if schedule.endswith(".json") else schedule,  # a file: its name
                   "weight_banks": WEIGHT_BANKS, "panel_unroll": list(panel_unroll), "expert_list": expert_list},
        # one layer outside the MLA/KDA arms, data-dependent loops (the routed experts) left out
        "issued_bundles": loop.issued_bundles,
        "arms": {("mla" if arm.data_dependent else "kda"): {
            "issued_bundles": arm.issued_bundles, "start": arm.start, "end": arm.end,
            "data_dependent_loops": [{"start": d.start, "bundles": d.bundles} for d in arm.data_dependent]}
            for arm in loop.arms},
        "layer_loop_bundles": loop.loop.bundles, "layer_loop_trips": loop.loop.trips,
        "data_dependent_loops": [{"start": d.start, "bundles": d.bundles} for d in loop.data_dependent],
        "inner_loops": [{"start": i.start, "bundles": i.bundles, "trips": i.trips} for i in loop.inner],
        "kernel_bundles": compiled.total_bundles,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "source": "libtpu final bundles (compile-only topology, this machine): the layer loop's iteration",
    }


def count(batch: int, panel_unroll: tuple[int, int], hardware: str = "tpu-v5e", dump_dir: str | None = None,
          schedule: str = SCHEDULE) -> dict[str, Any]:
    """One compile's layer-loop record (module docstring); the dump kept under ``dump_dir``."""
    if dump_dir is not None:
        dump = Path(dump_dir) / f"{hardware}-{schedule}-b{batch}-u{panel_unroll[0]}x{panel_unroll[1]}"
        dump.mkdir(parents=True, exist_ok=True)
        compile_dump(batch, panel_unroll, hardware, str(dump), schedule)
        return record_of(dump, batch, panel_unroll, hardware, schedule=schedule)
    with tempfile.TemporaryDirectory(prefix="llo-layer-") as folder:
        compile_dump(batch, panel_unroll, hardware, folder, schedule)
        return record_of(folder, batch, panel_unroll, hardware, schedule=schedule)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.tpu_bench.static_layer", allow_abbrev=False)
    add_batch_option(parser, default=None, action="append", required=True, help="a batch to compile (repeat for more)")
    parser.add_argument("--panel-unroll", type=int, nargs=2, default=(PANEL_UNROLL, EXPERT_PANEL_UNROLL),
                        metavar=("DENSE", "EXPERT"))
    add_hardware_option(parser, default="tpu-v5e", help=f"the chip compiled for: {' or '.join(CHIPS)}")
    add_schedule_option(parser, default=SCHEDULE, help="the schedule the kernel is compiled under: a built-in name or a "
                        "schedule file, recorded by its name (default: published)")
    parser.add_argument("--out", default=None, help="append JSON lines here (default: stdout)")
    parser.add_argument("--dump-dir", default=None, help="keep each compile's dump in a folder under this one")
    parser.add_argument("--from-dump", default=None, help="read this dump folder (one --batch) instead of compiling")
    parser.add_argument("--expert-list", default=EXPERT_LIST_BUILD, choices=("walk", "vector"),
                        help="with --from-dump: how the dumped kernel's moe.topk built the list (default: this kernel's)")
    args = parser.parse_args(argv)
    if min(args.panel_unroll) < 1:
        parser.error("--panel-unroll must be >= 1")
    if args.hardware not in CHIPS:
        parser.error(f"--hardware {args.hardware}: the layer loop is recorded for {' or '.join(CHIPS)}")
    if args.from_dump and len(args.batch) != 1:
        parser.error("--from-dump reads one compile: give one --batch")
    for batch in args.batch:
        record = (record_of(args.from_dump, batch, tuple(args.panel_unroll), args.hardware, args.expert_list, args.schedule)
                  if args.from_dump else count(batch, tuple(args.panel_unroll), args.hardware, args.dump_dir, args.schedule))
        arms = ", ".join(f"{name} arm {arm['issued_bundles']}" for name, arm in record["arms"].items())
        sys.stderr.write(f"{args.hardware} {args.schedule} batch {batch}, panel loops {tuple(args.panel_unroll)}: {record['issued_bundles']} "
                         f"bundles a layer outside the arms, {arms}\n")
        if args.out:  # each record as it comes: a later compile that fails loses nothing
            append_record(args.out, record, sort_keys=True)
        else:
            sys.stdout.write(record_line(record, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
