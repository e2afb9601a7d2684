"""Which calibration procedure a chip and its data get (never the command line's choice).

Each procedure is one source (:mod:`calibration.sources`) fitted through the one core
(:func:`calibration.core.fit`).
"""

from __future__ import annotations

from hwmodels.schema import Chip

PROCEDURES = ("part by part", "end to end", "cpu loop", "gpu micro", "gpu stack", "gpu k3 stack", "tpu kernel records")
GPU_K3_STACK_SETS = ("published:b300-sglang-k3",)  # published K3 rows on B300 (calibration.sources.k3_b300)
GPU_STACK_SETS = ("published:b200-vllm-qwen3.5",)  # published per-stage splits (calibration.sources.gpu_stack)


def choose_procedure(chip: Chip, *, measurements: str, micro_set: bool = False, has_components: bool = False,
                     parameters_given: bool = False, kernel_records: bool = False) -> str:
    """The calibration procedure for ``chip`` and its data (not the command line's choice):

    - a TPU's own megakernel step times (``megakernel.runner`` records) → ``tpu kernel records``
      (:mod:`calibration.sources.tpu_kernel_fit`);
    - a CPU chip measured by the closed loop → ``cpu loop``;
    - a GPU serving stack's published per-stage split → ``gpu stack``;
    - the published K3 rows on B300 → ``gpu k3 stack`` (:mod:`calibration.sources.k3_b300`);
    - a :mod:`calibration.gpu_bench` file (micro-benchmarks + whole steps) → ``gpu micro``;
    - component measurements for this chip exist and no figure list was given → ``part by part``;
    - otherwise → ``end to end``.
    """
    if chip.kind == "tpu" and kernel_records:
        return "tpu kernel records"
    if chip.kind == "cpu" and measurements.startswith("cpu-loop"):
        return "cpu loop"
    if chip.kind == "gpu" and measurements in GPU_STACK_SETS:
        return "gpu stack"
    if measurements in GPU_K3_STACK_SETS:
        return "gpu k3 stack"
    if micro_set:
        return "gpu micro"
    if has_components and not parameters_given:
        return "part by part"
    return "end to end"
