"""A two-layer program small enough to simulate by hand: the engine must match exactly.

The chip is built in the test with round numbers; the program is built op by op. Each
expected time is worked out in the test's docstring/comments, microsecond by microsecond.
"""

from __future__ import annotations

from typing import Any

import pytest

from hwmodels.schema import Chip
from tpusim.engine import simulate
from tpusim.schedule.schema import FamilySchedule, Schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import CollectiveCall, LayerProgram, Op, Program
from tpusim.workload.shapes import TensorSpec
from tpusim.workload.sharding import CollectiveSpec, CollectiveStage

US = 1e-6
GATE_UP_BYTES = 256 * 1024 * 2  # bf16 256 x 1024 = 524,288 B
DOWN_BYTES = 512 * 256 * 2  # bf16 512 x 256 = 262,144 B
# HBM: 524,288 B in 20 µs -> 2.62144e10 B/s (so gate_up streams in 20 µs alone, down in 10).
HBM_BYTES_PER_S = GATE_UP_BYTES / (20 * US)
# MXU: tile 128 x 128; batch 1 pads to 128 rows. gate_up: 2 * 128 * 256 * 1024 = 2^26 FLOPs,
# down: 2 * 128 * 512 * 256 = 2^25 FLOPs. Peak 2^26 FLOPs per 10 µs: gate_up 10 µs, down 5 µs.
# Weight push 1 ns per tile (16 and 8 tiles): far below the FLOP term.
MXU_PEAK = 2**26 / (10 * US)
VPU_PEAK = 1e10  # norm: 2e4 vector FLOPs -> 2 µs
# Collective after mlp.down: one ICI stage, 2 peers x 1000 B at 1e9 B/s = 2 µs, + 3 µs latency.


def _figure(value: float) -> dict[str, Any]:
    return {"value": value, "source": "test: hand-computed case"}


def hand_chip(*, efficient_in_flight: int = 4, penalty: float = 0.0) -> Chip:
    return Chip.model_validate({
        "name": "hand-chip", "vendor": "google", "kind": "tpu", "devices_per_chip": 1,
        "hbm": {"capacity_bytes": _figure(1e9), "peak_bandwidth_bytes_per_s": _figure(HBM_BYTES_PER_S),
                "sustained_bandwidth_bytes_per_s": _figure(HBM_BYTES_PER_S)},
        "on_chip": [{"name": "vmem", "capacity_bytes": _figure(64 * 2**20)}],
        "compute": [
            {"name": "mxu", "peak_flops_per_s": {"bf16": _figure(MXU_PEAK)}, "tile_rows": 128,
             "tile_cols": 128, "weight_push_s_per_tile": _figure(1e-9)},
            {"name": "vpu", "peak_flops_per_s": {"f32": _figure(VPU_PEAK)}},
        ],
        "dma": {"issue_latency_s": _figure(1 * US), "efficient_in_flight": efficient_in_flight,
                "concurrency_penalty_per_dma": _figure(penalty)},
        "links": [{"name": "ici", "bandwidth_bytes_per_s_per_direction": _figure(1e9),
                   "latency_s": _figure(1 * US), "collective_stage_latency_s": _figure(3 * US)}],
        "execution": {"mode": "megakernel", "launch_overhead_s": _figure(0.0),
                      "per_step_overhead_s": _figure(10 * US), "per_layer_overhead_s": _figure(2 * US)},
    })


def hand_program() -> Program:
    """Two layers of [norm (VPU, 2 µs), mlp.gate_up, mlp.down + all-reduce]."""
    model = load_model("kimi-k3-mini").with_layers(2)  # sizes the VMEM arenas only
    plan = plan_for(model, 1)
    gate_up = TensorSpec("mlp.gate_up", "dense_mlp", "dense", "bf16", 256, 1024)
    down = TensorSpec("mlp.down", "dense_mlp", "dense", "bf16", 512, 256)
    assert (gate_up.bytes, down.bytes) == (GATE_UP_BYTES, DOWN_BYTES)
    spec = CollectiveSpec(name="mlp.allreduce", phase="mlp", kind="all_reduce", bytes_per_token=1000,
                          stages=[CollectiveStage(link="ici", peers=2)], after="mlp.down")
    layers = []
    for layer in range(2):
        ops = [
            Op("mlp.mix_norm", "mlp.mix_norm", layer, "mlp", "vpu", vector_flops=2e4),
            Op("mlp.gate_up", "mlp.gate_up", layer, "mlp", "mxu", tensors=(gate_up,), matmuls=((1, 256, 1024),)),
            Op("mlp.down", "mlp.down", layer, "mlp", "mxu", tensors=(down,), matmuls=((1, 512, 256),),
               collectives=(CollectiveCall(spec, 1000),)),
        ]
        layers.append(LayerProgram(layer, "kda", False, ops, 0))
    return Program(model=model, plan=plan, batch=1, context_tokens=1, routing_label="hand", seed=0,
                   device_view="hand", layers=layers, head_ops=[])


def schedule(distance: int, buffers: int) -> Schedule:
    return Schedule(name=f"d{distance}", families={
        "dense_mlp": FamilySchedule(prefetch_distance_ops=distance, buffers=buffers)}, max_dmas_in_flight=4)


def test_no_prefetch_matches_hand_arithmetic() -> None:
    """d = 0: every copy is issued when its op starts and waited on at once.

    t=0..10 per-step overhead; 10..12 layer 0 overhead; 12..14 norm.
    gate_up: issued 14, 1 µs latency, 20 µs stream -> lands 35; compute 35..45.
    down: issued 45, lands 45+1+10 = 56; compute 56..61; all-reduce 3 + 2 = 5 µs -> 66.
    layer 1: overhead 66..68, norm 68..70, gate_up lands 91, compute ..101,
    down lands 112, compute ..117, all-reduce ..122.  Step 122 µs; exposed 21+11+21+11 = 64.
    """
    result = simulate(hand_program(), schedule(0, 1), hand_chip())
    assert result.step_s == pytest.approx(122 * US, rel=1e-9)
    assert result.exposed_dma_s == pytest.approx(64 * US, rel=1e-9)
    assert result.breakdown_s["mlp"] == pytest.approx(2 * (2 + 10 + 5) * US, rel=1e-9)
    assert result.breakdown_s["collectives"] == pytest.approx(10 * US, rel=1e-9)
    assert result.breakdown_s["fixed_overheads"] == pytest.approx(14 * US, rel=1e-9)
    assert sum(result.breakdown_s.values()) == pytest.approx(result.step_s, rel=1e-12)
    assert result.dma_count == 4
    assert result.dma_bytes == 2 * (GATE_UP_BYTES + DOWN_BYTES)
    # HBM busy = in flight 21 + 11 per layer; exposed is all of it.
    assert result.dma_busy_s == pytest.approx(64 * US, rel=1e-9)
    assert result.overlap_fraction == pytest.approx(0.0, abs=1e-9)


def test_prefetch_one_op_ahead_matches_hand_arithmetic() -> None:
    """d = 1, two buffers: each copy is issued when the op before its consumer starts.

    12: norm starts, gate_up0 issued, streams from 13 alone (full rate).
    14: gate_up0's op starts, down0 issued; from 15 both stream at half rate.
        By 15 gate_up0 has 2/20 of its bytes (52,428.8 B); down0 (262,144 B) at half rate
        takes 20 µs -> lands 35. gate_up0 then has 314,572.8 B, the rest (209,715.2 B) at
        full rate takes 8 µs -> lands 43.  Compute 43..53 (exposed 14..43 = 29 µs).
    53..58 down0 (landed), all-reduce 58..63, layer overhead 63..65.
    65: norm1 starts, gate_up1 issued (streams from 66); 67: down1 issued (from 68).
        Same pattern shifted by 53 µs: down1 lands 88, gate_up1 lands 96 (exposed 67..96 = 29).
    96..106 gate_up1, 106..111 down1, all-reduce ..116.  Step 116 µs, exposed 58 µs.
    """
    result = simulate(hand_program(), schedule(1, 2), hand_chip())
    assert result.step_s == pytest.approx(116 * US, rel=1e-9)
    assert result.exposed_dma_s == pytest.approx(58 * US, rel=1e-9)
    assert result.vmem_peak_bytes - result.vmem_static_bytes <= 0


def test_concurrency_penalty_slows_shared_streams() -> None:
    """As above, but past 1 copy in flight throughput drops: efficiency(2) = 1 / (1 + 0.25).

    From 15 the two copies share 0.8 x bandwidth: 0.4 x 2.62144e10 = 1.048576e10 B/s each.
    down0: 262,144 B / 1.048576e10 = 25 µs -> lands 40; gate_up0 then has 314,572.8 B,
    the rest at full rate (alone again) 8 µs -> lands 48. Compute 48..58, down0 58..63,
    all-reduce ..68, overhead ..70, norm1 70..72 (gate_up1 issued 70, streams from 71),
    down1 issued 72 (from 73): down1 lands 98, gate_up1 lands 106; compute 106..116,
    down1 ..121, all-reduce ..126.  Step 126 µs.
    """
    result = simulate(hand_program(), schedule(1, 2), hand_chip(efficient_in_flight=1, penalty=0.25))
    assert result.step_s == pytest.approx(126 * US, rel=1e-9)


def test_event_list_uses_kernel_vocabulary() -> None:
    result = simulate(hand_program(), schedule(0, 1), hand_chip(), record_events=True)
    assert result.events is not None
    assert result.events[:6] == [
        ("compute", "mlp.mix_norm", 0),
        ("dma_start", "dense_mlp", "mlp.gate_up", 0, 0),
        ("compute", "mlp.gate_up", 0),
        ("dma_wait", "dense_mlp", "mlp.gate_up", 0, 0),
        ("dma_start", "dense_mlp", "mlp.down", 0, 0),
        ("compute", "mlp.down", 0),
    ]


def test_a_fixed_cost_per_mxu_product_adds_up_by_hand() -> None:
    """``dot_overhead_s`` = 1 µs per product, d = 0 (nothing overlaps, so it adds to the step).

    gate_up (256 x 1024, one slab, unlooped: 256 rows <= 1024): one product per 128-column
    panel = 8; down (512 x 256): 2 panels = 2. Per layer 10 µs, two layers: 122 + 20 = 142 µs.
    """
    chip = hand_chip()
    data = chip.model_dump(mode="python")
    data["compute"][0]["dot_overhead_s"] = _figure(1 * US)
    result = simulate(hand_program(), schedule(0, 1), Chip.model_validate(data))
    assert result.step_s == pytest.approx(142 * US, rel=1e-9)


def test_matmul_dots_follow_the_kernels_loops() -> None:
    from tpusim.schedule.kernel_layout import matmul_dots

    assert matmul_dots(1, 256, 1024) == 8  # static einsum: one product per panel
    assert matmul_dots(1, 7168, 1664) == 28 * 13  # looped: 256-row input chunks x 13 panels
    assert matmul_dots(12, 624, 1664) == 12 * 3 * 13  # 12 slabs, each 3 chunks (the last one a tail)


def test_an_expert_part_multiplies_behind_its_conversion_panel_by_panel() -> None:
    """The VPU converts panel p + 1 while the MXU takes panel p: the pair lasts the longer
    stage plus one panel of the shorter. VPU 12 µs, MXU 3 µs, 12 panels: 12 + 3/12 = 12.25 µs
    (0.25 µs left after the conversion); VPU 4 µs, MXU 10 µs, 4 panels: 10 + 4/4 = 11 µs (7 µs
    after it); one panel: no overlap, 4 + 10 = 14 µs (10 after)."""
    from tpusim.engine.lowering import behind_conversion_s

    assert behind_conversion_s(3 * US, 12 * US, 12) == pytest.approx(0.25 * US)
    assert behind_conversion_s(10 * US, 4 * US, 4) == pytest.approx(7 * US)
    assert behind_conversion_s(10 * US, 4 * US, 1) == pytest.approx(10 * US)


def test_the_per_layer_cost_in_shares_at_each_op_matches_hand_arithmetic() -> None:
    """d = 1, two buffers, ``per_layer_overhead_at: each_op``: the 2 µs a layer is paid as 2/3 µs
    at the start of each of the layer's three ops, before the op issues its copies.

    10..10.667 norm0's share; gate_up0 issued 10.667 (streams from 11.667 alone); norm0 ..12.667.
    12.667..13.333 gate_up0's share; down0 issued 13.333, streams from 14.333 beside gate_up0 (which
    has 2.667/20 of its bytes, 69,905 B): down0 at half rate 20 µs -> lands 34.333; gate_up0's rest
    (192,239 B) alone 7.333 µs -> lands 41.667; compute 41.667..51.667. down0's share ..52.333, compute
    ..57.333, all-reduce ..62.333. Layer 1 the same shifted by 52.333 µs: step 114.667 µs (116 with the
    2 µs in one block at the layer's start, where neither copy of the layer was issued yet)."""
    data = hand_chip().model_dump(mode="python")
    data["execution"]["per_layer_overhead_at"] = "each_op"
    result = simulate(hand_program(), schedule(1, 2), Chip.model_validate(data))
    assert result.step_s == pytest.approx((114 + 2 / 3) * US, rel=1e-9)
    assert result.breakdown_s["fixed_overheads"] == pytest.approx(14 * US, rel=1e-9)  # the same 10 + 2 x 2 µs
    assert sum(result.breakdown_s.values()) == pytest.approx(result.step_s, rel=1e-12)
