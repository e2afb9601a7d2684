"""Capacity first: a command that takes a model and a system checks HBM before anything else.

Weights + KV cache + recurrent state per device (:mod:`tpusim.workload.capacity`, the one
owner of that arithmetic) against the device's HBM. A deployment that does not fit stops
with the numbers, exit 2, before any routing draw, schedule or simulation; a step time for
a system that cannot hold the model is a confident wrong number. ``--force`` simulates it
anyway and every result it prints carries the label ``does not fit``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from functools import partial
from typing import Any

from hwmodels.errors import InputError

DOES_NOT_FIT = "does not fit"
FITS = "fits"
GB = 1e9


@dataclass(frozen=True)
class FitVerdict:
    """Whether the model's shard and cache fit one device's HBM (bytes per device)."""

    fits: bool
    needed_bytes_per_device: int
    hbm_bytes_per_device: float
    reason: str

    @property
    def label(self) -> str:
        return FITS if self.fits else DOES_NOT_FIT

    def as_json(self) -> dict[str, Any]:
        return {"fits": self.fits, "label": self.label, "needed_bytes_per_device": self.needed_bytes_per_device,
                "hbm_bytes_per_device": self.hbm_bytes_per_device, "reason": self.reason,
                "summary": self.summary()}

    def summary(self) -> str:
        """``150.2 / 94.7 GB per device (fits)``: needed / available, and the verdict."""
        return (f"{self.needed_bytes_per_device / GB:.1f} / {self.hbm_bytes_per_device / GB:.1f} GB per device "
                f"({self.label})")


def add_force_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true",
                        help="simulate even if the model does not fit HBM; the result is labelled 'does not fit'")


def check_fit(args: argparse.Namespace, model: Any, plan: Any, system: Any) -> FitVerdict:
    """The verdict for the parsed ``--batch``/``--context``; InputError unless it fits or ``--force``."""
    from tpusim.workload.capacity import capacity_report, check_capacity
    from tpusim.workload.model_catalog import plan_for_system

    batch = getattr(args, "batch", 1)
    context_tokens = args.context
    if model.max_context_tokens is not None and context_tokens > model.max_context_tokens:
        raise InputError(f"--context {context_tokens}: {model.name} supports at most {model.max_context_tokens} "
                         f"tokens of context ({model.source})")
    report = capacity_report(model, plan, system.chip, batch=batch, context_tokens=context_tokens)
    reason = ""
    if report.fits and "force" in getattr(args, "given", ()):  # --force would change nothing: say so, once
        raise InputError(f"--force: {model.name} on {system.name} fits HBM at batch {batch}, context {context_tokens} "
                         f"({report.total_bytes / GB:.1f} / {report.capacity_bytes / GB:.1f} GB per device); "
                         "nothing to force, drop --force")
    if not report.fits:
        try:
            check_capacity(model, plan, system.chip, chips=system.chips, batch=batch, context_tokens=context_tokens,
                           plan_for_chips=partial(plan_for_system, model, system.chip, choice=getattr(args, "plan", None)))
        except InputError as error:
            reason = str(error)
        if not getattr(args, "force", False):
            raise InputError(f"{reason} (--force simulates it anyway, labelled '{DOES_NOT_FIT}')")
        print(f"tpusim {args.command}: warning: {reason}; simulating anyway (--force), every result is "
              f"labelled '{DOES_NOT_FIT}'", file=sys.stderr)
    return FitVerdict(report.fits, report.total_bytes, report.capacity_bytes, reason)
