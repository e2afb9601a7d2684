"""One entry point for measurement sources, and the rules for which may calibrate what.

Sources (:func:`load_measurements`):

- ``published:tpu7x-musespark`` — the published TPU7x set (:mod:`calibration.sources.tpu7x_published`),
  read by the source the registry (:mod:`calibration.sources.registry`) names for it;
- a ``.jsonl`` file — measurement records (:mod:`calibration.sources.measurements`), including the
  kernel runner's records (:func:`read_kernel_records`), which use the same schema
  (``schedule_name`` is accepted for ``schedule``; extra keys are kept in ``extra``).

``jax.profiler`` traces carry timings but not the workload, so they enter through
:func:`calibration.sources.profiler.trace_measurement` (which takes the model, system and batch) and
are appended to a ``.jsonl`` file like any other record.

Honest labels: a record timed on the Pallas interpreter (``backend: cpu-interpret``) measures
the host CPU running an interpreter, not a TPU; :func:`usable_for` refuses to calibrate any
accelerator with it, and says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from calibration.sources.measurements import Measurement, read_measurements
from calibration.sources.registry import PUBLISHED_PREFIX, published_records, published_sets
from hwmodels.catalog import display_path
from hwmodels.errors import InputError

INTERPRETER_BACKENDS = ("cpu-interpret",)


def load_measurements(spec: str) -> list[Measurement]:
    """Records from ``published:<name>`` (read by the source the registry names for it,
    :func:`calibration.sources.registry.published_records`) or a ``.jsonl`` path (see the
    module docstring)."""
    if spec.startswith(PUBLISHED_PREFIX):
        return published_records(spec)
    path = Path(spec)
    if path.is_dir() or spec.endswith((".trace.json.gz", ".trace.json")):
        raise InputError(
            f"{display_path(path)}: a profiler trace has no workload description; convert it "
            "with calibration.sources.profiler.trace_measurement and append it to a .jsonl file"
        )
    if not path.exists():
        known = ", ".join(published_sets())
        raise InputError(f"--measurements {spec}: no such file (or use {known})")
    return read_measurements(path)


def read_kernel_records(path: Path | str, *, backend: str | None = None) -> list[Measurement]:
    """The kernel runner's records (same JSONL schema), optionally only one ``backend``."""
    records = read_measurements(path)
    if backend is None:
        return records
    chosen = [r for r in records if r.backend == backend]
    if not chosen:
        found = ", ".join(sorted({r.backend for r in records}))
        raise InputError(f"{display_path(path)}: no records with backend {backend!r} (found: {found})")
    return chosen


def usable_for(records: Sequence[Measurement], chip_name: str, chip_kind: str) -> list[Measurement]:
    """The records that may calibrate ``chip_name``; raises if none may, naming why.

    Kept: records measured on ``chip_name``. Refused for an accelerator: interpreter
    timings (they time the host CPU).
    """
    on_chip = [r for r in records if r.system.chip == chip_name]
    if not on_chip:
        found = ", ".join(sorted({r.system.chip for r in records}))
        raise InputError(f"no measurements on {chip_name} (the file has: {found})")
    if chip_kind != "cpu":
        interpreted = [r for r in on_chip if r.backend in INTERPRETER_BACKENDS]
        if interpreted:
            raise InputError(
                f"{len(interpreted)} record(s) have backend {interpreted[0].backend!r}: the Pallas "
                f"interpreter runs on the host CPU, so its timings cannot calibrate {chip_name}; "
                "calibrate host-cpu with them or drop them"
            )
    return on_chip
