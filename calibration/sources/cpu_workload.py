"""A jitted per-op replay of a :class:`~tpusim.workload.program.Program` on the JAX CPU backend.

The replay itself lives in :mod:`calibration.gpu_bench.replay` (jax + numpy only, shared with
the GPU harness); this module describes the program for it
(:func:`calibration.sources.step_description.describe_program`, one matmul per expert) and keeps the
CPU loop's names.

The CPU closed loop needs a real decode step whose bytes, FLOPs and op count are exactly
the ones the simulator prices: the replay runs one XLA kernel or a few per program op, all in
one ``jax.jit`` executable (as a served model is), so a prediction error is the simulator's,
not a workload mismatch. Only the routed experts of the program's routing draw are
allocated. Weight formats must be ones the CPU stores natively (``bf16``, ``f32``);
``resolve_model("...[formats=f32]")`` rewrites a model's formats for this.
"""

from __future__ import annotations

from dataclasses import dataclass

from calibration.gpu_bench.replay import ReplayStep, build_step
from calibration.sources.step_description import describe_program
from tpusim.workload.program import Program


@dataclass
class CpuStep(ReplayStep):
    """A compiled per-op replay of ``program``: ``run()`` executes one step and waits for it."""

    program: Program | None = None


def build_cpu_step(program: Program, *, seed: int = 0) -> CpuStep:
    """Allocate the program's weights and caches and jit its per-op replay."""
    step = build_step(describe_program(program, group_experts=False), seed=seed)
    return CpuStep(fn=step.fn, args=step.args, compile_s=step.compile_s, weight_bytes=step.weight_bytes,
                   cache_bytes=step.cache_bytes, ops=step.ops, program=program)
