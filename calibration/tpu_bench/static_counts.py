"""The probes' static schedules: libtpu's bundles per panel (expert parts) or per repetition
(``code_size``, ``--code-size``; ``kda_core``, ``--kda-core``), on this machine.

For each ``expert_product`` probe (:mod:`calibration.tpu_bench.probes_products`) this compiles
the probe for a compile-only topology with libtpu's dump on (a fresh process per probe: libtpu
reads ``LIBTPU_INIT_ARGS`` once), reads the kernel's schedule
(:mod:`calibration.sources.compiler_schedule`) and reports the panel loop — the innermost loop
body, one 128-column panel of the part — as bundles and unit operations per panel and per
weight. Bundles per panel x panels / the chip's clock is the part's static compute time (no
stall counted).

``python -m calibration.tpu_bench.static_counts [--topology v5e:2x2] [--code-size | --kda-core] [--out FILE.jsonl]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
from typing import Any

from calibration.sources.compiler_schedule import read_dump
from hwmodels.records.jsonl import append_record, record_line

VREG_LANES = 8 * 128
TOPOLOGIES = {"v5e:2x2": "tpu-v5e", "tpu7x:2x2x1": "tpu-v7"}
STATIC_ROWS_MAX = 16  # the largest batch the v5e sets run: its products take two 8-row sublane tiles


def _compile_in_this_process(part: str, decoder: str, rows: int, topology: str) -> None:
    from calibration.tpu_bench.common import compile_for, topology_device
    from calibration.tpu_bench.probes_products import _product_probe

    probe = _product_probe(part, decoder, rows, (1,), None)
    compile_for(probe, topology_device(topology))


def count(part: str, decoder: str, rows: int, topology: str = "v5e:2x2") -> dict[str, Any]:
    """One probe's panel-loop counts (compiles in a subprocess with the dump on)."""
    from calibration.tpu_bench.probes_products import _geometry

    panels, k, _, _ = _geometry(part)
    schedule = _schedule_of(f"_compile_in_this_process({part!r}, {decoder!r}, {rows}, {topology!r})",
                            f"{part}/{decoder}/rows {rows}")
    inner = schedule.innermost()
    panel = max(inner, key=lambda loop: loop.bundles)  # the panel loop dominates the kernel
    weights = k * 128
    return {
        "kind": "static_schedule", "probe": "expert_product", "topology": topology,
        "chip": TOPOLOGIES.get(topology, topology),
        "params": {"part": part, "decoder": decoder, "rows": rows, "panels": panels, "k": k},
        "panel_bundles": panel.bundles, "panel_units": panel.units,
        "bundles_per_weight": panel.bundles / weights,
        # a VALU instruction works on one vreg: 8 sublanes x 128 lanes of 32-bit values
        "valu_ops_per_weight": panel.units.get("VALU", 0) * VREG_LANES / weights,
        "part_bundles": panel.bundles * panels, "kernel_bundles": schedule.total_bundles,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "source": "libtpu final bundles (compile-only topology, this machine)",
    }


def _compile_code_in_this_process(rounds: int, form: str, topology: str) -> None:
    from calibration.tpu_bench.common import compile_for, topology_device
    from calibration.tpu_bench.probes_code import _code_probe

    compile_for(_code_probe(rounds, form, (1,), None), topology_device(topology))


def count_code(rounds: int, form: str, topology: str = "v5e:2x2") -> dict[str, Any]:
    """The ``code_size`` probe's bundles a repetition (:mod:`calibration.tpu_bench.probes_code`):
    the repetition loop's own bundles plus, in the looped form, its inner loop's body times
    its trips (``rounds / 8``); the distinct code a repetition runs is ``code_bundles``."""
    from calibration.tpu_bench.probes_code import INNER_ROUNDS

    schedule = _schedule_of(f"_compile_code_in_this_process({rounds}, {form!r}, {topology!r})",
                            f"code_size {form} rounds {rounds}")
    repetition = max(schedule.loops, key=lambda loop: loop.bundles)  # the fori_loop over R
    inner = repetition.children
    trips = rounds // INNER_ROUNDS if form == "looped" else 1
    if form == "looped" and len(inner) != 1:
        raise RuntimeError(f"code_size looped rounds {rounds}: expected one inner loop, found {len(inner)}")
    issued = repetition.own_bundles + sum(child.bundles for child in inner) * trips
    valu = repetition.units.get("VALU", 0) + sum(child.units.get("VALU", 0) for child in inner) * trips
    return {
        "kind": "static_schedule", "probe": "code_size", "topology": topology,
        "chip": TOPOLOGIES.get(topology, topology),
        "params": {"rounds": rounds, "form": form},
        "repetition_bundles": issued, "code_bundles": repetition.bundles, "valu_ops": valu,
        "loop_iterations": 1 + (trips if form == "looped" else 0),  # the repetition's back edge, the inner loop's
        "kernel_bundles": schedule.total_bundles,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "source": "libtpu final bundles (compile-only topology, this machine)",
    }


def _compile_kda_core_in_this_process(batch: int, topology: str) -> None:
    from calibration.tpu_bench.common import compile_for, topology_device
    from calibration.tpu_bench.probes_attention import kda_core_probes

    probe = next(p for p in kda_core_probes(None, False) if p.params["batch"] == batch)
    compile_for(probe, topology_device(topology))


def count_kda_core(batch: int, topology: str = "v5e:2x2") -> dict[str, Any]:
    """The ``kda_core`` probe's bundles a repetition (:mod:`calibration.tpu_bench.probes_attention`):
    the repetition loop's body — one KDA layer's core, its state copies' issues and waits
    included — straight-line code, checked to hold no inner loop."""
    schedule = _schedule_of(f"_compile_kda_core_in_this_process({batch}, {topology!r})", f"kda_core batch {batch}")
    repetition = max(schedule.loops, key=lambda loop: loop.bundles)  # the fori_loop over R
    if repetition.children:
        raise RuntimeError(f"kda_core batch {batch}: the repetition holds {len(repetition.children)} inner loops")
    return {
        "kind": "static_schedule", "probe": "kda_core", "topology": topology,
        "chip": TOPOLOGIES.get(topology, topology), "params": {"batch": batch},
        "repetition_bundles": repetition.bundles, "valu_ops": repetition.units.get("VALU", 0),
        "loop_iterations": 1, "kernel_bundles": schedule.total_bundles,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "source": "libtpu final bundles (compile-only topology, this machine)",
    }


def _schedule_of(call: str, what: str) -> Any:
    """Compile by ``call`` (a function of this module) in a fresh process with libtpu's dump
    on and read the probe kernel's schedule."""
    with tempfile.TemporaryDirectory(prefix="llo-") as dump:
        env = {**os.environ, "TPU_SKIP_MDS_QUERY": "1", "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
               "LIBTPU_INIT_ARGS": f"--xla_jf_dump_to={dump}"}
        code = f"from calibration.tpu_bench import static_counts as s; s.{call}"
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"compile of {what} failed: {done.stderr[-2000:]}")
        return read_dump(dump, "tpu_custom_call")  # the probe kernel, not a (larger) copy program


def main(argv: list[str] | None = None) -> int:
    from calibration.tpu_bench.probes_products import (
        MXU_DECODERS,
        PARTS,
        PRODUCT_DECODERS,
        PRODUCT_ROWS,
    )
    from megakernel.quant_mxu import ROW_EXPANSION_MAX_ROWS

    parser = argparse.ArgumentParser(prog="python -m calibration.tpu_bench.static_counts", allow_abbrev=False)
    parser.add_argument("--topology", default="v5e:2x2", choices=sorted(TOPOLOGIES))
    parser.add_argument("--out", default=None, help="append JSON lines here (default: stdout)")
    parser.add_argument("--code-size", action="store_true",
                        help="count the code_size probe's two forms at each size instead of the expert parts")
    parser.add_argument("--kda-core", action="store_true",
                        help="count the kda_core probe's repetition at 1, 4, 8 and 16 rows instead")
    parser.add_argument("--part", action="append", choices=sorted(PARTS))
    parser.add_argument("--decoder", action="append", choices=PRODUCT_DECODERS + MXU_DECODERS,
                        help="default: the decoders, and on tpu7x also the FP8 MXU products")
    # rows 2 as well: the largest batch whose MXFP4 down the TPU7x kernel multiplies row by row;
    # 16: the largest batch the v5e sets run (two 8-row sublane tiles a product)
    parser.add_argument("--rows", action="append", type=int,
                        choices=sorted({*PRODUCT_ROWS, ROW_EXPANSION_MAX_ROWS, STATIC_ROWS_MAX}))
    args = parser.parse_args(argv)
    records: list[dict[str, Any]] = []
    if args.code_size:
        from calibration.tpu_bench.probes_code import CODE_ROUNDS

        for rounds in CODE_ROUNDS:
            for form in ("looped", "straight"):
                record = count_code(rounds, form, args.topology)
                records.append(record)
                sys.stderr.write(f"code_size {form} rounds {rounds}: {record['repetition_bundles']} bundles a "
                                 f"repetition, {record['code_bundles']} of code\n")
    if args.kda_core:
        from calibration.tpu_bench.probes_attention import KDA_BATCHES

        for batch in KDA_BATCHES:
            record = count_kda_core(batch, args.topology)
            records.append(record)
            sys.stderr.write(f"kda_core batch {batch}: {record['repetition_bundles']} bundles a repetition\n")
    for part in () if args.code_size or args.kda_core else args.part or PARTS:
        for rows in args.rows or PRODUCT_ROWS:
            fp8_chip = TOPOLOGIES.get(args.topology) == "tpu-v7"
            for decoder in args.decoder or PRODUCT_DECODERS + (MXU_DECODERS if fp8_chip else ()):
                if decoder == "fold" and part != "down":
                    continue
                record = count(part, decoder, rows, args.topology)
                records.append(record)
                sys.stderr.write(f"{part} {decoder} rows {rows}: {record['panel_bundles']} bundles/panel, "
                                 f"{record['valu_ops_per_weight']:.2f} VALU ops/weight\n")
    if args.out:
        for record in records:
            append_record(args.out, record, sort_keys=True)
    else:
        sys.stdout.write("".join(record_line(r, sort_keys=True) + "\n" for r in records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
