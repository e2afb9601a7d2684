"""Benchmark the schedule sweep: Kimi K3 on 16 TPU v7 chips, the default space and budget.

Run::

    .venv/bin/python benchmarks/bench_sweep.py                    # batch 1 and 8, --jobs 2
    .venv/bin/python benchmarks/bench_sweep.py --batch 8 --jobs 2 --out sweeps/k3

For each batch it runs :func:`tpusim.sweep.run_sweep` exactly as ``tpusim sweep --model
kimi-k3 --hardware tpu-v7 --chips 16 --batch B --jobs 2`` would (published hardware figures,
no calibration overlay, seed 0) and prints the measured wall time, the wall time per phase,
the counts (considered / pruned / screened / simulated / estimate only), the chosen schedule
against ``published`` (both simulated) and the knobs that matter most. Target: ≥ 1000
candidates in ≤ 120 s wall on the 2-core dev machine; the script exits non-zero otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from hwmodels.catalog import make_system
from tpusim.cli_options import add_batch_option
from tpusim.sweep import run_sweep
from tpusim.sweep.defaults import DEFAULT_BUDGET, DEFAULT_SCREEN_LAYERS
from tpusim.sweep.report import knob_spreads, one_knob_effects
from tpusim.workload.model_catalog import load_model, plan_for

TARGET_WALL_S = 120.0
TARGET_CANDIDATES = 1000


def bench(batch: int, jobs: int, budget: int, out: Path) -> bool:
    system = make_system("tpu-v7", 16, calibrated=False)
    model = load_model("kimi-k3")
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip)
    started = time.perf_counter()
    result = run_sweep(model, plan, system, batch, out_dir=out, budget=budget, jobs=jobs, seed=0, quiet=True)
    wall_s = time.perf_counter() - started
    best, published = result.best_row, result.published_row
    assert published is not None
    print(f"K3 on tpu-v7 x16, batch {batch}, --jobs {jobs}, budget {budget}: {wall_s:.1f} s wall (measured)")
    print("  phases: " + ", ".join(f"{name} {secs:.1f} s" for name, secs in result.phase_s.items()))
    print(f"  candidates: {result.considered} considered = {result.pruned} pruned + {result.simulated} simulated "
          f"+ {result.estimated} estimate only ({result.screened} screened on {DEFAULT_SCREEN_LAYERS} layers)")
    print(f"  chosen {best['name']} ({best['hash']}): {best['predicted_ms']:.4f} ms/step, "
          f"{best['tokens_per_s']:.1f} tokens/s ({best['predicted_by']})")
    print(f"  published: {published['predicted_ms']:.4f} ms/step, {published['tokens_per_s']:.1f} tokens/s "
          f"({published['predicted_by']}), rank {result.published_rank} of {result.simulated}; "
          f"speed-up {result.speedup_vs_published:.3f}x")
    top = knob_spreads(result.sensitivity)[:6]
    print(f"  knobs that matter most around {result.sensitivity_seed} (each varied alone; "
          f"{result.sensitivity_label}): "
          + "; ".join(f"{t['knob']} {t['spread_pct']:.1f} % (best {t['best_value']})" for t in top))
    helpful = one_knob_effects(result.rows)[:5]
    print("  most helpful single changes (simulated): "
          + "; ".join(f"{e['parent']} ~ {e['change']}: {e['delta_ms']:+.3f} ms" for e in helpful))
    print(f"  outputs: {out}")
    ok = result.considered >= TARGET_CANDIDATES and wall_s <= TARGET_WALL_S
    if not ok:
        print(f"  FAILED: target is >= {TARGET_CANDIDATES} candidates in <= {TARGET_WALL_S:.0f} s")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    add_batch_option(parser, default=[1, 8], type=int, nargs="+")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    parser.add_argument("--out", type=Path, default=None, help="keep the outputs here (default: a temp folder)")
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as scratch:
        for batch in args.batch:
            out = (args.out or Path(scratch)) / f"k3-tpu-v7x16-b{batch}"
            ok = bench(batch, args.jobs, args.budget, out) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
