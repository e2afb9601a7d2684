"""The CPU closed loop: probe this host, time real jitted decode steps, fit, report.

The same pipeline as the TPU calibration, on the one machine we can always measure:

1. **Probe** the host (:func:`hwmodels.probe.probe_host`, what ``tpusim hardware probe``
   runs) and save it as the ``host-cpu`` catalog entry: copy bandwidth, matmul FLOP/s,
   dispatch cost, all ``measured``. Its execution mode is ``per_op_launch``: the simulator
   charges one launch per op and streams each op's weights when the op starts (no
   megakernel, no cross-op prefetch).
2. **Workload.** For each (width, batch) point, a small model of one architecture
   (``kimi-k3-mini`` at ``width`` hidden, ``layers`` layers, f32 weights:
   ``kimi-k3-mini[width=512,layers=4,formats=f32]``) becomes a per-device program
   (:class:`calibration.sources.predict.Predictor`, the same program the simulator prices), and
   :func:`calibration.sources.cpu_workload.build_cpu_step` replays it as one ``jax.jit`` executable
   on the CPU, one XLA kernel (or a few) per program op. Why our own replay rather than
   ``megakernel.reference``: the replay has exactly the program's bytes, FLOPs and op count,
   so a prediction error is the simulator's, not a workload mismatch.
   Why f32: XLA:CPU's bf16 matrix-vector products run far below the memory bandwidth
   (measured here: ≈ 1–2 GB/s against ≈ 20 GB/s for f32), a code-generation effect the
   simulator does not model.
3. **Measure** (:func:`measure_points`): compile, ``warmup`` untimed steps, then the median
   (and half the IQR) over ``repeats`` interleaved rounds of the fastest of ``burst`` steps →
   one :class:`~calibration.sources.measurements.Measurement` with ``backend: cpu-xla`` per point.
4. **Predict and fit**: the simulator with the probed chip predicts every point
   (uncalibrated), :func:`calibration.sources.step_times.fit_chip` fits the host's effective memory rate,
   per-op launch cost, matmul rate and per-step cost (:func:`calibration.sources.step_times.default_parameters`),
   and the report compares before and after.

:meth:`CpuLoopConfig.quick` is the CI variant (2 layers, 3 widths x 3 batches, few repeats:
≈ 15–30 s end to end on two cores).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from calibration.sources.cpu_workload import build_cpu_step
from calibration.sources.measurements import MS_PER_S, Measurement, SystemRef
from calibration.sources.predict import Predictor
from calibration.sources.step_times import FitResult, default_parameters, fit_chip
from hwmodels.catalog import list_chips, load_chip
from hwmodels.probe import HOST_CHIP_NAME, probe_host, write_host_entry
from hwmodels.records.timing import summarise
from hwmodels.schema import Chip

CPU_BACKEND = "cpu-xla"


@dataclass(frozen=True)
class CpuLoopConfig:
    """Which points the loop measures and how."""

    base_model: str = "kimi-k3-mini"
    layers: int = 4
    widths: tuple[int, ...] = (256, 512, 1024, 1536)
    batches: tuple[int, ...] = (1, 4, 16)
    context: int = 256
    routing: str = "uniform"
    formats: str = "f32"
    warmup: int = 2
    repeats: int = 7
    burst: int = 3
    holdout: str | None = "batch=4"
    extra_points: tuple[tuple[int, int], ...] = field(default_factory=tuple)

    @classmethod
    def quick(cls) -> CpuLoopConfig:
        """The CI variant: 2 layers, widths 256/512/1024 at batch 1, 4, 8, 5 timed steps;
        batch 4 held out."""
        return cls(layers=2, widths=(256, 512, 1024), batches=(1, 4, 8), warmup=1, repeats=5, burst=2)

    def model_spec(self, width: int) -> str:
        return f"{self.base_model}[width={width},layers={self.layers},formats={self.formats}]"

    def points(self) -> list[tuple[int, int]]:
        grid = [(w, b) for w in self.widths for b in self.batches]
        return grid + [p for p in self.extra_points if p not in grid]


def host_chip(*, probe: bool, quick_probe: bool = False) -> Chip:
    """The ``host-cpu`` chip: probed now (and saved) if asked or if there is no entry yet."""
    if probe or HOST_CHIP_NAME not in list_chips():
        write_host_entry(probe_host(quick=quick_probe))
    return load_chip(HOST_CHIP_NAME, calibrated=False)


def measure_points(
    config: CpuLoopConfig,
    chip: Chip,
    *,
    predictor: Predictor | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Measurement]:
    """Time the jitted per-op replay at every (width, batch) point of ``config``.

    Steps: (1) build and compile every point's step (weights stay allocated); (2) warm each
    up; (3) run ``repeats`` rounds, each round timing ``burst`` consecutive steps of every
    point in turn and keeping the fastest of the burst; (4) per point, the median over rounds
    (spread: half the inter-quartile range). Interleaving the points spreads any load from
    other processes over all of them instead of one; the fastest-of-burst drops steps that a
    short burst of such load hit.
    """
    predictor = predictor or Predictor()
    host = socket.gethostname()
    prepared = []
    for width, batch in config.points():
        skeleton = Measurement(
            model=config.model_spec(width), system=SystemRef(chip=chip.name, chips=1), batch=batch,
            context=config.context, routing=config.routing, schedule="naive", backend=CPU_BACKEND,
            ms_per_step_median=1.0,
        )
        program = predictor.program(chip, skeleton)
        step = build_cpu_step(program)
        for _ in range(config.warmup):
            step.run()
        prepared.append((width, skeleton, program, step, []))
    for _ in range(config.repeats):
        for _width, _skeleton, _program, step, samples in prepared:
            samples.append(min(step.time_steps(warmup=0, repeats=config.burst)))
    records = []
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    for width, skeleton, program, step, samples in prepared:
        timing = summarise(samples)
        record = skeleton.model_copy(update={
            "ms_per_step_median": timing.median_s * MS_PER_S,
            "ms_per_step_spread": timing.spread_s * MS_PER_S,
            "spread_kind": f"iqr/2 over {config.repeats} rounds of fastest-of-{config.burst}",
            "steps": config.repeats * config.burst,
            "provenance": (
                f"measured on {host} {when}: jax.jit per-op replay of the program "
                f"(calibration.sources.cpu_workload), {len(program.ops)} ops, "
                f"{step.weight_bytes / 1e6:.1f} MB weights, compile {step.compile_s:.2f} s, "
                f"{config.warmup} warm-up steps, median over {config.repeats} interleaved rounds "
                f"of the fastest of {config.burst} steps"
            ),
            "label": "measured",
            "extra": {"width": width, "ops": len(program.ops), "weight_bytes": step.weight_bytes,
                      "min_ms": timing.min_s * MS_PER_S},
        })
        records.append(record)
        if progress:
            progress(f"width {width} batch {record.batch}: {record.ms_per_step_median:.3f} ms "
                     f"(± {record.ms_per_step_spread:.3f})")
    return records


def run_cpu_loop(
    config: CpuLoopConfig | None = None,
    *,
    probe: bool = True,
    quick_probe: bool = False,
    records: Sequence[Measurement] | None = None,
    holdout: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[FitResult, list[Measurement]]:
    """Probe, measure (unless ``records`` are given), fit; returns the fit and the records."""
    config = config or CpuLoopConfig()
    chip = host_chip(probe=probe, quick_probe=quick_probe)
    predictor = Predictor()
    measured = list(records) if records is not None else measure_points(
        config, chip, predictor=predictor, progress=progress)
    result = fit_chip(
        chip, measured, parameters=default_parameters(chip),
        holdout=holdout if holdout is not None else config.holdout, predictor=predictor,
        diff_step=1e-3, max_nfev=40,
    )
    return result, measured
