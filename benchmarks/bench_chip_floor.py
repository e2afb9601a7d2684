"""K3's per-device program on the TPU v5e against its physical floor, predicted before it ran.

From committed records only (no TPU needed)::

    .venv/bin/python benchmarks/bench_chip_floor.py [--decoder fp8-pairs]

For each K3-shard decode of the kernel with ``--decoder`` (default: the kernel as it is now,
:data:`megakernel.quant_pairs.KERNEL_DECODER`), measured on tpu-v5e
(``calibration/data/tpu-v5e-kernel.jsonl``): ms per step, HBM GB per step, the **floor** —
the step's HBM bytes at the chip's streaming rate plus one empty call, both from the probes of
the same device session (or, for a session that ran none, the latest one before it, named) (``dma_stream`` copies of >= 4 MiB less the empty call, and
``empty_call``; ``calibration/data/tpu-v5e-probes.jsonl``) — the ratio measured / floor, the
plain-JAX/XLA step on the same chip and bytes where it ran beside the kernel
(``tpu-v5e-xla.jsonl``), and the predictions recorded before the run
(``tpu-v5e-predictions.jsonl``) with their errors: the simulator's
(:mod:`calibration.reports.tpu_v5e_plan`) and, for a kernel build first predicted from measured
variants, the derived one (:mod:`calibration.reports.tpu_v5e_derived`). One kernel build a
table (``--panel-unroll DENSE EXPERT``, default the kernel's). A second table sets the step's
non-expert work beside plain XLA's with no routed expert, per session that timed it.
Exit 2 when a records file is missing or the decoder has no runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import sys
from pathlib import Path
from typing import Any

from calibration.sources.tpu_chip_records import most_measured_build
from calibration.sources.tpu_probes import SUSTAINED, probe_figures, record_decoder
from hwmodels.errors import InputError
from hwmodels.records.kernel import WALK, record_unroll
from megakernel.quant_pairs import KERNEL_DECODER
from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, PANEL_UNROLL

DATA = Path(__file__).resolve().parents[1] / "calibration" / "data"
SESSION = dt.timedelta(minutes=12)  # one device call (at most 10 minutes): its probes follow its kernel runs
PROBE_RUN = dt.timedelta(minutes=15)  # one call's probes: an earlier call's are not pooled with them


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _when(record: dict[str, Any]) -> dt.datetime:
    text = record.get("date") or record["provenance"].split("date=")[1].split()[0]
    return dt.datetime.fromisoformat(text)


def session_floor_figures(probes: list[dict[str, Any]], at: dt.datetime) -> tuple[float, float, str]:
    """(streaming bytes/s, empty call s, where from) from the probes of the device session at
    ``at``; a session that ran none takes the latest session's before it, and says so."""
    ok = [r for r in probes if r.get("check") == "ok" and r["probe"] in ("dma_stream", "empty_call")]

    def figures(near: list[dict[str, Any]]) -> tuple[float, float] | None:
        stream, empty = probe_figures(near), [r["seconds_median"] for r in near if r["probe"] == "empty_call"]
        return (stream[SUSTAINED].value, min(empty)) if SUSTAINED in stream and empty else None

    same = figures([r for r in ok if dt.timedelta(0) <= _when(r) - at <= SESSION])
    if same is not None:
        return *same, f"the same session, {at.date()}"
    before = sorted((r for r in ok if _when(r) < at), key=_when)
    if before:
        last = _when(before[-1])
        earlier = figures([r for r in before if last - _when(r) <= PROBE_RUN])
        if earlier is not None:
            return *earlier, f"the latest session before, {last.isoformat(timespec='minutes')}"
    raise LookupError(f"no dma_stream/empty_call probes at or before {at.isoformat()}")


def _decodes(data: Path) -> list[dict[str, Any]]:
    """Every kernel run: at the defaults of its day, and the other builds' (each row names its build)."""
    variants = data / "tpu-v5e-kernel-variants.jsonl"
    return _rows(data / "tpu-v5e-kernel.jsonl") + (_rows(variants) if variants.exists() else [])


def table(decoder: str = KERNEL_DECODER, data: Path = DATA,
          unroll: tuple[int, int] = (PANEL_UNROLL, EXPERT_PANEL_UNROLL)) -> list[str]:
    kernel = [r for r in _decodes(data)
              if r.get("shard_of") == "k3-tp32" and record_decoder(r) == decoder and r.get("expert_cap") is None
              and record_unroll(r) == unroll]
    if not kernel:
        raise LookupError(f"no K3-shard runs of decoder {decoder}")
    probes = _rows(data / "tpu-v5e-probes.jsonl")
    xla = {(r["stands_next_to"]["schedule_hash"], r["batch"]): r for r in _rows(data / "tpu-v5e-xla.jsonl")
           if "stands_next_to" in r and r.get("expert_cap") is None}
    predictions = [r for r in _rows(data / "tpu-v5e-predictions.jsonl")
                   if r["decoder"] == decoder and record_unroll(r) == unroll and r.get("expert_cap") is None]
    lines = [f"K3 TP32 per-device program, decoder {decoder}, panel loops {unroll[0]} (dense) and {unroll[1]} "
             "(experts) panels an iteration, measured on tpu-v5e; floor = HBM bytes / the streaming rate + one empty "
             "call, both from the run's own device session's probes (dma_stream, empty_call), or the latest "
             "session's before it where it ran none (marked *)",
             "| schedule | batch | measured ms | GB/step | GB/s (dma_stream) | floor ms (analytic) | measured/floor "
             "| XLA ms (measured) | kernel/XLA | predicted ms (simulated, recorded before the run) | error "
             "| predicted ms (derived, recorded before the run) | error |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(kernel, key=lambda r: (r["batch"], r["ms_per_step_median"])):
        gb = r["hbm_bytes_per_step"] / 1e9
        rate, empty, where = session_floor_figures(probes, _when(r))
        mark = "" if where.startswith("the same session") else "*"
        floor_ms = (r["hbm_bytes_per_step"] / rate + empty) * 1e3
        ms = r["ms_per_step_median"]
        base = xla.get((r["schedule_hash"], r["batch"]))
        if base is not None and abs(_when(base) - _when(r)) > SESSION:
            base = None  # an XLA run of another session (another kernel) is not this run's baseline
        xla_ms = f"{base['ms_per_step_median']:.1f}" if base else "—"
        ratio = f"{ms / base['ms_per_step_median']:.3f}" if base else "—"
        cells = []
        for derived in (False, True):
            pred = next((p for p in reversed(predictions) if p["batch"] == r["batch"] and _when(p) < _when(r)
                         and p["label"].startswith("derived") == derived
                         and Path(p["schedule"]).stem in (r["schedule"], _stem_of(r))), None)
            cells += [f"{pred['predicted_ms']:.2f}", f"{pred['predicted_ms'] / ms - 1:+.1%}"] if pred else ["—", "—"]
        lines.append(f"| {r['schedule']}{_listed(r)} | {r['batch']} | {ms:.2f} ± {r['ms_per_step_spread']:.2f} | {gb:.2f} | "
                     f"{rate / 1e9:.0f}{mark} | {floor_ms:.1f} | {ms / floor_ms:.2f} | {xla_ms} | {ratio} | "
                     + " | ".join(cells) + " |")
    return lines


def variants_table(decoder: str = KERNEL_DECODER, data: Path = DATA,
                   shown: tuple[tuple[int, int], ...] = ()) -> list[str]:
    """The kernel's variants (``tpu-v5e-kernel-variants.jsonl``: knobs away from the defaults
    of their day) of builds other than ``shown``, each beside its floor and the simulator's
    prediction recorded before it ran."""
    path = data / "tpu-v5e-kernel-variants.jsonl"
    if not path.exists():
        return []
    probes = _rows(data / "tpu-v5e-probes.jsonl")
    predictions = [r for r in _rows(data / "tpu-v5e-predictions.jsonl")
                   if r["decoder"] == decoder and r.get("kernel_variant") and not r["label"].startswith("derived")
                   and r.get("expert_cap") is None]
    lines = ["| schedule | batch | panel loops (dense, experts) | measured ms | floor ms (analytic) | measured/floor "
             "| predicted ms (simulated, recorded before the run) | error |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in sorted((r for r in _rows(path) if record_decoder(r) == decoder and record_unroll(r) not in shown),
                    key=lambda r: (r["batch"], _when(r))):
        rate, empty, _ = session_floor_figures(probes, _when(r))
        floor_ms = (r["hbm_bytes_per_step"] / rate + empty) * 1e3
        ms = r["ms_per_step_median"]
        pred = next((p for p in reversed(predictions) if p["batch"] == r["batch"] and record_unroll(p) == record_unroll(r)
                     and _when(p) < _when(r) and Path(p["schedule"]).stem in (r["schedule"], _stem_of(r))), None)
        cells = [f"{pred['predicted_ms']:.2f}", f"{pred['predicted_ms'] / ms - 1:+.1%}"] if pred else ["—", "—"]
        lines.append(f"| {r['schedule']} | {r['batch']} | {record_unroll(r)[0]}, {record_unroll(r)[1]} | {ms:.2f} | "
                     f"{floor_ms:.1f} | {ms / floor_ms:.2f} | " + " | ".join(cells) + " |")
    return lines


def _expert_layers(record: dict[str, Any]) -> int:
    """Routed experts the run multiplied, summed over layers (its cap applied)."""
    cap = record.get("expert_cap")
    return sum(n if cap is None else min(n, cap) for n in record["experts_per_layer"])


def nonexpert_table(data: Path = DATA) -> list[str]:
    """The step's non-expert work both ways, per session that timed the plain-XLA step with no
    routed expert (``tpu-v5e-xla-capped.jsonl``, cap 0: measured) beside the kernel: the kernel's
    own at 0 experts is derived — the line through its capped run(s) and its full decode of the
    same session, in routed expert-layers, read at 0 — where the session capped the kernel; the
    kernel's whole step stands beside it either way."""
    capped_xla = [r for r in _rows(data / "tpu-v5e-xla-capped.jsonl") if r.get("expert_cap") == 0]
    kernel = [r for r in _decodes(data) if r.get("shard_of") == "k3-tp32"]
    capped_kernel = [r for r in _rows(data / "tpu-v5e-fixed-cost.jsonl") if r.get("shard_of") == "k3-tp32"]
    lines = ["| batch | panel loops (dense, experts) | XLA, no routed expert (measured) | kernel's whole step (measured) "
             "| kernel at 0 experts (derived: line through its capped and full runs) | kernel/XLA, non-expert |",
             "|---:|---|---:|---:|---:|---:|"]
    for x in sorted(capped_xla, key=lambda r: (r["batch"], _when(r))):
        near = [r for r in kernel if r["batch"] == x["batch"] and r["schedule_hash"] == x["stands_next_to"]["schedule_hash"]
                and abs(_when(r) - _when(x)) <= SESSION]
        if not near:
            continue
        def caps_of(full: dict[str, Any], batch: int = x["batch"]) -> list[dict[str, Any]]:
            return [r for r in capped_kernel if r["batch"] == batch and r["schedule_hash"] == full["schedule_hash"]
                    and abs(_when(r) - _when(full)) <= SESSION and record_unroll(r) == record_unroll(full)]
        # the build the session capped (its line reads the non-expert part), else the nearest run
        full = min(near, key=lambda r: (not caps_of(r), abs(_when(r) - _when(x))))
        caps = caps_of(full)
        intercept = "—"
        ratio = f"<= {full['ms_per_step_median'] / x['ms_per_step_median']:.3f} (whole step)"
        if caps:
            points = [(_expert_layers(r), r["ms_per_step_median"]) for r in (*caps, full)]
            (e0, t0), (e1, t1) = min(points), max(points)
            at0 = t0 - e0 * (t1 - t0) / (e1 - e0)
            intercept, ratio = f"{at0:.2f}", f"{at0 / x['ms_per_step_median']:.3f}"
        build = record_unroll(full)
        lines.append(f"| {x['batch']} | {build[0]}, {build[1]}{_listed(full)} | {x['ms_per_step_median']:.1f} | {full['ms_per_step_median']:.2f} | "
                     f"{intercept} | {ratio} |")
    return lines


def nonexpert_by_caps(data: Path = DATA) -> list[str]:
    """Each kernel build's step at 0 experts from its capped runs alone (a device session that
    capped the kernel at >= 2 expert counts with no XLA beside it): the least-squares line in
    routed expert-layers, read at 0 (derived), beside the latest plain-XLA step with no routed
    expert at that batch (measured, in another session: named)."""
    capped_xla = [r for r in _rows(data / "tpu-v5e-xla-capped.jsonl") if r.get("expert_cap") == 0]
    capped = [r for r in _rows(data / "tpu-v5e-fixed-cost.jsonl") if r.get("shard_of") == "k3-tp32"]
    sessions: dict[tuple[Any, ...], list[list[dict[str, Any]]]] = {}
    for r in sorted(capped, key=_when):
        key = (r["batch"], r["schedule_hash"], record_unroll(r), record_decoder(r), r.get("expert_list", WALK))
        runs_of = sessions.setdefault(key, [])
        if not runs_of or _when(r) - _when(runs_of[-1][-1]) > SESSION:
            runs_of.append([])
        runs_of[-1].append(r)
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for key, runs_of in sessions.items():
        # the latest session with two caps of the build; a later session's other caps join it
        base = next((i for i in reversed(range(len(runs_of))) if len({r["expert_cap"] for r in runs_of[i]}) >= 2), None)
        if base is None:
            continue
        group = list(runs_of[base])
        for later in runs_of[base + 1:]:
            group += [r for r in later if r["expert_cap"] not in {g["expert_cap"] for g in group}]
        groups[key] = group
    lines = []
    for (batch, _, unroll, decoder, listed), runs in groups.items():
        if len({r["expert_cap"] for r in runs}) < 2 or any(abs(_when(x) - _when(runs[0])) <= SESSION for x in capped_xla):
            continue
        xs = [float(_expert_layers(r)) for r in runs]
        ys = [r["ms_per_step_median"] for r in runs]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        at0 = my - slope * mx
        xla = max((x for x in capped_xla if x["batch"] == batch), key=_when, default=None)
        versus = (f"{at0 / xla['ms_per_step_median']:.3f} (XLA's {xla['ms_per_step_median']:.1f} ms, measured "
                  f"{_when(xla).date()}, another session)") if xla else "—"
        caps = ", ".join(f"{r['schedule']} c={r['expert_cap']}" for r in runs)
        lines.append(f"- {decoder}, panel loops {unroll[0]}/{unroll[1]}, {listed} expert list, batch {batch}: "
                     f"**{at0:.2f} ms** at 0 experts "
                     f"(derived from {caps}, {_when(runs[0]).isoformat(timespec='minutes')}; "
                     f"{slope * 1e3:.2f} µs a routed expert-layer); kernel/XLA non-expert {versus}")
    return lines


@functools.cache
def _schedule_files() -> dict[str, Path]:
    from calibration.sources.tpu_chip_records import schedules_by_hash

    return schedules_by_hash()  # reads every schedule file: once per run, not once per row


def _listed(record: dict[str, Any]) -> str:
    """`` (vector list)`` for a run whose moe.topk built the expert list as vectors; runs
    before the field walked it (:class:`hwmodels.records.kernel.KernelRecord`)."""
    listed = record.get("expert_list", WALK)
    return "" if listed == WALK else f" ({listed} list)"


def _stem_of(record: dict[str, Any]) -> str:
    path = _schedule_files().get(record["schedule_hash"])
    return path.stem if path is not None else record["schedule"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_chip_floor", allow_abbrev=False)
    parser.add_argument("--decoder", default=KERNEL_DECODER)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--panel-unroll", type=int, nargs=2, default=None, metavar=("DENSE", "EXPERT"),
                        help="the kernel build: panels a panel loop's iteration issues (default: the kernel's "
                             "own, then the build with the most committed decodes)")
    args = parser.parse_args(argv)
    try:
        builds = ([tuple(args.panel_unroll)] if args.panel_unroll else
                  list(dict.fromkeys([(PANEL_UNROLL, EXPERT_PANEL_UNROLL), most_measured_build(args.decoder)])))
        tables = [table(args.decoder, args.data, build) for build in builds]  # type: ignore[arg-type]
    except (FileNotFoundError, LookupError, KeyError, ValueError, InputError) as error:
        sys.stderr.write(f"bench_chip_floor: {error}\n")
        return 2
    sys.stdout.write("\n\n".join("\n".join(lines) for lines in tables) + "\n")
    variants = variants_table(args.decoder, args.data, tuple(builds))  # type: ignore[arg-type]
    if variants:
        sys.stdout.write("\nThe kernel's other builds (knobs away from the defaults of their day), measured on tpu-v5e; "
                         "floors analytic:\n" + "\n".join(variants) + "\n")
    if (args.data / "tpu-v5e-xla-capped.jsonl").exists():
        sys.stdout.write("\nThe step's non-expert work, kernel and plain XLA in the same device session "
                         "(panel loops as the kernel then was):\n" + "\n".join(nonexpert_table(args.data)) + "\n")
        by_caps = nonexpert_by_caps(args.data)
        if by_caps:
            sys.stdout.write("\nThe kernel's step at 0 experts from its capped runs alone (sessions with no XLA beside "
                             "them):\n" + "\n".join(by_caps) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
