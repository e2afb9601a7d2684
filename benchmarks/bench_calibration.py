"""Calibration benchmark: the published TPU7x fits and the full CPU closed loop.

Usage::

    .venv/bin/python benchmarks/bench_calibration.py --out /tmp/calib [--tpu] [--cpu] [--quick]

``--tpu`` fits tpu-v7 on the 12 published Muse Spark points four ways (all 12; holding out
each weight format in turn) and writes ``report.md``/``scatter.png``/``fit.json`` per fit
under ``OUT/tpu-v7/<name>/`` plus ``OUT/tpu-v7/summary.md``. ``--cpu`` runs the full CPU loop
(probe, 12 (width, batch) points, fit with batch 4 held out) into ``OUT/host-cpu/``.
Overlays are *not* saved (``TPUSIM_LOCAL_DIR`` points into ``OUT``), so the benchmark never
changes what other commands load. Several minutes: every fit simulates ~1000 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def tpu(out: Path, max_evals: int) -> None:
    from calibration.reports.fit_report import write_fit_report
    from calibration.sources.predict import Predictor
    from calibration.sources.step_times import fit_chip
    from calibration.sources.tpu7x_published import load_published
    from hwmodels.atomic import write_text_atomic
    from hwmodels.catalog import load_chip

    published = load_chip("tpu-v7", calibrated=False)
    records = load_published()
    predictor = Predictor()
    lines = [
        "| fit | calibration points | held out | MAPE uncalibrated (all) | MAPE calibrated (fitted) "
        "| MAPE calibrated (held out) | max calibrated |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, holdout in (("all", None), ("hold-int4", "format=int4+bf16"),
                          ("hold-nvfp4-bf16", "format=nvfp4+bf16"), ("hold-nvfp4-int8", "format=nvfp4+int8")):
        start = time.perf_counter()
        result = fit_chip(published, records, holdout=holdout, predictor=predictor, max_nfev=max_evals)
        folder = out / "tpu-v7" / name
        write_fit_report(result, folder, title=f"tpu-v7 on the published Muse Spark set ({name})",
                         predictor=predictor)
        write_text_atomic(folder / "fit.json", json.dumps(result.to_json(), indent=2, default=float) + "\n")
        s = result.summary()

        def pct(value: float | None) -> str:
            return "—" if value is None else f"{value * 100:.1f} %"

        worst = max(v for v in (s["max_error_calibration"], s["max_error_holdout"]) if v is not None)
        lines.append(f"| {name} | {len(result.split.calibration)} | {holdout or '—'} | {pct(s['mape_before'])} "
                     f"| {pct(s['mape_calibration'])} | {pct(s['mape_holdout'])} | {pct(worst)} |")
        print(lines[-1], f"({time.perf_counter() - start:.0f} s)", flush=True)
    write_text_atomic(out / "tpu-v7" / "summary.md", "\n".join(lines) + "\n")


def cpu(out: Path, quick: bool) -> None:
    from calibration.reports.fit_report import write_fit_report
    from calibration.sources.cpu_loop import CpuLoopConfig, run_cpu_loop
    from calibration.sources.measurements import write_measurements
    from hwmodels.atomic import write_text_atomic

    config = CpuLoopConfig.quick() if quick else CpuLoopConfig()
    result, records = run_cpu_loop(config, probe=True, progress=lambda line: print(" ", line, flush=True))
    folder = out / "host-cpu"
    write_fit_report(result, folder, title="host-cpu: jitted per-op decode steps (CPU closed loop)")
    write_text_atomic(folder / "fit.json", json.dumps(result.to_json(), indent=2, default=float) + "\n")
    write_measurements(folder / "measurements.jsonl", records)
    print(json.dumps({k: v for k, v in result.summary().items()}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tpu", action="store_true")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--quick", action="store_true", help="CPU loop: the CI variant")
    parser.add_argument("--max-evals", type=int, default=30)
    args = parser.parse_args()
    os.environ["TPUSIM_LOCAL_DIR"] = str(args.out / "local")
    if args.tpu or not args.cpu:
        tpu(args.out, args.max_evals)
    if args.cpu or not args.tpu:
        cpu(args.out, args.quick)


if __name__ == "__main__":
    main()
