"""The one door for a calibration measurement source: every source, registered once.

A **source** is one module of :mod:`calibration.sources` that

1. **recognises** its measurement spec (what ``tpusim calibrate --measurements`` names, read
   with the chip: :class:`Request`),
2. **loads** it (``load``),
3. **poses its problem for the one core** and fits it (``fit``: a
   :class:`calibration.core.Problem` solved by :func:`calibration.core.fit`, or a direct rule
   of :mod:`calibration.core.fitting` where a solve adds nothing),
4. turns the result into an **overlay** through the one builder (``overlay``:
   :func:`calibration.core.overlay_builder.build_overlay`; written only by
   :func:`calibration.core.overlay_builder.write_overlay`).

Each hook is a ``module:attribute`` reference, resolved when used (:meth:`Source.hook`), as
entry points are: reading the registry imports no source (``tpusim calibrate --help`` stays
light) and nothing here imports upward. ``command`` names the ``tpusim calibrate`` runner
of a source (:mod:`calibration.commands`); a source without one is fitted or read by the
tool ``tool`` names. :func:`recognise` picks the first source, in :data:`SOURCES` order, that
recognises a request: that is the procedure ``tpusim calibrate`` runs (chosen by calibration
from the chip and the data, not by the command line unless ``--procedure`` names one):

- a TPU's own megakernel step times (``megakernel.runner`` records) → ``tpu kernel records``;
- a CPU chip measured by the closed loop → ``cpu loop``;
- a GPU serving stack's published per-stage split → ``gpu stack``;
- the published K3 rows on B300 → ``gpu k3 stack``;
- a :mod:`calibration.gpu_bench` file (micro-benchmarks + whole steps) → ``gpu micro``;
- component measurements for this chip exist and no figure list was given → ``part by part``;
- otherwise → ``end to end``.

A ``published:`` set of step times (``--measurements published:tpu7x-musespark``) is loaded by the
source whose ``published`` names it (:func:`published_records`), whichever procedure fits it.

Adding a source (``calibration/README.md``): one module with its hooks, one entry in
:data:`SOURCES`, one test (``tests/test_source_registry.py`` resolves every hook).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hwmodels.errors import InputError

if TYPE_CHECKING:
    from calibration.sources.measurements import Measurement
    from hwmodels.schema import Chip

GPU_K3_STACK_SETS = ("published:b300-sglang-k3",)  # published K3 rows on B300 (calibration.sources.k3_b300)
GPU_STACK_SETS = ("published:b200-vllm-qwen3.5",)  # published per-stage splits (calibration.sources.gpu_stack)
PUBLISHED_PREFIX = "published:"  # a set of package data, read by the source that registers it


@dataclass(frozen=True)
class Request:
    """What a calibration is asked to fit: the chip (its published entry), the measurement
    spec, and what the caller found in the data (kernel records, a micro-benchmark set,
    component measurements for the chip) and whether figures were named (``--parameters``)."""

    chip: Chip
    measurements: str
    kernel_records: bool = False
    micro_set: bool = False
    has_components: bool = False
    parameters_given: bool = False


@dataclass(frozen=True)
class Source:
    """One registered source (module docstring): its name (the procedure ``tpusim calibrate``
    reports), what it reads, and its hooks as ``module:attribute`` references."""

    name: str
    what: str
    recognises: Callable[[Request], bool]
    load: str
    fit: str | None
    overlay: str | None
    command: str | None = None
    tool: str = ""
    # the ``published:`` sets of step times ``load`` reads as measurement records, called with
    # the set's name (:func:`published_records`: what ``--measurements published:<name>`` loads)
    published: tuple[str, ...] = ()

    def hook(self, which: str) -> Any:
        """The object a hook (``load``, ``fit``, ``overlay``, ``command``) names, imported now."""
        reference = getattr(self, which)
        if reference is None:
            raise LookupError(f"source {self.name!r} has no {which} hook")
        module, _, attribute = reference.partition(":")
        target: Any = importlib.import_module(module)
        for name in attribute.split("."):
            target = getattr(target, name)
        return target


def _never(_: Request) -> bool:
    return False


SOURCES: tuple[Source, ...] = (
    Source("tpu kernel records", "the megakernel's own K3-shard step times on a TPU (megakernel.runner records)",
           lambda r: r.chip.kind == "tpu" and r.kernel_records,
           load="calibration.sources.tpu_chip_records:load_chip_records",
           fit="calibration.sources.tpu_kernel_fit:calibrate_kernel_records",
           overlay="calibration.sources.tpu_kernel_fit:KernelFit.overlay",
           command="calibration.commands.calibrate_kernel:run_kernel_records"),
    Source("cpu loop", "this host, probed and timed running jitted decode steps (cpu-loop, cpu-loop-quick)",
           lambda r: r.chip.kind == "cpu" and r.measurements.startswith("cpu-loop"),
           load="calibration.sources.cpu_loop:measure_points",
           fit="calibration.sources.cpu_loop:run_cpu_loop",
           overlay="calibration.sources.step_times:FitResult.overlay",
           command="calibration.commands.calibrate:run_single_fit"),
    Source("gpu stack", "a GPU serving stack's published per-stage split (published:b200-vllm-qwen3.5)",
           lambda r: r.chip.kind == "gpu" and r.measurements in GPU_STACK_SETS,
           load="calibration.sources.gpu_stack:published_group_us",
           fit="calibration.sources.gpu_stack:fit_gpu_stack",
           overlay="calibration.sources.gpu_stack:stack_overlay",
           command="calibration.commands.calibrate_stacks:run_gpu_stack"),
    Source("gpu k3 stack", "the published K3 rows on 8 B300 with SGLang (published:b300-sglang-k3)",
           lambda r: r.measurements in GPU_K3_STACK_SETS,
           load="calibration.sources.k3_b300:load_b300_k3",
           fit="calibration.sources.k3_b300:fit_k3_stack",
           overlay="calibration.sources.k3_b300:overlay_of",
           command="calibration.commands.calibrate_stacks:run_k3_stack"),
    Source("gpu micro", "a calibration.gpu_bench file: micro-benchmarks fitted, whole steps predicted",
           lambda r: r.micro_set,
           load="calibration.sources.loaders:load_measurements",
           fit="calibration.sources.gpu_micro:fit_micro",
           overlay="calibration.sources.step_times:FitResult.overlay",
           command="calibration.commands.calibrate:run_single_fit"),
    Source("part by part", "step times with component measurements of the chip (published:tpu7x-musespark + "
           "published:tpu7x-components): each part first, then the step times",
           lambda r: r.has_components and not r.parameters_given,
           load="calibration.sources.tpu_components:load_components",
           fit="calibration.sources.tpu_calibration:calibrate_by_parts",
           overlay="calibration.sources.tpu_calibration:PartsResult.overlay",
           command="calibration.commands.calibrate:run_parts"),
    Source("end to end", "measured or published step times (a .jsonl file, published:tpu7x-musespark)",
           lambda r: True,
           load="calibration.sources.loaders:load_measurements",
           fit="calibration.sources.step_times:fit_chip",
           overlay="calibration.sources.step_times:FitResult.overlay",
           command="calibration.commands.calibrate:run_single_fit"),
    # Sources read by their own tools (no `tpusim calibrate` path; the same builder and writer).
    Source("tpu7x published", "the published TPU7x step times of Muse Spark (published:tpu7x-musespark), read as "
           "measurement records", _never,
           load="calibration.sources.tpu7x_published:load_published", fit=None, overlay=None,
           tool="tpusim calibrate --measurements published:tpu7x-musespark (fitted by end to end or part by part)",
           published=("published:tpu7x-musespark",)),
    Source("tpu v5e probes", "micro-benchmarks run on one TPU v5e (calibration/data/tpu-v5e-probes.jsonl)",
           _never, load="calibration.sources.tpu_probes:load_probes",
           fit="calibration.sources.tpu_probes:probe_figures",
           overlay="calibration.sources.tpu_probes:probe_overlay",
           tool="python -m calibration.sources.tpu_probes --save"),
    Source("tpu v5e fixed cost", "the K3-shard kernel's runs with capped experts (tpu-v5e-fixed-cost.jsonl), "
           "read through the simulator", _never,
           load="calibration.sources.tpu_fixed_cost:capped_runs",
           fit="calibration.sources.tpu_fixed_cost:fixed_cost", overlay=None,
           tool="calibration.sources.tpu_fixed_cost:kernel_probe_chip (figures labelled derived, no overlay)"),
    Source("gpu batch sweeps", "public Blackwell decode sweeps by concurrency (published:gpu-batch-sweeps)",
           _never, load="calibration.sources.gpu_batch_data:load_rows",
           fit="calibration.sources.gpu_batch_sweeps:calibrate",
           overlay="calibration.sources.gpu_batch_ttft:batch_overlays",
           tool="python -m calibration.reports.gpu_batch --write-overlays"),
    Source("compiler static schedule", "libtpu's bundles per loop body of the kernel (tpu-v5e-static-schedule.jsonl; "
           "a dump folder)", _never,
           load="calibration.sources.tpu_layer_static:layer_issues",
           fit="calibration.sources.tpu_layer_static:layer_remainder", overlay=None,
           tool="python -m calibration.sources.compiler_schedule DIR; calibration.reports.tpu_v7_compiler_priced"),
    Source("tpu v5e code issue", "the code_size probe (tpu-v5e-probes.jsonl) against its static bundles "
           "(tpu-v5e-static-schedule.jsonl): seconds a bundle and a loop iteration, as the chip issues them",
           _never, load="calibration.sources.tpu_code_issue:code_forms",
           fit="calibration.sources.tpu_code_issue:code_issue", overlay=None,
           tool="python -m calibration.sources.tpu_code_issue (read by the first-principles chip, no overlay)"),
)
BY_NAME = {source.name: source for source in SOURCES}


def source(name: str) -> Source:
    """The registered source ``name`` (``KeyError`` naming the known ones)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no calibration source {name!r} (known: {', '.join(BY_NAME)})") from None


def recognise(request: Request) -> Source:
    """The first source of :data:`SOURCES` that recognises ``request`` (``end to end`` takes
    whatever no other source claims)."""
    return next(s for s in SOURCES if s.recognises(request))


def published_sets() -> tuple[str, ...]:
    """Every ``published:`` set of step times a registered source reads as measurement records."""
    return tuple(spec for entry in SOURCES for spec in entry.published)


def published_records(spec: str) -> list[Measurement]:
    """The measurement records of the ``published:<name>`` set ``spec``, read by the ``load``
    hook of the source that registers it (:class:`~hwmodels.errors.InputError` naming the
    known sets for any other name)."""
    name = spec.removeprefix(PUBLISHED_PREFIX)
    for entry in SOURCES:
        if spec in entry.published:
            return entry.hook("load")(name)
    names = sorted(registered.removeprefix(PUBLISHED_PREFIX) for registered in published_sets())
    raise InputError(f"unknown published dataset {name!r}; known: {', '.join(names)}")


__all__ = ["GPU_K3_STACK_SETS", "GPU_STACK_SETS", "PUBLISHED_PREFIX", "SOURCES", "Request", "Source",
           "published_records", "published_sets", "recognise", "source"]
