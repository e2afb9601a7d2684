"""The one table of calibratable figures: every figure any calibration fits, declared once.

A parameter is a dotted figure path of a :class:`~hwmodels.schema.Chip` (the same paths a
:class:`~hwmodels.overlay.CalibrationOverlay` uses). :data:`PARAMETERS` declares each one:
its name, unit, the catalog path it overrides, its physical bounds per chip kind, and what
in the data pins it. Every source reads this table (:func:`parameter`); no source writes
bounds of its own. ``tpusim calibrate --explain`` prints it for a chip
(:mod:`calibration.reports.explain`), with each figure's prior.

**Priors.** A fit starts from the chip's catalog value of the figure (labelled ``prior``
where a calibration fits it, with its source: a spec sheet, another system's measurement or
first principles, never the data it is fitted on; ``tests/test_priors.py`` checks that). A
part of a staged fit starts from the previous stage's chip instead. A source may also pull
the fit toward the priors (:attr:`calibration.core.problem.Problem.prior_weight`, the K3
stack's weak pull). A figure no catalog chip carries (the GPU batch-growth figures: without
them the engine adds no term) declares its prior and the prior's source in the table
(:attr:`Parameter.prior`); such a fit starts from :func:`with_declared_priors`.

**Bounds** are physical, not convenient, and per chip kind: relative ones are factors of the
chip's own *published* value (so tpu-v5e's 0.8 TB/s and gb200's 8 TB/s each get bounds
around their own figure); absolute ones are in the figure's unit. A sustained HBM rate is
never above the chip's published peak (on a host CPU the "peak" is the probe's copy rate,
which a streaming read can beat: :func:`implied_values`). A fit that stops at a bound is
flagged: the model is missing something, and the flag says where to look.

The fit varies a chip by laying a trial overlay over a base chip (:func:`chip_with`), so
every candidate passes the schema's own checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from calibration.core.overlay_builder import build_overlay, fitted_figure
from hwmodels.errors import InputError
from hwmodels.overlay import apply_overlay, iter_figures
from hwmodels.schema import Chip

KINDS = ("tpu", "gpu", "cpu")


@dataclass(frozen=True)
class Bound:
    """A parameter's bounds on one kind of chip: factors of the published value
    (``relative``) or values in the figure's unit."""

    lower: float
    upper: float
    relative: bool = False

    def text(self) -> str:
        return f"{self.lower:g}–{self.upper:g} x published" if self.relative else f"{self.lower:.3g}–{self.upper:.3g}"


@dataclass(frozen=True)
class Parameter:
    """One calibratable figure (see the module docstring)."""

    name: str
    path: str  # the catalog figure it overrides
    unit: str
    bounds: dict[str, Bound]  # chip kind -> bounds (a kind absent: not calibrated on such chips)
    why: str  # what in the data pins it
    hold_rank: int = 0  # among unidentifiable parameters of one fit, higher ranks are held first
    # A figure no catalog chip carries (None in the schema: the engine adds no term without it)
    # has no catalog value to start from: its prior is declared here, with its source.
    prior: float | None = None
    prior_source: str = ""

    def bound(self, kind: str) -> Bound:
        if kind not in self.bounds:
            raise InputError(f"{self.path} is not calibrated on {kind} chips (bounds only for "
                             f"{', '.join(self.bounds)})")
        return self.bounds[kind]

    def bounds_for(self, chip: Chip) -> tuple[float, float]:
        """Bounds for ``chip`` (a relative bound scaled by its published value of the figure),
        tightened by the chip itself (a sustained rate never above the peak)."""
        bound = self.bound(chip.kind)
        lower, upper = bound.lower, bound.upper
        if bound.relative:
            value = figure_value(chip, self.path)
            lower, upper = lower * value, upper * value
        if self.path == SUSTAINED_PATH and chip.kind != "cpu":
            upper = min(upper, chip.hbm.peak_bandwidth_bytes_per_s.value)
        return lower, upper


HOST_PEAK_PATH = "hbm.peak_bandwidth_bytes_per_s"
SUSTAINED_PATH = "hbm.sustained_bandwidth_bytes_per_s"
_REL = {"relative": True}

PARAMETERS: tuple[Parameter, ...] = (
    Parameter("hbm_sustained", SUSTAINED_PATH, "B/s",
              {"tpu": Bound(0.45, 1.25, **_REL), "gpu": Bound(0.45, 1.25, **_REL), "cpu": Bound(1e9, 1e13)},
              "bytes per step differ across formats and widths; the dense DMA ring's achieved rate; "
              "copy micro-benchmarks"),
    Parameter("mxu_push", "compute.mxu.weight_push_s_per_tile", "s/tile", {"tpu": Bound(0.25, 5.0, **_REL)},
              "decode matmuls are push-bound (rows pad only to the 8-row sublane tile); bf16 rows pin it"),
    Parameter("mxu_push_int8", "compute.mxu.weight_push_s_per_tile_by_dtype.int8", "s/tile",
              {"tpu": Bound(0.25, 4.0, **_REL)},
              "int8 dense weights are converted on their way into the MXU; the nvfp4+int8 and nvfp4+bf16 "
              "rows differ only in the dense format"),
    Parameter("per_layer", "execution.per_layer_overhead_s", "s", {"tpu": Bound(0.0, 20e-6), "gpu": Bound(0.0, 20e-6)},
              "the per-layer remainder once bytes, tiles and payloads are priced (the Muse breakdown)"),
    Parameter("per_step", "execution.per_step_overhead_s", "s",
              {"tpu": Bound(0.1, 10.0, **_REL), "gpu": Bound(1e-7, 1e-2), "cpu": Bound(1e-7, 1e-2)},
              "fixed cost per step call (the published host figure; dispatch of the gap micro-benchmarks)"),
    Parameter("dma_penalty", "dma.concurrency_penalty_per_dma", "1", {"tpu": Bound(0.0, 0.6)},
              "8 expert slots in flight finish later than 4 (round-robin DMA engine)"),
    Parameter("dequant_fp8", "compute.vpu.dequant_s_per_element.fp8_e4m3_b256", "s/element",
              {"tpu": Bound(0.25, 20.0, **_REL)},
              "VPU conversion of FP8 expert weights on a chip whose MXU cannot take FP8 (tpu-v5e): the "
              "per-panel dequant probe; K3-shard step times, where it runs once per routed expert"),
    Parameter("dequant_mxfp4", "compute.vpu.dequant_s_per_element.mxfp4", "s/element",
              {"tpu": Bound(0.25, 20.0, **_REL)},
              "VPU conversion of MXFP4 expert weights (tpu-v5e); moves with dequant_fp8 in step times "
              "(every expert has both), so step-time fits hold one of them", hold_rank=1),
    Parameter("ici_latency", "links.ici.latency_s", "s", {"tpu": Bound(0.05, 20.0, **_REL)},
              "issue-to-landing latency of one ICI copy (collective microbenchmarks)"),
    Parameter("ici_issue", "links.ici.message_issue_s", "s", {"tpu": Bound(0.05, 20.0, **_REL)},
              "sender cost per remote copy on ICI (7 copies per phase: only 7 x issue + latency is seen, "
              "so it is held before the latency)", hold_rank=1),
    Parameter("ici_bandwidth", "links.ici.bandwidth_bytes_per_s_per_direction", "B/s",
              {"tpu": Bound(0.15, 3.0, **_REL)}, "aggregate ICI egress per core (cross-chip copy rates)"),
    Parameter("sibling_latency", "links.sibling.latency_s", "s", {"tpu": Bound(0.05, 20.0, **_REL)},
              "issue-to-landing latency of a sibling-core copy"),
    Parameter("sibling_issue", "links.sibling.message_issue_s", "s", {"tpu": Bound(0.05, 20.0, **_REL)},
              "sender cost per sibling copy", hold_rank=1),
    Parameter("sibling_bandwidth", "links.sibling.bandwidth_bytes_per_s_per_direction", "B/s",
              {"tpu": Bound(0.2, 10.0, **_REL)},
              "sibling-core copy rate (published 101 GB/s at 256 KiB, 610 GB/s at 16 MiB)"),
    Parameter("launch", "execution.launch_overhead_s", "s", {"cpu": Bound(1e-8, 1e-3)},
              "per-op cost inside one XLA executable: ops per step are fixed by the layer count"),
    Parameter("cpu_matmul_f32", "compute.cpu.peak_flops_per_s.f32", "FLOP/s", {"cpu": Bound(1e9, 1e14)},
              "matmul FLOPs grow with batch at a fixed weight size"),
    Parameter("op_efficiency", "execution.per_op_efficiency", "1", {"gpu": Bound(0.05, 1.0), "cpu": Bound(0.05, 1.0)},
              "the fraction of the sustained rate one kernel reaches (matmul micro-benchmarks; K3 step times)"),
    Parameter("graph_gap", "execution.gpu.kernel_gap_s", "s", {"gpu": Bound(5e-8, 5e-5)},
              "the graph gap every kernel pays (compiled-gap micro-benchmarks; the stack split; K3 step times)"),
    Parameter("gemm_fixed", "execution.gpu.gemm_fixed_s", "s", {"gpu": Bound(5e-8, 5e-5)},
              "a decode GEMM's fixed time (the published split's GEMM group)"),
    Parameter("attention_fixed", "execution.gpu.attention_fixed_s", "s", {"gpu": Bound(5e-8, 5e-5)},
              "a decode attention kernel's fixed time (the published split's attention group)"),
    # What grows with the decode batch (tpusim.engine.gpu_batch): no catalog chip carries these
    # figures, so each declares its prior; fitted by calibration.sources.gpu_batch_sweeps.
    Parameter("grouped_gemm_expert_s", "execution.gpu.grouped_gemm_expert_s", "s", {"gpu": Bound(0.0, 20e-6)},
              "TPOT growth with concurrency beyond the bytes: each more distinct expert a batch routes to "
              "(public Blackwell sweeps, Kimi-K2.5 TP4/EP4 at concurrency 8 and DeepSeek-R1 / Qwen3 1k/1k at 16)",
              prior=0.5e-6,
              prior_source="prior (assumed): one grouped-GEMM tile's prologue and epilogue per expert that received "
                           "a token (TMA descriptors, block-scale load, pipeline fill, store), ~0.5 us; FlashInfer "
                           "trtllm-gen and CUTLASS grouped GEMMs schedule tiles per expert"),
    Parameter("sampling_sequence_s", "execution.gpu.sampling_sequence_s", "s", {"gpu": Bound(0.0, 200e-6)},
              "TPOT growth with concurrency at a fixed expert count: each more running request per step "
              "(the same public sweep points)",
              prior=5e-6,
              prior_source="prior (assumed): sampler + scheduler + output processing per running request and step "
                           "not hidden by vLLM V1's / SGLang's overlap, ~5 us"),
    Parameter("eager_host_op_s", "execution.gpu.eager_host_op_s", "s", {"gpu": Bound(0.0, 200e-6)},
              "TPOT growth with concurrency where prompts are short: other clients' prefills, run without a CUDA "
              "graph, last the host's time to issue their kernels (public B200 sweeps, DeepSeek-R1 / Qwen3 1k/1k "
              "at concurrency 16; the concurrency-1 TTFTs bound it)",
              prior=38e-6,
              prior_source="prior (assumed from the published concurrency-1 TTFTs, not the TPOTs judged): a 4194-token "
                           "prompt's TTFT exceeds a 610-token one's by 14.2 ms (DeepSeek-R1) and 22.7 ms (Qwen3) on "
                           "8 B200 with SGLang, where the engine's GPU-bound prefills differ by 63 / 49 ms, so the "
                           "short prompt waits on its host: 42 / 34 us per kernel, mean 38 us "
                           "(calibration.sources.gpu_batch_sweeps.ttft_host_op_s); a few eager PyTorch ops of "
                           "~5-10 us each plus a ~4-6 us launch per kernel of the fusion table"),
    # A served request's time outside the engine's steps (tpusim.serving.first_token): no catalog chip
    # carries these; fitted on the TTFT rows of the frozen split's fit side by calibration.sources.gpu_batch_ttft.
    Parameter("request_overhead_s", "execution.gpu.request_overhead_s", "s", {"gpu": Bound(0.0, 0.5)},
              "TTFT beyond the prefill at an idle server (published concurrency-1 TTFTs of the fit side)",
              prior=20e-3,
              prior_source="prior (assumed): an HTTP round trip, tokenizing a prompt of a few thousand tokens, the "
                           "scheduler's receipt over ZMQ and streaming the first token back, ~20 ms"),
    Parameter("request_turnaround_s", "execution.gpu.request_turnaround_s", "s", {"gpu": Bound(0.0, 0.05)},
              "TTFT growth with concurrency: how long after a step boundary a closed-loop client's next request "
              "reaches the scheduler (published TTFTs of the fit side at concurrency 16-100)",
              prior=5e-3,
              prior_source="prior (assumed): detokenizing and streaming the last token, the client's next POST "
                           "(sglang.bench_serving, asyncio) and tokenizing its prompt, ~5 ms"),
    Parameter("attention_sequence_s", "execution.gpu.attention_sequence_s", "s", {"gpu": Bound(0.0, 5e-6)},
              "each more sequence per attention layer; on the public sweeps' fit points it moves with "
              "sampling_sequence_s, so that source holds it at its prior",
              prior=0.1e-6,
              prior_source="prior (assumed, not fitted: collinear with sampling_sequence_s on the fit set): a "
                           "split-KV decode kernel's per-sequence split metadata and merge, ~0.1 us per layer"),
)
BY_PATH = {p.path: p for p in PARAMETERS}


def parameter(path: str) -> Parameter:
    """The table's declaration of ``path`` (``KeyError`` naming it if it has none)."""
    try:
        return BY_PATH[path]
    except KeyError:
        raise KeyError(f"{path!r} is not a calibratable figure (calibration.core.parameters)") from None


def parameters(*paths: str) -> tuple[Parameter, ...]:
    return tuple(parameter(path) for path in paths)


def figure_value(chip: Chip, path: str) -> float:
    """The value of the figure at ``path`` (``KeyError`` naming the path if there is none)."""
    for candidate, figure in iter_figures(chip):
        if candidate == path:
            return figure.value
    raise KeyError(f"chip {chip.name} has no figure {path!r}")


def implied_values(base: Chip, values: dict[str, float]) -> dict[str, float]:
    """Figures that must move with the fitted ones to keep the chip valid.

    Only one case: on a host CPU the "peak" HBM figure is the probe's copy rate (read +
    write), not a published limit, and a streaming read can beat it; when the fitted
    sustained rate exceeds it, the peak is raised to match. Published chips never get this:
    their sustained rate is bounded by the peak instead (:meth:`Parameter.bounds_for`).
    """
    sustained = values.get(SUSTAINED_PATH)
    peak = base.hbm.peak_bandwidth_bytes_per_s.value
    if base.kind == "cpu" and sustained is not None and sustained > peak:
        return {HOST_PEAK_PATH: sustained}
    return {}


def with_declared_priors(chip: Chip, specs: tuple[Parameter, ...]) -> Chip:
    """``chip`` with the declared prior of every parameter in ``specs`` that the chip does not
    carry laid over it (where such a fit starts); a figure the chip has keeps its value."""
    have = {path for path, _figure in iter_figures(chip)}
    missing = {p.path: p.prior for p in specs if p.path not in have and p.prior is not None}
    return chip_with(chip, missing, fitted_on="declared priors") if missing else chip


def chip_with(base: Chip, values: dict[str, float], *, fitted_on: str = "trial") -> Chip:
    """``base`` with ``values`` (and :func:`implied_values`) laid over it as an overlay."""
    merged = {**values, **implied_values(base, values)}
    overlay = build_overlay(base.name, fitted_on, {path: fitted_figure(value) for path, value in merged.items()})
    return apply_overlay(base, overlay, origin="trial fit")


def user_parameter(path: str, chip: Chip) -> Parameter:
    """A figure the user asked to fit (``--parameters``): the table's declaration, or for a
    figure the table lacks, bounds of 0.1–10x its published value (labelled ``user``)."""
    if path in BY_PATH:
        return BY_PATH[path]
    try:
        figure_value(chip, path)
    except KeyError as error:
        raise InputError(f"--parameters: {error.args[0]}") from None
    return Parameter(path, path, "", {kind: Bound(0.1, 10.0, relative=True) for kind in KINDS}, "user")


def parse_parameters(text: str, chip: Chip) -> tuple[Parameter, ...]:
    """Comma-separated figure paths (``--parameters``), each resolved by :func:`user_parameter`."""
    specs = tuple(user_parameter(path, chip) for path in filter(None, (p.strip() for p in text.split(","))))
    if not specs:
        raise InputError("--parameters: no parameter paths given")
    return specs
