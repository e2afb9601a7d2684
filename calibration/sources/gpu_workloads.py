"""What the GPU harness runs: step descriptions and matmul shapes from the simulator's programs.

The harness (:mod:`calibration.gpu_bench`) runs without tpusim, so the shapes it needs are
computed here, from :func:`tpusim.workload.program.build_program` (whose tensors come from
:mod:`tpusim.workload.shapes`, the one owner of shapes), and shipped as
``calibration/gpu_bench/workloads.json``::

    python -m calibration.sources.gpu_workloads            # rewrite workloads.json
    python -m calibration.sources.gpu_workloads --check    # exit 1 if the shipped file is stale

Two sets:

- ``h200``: Llama-3.2-1B, Llama-3.1-8B, Qwen3-30B-A3B (one GPU, bf16) and a **4-layer slice
  of Kimi K3** at its per-device widths under an 8-way plan (layer 0 with the dense MLP,
  layers 1-2 KDA + latent MoE, layer 3 MLA + latent MoE, and the head; bf16 everywhere
  because plain JAX has no MXFP4 matmul; run on one GPU without the plan's collectives), at
  batch 1, 8, 32 and 1024 tokens of context; matmul shapes are every distinct projection
  ``(K, N)`` of those programs.
- ``cpu``: the same architectures at CI sizes (width 256, 2 layers, small vocabularies, f32)
  for the harness's CPU mode and the CPU demonstration of the whole path.

A test compares the shipped file with :func:`bench_workloads`, so the file cannot drift
from the simulator's shapes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from calibration.gpu_bench import WORKLOADS_PATH
from calibration.sources.predict import resolve_model
from calibration.sources.step_description import describe_program
from hwmodels.atomic import write_text_atomic
from hwmodels.units import GIB, MIB
from tpusim.workload.model_catalog import plan_for
from tpusim.workload.program import build_program
from tpusim.workload.routing import parse_routing


@dataclass(frozen=True)
class BenchModel:
    """One model the harness steps: a display name, the simulator's model spec, a plan size."""

    name: str
    model: str
    plan_devices: int = 1
    note: str = ""


K3_SLICE_NOTE = ("a 4-layer slice of Kimi K3 (layer 0 dense MLP, 1-2 KDA, 3 MLA, latent MoE) at its "
                 "8-way per-device widths, run on one GPU without the plan's collectives")
SETS: dict[str, dict[str, Any]] = {
    "h200": {
        "chip": "h200", "context": 1024, "batches": (1, 8, 32), "rows": (1, 8, 64, 256),
        "dtypes": ("bf16", "fp8"), "copy_max_bytes": 4 * GIB, "rotate_bytes": 256 * MIB,
        "models": (
            BenchModel("llama-3.2-1b", "llama-3.2-1b"),
            BenchModel("llama-3.1-8b", "llama-3.1-8b"),
            BenchModel("qwen3-30b-a3b", "qwen3-30b-a3b"),
            BenchModel("kimi-k3-tp8-slice", "kimi-k3[layers=4,formats=bf16]", 8, K3_SLICE_NOTE),
        ),
    },
    "cpu": {
        "chip": "host-cpu", "context": 128, "batches": (1, 8), "rows": (1, 8),
        "dtypes": ("f32",), "copy_max_bytes": 4 * MIB, "rotate_bytes": 8 * MIB,
        "models": (
            BenchModel("llama-tiny", "llama-3.2-1b[width=256,layers=2,vocab=2048,formats=f32]"),
            BenchModel("qwen3-moe-tiny", "qwen3-30b-a3b[width=256,layers=2,experts=16,top_k=4,vocab=2048,formats=f32]"),
            BenchModel("kimi-k3-mini-tp8-slice", "kimi-k3-mini[layers=2,formats=f32]", 8,
                       "kimi-k3-mini at 8-way per-device widths, no collectives"),
        ),
    },
}


def _program(entry: BenchModel, batch: int, context: int) -> Any:
    model = resolve_model(entry.model)
    plan = plan_for(model, entry.plan_devices, intra_link="nvlink")
    return plan, build_program(model, plan, batch=batch, context_tokens=context, routing=parse_routing("uniform"))


def matmul_shapes(programs: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Every distinct projection ``(K, N)`` of ``programs``, first use named as its source."""
    seen: dict[tuple[int, int], str] = {}
    for name, program in programs:
        for op in program.ops:
            if op.unit != "mxu":
                continue
            for tensor in op.tensors:
                seen.setdefault((tensor.rows, tensor.cols), f"{name} {tensor.name}")
    return [{"k": k, "n": n, "source": source} for (k, n), source in seen.items()]


def bench_set(name: str) -> dict[str, Any]:
    """One set of the workloads file (see the module docstring)."""
    spec = SETS[name]
    steps, first_programs = [], []
    for entry in spec["models"]:
        for batch in spec["batches"]:
            plan, program = _program(entry, batch, spec["context"])
            if batch == spec["batches"][0]:
                first_programs.append((entry.name, program))
            steps.append({
                "name": entry.name, "model": entry.model, "plan": plan.name, "plan_devices": entry.plan_devices,
                "batch": batch, "note": entry.note, "weight_bytes": program.weight_bytes,
                "description": describe_program(program, group_experts=True),
            })
    return {
        "chip": spec["chip"], "context": spec["context"], "rows": list(spec["rows"]), "dtypes": list(spec["dtypes"]),
        "copy_max_bytes": spec["copy_max_bytes"], "rotate_bytes": spec["rotate_bytes"],
        "matmuls": matmul_shapes(first_programs), "steps": steps,
    }


def bench_workloads() -> dict[str, Any]:
    """The whole workloads file as a dict."""
    return {"generated_by": "python -m calibration.sources.gpu_workloads",
            "sets": {name: bench_set(name) for name in SETS}}


def render(workloads: dict[str, Any]) -> str:
    """Compact JSON, one step per line (small, and diffs stay readable)."""
    lines = ["{", f'"generated_by": {json.dumps(workloads["generated_by"])},', '"sets": {']
    names = list(workloads["sets"])
    for index, name in enumerate(names):
        body = workloads["sets"][name]
        head = {key: value for key, value in body.items() if key != "steps"}
        lines.append(f"{json.dumps(name)}: {json.dumps(head, separators=(',', ':'))[:-1]},")
        lines.append('"steps": [')
        lines += [json.dumps(step, separators=(",", ":")) + ("," if i < len(body["steps"]) - 1 else "")
                  for i, step in enumerate(body["steps"])]
        lines.append("]}" + ("," if index < len(names) - 1 else ""))
    lines += ["}", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="python -m calibration.sources.gpu_workloads", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the shipped workloads.json is stale")
    args = parser.parse_args(argv)
    text = render(bench_workloads())
    if args.check:
        current = WORKLOADS_PATH.read_text(encoding="utf-8") if WORKLOADS_PATH.exists() else ""
        if current != text:
            sys.stderr.write(f"{WORKLOADS_PATH}: stale; run python -m calibration.sources.gpu_workloads\n")
            return 1
        return 0
    write_text_atomic(WORKLOADS_PATH, text)
    sys.stdout.write(f"wrote {WORKLOADS_PATH} ({len(text) / 1e3:.0f} kB)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
