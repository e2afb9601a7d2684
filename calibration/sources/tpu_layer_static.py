"""What one layer of the megakernel issues beyond the engine's ops, from libtpu's own schedule.

The fixed-cost probe finds about 50 µs a layer that the simulator's ops do not price
(:mod:`calibration.sources.tpu_fixed_cost`, "way (b)": fitted on the kernel's capped runs).
The compiler's schedule bounds how much of it is code the layer issues
(:mod:`calibration.tpu_bench.static_layer` records it, :mod:`calibration.sources.compiler_loops`
reads it): K3's per-device kernel on the v5e (panel loops 8/2) issues, per layer of its loop,
23,266 bundles outside the MLA/KDA ``lax.cond`` at batch 1 plus 36,404 in an MLA layer's arm
or 27,603 in a KDA layer's (39.8 / 33.9 µs at 1.5 GHz, no stall counted), against the
engine's 25.5 / 19.5 µs of MXU and VPU work for the same ops: about 14 µs a layer of issue the
engine does not price. Per-row code doubles past one 8-row sublane tile: at batch 16 the
layer issues 58.5 / 57.8 µs against the engine's 29.5 / 25.8. The rest of way (b)'s 50 µs
is time the bundles do not hold (stalls: MXU result latency, vector-to-scalar pops, waits).

:func:`layer_remainder` turns that into the simulator's per-layer figure
(``execution.per_layer_overhead_s``, paid on the compute stream): for each layer of the
loop, what the record says it issues (outside the arms, plus its kind's arm) / the clock,
less the engine's own compute for the ops the record counts (the non-expert ops' MXU and VPU
pieces; left out, as the record leaves out the kernel's data-dependent loops: the routed
experts, the combine that sums them, and the MLA core's KV tiles up to the position); the
mean over the loop's layers. A floor of what the code costs: stalls are not in bundles.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from calibration.sources.tpu_chip_records import schedule_named
from hwmodels.records.kernel import WALK
from hwmodels.schema import Chip
from tpusim.collector import collector_paused
from tpusim.engine.build import lower
from tpusim.engine.core import execution_policy, step_vmem_plan
from tpusim.workload.format_choice import formats_for_chip
from tpusim.workload.model_catalog import load_model, shard_plan
from tpusim.workload.program import build_program
from tpusim.workload.registry.names import MlaOp, MoeOp

DATA = Path(__file__).resolve().parents[1] / "data"
STATIC_PATH = DATA / "tpu-v5e-static-schedule.jsonl"
PUBLISHED = "published"  # the schedule the layer-loop records were compiled under unless they say
V5E_CLOCK_HZ = 1.5e9  # derived: 197 TF/s bf16 (catalog) = 4 MXUs x 128 x 128 x 2 flops x 1.5 GHz
# the engine's ops whose kernel code sits in a data-dependent loop (left out of the record)
DATA_DEPENDENT_OPS = frozenset({MlaOp.CORE, MoeOp.COMBINE})


@dataclasses.dataclass(frozen=True)
class LayerIssue:
    batch: int
    panel_unroll: tuple[int, int]
    issued_bundles: int  # a layer outside the MLA/KDA arms
    arms: dict[str, int]  # bundles each arm issues: "mla", "kda"
    date: str
    expert_list: str = WALK  # how the compiled moe.topk built the expert list (records before: walk)
    iterations: int = 0  # loop iterations a layer runs outside the arms (its own back edge included)
    arm_iterations: dict[str, int] = dataclasses.field(default_factory=dict)  # and in each arm
    # the MLA core's KV loop (data-dependent: left out of the above): a tile's bundles beyond its
    # part loop, the part loop's body and its trips a tile (kv_loops)
    kv_tile_bundles: int = 0
    kv_part_bundles: int = 0
    kv_part_trips: int = 0
    kv_tile_iterations: int = 0
    kv_part_iterations: int = 0
    schedule: str = PUBLISHED  # the built-in schedule the kernel was compiled under (records before: published)

    def issue_s(self, kind: str, clock_hz: float = V5E_CLOCK_HZ, loop_iteration_s: float = 0.0) -> float:
        """Seconds a layer of ``kind`` ("mla" or "kda") issues at ``clock_hz``, each loop
        iteration it runs (the data-dependent loops' left out) paying ``loop_iteration_s`` more."""
        iterations = self.iterations + self.arm_iterations.get(kind, 0)
        return (self.issued_bundles + self.arms[kind]) / clock_hz + iterations * loop_iteration_s


def loop_iterations(record: dict[str, Any]) -> tuple[int, dict[str, int]]:
    """(iterations outside the arms, per arm) one pass of a ``layer_body`` record's layer loop
    runs: each inner loop with a static count, its trips times those of the inner loops that
    hold it; loops inside a data-dependent loop left out (as their bundles are); outside the
    arms the layer loop's own back edge (+1)."""
    loops = [(r["start"], r["start"] + r["bundles"] - 1, r["trips"]) for r in record.get("inner_loops", [])]
    dependent = [(d["start"], d["start"] + d["bundles"] - 1) for d in record.get("data_dependent_loops", [])]
    dependent += [(d["start"], d["start"] + d["bundles"] - 1)
                  for arm in record.get("arms", {}).values() for d in arm.get("data_dependent_loops", [])]
    arms = {kind: (arm["start"], arm["end"]) for kind, arm in record.get("arms", {}).items() if "start" in arm}

    def runs(lo: int, hi: int, skip: list[tuple[int, int]]) -> int:
        total = 0
        for start, end, trips in loops:
            if not lo <= start <= hi or any(a <= start <= b for a, b in skip + dependent):
                continue
            held = [t for s, e, t in loops if (s, e) != (start, end) and s <= start and end <= e]
            total += trips * int(np.prod(held, dtype=np.int64))
        return total

    outside = runs(0, max((end for _, end, _ in loops), default=0), list(arms.values())) + 1
    return outside, {kind: runs(*arms[kind], []) if kind in arms else 0 for kind in record.get("arms", {})}


def kv_loops(record: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """The MLA arm's data-dependent loop in a ``layer_body`` record — the kernel's KV-tile loop
    (``kernel_attention._attend_cache``), whose largest inner loop folds a tile's parts: (a
    tile's bundles beyond its parts, a part's bundles, the parts a tile as compiled, the loop
    iterations a tile runs beyond its parts' and its own back edge, those a part runs beyond its
    own), each smaller inner loop's bundles counted as many times as it runs; zeros when the
    record has no such loop."""
    tiles = record.get("arms", {}).get("mla", {}).get("data_dependent_loops", [])
    if len(tiles) != 1:
        return 0, 0, 0, 0, 0
    lo, hi = tiles[0]["start"], tiles[0]["start"] + tiles[0]["bundles"] - 1
    inner = [loop for loop in record.get("inner_loops", []) if lo <= loop["start"] <= hi]
    if not inner:
        return 0, 0, 0, 0, 0
    part = max(inner, key=lambda loop: loop["bundles"])
    p_lo, p_hi = part["start"], part["start"] + part["bundles"] - 1
    tile_bundles, part_bundles = tiles[0]["bundles"] - part["bundles"], part["bundles"]
    tile_iterations = part_iterations = 0
    for loop in inner:
        if loop is part:
            continue
        more = (loop["trips"] - 1) * loop["bundles"]  # its body is in the count once
        if p_lo <= loop["start"] <= p_hi:
            part_bundles, part_iterations = part_bundles + more, part_iterations + loop["trips"]
        else:
            tile_bundles, tile_iterations = tile_bundles + more, tile_iterations + loop["trips"]
    return tile_bundles, part_bundles, part["trips"], tile_iterations, part_iterations


def layer_issues(path: Path | str = STATIC_PATH) -> list[LayerIssue]:
    """Every layer-loop record of ``path`` (``probe: layer_body``)."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [LayerIssue(r["params"]["batch"], tuple(r["params"]["panel_unroll"]), r["issued_bundles"],
                       {kind: arm["issued_bundles"] for kind, arm in r["arms"].items()}, r["date"],
                       r["params"].get("expert_list", WALK), *loop_iterations(r), *kv_loops(r),
                       r["params"].get("schedule", PUBLISHED))
            for r in rows if r.get("probe") == "layer_body"]


def layer_issue(batch: int, panel_unroll: tuple[int, int], path: Path | str = STATIC_PATH,
                expert_list: str = WALK, schedule: str = PUBLISHED) -> LayerIssue:
    """The latest record at ``batch`` of the build (``panel_unroll``, ``expert_list``) compiled
    under ``schedule``, else the published schedule's (a schedule changes the kernel's code: its
    copies' issue points, a ring pool's bookkeeping), else of the build nearest it (the same
    expert list, then the same expert loop first); KeyError when no build has one at that batch."""
    at = [r for r in layer_issues(path) if r.batch == batch]
    if not at:
        raise KeyError(f"no layer-loop record at batch {batch} in {path} "
                       f"(python -m calibration.tpu_bench.static_layer --batch {batch} --out {path})")
    def distance(r: LayerIssue) -> tuple[bool, bool, bool, int, bool, bool]:
        return (r.expert_list != expert_list, r.panel_unroll != tuple(panel_unroll), r.panel_unroll[1] != panel_unroll[1],
                abs(r.panel_unroll[0] - panel_unroll[0]), r.schedule != schedule, r.schedule != PUBLISHED)
    return min(sorted(at, key=lambda r: r.date, reverse=True), key=distance)  # the latest among equals


def engine_layer_compute_s(chip: Chip, batch: int, panel_unroll: tuple[int, int],
                           schedule: str = PUBLISHED) -> dict[int, tuple[str, float]]:
    """Per layer of the loop (1 … L-2) of K3's per-device program at ``batch`` under
    ``schedule``: its kind ("mla" or "kda") and the engine's MXU and VPU seconds for the ops a
    layer-loop record counts."""
    return _engine_layer_compute_s(chip.model_dump_json(), batch, tuple(panel_unroll), schedule)


@functools.cache
def _engine_layer_compute_s(chip_json: str, batch: int, panel_unroll: tuple[int, int],
                            schedule_name: str) -> dict[int, tuple[str, float]]:
    chip = Chip.model_validate_json(chip_json)
    program, schedule = _program(batch, schedule_name)
    policy = dataclasses.replace(execution_policy(chip), panel_unroll=panel_unroll)
    effective = policy.effective_schedule(schedule)
    with collector_paused():  # as the engine lowers: tens of thousands of acyclic objects
        lowered = lower(program, effective, chip, policy, step_vmem_plan(program, effective))
    last = max(op.layer for op in program.ops)
    seconds: dict[int, float] = {}
    mla: set[int] = set()
    mla_ops = set(MlaOp)  # (once: an enum's set made per op was a third of this function's time)
    for op, plan in zip(program.ops, lowered.ops, strict=True):
        if not 1 <= op.layer <= last - 1:
            continue
        if op.name in mla_ops:
            mla.add(op.layer)
        if op.expert_index is None and op.name not in DATA_DEPENDENT_OPS:
            seconds[op.layer] = seconds.get(op.layer, 0.0) + sum(piece.duration_s for piece in plan.pieces)
    return {layer: ("mla" if layer in mla else "kda", s) for layer, s in seconds.items()}


def _program(batch: int, schedule: str = PUBLISHED) -> tuple[Any, Any]:
    return _program_at(batch), _schedule(schedule)


@functools.cache
def _program_at(batch: int) -> Any:  # one program a batch, whatever the schedule
    model = formats_for_chip(load_model("kimi-k3"), None, "tpu")[0]  # as the kernel records' programs
    return build_program(model, shard_plan(model, "k3-tp32"), batch=batch, context_tokens=1024)


@functools.cache
def _schedule(name: str) -> Any:
    return schedule_named(name)


def layer_remainder(chip: Chip, batch: int, panel_unroll: tuple[int, int],
                    path: Path | str = STATIC_PATH, clock_hz: float = V5E_CLOCK_HZ,
                    expert_list: str = WALK, loop_iteration_s: float = 0.0,
                    schedule: str = PUBLISHED) -> tuple[float, str]:
    """(seconds a layer, source): the mean over the loop's layers of what the record (of the
    build ``panel_unroll``, ``expert_list``, compiled under ``schedule`` where there is one:
    :func:`layer_issue`) says the layer issues (outside the arms, plus its kind's arm; each loop
    iteration ``loop_iteration_s`` more) less the engine's compute for the same ops on ``chip``
    under the record's schedule (module docstring), clipped at 0."""
    record = layer_issue(batch, panel_unroll, path, expert_list, schedule)
    layers = engine_layer_compute_s(chip, batch, panel_unroll, record.schedule)
    def issue(kind: str) -> float:
        return record.issue_s(kind, clock_hz, loop_iteration_s)
    value = max(sum(issue(kind) - s for kind, s in layers.values()) / len(layers), 0.0)
    engine = {kind: [s for k, s in layers.values() if k == kind] for kind in ("kda", "mla")}
    build = "" if record.panel_unroll == tuple(panel_unroll) else f" (the u{record.panel_unroll[0]}x{record.panel_unroll[1]} build's)"
    if record.expert_list != WALK or expert_list != WALK:
        build += f" ({record.expert_list} expert list{'' if record.expert_list == expert_list else ', nearest'})"
    if record.schedule != PUBLISHED or schedule != PUBLISHED:
        build += f" (the kernel under {record.schedule}{'' if record.schedule == schedule else ', nearest'})"
    return value, (f"derived from libtpu's static schedule{build} ({record.date[:10]}): a layer of the loop issues "
                   + ", ".join(f"{kind.upper()} {issue(kind) * 1e6:.1f} µs" for kind in ("kda", "mla"))
                   + f" at batch {batch} ({clock_hz / 1e9:.3f} G bundles/s"
                   + (f", {record.iterations + record.arm_iterations.get('kda', 0)} / "
                      f"{record.iterations + record.arm_iterations.get('mla', 0)} loop iterations at "
                      f"{loop_iteration_s * 1e9:.1f} ns" if loop_iteration_s else ", no stall")
                   + "), less the engine's "
                   + ", ".join(f"{sum(v) / len(v) * 1e6:.1f}" for v in engine.values() if v)
                   + " µs for the same ops; the mean over the loop's layers")


def attention_core_figures(batch: int, panel_unroll: tuple[int, int], path: Path | str = STATIC_PATH,
                           clock_hz: float = V5E_CLOCK_HZ, expert_list: str = WALK,
                           loop_iteration_s: float = 0.0, schedule: str = PUBLISHED) -> tuple[float, float, str] | None:
    """(seconds a cached token, seconds a tile beyond its tokens', source) of the MLA core from
    the record's KV loop (:func:`kv_loops`; the build's record at ``batch``, else the nearest
    build's): a part's bundles / the clock, plus its loop iterations, over the part's
    :data:`megakernel.math_mla.KV_FOLD_TOKENS` tokens; a tile's own bundles / the clock plus its
    iterations. The code of the batch's rows together, products and vector work alike (what the
    engine's ``execution.attention_core_s_per_token`` prices); bundles issued, no stall. None
    when the record has no KV loop."""
    from megakernel.math_mla import KV_FOLD_TOKENS

    record = layer_issue(batch, panel_unroll, path, expert_list, schedule)
    if not record.kv_part_bundles:
        return None
    token_s = (record.kv_part_bundles / clock_hz + (1 + record.kv_part_iterations) * loop_iteration_s) / KV_FOLD_TOKENS
    tile_s = record.kv_tile_bundles / clock_hz + (1 + record.kv_tile_iterations) * loop_iteration_s
    build = "" if (record.panel_unroll, record.expert_list) == (tuple(panel_unroll), expert_list) else \
        f" (the nearest build's: u{record.panel_unroll[0]}x{record.panel_unroll[1]}, {record.expert_list} expert list)"
    if record.schedule != PUBLISHED:
        build += f" (the kernel under {record.schedule})"
    return token_s, tile_s, (
        f"derived from libtpu's static schedule{build} ({record.date[:10]}): the MLA core's KV loop at batch {batch}, "
        f"{record.kv_part_bundles} bundles a {KV_FOLD_TOKENS}-token part ({record.kv_part_trips} parts a tile as "
        f"compiled) and {record.kv_tile_bundles} a tile beyond its parts, at {clock_hz / 1e9:.3f} G bundles/s"
        + (f", each loop iteration {loop_iteration_s * 1e9:.1f} ns more" if loop_iteration_s else ", no stall"))


def put_attention_core(data: dict[str, Any], core: tuple[float, float, str] | None, note: str = "",
                       label: str = "derived") -> None:
    """Write :func:`attention_core_figures`' result (or another source's of the same shape) into
    dumped chip ``data`` (its ``execution.attention_core_s_per_token``, ``label``, and ``_per_tile``,
    always the static schedule's, ``derived``; ``note`` appended to the source); nothing when ``core`` is None (the chip keeps pricing the
    core by its products)."""
    if core is None:
        return
    token_s, tile_s, source = core
    data["execution"].update({"attention_core_s_per_token": {"value": token_s, "label": label, "source": source + note},
                              "attention_core_s_per_tile": {"value": tile_s, "label": "derived", "source": source + note}})
