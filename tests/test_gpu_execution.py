"""The GPU execution model: the serving stack, eager launches and a GPU megakernel.

Kimi K3 on 16 GB200 (one NVL72 domain; attention TP16, experts EP16) at batch 1, a
hand-computed one-op program for the per-op efficiency, the fusion table's kernel counts,
NVLink-domain routing of collectives, and the HBM capacity check.
"""

from __future__ import annotations

from functools import cache

import pytest

from hwmodels.catalog import load_chip, make_system
from hwmodels.errors import InputError
from hwmodels.schema import Chip
from hwmodels.units import MIB
from tpusim.compare.rows import with_execution
from tpusim.engine import InfeasibleSchedule, SimResult, simulate
from tpusim.engine.gpu import (
    GPU_BREAKDOWN_KEYS,
    gpu_breakdown,
    l2_schedule,
    price_collective,
)
from tpusim.engine.gpu_fusion import op_kernels
from tpusim.engine.policy import execution_policy
from tpusim.schedule.schema import FamilySchedule, Schedule, load_schedule
from tpusim.workload.capacity import check_capacity
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import CollectiveCall, LayerProgram, Op, Program, build_program
from tpusim.workload.shapes import TensorSpec
from tpusim.workload.sharding import CollectiveSpec, CollectiveStage

US = 1e-6


@cache
def k3_gb200(batch: int = 1) -> tuple[Program, Chip]:
    model = load_model("kimi-k3")
    plan = plan_for(model, 16, devices_per_chip=1, intra_link="nvlink")
    chip = make_system("gb200", 16, calibrated=False).chip
    # these tests pin the generic fusion table (gpu_fusion); gb200's catalog stack is sglang-k3
    # (tests/test_k3_stack.py pins that one)
    gpu = chip.execution.gpu.model_copy(update={"stack": "generic"})
    chip = chip.model_copy(update={"execution": chip.execution.model_copy(update={"gpu": gpu})})
    return build_program(model, plan, batch=batch), chip


@cache
def k3_run(execution: str) -> SimResult:
    program, chip = k3_gb200()
    variant = with_execution(chip, execution)
    schedule = l2_schedule(load_schedule("published")) if execution == "megakernel" else load_schedule("naive")
    return simulate(program, schedule, variant)


# --------------------------------------------------------------------------- K3, batch 1


def test_eager_is_slower_than_the_stack_which_is_slower_than_the_megakernel() -> None:
    per, stack, mega = k3_run("eager"), k3_run("stack"), k3_run("megakernel")
    assert (per.execution_mode, stack.execution_mode, mega.execution_mode) == (
        "per_op_launch", "serving_stack", "megakernel")
    assert per.step_s > stack.step_s > mega.step_s
    # eager and the stack run the same kernels; only the launch differs (host launch vs graph gap)
    assert stack.launch_count == per.launch_count
    gpu = k3_gb200()[1].execution.gpu
    gap = per.step_s - stack.step_s
    # the collectives differ too (NCCL vs one-shot), so the launch difference bounds the gap from below
    assert gap >= per.launch_count * (3.0e-6 - gpu.kernel_gap_s.value) * 0.999


def test_breakdown_shows_launches_collectives_and_exposed_copies_as_the_difference() -> None:
    per, mega = k3_run("eager"), k3_run("megakernel")
    parts = {name: gpu_breakdown(result) for name, result in (("per", per), ("mega", mega))}
    for name, result in (("per", per), ("mega", mega)):
        assert tuple(parts[name]) == GPU_BREAKDOWN_KEYS
        assert sum(parts[name].values()) == pytest.approx(result.step_s, rel=1e-9)
    gap = {key: parts["per"][key] - parts["mega"][key] for key in GPU_BREAKDOWN_KEYS}
    assert gap["launches"] > 0 and gap["collectives"] > 0 and gap["exposed_dma"] > 0
    # The four explain the whole gap (compute differs only by per_op_efficiency) ...
    explained = gap["launches"] + gap["kernel_fixed"] + gap["collectives"] + gap["exposed_dma"]
    assert explained > 0.9 * (per.step_s - mega.step_s)
    # ... and per-kernel costs are the largest share at batch 1: ~2400 kernels.
    assert max(gap, key=lambda key: gap[key]) in ("launches", "kernel_fixed")
    assert mega.launch_count == 1 and per.launch_count > 2000


def test_launch_count_is_the_fusion_table_plus_one_nccl_kernel_per_call() -> None:
    program, _chip = k3_gb200()
    kinds = op_kernels(program).kinds
    calls = sum(len(op.collectives) for op in program.ops)
    quantize = sum(1 for op in program.ops if op.role == "moe.expert" and op.expert_index == 0)
    assert k3_run("eager").launch_count == sum(map(len, kinds)) + quantize + calls

    def layer_kernels(prog: Program, layer: int) -> int:
        layout = op_kernels(prog).kinds
        return sum(len(layout[i]) for i, op in enumerate(prog.ops) if op.layer == layer)

    kda_layer, mla_layer = 1, 3
    assert program.layers[kda_layer].attention_kind == "kda" and program.layers[mla_layer].attention_kind == "mla"
    assert layer_kernels(program, kda_layer) == 22  # 8 attention + 14 MoE (see gpu_fusion)
    assert layer_kernels(program, mla_layer) == 25
    # A fused-MoE grouped GEMM launches once per layer however many experts the device got.
    batch8, _ = k3_gb200(8)
    assert batch8.layers[kda_layer].routed_experts > program.layers[kda_layer].routed_experts
    assert layer_kernels(batch8, kda_layer) == 22


# --------------------------------------------------------------------------- by hand


def _one_op_program() -> Program:
    """One layer, one bf16 GEMM of exactly one 4 MiB slab (1024 x 2048), batch 1, no peers."""
    model = load_model("kimi-k3-mini").with_layers(1)  # sizes the staging arenas only
    weight = TensorSpec("mlp.down", "dense_mlp", "dense", "bf16", 1024, 2048)
    assert weight.bytes == 4 * MIB
    op = Op("mlp.down", "mlp.down", 0, "mlp", "mxu", tensors=(weight,), matmuls=((1, 1024, 2048),))
    return Program(model=model, plan=plan_for(model, 1), batch=1, context_tokens=1, routing_label="hand",
                   seed=0, device_view="hand", layers=[LayerProgram(0, "kda", False, [op], 0)], head_ops=[])


def test_per_op_efficiency_is_applied_once_by_hand() -> None:
    """GB200 eager, per kernel: 20 µs per step + 3 µs launch + the kernel's fixed time and
    ramp (checked in test_gpu_stack.py) + 1 µs copy issue + 4 MiB at
    0.889 x 7.2 TB/s (= AIConfigurator's 0.8 x 8 TB/s, once) + a 64-row-padded MMA
    (2 x 64 x 1024 x 2048 FLOP) at 0.889 x 2.5 PFLOP/s. The megakernel: the same copy at the
    sustained 7.2 TB/s and the MMA at peak, plus one 3 µs launch and a 1.5 µs grid barrier.
    """
    chip = load_chip("gb200", calibrated=False)
    peak_hbm = chip.hbm.peak_bandwidth_bytes_per_s.value
    sustained = chip.hbm.sustained_bandwidth_bytes_per_s.value
    efficiency = chip.execution.per_op_efficiency.value  # type: ignore[union-attr]
    assert efficiency * sustained == pytest.approx(0.8 * peak_hbm, rel=1e-4)  # AIC: 0.8 x peak, once
    assert sustained == pytest.approx(0.9 * peak_hbm)  # a long copy stream; not AIC's per-op 0.8
    flops = 2 * 64 * 1024 * 2048
    bf16 = chip.unit("tensor_core").peak_for("bf16")
    program = _one_op_program()

    per_kernel = simulate(program, load_schedule("naive"), with_execution(chip, "eager"))
    hbm_s = 4 * MIB / (efficiency * sustained)
    assert hbm_s == pytest.approx(4 * MIB / 6.4e12, rel=1e-4)
    expected = 20 * US + 3 * US + per_kernel.kernel_fixed_s + 1 * US + hbm_s + flops / (efficiency * bf16)
    assert per_kernel.step_s == pytest.approx(expected, rel=1e-9)
    assert per_kernel.launch_count == 1 and per_kernel.launch_s == pytest.approx(3 * US)

    # No prefetch; 8 buffers so the arena (sized from kimi-k3-mini's 0.75 MiB of dense MLP
    # kinds) holds the 4 MiB slab.
    d0 = Schedule(name="d0", families={"dense_mlp": FamilySchedule(prefetch_distance_ops=0, buffers=8)})
    mega = simulate(program, d0, with_execution(chip, "megakernel"))
    expected = 20 * US + 3 * US + 1.5 * US + 1 * US + 4 * MIB / sustained + flops / bf16
    assert mega.step_s == pytest.approx(expected, rel=1e-9)
    assert gpu_breakdown(mega)["other_overheads"] == pytest.approx(21.5 * US)


# --------------------------------------------------------------------------- variants


def test_variants_switch_labelled_figures_only() -> None:
    chip = load_chip("gb200", calibrated=False)
    assert chip.execution.mode == "serving_stack"
    gpu = chip.execution.gpu
    assert gpu is not None
    eager = with_execution(chip, "eager")
    assert eager.execution.mode == "per_op_launch" and eager.execution.launch_overhead_s == chip.execution.launch_overhead_s
    mega = with_execution(chip, "megakernel")
    assert mega.execution.mode == "megakernel" and mega.hbm == chip.hbm
    assert mega.execution.per_layer_overhead_s == gpu.grid_barrier_s
    assert mega.link("nvlink").collective_stage_latency_s == gpu.in_kernel_stage_latency_s
    assert mega.link("pcie") == chip.link("pcie")  # the scale-out link keeps its figure
    for figure in (gpu.grid_barrier_s, gpu.in_kernel_stage_latency_s, gpu.kernel_slab_bytes,
                   gpu.kernel_copies_in_flight):
        assert figure.label == "assumed" and "prior" in figure.source
    assert mega.staging_memory.name == "l2"
    assert mega.staging_memory.usable_bytes < mega.staging_memory.capacity_bytes.value
    policy = execution_policy(mega)
    assert policy.cross_op_prefetch and policy.enforce_staging_capacity and not policy.collective_launches
    conventional = execution_policy(chip)
    assert not conventional.cross_op_prefetch and conventional.collective_launches and conventional.collectives_block
    with pytest.raises(InputError, match="not a GPU"):
        from tpusim.engine.gpu import gpu_variant

        gpu_variant(load_chip("tpu-v7"), "megakernel")


def test_megakernel_schedule_must_fit_l2() -> None:
    program, chip = k3_gb200()
    with pytest.raises(InfeasibleSchedule, match="MiB"):
        simulate(program, load_schedule("published"), with_execution(chip, "megakernel"))


# --------------------------------------------------------------------------- collectives


def _allreduce(stages: list[tuple[str, int]], payload: int = 14336) -> CollectiveCall:
    spec = CollectiveSpec(name="allreduce", phase="moe", kind="all_reduce", bytes_per_token=payload,
                          stages=[CollectiveStage(link=link, peers=peers) for link, peers in stages],  # type: ignore[arg-type]
                          after="moe.combine")
    return CollectiveCall(spec, payload)


def test_nccl_pays_one_latency_per_call_in_kernel_one_per_stage() -> None:
    chip = load_chip("gb200", calibrated=False)
    nvlink = chip.link("nvlink")
    call = _allreduce([("nvlink", 7), ("nvlink", 1)])
    bytes_s = 14336 * 8 / nvlink.bandwidth_bytes_per_s_per_direction.value
    latency = nvlink.collective_stage_latency_s.value
    assert price_collective(chip, call, 16, per_call=True) == (("nvlink", pytest.approx(latency + bytes_s)),)
    per_stage = price_collective(chip, call, 16, per_call=False)
    assert sum(seconds for _link, seconds in per_stage) == pytest.approx(2 * latency + bytes_s)


def test_systems_beyond_the_nvlink_domain_use_the_scale_out_link_or_fail_clearly() -> None:
    h200 = load_chip("h200", calibrated=False)  # HGX: 8 GPUs per NVLink domain
    call = _allreduce([("nvlink", 7), ("nvlink", 1)])
    inside = price_collective(h200, call, 8, per_call=True)
    across = price_collective(h200, call, 16, per_call=True)
    assert [link for link, _ in inside] == ["nvlink"]
    assert [link for link, _ in across] == ["nvlink", "pcie"]
    assert sum(s for _, s in across) > sum(s for _, s in inside)
    # a stage with more peers than the domain holds leaves it too
    gather = _allreduce([("nvlink", 15)])
    assert [link for link, _ in price_collective(h200, gather, 16, per_call=True)] == ["pcie"]
    # GB200: 16 GPUs sit in one NVL72 domain; 80 do not
    gb200 = load_chip("gb200", calibrated=False)
    assert [link for link, _ in price_collective(gb200, call, 16, per_call=True)] == ["nvlink"]
    assert [link for link, _ in price_collective(gb200, call, 80, per_call=True)] == ["nvlink", "pcie"]
    no_nic = h200.model_copy(update={"links": [h200.link("nvlink")]})
    with pytest.raises(InputError, match=r"spans more than one NVLink domain \(8 GPUs\)"):
        price_collective(no_nic, call, 16, per_call=True)


# --------------------------------------------------------------------------- capacity


def test_k3_is_rejected_on_4_gb200_and_fits_on_16() -> None:
    model = load_model("kimi-k3")
    chip = load_chip("gb200", calibrated=False)
    small = plan_for(model, 4, devices_per_chip=1, intra_link="nvlink")
    with pytest.raises(InputError) as caught:
        check_capacity(model, small, chip, chips=4, batch=1, context_tokens=1024,
                       plan_for_chips=lambda n: plan_for(model, n, devices_per_chip=1, intra_link="nvlink"))
    message = str(caught.value)
    # the advice is the smallest count the capacity check itself passes (16: 153.8 GB per device)
    assert "does not fit on 4 x gb200" in message and "GB of HBM" in message and "16 x gb200 fit" in message
    report = check_capacity(model, plan_for(model, 16, devices_per_chip=1, intra_link="nvlink"), chip,
                            chips=16, batch=1, context_tokens=1024)
    assert report.fits and report.total_bytes < chip.hbm.capacity_bytes.value
