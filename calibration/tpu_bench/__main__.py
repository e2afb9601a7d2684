"""``python -m calibration.tpu_bench run|compile``: see :mod:`calibration.tpu_bench`.

``compile`` needs, on a machine without a TPU, ``JAX_PLATFORMS=cpu`` before JAX starts (it
sets ``TPU_SKIP_MDS_QUERY`` and ``ALLOW_MULTIPLE_LIBTPU_LOAD`` itself)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from hwmodels.records.jsonl import append_record, record_line


class _JsonlList(list):  # type: ignore[type-arg]
    """A list that also writes each appended record as one JSON line (flushed)."""

    def __init__(self, path: str | None) -> None:
        super().__init__()
        self._path = path

    def append(self, item: Any) -> None:
        super().append(item)
        if self._path is not None:
            append_record(self._path, item, sort_keys=True)
        else:
            sys.stdout.write(record_line(item, sort_keys=True) + "\n")
            sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="python -m calibration.tpu_bench")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", allow_abbrev=False, help="time the probes on this machine's default JAX device")
    run.add_argument("--budget", type=float, default=90.0, help="seconds after which no new probe starts")
    run.add_argument("--out", default=None, help="append JSON lines here (default: stdout)")
    run.add_argument("--quick", action="store_true", help="tiny sizes (CPU interpret-mode dry run)")
    run.add_argument("--workers", type=int, default=4, help="compiles in flight ahead of the timing")
    run.add_argument("--probe", action="append", default=None, help="only probes of this name (repeatable)")
    run.add_argument("--no-slow", action="store_true",
                     help="leave out the slow-compiling variants (single-dot matmuls, whole-slice dequant)")
    comp = sub.add_parser("compile", allow_abbrev=False, help="compile every probe for a TPU topology (no TPU needed)")
    comp.add_argument("topology", nargs="?", default="v5e:2x2")
    comp.add_argument("--subset", choices=("all", "representative"), default="all")
    args = parser.parse_args(argv)

    if args.cmd == "compile":
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        from calibration.tpu_bench.probes import compile_all_for, representative

        only = representative if args.subset == "representative" else None
        sys.stdout.write(json.dumps(compile_all_for(args.topology, only=only)) + "\n")
        return 0

    from calibration.tpu_bench.probes import run_probes, slow_compile

    names = set(args.probe) if args.probe else None

    def only(p: Any) -> bool:
        return (names is None or p.name in names) and not (args.no_slow and slow_compile(p))

    records = _JsonlList(args.out)
    run_probes(args.budget, records, quick=args.quick, compile_workers=args.workers, only=only)
    errors = sum(1 for r in records if r["kind"] != "probe")
    sys.stderr.write(f"{len(records)} records, {errors} errors\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
