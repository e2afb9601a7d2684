"""What grows with the batch on a GPU serving stack, beyond the bytes and FLOPs the engine streams.

The engine already prices what a decode batch reads and computes: the *distinct* routed
experts the batch selects (the program's routing draw), the KV cache of every sequence (MLA's
latent replicated on every TP rank, as SGLang / vLLM run MLA under TP), the rows of every GEMM
padded to the MMA tile. What the field's stacks add per batch element, and what a batch-1
fit cannot see, are four mechanisms, each a named term of the step
(:func:`batch_terms`, shown in :func:`tpusim.engine.gpu.gpu_breakdown`)::

    expert_groups    = grouped_gemm_expert_s x 2 x Σ_MoE layers (d_l(B) - d_1)
    attention_seqs   = attention_sequence_s x attention layers x (S - 1)
    sampling_sched   = sampling_sequence_s x (S - 1)
    graph_padding    = grouped_gemm_expert_s x 2 x MoE layers x (d(B_graph) - d(B))
                       (padded rows are routed, not sampled)

- **Grouped expert GEMM per expert.** The fused-MoE kernels (TRT-LLM / FlashInfer
  ``trtllm-gen`` MoE, vLLM's ``fused_moe`` / CUTLASS grouped GEMM, SGLang's ``moe_runner``)
  give every expert that received a token its own tiles: its own tile-scheduler entry,
  prologue (TMA descriptors, block-scale loads) and epilogue, whatever its token count (at
  decode ~1 token per expert). ``d_l(B)`` is the number of distinct local experts in MoE layer
  ``l`` of the program (the engine's own routing draw), ``d_1 = G k / E`` the expected count at
  batch 1 (``G`` experts on the device, top-``k`` of ``E``): the batch-1 share is inside the
  batch-1 fit of the stack (``kernel_gap_s``, ``per_op_efficiency``), so only the growth is
  charged. Two grouped GEMMs per layer (gate/up FC1, down FC2).
- **Attention per sequence.** A split-KV decode kernel (FlashMLA / FlashInfer / trtllm-gen
  MLA, FlashAttention decode) schedules work per sequence: its metadata, its split and the
  merge of its partial results cost a fixed time per sequence and layer beyond the KV bytes
  (which the engine streams). Linear-attention recurrences (KDA) also run per sequence.
- **Sampling and scheduling per step.** The sampler (logits processing, top-p/top-k, the
  penalties), the scheduler's per-request bookkeeping and output processing cost a fixed time
  per running request and step on the host / in small kernels, not hidden behind the graph
  (vLLM V1 and SGLang overlap part of it; what is left is what this figure measures).
- **CUDA-graph batch buckets.** A stack captures graphs at fixed batch sizes and pads a batch
  up to the next captured size (:data:`GRAPH_BATCH_SIZES`); the padded rows run through every
  GEMM and are routed, so they touch more experts: ``d(B)`` is the routing model's uniform
  expectation ``G (1 - (1 - k/E)^B)`` (:mod:`tpusim.workload.routing`).

Chunked-prefill interference is a serving mechanism, not a step term: the serving simulator
runs other requests' prefill chunks between decode steps (:mod:`tpusim.serving.simulator`);
its closed form for a closed loop is :func:`tpusim.serving.interference.prefill_stall_s`.

- **A prefill runs without a CUDA graph** (SGLang captures graphs for decode batches only;
  vLLM V1's piecewise graphs stop at its largest captured token count, 512 by default): the
  host issues every kernel of the step from Python through the framework's dispatcher, and
  the GPU runs them as they come. The step lasts the longer of the two
  (:func:`prefill_step_s`)::

      prefill = max(engine step, kernels launched x eager_host_op_s)

  A long prompt is GPU-bound (the engine's step stands); a short one (the 500-token prompts
  of a 1k/1k sweep) is host-bound, and every other client's decode waits for it.

The figures live in ``execution.gpu`` (:class:`hwmodels.schema.GpuExecution`); a chip
without them (``None``) has no batch terms and no host floor, which is what the engine did
before.
"""

from __future__ import annotations

import bisect

from hwmodels.schema import Chip, GpuExecution
from tpusim.engine.result import SimResult
from tpusim.workload.program import Program, StepPhase

# CUDA-graph capture sizes by stack family (the batch a decode step is padded up to):
# - SGLang, non-speculative, >= 160 GB GPUs: [1,2,4,8,12] + 16..256 step 8 + 272..<512 step 16
#   + 512 (max bs 512), read in server_args.py ([SGLK3] shared/reference/k3-on-sglang.md section 5);
# - vLLM: [1, 2, 4] + 8..512 step 8 (assumed: vLLM's documented default capture list for a
#   512 max capture size; not in the reference set).
GRAPH_BATCH_SIZES: dict[str, tuple[int, ...]] = {
    "vllm": (1, 2, 4, *range(8, 513, 8)),
    "sglang": (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 513, 16)),
}
GROUPED_GEMMS_PER_MOE_LAYER = 2  # FC1 (gate/up, activation fused) and FC2 (down)
BATCH_TERMS = ("expert_groups", "attention_seqs", "sampling_sched", "graph_padding")


def stack_family(chip: Chip) -> str:
    """``sglang`` for an SGLang stack file (``sglang-*``), else ``vllm`` (the generic table is
    the vLLM-class stack)."""
    gpu = chip.execution.gpu
    return "sglang" if gpu is not None and gpu.stack.startswith("sglang") else "vllm"


def graph_batch_size(batch: int, family: str = "vllm") -> int:
    """The captured graph batch ``batch`` is padded to (``batch`` itself beyond the largest,
    where the stack runs eagerly)."""
    sizes = GRAPH_BATCH_SIZES[family]
    index = bisect.bisect_left(sizes, batch)
    return sizes[index] if index < len(sizes) else batch


def expected_distinct(experts_on_device: int, top_k: int, num_experts: int, rows: int) -> float:
    """Uniform routing: expected distinct experts of ``experts_on_device`` that ``rows`` rows
    select (each row picks ``top_k`` of ``num_experts``)."""
    return experts_on_device * (1.0 - (1.0 - top_k / num_experts) ** rows)


def _figures(gpu: GpuExecution) -> tuple[float, float, float]:
    def value(name: str) -> float:
        figure = getattr(gpu, name)
        return 0.0 if figure is None else figure.value
    return value("grouped_gemm_expert_s"), value("attention_sequence_s"), value("sampling_sequence_s")


def local_experts(program: Program) -> int:
    """Experts one device holds (whole or a slice): ``E / expert_groups``."""
    moe = program.model.moe
    return 0 if moe is None else moe.num_experts // max(1, program.plan.expert_groups)


def distinct_by_layer(program: Program) -> dict[int, int]:
    """Distinct routed experts on this device per MoE layer (the program's routing draw)."""
    return {layer.layer: layer.routed_experts for layer in program.layers if layer.is_moe}


def batch_terms(chip: Chip, program: Program) -> dict[str, float]:
    """The batch-growth terms of one decode step, seconds (module docstring); empty for a chip
    without the figures, a prefill program or a non-GPU chip."""
    gpu = chip.execution.gpu
    if chip.kind != "gpu" or gpu is None or program.phase != StepPhase.DECODE:
        return {}
    expert_s, attention_s, sampling_s = _figures(gpu)
    if not (expert_s or attention_s or sampling_s):
        return {}
    sequences = program.sequences or program.batch
    model = program.model
    terms = dict.fromkeys(BATCH_TERMS, 0.0)
    if model.moe is not None:
        experts = local_experts(program)
        first = expected_distinct(experts, model.moe.top_k, model.moe.num_experts, 1)
        extra = sum(max(0.0, count - first) for count in distinct_by_layer(program).values())
        terms["expert_groups"] = expert_s * GROUPED_GEMMS_PER_MOE_LAYER * extra
        padded = graph_batch_size(program.batch, stack_family(chip))
        if padded > program.batch:
            grow = (expected_distinct(experts, model.moe.top_k, model.moe.num_experts, padded)
                    - expected_distinct(experts, model.moe.top_k, model.moe.num_experts, program.batch))
            terms["graph_padding"] = expert_s * GROUPED_GEMMS_PER_MOE_LAYER * len(model.moe_layers) * grow
    terms["attention_seqs"] = attention_s * model.num_layers * (sequences - 1)
    terms["sampling_sched"] = sampling_s * (sequences - 1)
    return terms


def host_bound_s(chip: Chip, result: SimResult) -> float:
    """Seconds a step run without a CUDA graph waits beyond ``result`` for the host to issue
    its kernels: ``max(0, launches x eager_host_op_s - step)``; 0 on a chip without the figure,
    a non-GPU chip or a GPU megakernel (one launch)."""
    gpu = chip.execution.gpu
    if chip.kind != "gpu" or gpu is None or gpu.eager_host_op_s is None or chip.execution.mode == "megakernel":
        return 0.0
    return host_wait_s(result.launch_count, result.step_s, gpu.eager_host_op_s.value)


def host_wait_s(launches: int, step_s: float, host_op_s: float) -> float:
    """``max(0, launches x host_op_s - step_s)``: what a step of ``launches`` kernels and
    ``step_s`` on the GPU waits for a host that needs ``host_op_s`` per kernel."""
    return max(0.0, launches * host_op_s - step_s)


def prefill_step_s(chip: Chip, result: SimResult) -> float:
    """A prefill step's seconds: the engine's step or, when longer, the host's time to issue its
    kernels (module docstring)."""
    return result.step_s + host_bound_s(chip, result)

