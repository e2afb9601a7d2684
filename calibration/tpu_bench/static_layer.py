"""The megakernel's layer loop as libtpu schedules it: bundles one layer issues, on this machine.

Compiles K3's per-device megakernel (``python -m megakernel.mosaic_compile``, in a fresh
process with libtpu's dump on: libtpu reads ``LIBTPU_INIT_ARGS`` once) for a compile-only
topology, reads the kernel's final bundles (:mod:`calibration.sources.compiler_schedule`)
and its loop over layers (:func:`calibration.sources.compiler_loops.layer_loop`): the
bundles one iteration issues, inner loops times their trip counts, the data-dependent loops
(the routed experts, the MLA cache tiles up to the position) left out and listed. One
record per (batch, panel loops) goes to ``calibration/data/tpu-v5e-static-schedule.jsonl``
beside the expert parts' panel counts (:mod:`calibration.tpu_bench.static_counts`).

``python -m calibration.tpu_bench.static_layer --batch 1 [--batch 8 ...] [--panel-unroll 8 2] [--out FILE]``
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
from typing import Any

from calibration.sources.compiler_loops import layer_loop
from calibration.sources.compiler_schedule import read_dump
from tpusim.records_io import append_record, record_line
from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, PANEL_UNROLL

TOPOLOGY, CHIP = "v5e:2x2", "tpu-v5e"
MODEL, SHARD_OF, CONTEXT, SCHEDULE, WEIGHT_BANKS = "kimi-k3", "k3-tp32", 1024, "published", 2
PROGRAM = "-step.1-"  # the megakernel's own program in the dump (not XLA's jit_step wrapper)


def count(batch: int, panel_unroll: tuple[int, int], hardware: str = CHIP) -> dict[str, Any]:
    """One compile's layer-loop record (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="llo-layer-") as dump:
        env = {**os.environ, "TPU_SKIP_MDS_QUERY": "1", "JAX_PLATFORMS": "cpu",
               "LIBTPU_INIT_ARGS": f"--xla_jf_dump_to={dump}"}
        command = [sys.executable, "-m", "megakernel.mosaic_compile", "--model", MODEL, "--shard-of", SHARD_OF,
                   "--weight-banks", str(WEIGHT_BANKS), "--hardware", hardware, "--batch", str(batch),
                   "--context", str(CONTEXT), "--schedule", SCHEDULE,
                   "--panel-unroll", str(panel_unroll[0]), str(panel_unroll[1])]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"compile of batch {batch}, panel loops {panel_unroll} failed: {done.stderr[-2000:]}")
        schedule = read_dump(dump, PROGRAM)
    loop = layer_loop(schedule)
    return {
        "kind": "static_schedule", "probe": "layer_body", "topology": TOPOLOGY, "chip": hardware,
        "params": {"model": MODEL, "shard_of": SHARD_OF, "batch": batch, "context": CONTEXT, "schedule": SCHEDULE,
                   "weight_banks": WEIGHT_BANKS, "panel_unroll": list(panel_unroll)},
        "issued_bundles": loop.issued_bundles,  # one layer, data-dependent loops left out
        "layer_loop_bundles": loop.loop.bundles, "layer_loop_trips": loop.loop.trips,
        "data_dependent_loops": [{"start": d.start, "bundles": d.bundles} for d in loop.data_dependent],
        "inner_loops": [{"start": i.start, "bundles": i.bundles, "trips": i.trips} for i in loop.inner],
        "kernel_bundles": schedule.total_bundles,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "source": "libtpu final bundles (compile-only topology, this machine): the layer loop's iteration",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.tpu_bench.static_layer", allow_abbrev=False)
    parser.add_argument("--batch", action="append", type=int, required=True)
    parser.add_argument("--panel-unroll", type=int, nargs=2, default=(PANEL_UNROLL, EXPERT_PANEL_UNROLL),
                        metavar=("DENSE", "EXPERT"))
    parser.add_argument("--out", default=None, help="append JSON lines here (default: stdout)")
    args = parser.parse_args(argv)
    if any(b < 1 for b in args.batch) or min(args.panel_unroll) < 1:
        parser.error("--batch and --panel-unroll must be >= 1")
    for batch in args.batch:
        record = count(batch, tuple(args.panel_unroll))
        sys.stderr.write(f"batch {batch}, panel loops {tuple(args.panel_unroll)}: {record['issued_bundles']} bundles "
                         f"a layer, {len(record['data_dependent_loops'])} data-dependent loops left out\n")
        if args.out:  # each record as it comes: a later compile that fails loses nothing
            append_record(args.out, record, sort_keys=True)
        else:
            sys.stdout.write(record_line(record, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
