"""Bring a :mod:`calibration.gpu_bench` run home: validate it, add the traces, write the data file.

::

    python -m calibration.sources.gpu_ingest OUT [--into calibration/data] [--force]

reads ``OUT/records.jsonl`` (every line validated as a
:class:`~calibration.sources.measurements.Measurement`), turns each trace listed in
``OUT/traces.json`` into one more record with :func:`calibration.sources.profiler.trace_measurement`
(the traced step's median, and its top kernels as per-step phases; ``extra.kind:
profile``), and writes them all to ``<into>/<chip>-<YYYY-MM-DD>.jsonl`` (atomically;
refuses to replace an existing file without ``--force``). The date and chip come from
``OUT/run.json`` (or, for a run cut short before writing it, from the first record). The
result is what ``tpusim calibrate --measurements`` reads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from calibration.sources.measurements import Measurement, read_measurements, write_measurements
from calibration.sources.profiler import load_trace, trace_measurement
from hwmodels.catalog import display_path
from hwmodels.errors import InputError
from hwmodels.textfile import read_user_json

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
PROFILE_KIND = "profile"


def _read_json(path: Path) -> Any:
    if not path.exists():
        raise InputError(f"{display_path(path)}: file not found (is this a gpu_bench --out folder?)")
    return read_user_json(path, shown=display_path(path))


def trace_records(out: Path) -> list[Measurement]:
    """One ``profile`` record per trace listed in ``out/traces.json``."""
    index = _read_json(out / "traces.json")
    records = []
    for entry in index:
        trace = load_trace(out / entry["folder"])
        measured = trace_measurement(
            trace, model=entry["model"], system={"chip": entry["chip"], "chips": 1}, batch=int(entry["batch"]),
            context=int(entry["context"]), backend=entry["backend"], step_name="decode",
        )
        kernels = sum(stats.count for stats in trace.kernel_stats(trace.modules()[0] if trace.modules() else None).values())
        records.append(measured.model_copy(update={
            "label": entry["label"],
            "extra": {"kind": PROFILE_KIND, "name": entry["name"], "plan_devices": int(entry["plan_devices"]),
                      "kernel_events": kernels, "modules": trace.modules()[:3]},
        }))
    return records


def ingest(out: Path | str) -> tuple[list[Measurement], dict[str, Any]]:
    """The run's records (validated) plus its trace records, and its ``run.json``."""
    folder = Path(out)
    records = read_measurements(folder / "records.jsonl")
    if (folder / "run.json").exists():
        run = _read_json(folder / "run.json")
    else:  # a run cut by its time limit: what run.json would say, from the first record
        first = records[0]
        run = {"chip": first.system.chip, "date": first.extra.get("date", "unknown"), "label": first.label,
               "device": first.extra.get("device", "unknown"), "complete": False}
    traces = trace_records(folder) if (folder / "traces.json").exists() else []
    return records + traces, run


def data_file_name(run: dict[str, Any]) -> str:
    """``h200-2026-11-30.jsonl`` from the run's chip and date."""
    return f"{run['chip']}-{str(run['date'])[:10]}.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="python -m calibration.sources.gpu_ingest", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="a gpu_bench --out folder")
    parser.add_argument("--into", type=Path, default=DATA_DIR, help="folder for the data file")
    parser.add_argument("--force", action="store_true", help="replace an existing data file")
    args = parser.parse_args(argv)
    try:
        records, run = ingest(args.out)
        target = args.into / data_file_name(run)
        if target.exists() and not args.force:
            raise InputError(f"{display_path(target)} exists; pass --force to replace it")
        write_measurements(target, records)
    except InputError as error:
        sys.stderr.write(f"gpu_ingest: error: {error}\n")
        return 2
    sys.stdout.write(f"wrote {display_path(target)}: {len(records)} records ({run['label']}, {run['device']})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
