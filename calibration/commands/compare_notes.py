"""What ``tpusim compare`` prints under its table from calibration: the compiler-priced TPU v7.

``tpusim compare`` (:mod:`tpusim.app.cli.compare`) calls every entry point of group
``tpusim.compare_notes`` (:mod:`tpusim.app.plugins`); this is calibration's, registered in
``pyproject.toml``, so that the ground floor names no module of this layer.
"""

from __future__ import annotations

import argparse

# The K3 deployment libtpu compiled the TPU7x static schedule for: 16 chips (32 devices, k3-tp32).
COMPILER_PRICED_MODEL, COMPILER_PRICED_SYSTEM = "kimi-k3", ("tpu-v7", 16)


def compiler_priced_notes(args: argparse.Namespace, systems: list, batches: list[int]) -> list[str]:
    """The ``compiler-priced`` entry point of group ``tpusim.compare_notes``: K3 on 16 TPU v7
    priced by its compiler (:mod:`calibration.reports.tpu_v7_compiler_priced`): a line per
    batch with its interval from the v5e first-principles residuals, under the table (about
    20 s). Only for the program the static schedule was compiled for: kimi-k3 in its own
    formats and plan on tpu-v7:16 running the megakernel; other rows get no such line."""
    wanted = [spec for spec in systems if (spec.chip, spec.chips) == COMPILER_PRICED_SYSTEM
              and spec.execution in ("default", "megakernel")]
    if args.model != COMPILER_PRICED_MODEL or not wanted or args.formats or args.plan not in (None, "auto"):
        return []
    from calibration.reports.tpu_v7_compiler_priced import (
        LABEL,
        CompilerPricedConfig,
        interval_note,
        predict,
    )

    config = CompilerPricedConfig(model=args.model, chips=COMPILER_PRICED_SYSTEM[1], batches=tuple(batches),
                                  context_tokens=args.context, routing=args.routing, seed=args.seed)
    lines = [f"{wanted[0].label} {LABEL}, schedule {config.schedule}:"]
    for row in predict(config):
        lines.append(f"  batch {row.batch}: {row.step_ms:.3f} ms [{row.step_ms_low:.3f}–{row.step_ms_high:.3f}] "
                     f"(width {row.width_rel:.1%}), {row.batch / row.step_ms * 1e3:.1f} tokens/s; "
                     f"catalog figures {row.catalog_ms:.3f} ms, components fitted {row.parts_ms:.3f} ms")
    return [*lines, f"  {interval_note()}"]
