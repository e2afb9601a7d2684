"""The public Blackwell decode sweeps the GPU batch figures are fitted and judged on: which rows,
how each sweep is deployed and simulated, and which side of the frozen split each point is on.

The data (``calibration/data/gpu-batch-scaling.json``, *published*: 183 sourced rows, copied
from ``shared/reference/gpu-batch-scaling.json``; its caveats in that folder's ``.md``).

**Which rows, and why.** A row is used only when its deployment is fixed along its sweep,
its metric is decode TPOT as the client measured it, no speculative decoding changes the
tokens per step, and its model is one the simulator has (``data/gpu-batch-models/``):

=================  ============================================  ====================================
sweep              rows (JSON row_id)                            deployment
=================  ============================================  ====================================
k25-b200-tp4ep4    S1b 21-25: Kimi-K2.5 NVFP4, 8k/1k, c 4-64      vLLM, one TP4/EP4 instance
k25-gb200-disagg   S1b 26-29: Kimi-K2.5 NVFP4, 8k/1k, c 4-32      Dynamo + vLLM, disaggregated: 4
                                                                 TP4/EP4 decode workers (derived)
k25-b200-tp4       S1c 41-45: Kimi-K2.5 NVFP4, 8k/1k, c 4-64      vLLM v0.21, TP4 (experts TP4)
k25-b200-int4-tp8  S1c 35-39: Kimi-K2.5 INT4, 8k/1k, c 4-64       vLLM v0.21, TP8
dsr1-b200-*        S4 115-123: DeepSeek-R1 FP8, 3 ISL/OSL         SGLang, TP8; per-row mean lengths
qwen3-b200-*       S4 128-136: Qwen3-235B BF16, 3 ISL/OSL         SGLang, TP8; per-row mean lengths
=================  ============================================  ====================================

All aggregated (prefill and decode on the same GPUs) but the GB200 sweep, whose decode
workers are fixed from concurrency 4 to 32 and whose count is derived (:func:`derived_gpus`,
:data:`GB200_DECODE_WORKERS`): a point's decode step runs ``concurrency / workers``
sequences, and no prefill stalls it. Left out, each with its reason in :data:`EXCLUDED`: S1a
(MTP), S1b GB200 from concurrency 128 (the GPU count changes), S1c row 40, S1d, S1e-g, S2, S3,
S4 Kimi-K2 / gpt-oss, S5, S6, S7.

**The split** (``data/gpu-batch-split.json``, :func:`load_split`, frozen on 2026-12-06): whole
sweeps held out by a rule written down first (:func:`held_out_by_rule`); :func:`points` gives
every point its role (anchor: a sweep's lowest concurrency; fit; held-out) from that file only.
The fit and its judgement are :mod:`calibration.sources.gpu_batch_sweeps`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from calibration.core.parameters import chip_with
from hwmodels.catalog import load_chip
from hwmodels.schema import Chip
from tpusim.engine.gpu import gpu_variant

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DATA_FILE = DATA_DIR / "gpu-batch-scaling.json"
MODELS_DIR = DATA_DIR / "gpu-batch-models"
SPLIT_FILE = DATA_DIR / "gpu-batch-split.json"  # the frozen fit / held-out split (issue 50)
MEASUREMENT = "published:gpu-batch-sweeps"
# The per-kernel figures of the K3-on-B300 fit (`tpusim calibrate --hardware b300 --measurements
# published:b300-sglang-k3`, calibration.sources.k3_b300: kernel_gap_s 1.8 -> 0.9228 us,
# per_op_efficiency 0.8889 -> 0.9659; same SM architecture as B200/GB200): the batch-1 calibration
# the batch figures are fitted on top of. Changing them needs refresh_baseline().
BATCH1_FIGURES = {"execution.gpu.kernel_gap_s": 0.9228e-6, "execution.per_op_efficiency": 0.9659}
FIT_STACK = "generic"  # the vLLM-class fusion table (tpusim.engine.gpu_fusion)


@dataclass(frozen=True)
class Sweep:
    """One fixed-deployment sweep of the data and how it is simulated."""

    key: str
    source_id: str
    rows: tuple[int, ...]  # JSON row_id, by concurrency
    chip: str
    devices: int
    model: str  # a file in MODELS_DIR, with @variant
    plan: str
    disaggregated: bool
    workload: str
    stack: str  # vllm (chunked prefill mixed into decode steps) | sglang (prefill steps first)
    decode_workers: int = 1  # decode instances sharing the concurrency (disaggregated GB200: derived)


SWEEPS: tuple[Sweep, ...] = (
    Sweep("k25-b200-tp4ep4", "S1b", (21, 22, 23, 24, 25), "b200", 4, "kimi-k2.5.yaml@nvfp4",
          "tp=4,expert_groups=4,expert_tp=1", False, "8k/1k", "vllm"),
    Sweep("k25-gb200-disagg", "S1b", (26, 27, 28, 29), "gb200", 4, "kimi-k2.5.yaml@nvfp4",
          "tp=4,expert_groups=4,expert_tp=1", True, "8k/1k", "vllm", decode_workers=4),
    Sweep("k25-b200-tp4", "S1c", (41, 42, 43, 44, 45), "b200", 4, "kimi-k2.5.yaml@nvfp4",
          "tp=4,expert_groups=1,expert_tp=4", False, "8k/1k", "vllm"),
    Sweep("k25-b200-int4-tp8", "S1c", (35, 36, 37, 38, 39), "b200", 8, "kimi-k2.5.yaml@int4",
          "tp=8,expert_groups=1,expert_tp=8", False, "8k/1k", "vllm"),
    Sweep("dsr1-b200-1k1k", "S4", (115, 116, 117), "b200", 8, "deepseek-r1.yaml",
          "tp=8,expert_groups=1,expert_tp=8", False, "1k/1k", "sglang"),
    Sweep("dsr1-b200-1k8k", "S4", (118, 119, 120), "b200", 8, "deepseek-r1.yaml",
          "tp=8,expert_groups=1,expert_tp=8", False, "1k/8k", "sglang"),
    Sweep("dsr1-b200-8k1k", "S4", (121, 122, 123), "b200", 8, "deepseek-r1.yaml",
          "tp=8,expert_groups=1,expert_tp=8", False, "8k/1k", "sglang"),
    Sweep("qwen3-b200-1k1k", "S4", (128, 129, 130), "b200", 8, "qwen3-235b-a22b.yaml",
          "tp=8,expert_groups=1,expert_tp=8", False, "1k/1k", "sglang"),
    Sweep("qwen3-b200-1k8k", "S4", (131, 132, 133), "b200", 8, "qwen3-235b-a22b.yaml",
          "tp=8,expert_groups=1,expert_tp=8", False, "1k/8k", "sglang"),
    Sweep("qwen3-b200-8k1k", "S4", (134, 135, 136), "b200", 8, "qwen3-235b-a22b.yaml",
          "tp=8,expert_groups=1,expert_tp=8", False, "8k/1k", "sglang"),
)
EXCLUDED = {
    "S1a": "MTP on (TPOT per accepted token, acceptance not published); decode EP changes at 180; judged "
           "apart, with the draft + verify rule: calibration.sources.gpu_batch_speculative",
    "S1b 30-34": "GB200 from concurrency 128: the deployment changes (derived GPU count 41 at 128 against 22 "
                 "at 4-32, decode TP16/TP8 from 512); rows 26-29 are used with 4 decode workers (derived_gpus)",
    "S1c 40": "a single TP8 NVFP4 point (no sweep)",
    "S1d": "disaggregated with the deployment changing at every point; DeepSeek-V4 not modelled",
    "S1e-S1g": "one peak-throughput point per GPU, not sweeps",
    "S2": "no TPOT (tok/s/user is a derived upper bound); conc 64 queue-bound",
    "S3": "DeepSeek-V4 not modelled; speculative decoding and server config change by concurrency band",
    "S4 124-127": "Kimi-K2 changes deployment (DP-attention at 1, EP4 at 100); gpt-oss not modelled",
    "S5": "MLPerf latency-bound scenarios, no concurrency",
    "S6": "offline saturation points (trtllm-bench), not a concurrency sweep",
    "S7": "headline points only",
}
# The GB200 sweep's decode workers, derived (not published): derived_gpus() puts 20-22 GPUs under
# concurrency 4-32 (Little's law on the published tok/s/GPU and TPOT; the TTFT, unpublished, only
# lowers it), i.e. at most 5 TP4 workers; with one TP4 prefill worker, 4 decode workers. Three or
# fewer cannot be: from concurrency 4 to 32 the routed-expert (NVFP4, 24.8 MB, 60 layers) and
# latent-KV bytes one GPU must then read grow by >= 3.9 ms at the 8 TB/s peak, the measured TPOT by
# 3.2 ms (four workers: 2.95 ms).
GB200_DECODE_WORKERS = 4
INFERENCEX_LENGTH = 0.9  # InferenceX samples ISL and OSL at 80-100 % of nominal: mean 0.9


@dataclass(frozen=True)
class Point:
    """One published sweep point: what was measured and how the simulator sees it."""

    sweep: Sweep
    row_id: int
    concurrency: int
    isl: float
    osl: float
    tpot_ms: float
    role: str  # anchor | fit | held-out

    @property
    def context_tokens(self) -> int:
        return round(self.isl + self.osl / 2)

    @property
    def key(self) -> str:
        return f"{self.sweep.key}@{self.concurrency}"

    @property
    def rows(self) -> int:
        """Sequences one decode worker runs: the concurrency shared by the sweep's workers."""
        return max(1, round(self.concurrency / self.sweep.decode_workers))


@cache
def load_rows() -> dict[int, dict[str, Any]]:
    """The published rows by row_id (the package copy)."""
    return {int(row["row_id"]): row for row in json.loads(DATA_FILE.read_text(encoding="utf-8"))}


def derived_gpus(row: dict[str, Any]) -> float:
    """GPUs behind a point by Little's law, an upper bound: ``concurrency / TPOT`` output tokens/s
    over the published output tokens/s per GPU (the TTFT, not published for S1b, only lowers the
    real throughput per client)."""
    return row["concurrency"] * 1e3 / row["tpot_ms"] / row["output_tok_s_per_gpu"]


def _lengths(row: dict[str, Any]) -> tuple[float, float]:
    """Mean ISL / OSL of a row: S4 states its means in ``workload_note``; InferenceX rows are
    sampled at 80-100 % of nominal."""
    note = str(row.get("workload_note") or "")
    if "actual mean in=" in note:
        tail = note.split("actual mean in=", 1)[1]
        isl = float(tail.split(",", 1)[0])
        osl = float(tail.split("out=", 1)[1].split(" ", 1)[0])
        return isl, osl
    return INFERENCEX_LENGTH * row["isl"], INFERENCEX_LENGTH * row["osl"]


def family(sweep: Sweep) -> str:
    """A sweep's model family: its model file's name without ``.yaml`` and variant."""
    return sweep.model.split("@", 1)[0].removesuffix(".yaml")


@cache
def load_split() -> dict[str, Any]:
    """The frozen split (:data:`SPLIT_FILE`): its rule, date, sweep lists and the mechanisms found on
    held-out rows. The one owner of which sweep is fitted; :func:`points` reads it."""
    split = json.loads(SPLIT_FILE.read_text(encoding="utf-8"))
    keys = {s.key for s in SWEEPS}
    fit, held = set(split["fit_sweeps"]), set(split["held_out_sweeps"])
    if fit & held or fit | held != keys:
        raise ValueError(f"{SPLIT_FILE.name}: fit and held-out sweeps must partition {sorted(keys)}")
    return split


def held_out_by_rule(sweep: Sweep, rule: dict[str, list[str]]) -> bool:
    """The split's rule in code (``held_out_when`` of the split file): held out when the sweep's
    family, its GPU type or its publication is one the rule names."""
    return (family(sweep) in rule["family"] or sweep.chip not in rule["gpu_not"]
            or sweep.source_id in rule["source"])


def points() -> list[Point]:
    """Every used point with its role: the lowest concurrency of a sweep is its anchor; the rest
    are on their sweep's side of the frozen split (:func:`load_split`), fit or held-out."""
    rows = load_rows()
    fit_sweeps = set(load_split()["fit_sweeps"])
    out = []
    for sweep in SWEEPS:
        chosen = sorted((rows[i] for i in sweep.rows), key=lambda r: r["concurrency"])
        for rank, row in enumerate(chosen):
            role = "anchor" if rank == 0 else "fit" if sweep.key in fit_sweeps else "held-out"
            isl, osl = _lengths(row)
            out.append(Point(sweep, int(row["row_id"]), int(row["concurrency"]), isl, osl, float(row["tpot_ms"]),
                             role))
    return out


def sweep_chip(sweep: Sweep, values: dict[str, float] | None = None) -> Chip:
    """The published chip of a sweep, serving stack with the fit's fusion table, the batch-1
    figures and ``values`` laid over it."""
    published = load_chip(sweep.chip, calibrated=False)
    gpu = published.execution.gpu
    assert gpu is not None
    published = published.model_copy(update={"execution": published.execution.model_copy(
        update={"gpu": gpu.model_copy(update={"stack": FIT_STACK})})})
    return gpu_variant(chip_with(published, {**BATCH1_FIGURES, **(values or {})}, fitted_on=MEASUREMENT), "stack")

