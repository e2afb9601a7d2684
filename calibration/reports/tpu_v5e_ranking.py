"""Do schedules matter on the chip, and does the simulator rank them as the chip does?

``python -m calibration.reports.tpu_v5e_ranking [--panel-unroll DENSE EXPERT]``: for each batch
at which the kernel build (decoder :data:`megakernel.quant_pairs.KERNEL_DECODER`, panel loops
``--panel-unroll``, default the build with the most committed decodes: where the ranking sets
ran) ran at least three schedules on tpu-v5e (``calibration/data/tpu-v5e-kernel.jsonl`` and
``-kernel-variants.jsonl``): the measured spread (best, worst, worst without
``naive``), whether the sweep's pick (a schedule named ``best-*``) is the measured best,
and Kendall's τ between the measured order and the simulator's — the chip of
:func:`calibration.reports.tpu_v5e_plan.build_chip` (refit by way (b) on the build's own capped
runs; its decodes never read). Points measured before that refit existed are simulated after
the fact: the τ is the simulator's ranking, not a prediction recorded before the runs (those
are in ``tpu-v5e-predictions.jsonl``, beside each run in ``benchmarks/bench_chip_floor.py``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from calibration.core.fitting import rank_agreement
from calibration.reports.tpu_v5e_plan import build_chip, simulate_build
from calibration.sources.tpu_chip_records import most_measured_build
from megakernel.quant_pairs import KERNEL_DECODER

MIN_SCHEDULES = 3


@dataclass(frozen=True)
class Ranking:
    batch: int
    measured_ms: dict[str, float]
    simulated_ms: dict[str, float]

    @property
    def tau(self) -> float:
        names = sorted(self.measured_ms)
        return rank_agreement([self.measured_ms[n] for n in names], [self.simulated_ms[n] for n in names])

    @property
    def pick_is_best(self) -> bool | None:
        picks = [n for n in self.measured_ms if n.startswith("best-")]
        if not picks:
            return None
        return min(self.measured_ms, key=self.measured_ms.__getitem__) in picks


def rankings(unroll: tuple[int, int] | None = None) -> list[Ranking]:
    """One :class:`Ranking` per batch with >= :data:`MIN_SCHEDULES` schedules of the build
    (default: the build with the most committed decodes, where the ranking sets ran)."""
    unroll = unroll or most_measured_build(KERNEL_DECODER)
    chip, _ = build_chip(KERNEL_DECODER, unroll)
    simulated = simulate_build(chip, unroll)
    out = []
    for batch in sorted({r.batch for r, _ in simulated}):
        at = [(r, ms) for r, ms in simulated if r.batch == batch]
        if len(at) >= MIN_SCHEDULES:
            out.append(Ranking(batch, {r.schedule: r.ms_median for r, _ in at}, {r.schedule: ms for r, ms in at}))
    return out


def report(found: list[Ranking]) -> list[str]:
    lines = []
    for k in found:
        measured = sorted(k.measured_ms.items(), key=lambda item: item[1])
        without_naive = [ms for name, ms in measured if name != "naive"]
        pick = {None: "no sweep pick ran", True: "the sweep's pick is the measured best",
                False: "the sweep's pick is not the measured best"}[k.pick_is_best]
        lines.append(f"batch {k.batch}: {len(measured)} schedules measured on tpu-v5e {measured[0][1]:.2f}-{measured[-1][1]:.2f} ms "
                     f"(without naive {without_naive[0]:.2f}-{without_naive[-1]:.2f}, "
                     f"{without_naive[-1] / without_naive[0] - 1:.1%} spread); {pick}; Kendall tau simulated (refit chip, after the runs) vs "
                     f"measured {k.tau:.2f}")
        for name, ms in measured:
            lines.append(f"  {name}: measured {ms:.2f}, simulated {k.simulated_ms[name]:.2f} "
                         f"({k.simulated_ms[name] / ms - 1:+.1%})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.reports.tpu_v5e_ranking", allow_abbrev=False)
    parser.add_argument("--panel-unroll", type=int, nargs=2, default=None,
                        metavar=("DENSE", "EXPERT"))
    args = parser.parse_args(argv)
    sys.stdout.write("\n".join(report(rankings(tuple(args.panel_unroll) if args.panel_unroll else None))) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
