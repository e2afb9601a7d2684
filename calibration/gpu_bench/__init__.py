"""Measure a GPU (or this CPU) for calibration, with jax and numpy only.

``python -m calibration.gpu_bench --out DIR`` runs, in one process, on the first JAX
device: copy bandwidth from 64 KiB up to ``--max-bytes`` (4 GiB at most), the per-op cost of
eager dispatch and the per-kernel gap inside one compiled step, matmuls at the shipped
models' decode shapes (rows 1, 8, 64, 256; bf16 and fp8), whole decode steps of the shipped
step descriptions (Llama-3.2-1B, Llama-3.1-8B, Qwen3-30B-A3B and a 4-layer slice of Kimi K3
at its TP8 per-device widths, batch 1, 8, 32) and one ``jax.profiler`` trace per model. It
writes ``DIR/records.jsonl`` (``Measurement`` lines labelled ``measured-on-h200``, or
``measured-on-cpu`` on a CPU backend, each with the date, JAX version and device name),
``DIR/traces/`` with ``DIR/traces.json``, and ``DIR/run.json`` (what ran, what was skipped
and why).

Modules: :mod:`~calibration.gpu_bench.records` (timing recipe, record dicts),
:mod:`~calibration.gpu_bench.micro` (copies, gaps, matmuls), :mod:`~calibration.gpu_bench.replay`
(a step description as one jitted step), :mod:`~calibration.gpu_bench.steps` (decode steps
and traces), ``__main__`` (the command). Nothing here imports pydantic, simpy, scipy or
tpusim: the lent machine's Python has only JAX. Of the house it imports only the record
layer (:mod:`hwmodels.records`: the timing summary and the one JSON-lines writer, standard
library only). Bringing results home, fitting and
predicting happen on the simulator's side (:mod:`calibration.sources.gpu_ingest`,
:mod:`calibration.sources.gpu_micro`); ``run_on_device.sh`` is the one prepared device command.
"""

from pathlib import Path

WORKLOADS_PATH = Path(__file__).resolve().parent / "workloads.json"
