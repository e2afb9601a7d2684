"""The kernel runs the joint sweep's winner: one rule for what it runs
(:func:`tpusim.workload.kernel_support.kernel_cannot_run`), the mapping of a K3 deployment
onto the nano kernel (:func:`~tpusim.workload.kernel_support.map_deployment`), and the
collective megakernel running deployments against the one-device reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from megakernel.collective_plan import DECODE_SUPPORTED, SUPPORTED
from tpusim.app.cli import main
from tpusim.schedule.schema import Deployment, load_schedule, save_schedule
from tpusim.workload.kernel_support import (
    KERNEL_ALGORITHMS,
    KernelDeploymentError,
    kernel_cannot_run,
    kernel_deployment,
    kernel_expert_width,
)
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.registry.names import Collective

RUN_TIMEOUT_S = 300
ROOT = Path(__file__).resolve().parents[1]
# two non-default deployments of K3 on 32 devices (the published plan, other algorithms)
REDUCE_ALGORITHMS = {Collective.MOE_SHARED_REDUCE: "direct_all_gather",
                     Collective.MOE_ROUTED_REDUCE: "reduce_scatter_all_gather"}
ATTENTION_ALGORITHMS = {Collective.ATTN_PARTIAL_REDUCE: "direct_all_gather",
                        Collective.MOE_ROUTER_EXCHANGE: "direct_all_gather",
                        Collective.MLP_ALLREDUCE: "reduce_scatter_all_gather"}


def _deployed(path: Path, plan: str, collectives: dict[str, str]) -> Path:
    schedule = load_schedule("published")
    save_schedule(schedule.model_copy(update={"deployment": Deployment(plan=plan, collectives=collectives)}), path)
    return path


def _k3_plan_file(path: Path, groups: int, tp: int) -> Path:
    """K3's published TP32 plan with another expert split (a deployment may name a plan file)."""
    text = (ROOT / "tpusim/models/plan-k3-tp32.yaml").read_text().splitlines()
    keys = {"expert_groups": groups, "expert_tp": tp, "name": f"k3-tp32-ep{groups}x{tp}"}
    path.write_text("\n".join(
        f"{line.partition(':')[0]}: {keys[line.partition(':')[0]]}" if line.partition(":")[0] in keys else line
        for line in text) + "\n")
    return path


def test_the_kernel_rule_has_one_owner() -> None:
    assert DECODE_SUPPORTED == KERNEL_ALGORITHMS
    assert set(SUPPORTED) < set(KERNEL_ALGORITHMS)
    k3 = load_model("kimi-k3")
    published = plan_for(k3, 32)
    assert kernel_cannot_run(k3, published) == ""
    assert kernel_cannot_run(k3, published.with_algorithms(REDUCE_ALGORITHMS)) == ""
    generic = plan_for(k3, 32, choice="expert_groups=8,expert_tp=4")
    assert "collective attn.allreduce is not run in the kernel" in kernel_cannot_run(k3, generic)
    muse = load_model("muse-spark")
    assert kernel_cannot_run(muse, plan_for(muse, 8))  # not K3's collective pattern


def test_map_deployment_keeps_algorithms_and_scales_the_expert_split(tmp_path: Path) -> None:
    k3, nano = load_model("kimi-k3"), load_model("kimi-k3-nano")
    mapped = kernel_deployment("auto", REDUCE_ALGORITHMS, k3, 32, nano, 8)
    assert mapped.plan.name == "k3-nano-tp8" and (mapped.plan.expert_groups, mapped.plan.expert_tp) == (8, 1)
    algorithms = {s.name: s.algorithm for s in mapped.plan.collectives_at(1)}
    assert algorithms[Collective.MOE_SHARED_REDUCE] == "direct_all_gather"
    assert algorithms[Collective.MOE_ROUTED_REDUCE] == "reduce_scatter_all_gather"
    described = mapped.describe()
    assert described["rule"].endswith("map_deployment") and described["source_expert_tp"] == 4
    assert (described["expert_width"], described["model_expert_width"]) == (64, 64)  # 8 x 1: nano as it is
    # K3 4 x 8 on 32 devices -> nano 4 x 2 on 8 (expert TP scales with the device count): nano's 64-wide
    # experts would leave 32-column slices, so the mapping widens them to 128 (64-column slices);
    # K3 2 x 16 -> nano 2 x 4: 256
    for groups, tp, width in ((4, 8, 128), (2, 16, 256)):
        wide = kernel_deployment(str(_k3_plan_file(tmp_path / f"p{tp}.yaml", groups, tp)), {}, k3, None, nano, 8)
        assert (wide.plan.expert_groups, wide.plan.expert_tp) == (groups, tp // 4)
        assert wide.model.moe is not None and wide.model.moe.expert_intermediate_size == width
        assert wide.describe()["expert_width"] == width and wide.describe()["model_expert_width"] == 64
        assert kernel_cannot_run(wide.model, wide.plan) == ""
        assert nano.moe is not None and nano.moe.expert_intermediate_size == 64  # the catalog model is untouched
    assert kernel_expert_width(64, 1) == 64 and kernel_expert_width(64, 2) == 128 and kernel_expert_width(3072, 16) == 3072
    # K3 1 x 32: 96-column slices at K3's own width, refused at the source (nothing to widen there)
    with pytest.raises(KernelDeploymentError, match="expert slice width 96"):
        kernel_deployment(str(_k3_plan_file(tmp_path / "p32.yaml", 1, 32)), {}, k3, None, nano, 8)
    # identity at the deployment's own size
    same = kernel_deployment("auto", REDUCE_ALGORITHMS, k3, 32, k3, 32)
    assert same.plan.name == "k3-tp32" and (same.plan.expert_groups, same.plan.expert_tp) == (8, 4)
    with pytest.raises(KernelDeploymentError, match=r"attn\.allreduce is not run"):
        kernel_deployment("expert_groups=8,expert_tp=4", {}, k3, 32, nano, 8)
    with pytest.raises(KernelDeploymentError, match="no published plan"):
        kernel_deployment("auto", {}, k3, 32, nano, 4)


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "megakernel.commands.collective_check", "--devices", "8", "--layers", "4",
                           "--races", *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)


@pytest.mark.slow  # an interpret-mode run of 4 nano layers on 8 devices, race detector on: ~45-85 s
@pytest.mark.parametrize(("split", "algorithms"), [
    # CI: one run, the winner's split with every non-default algorithm of both sets below
    pytest.param((4, 8), {**REDUCE_ALGORITHMS, **ATTENTION_ALGORITHMS}, id="4x8-widened-every-algorithm"),
    # -m heavy (suite time: ~50-100 s each): the two sets apart, one on the published split
    pytest.param(None, REDUCE_ALGORITHMS, id="published-split-reductions", marks=pytest.mark.heavy),
    pytest.param((4, 8), ATTENTION_ALGORITHMS, id="4x8-widened-attention", marks=pytest.mark.heavy)])
def test_the_kernel_runs_a_k3_deployment_at_nano_size(tmp_path: Path, split: tuple[int, int] | None,
                                                      algorithms: dict[str, str]) -> None:
    """K3 4 x 8 (the batch-1 winner's split: nano 4 x 2, experts widened 64 -> 128) with other
    reductions and other attention/router/MLP algorithms; under -m heavy also the published split
    with the other reductions alone, and the 4 x 8 split with the other attention algorithms alone."""
    plan = "auto" if split is None else str(_k3_plan_file(tmp_path / "p.yaml", *split))
    done = _check("--schedule", str(_deployed(tmp_path / "best.json", plan, algorithms)))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["matches_reference"] and not result["races"] and result["race_detector"], result
    assert all(result["collectives"][name] == algorithm for name, algorithm in algorithms.items())
    mapping = result["deployment"]
    assert mapping["source_plan"].startswith("k3-tp32") and mapping["devices"] == 8
    if split is not None:
        assert (mapping["expert_groups"], mapping["expert_tp"], mapping["expert_width"]) == (4, 2, 128), mapping


@pytest.mark.slow  # builds the kernel's plan and refuses before any interpret-mode run: ~5-10 s
def test_a_split_the_kernel_cannot_cut_is_one_line_exit_2(tmp_path: Path) -> None:
    """K3 1 x 32 leaves 96-column expert slices (not a multiple of 64): refused at the source."""
    plan = _k3_plan_file(tmp_path / "p.yaml", 1, 32)
    done = _check("--schedule", str(_deployed(tmp_path / "best.json", str(plan), {})))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "128-lane rows" in done.stderr, done.stderr


def test_run_kernel_devices_refuses_a_generic_deployment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _deployed(tmp_path / "best.json", "expert_groups=8,expert_tp=4,attention=tp", {})
    assert main(["run-kernel", "--devices", "8", "--schedule", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "attn.allreduce is not run in the kernel" in err, err


@pytest.mark.slow  # lowers the full-size K3 kernel on 32 virtual devices: ~20-40 s
def test_lower_lowers_the_k3_winner_on_32_devices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _deployed(tmp_path / "best.json", "auto", REDUCE_ALGORITHMS)
    code = main(["lower", "--schedule", str(path), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["lowered"] and data["fits"] and data["devices"] == 32, data
    assert data["plan_collectives"][Collective.MOE_ROUTED_REDUCE] == "reduce_scatter_all_gather"
    assert data["scratch_total_bytes"] == data["accounting_total_bytes"]  # the one accounting, collectives included
    assert data["deployment"]["rule"].endswith("map_deployment")


def test_the_joint_sweep_gives_a_plan_the_kernel_cannot_run_a_row_not_a_win() -> None:
    from hwmodels.catalog import make_system
    from tpusim.sweep.joint import AUTO_PLAN, JointWorkload, _Validator, default_joint_space

    nano = load_model("kimi-k3-nano")
    space = default_joint_space(nano, 8)
    validator = _Validator(JointWorkload(nano, make_system("tpu-v7", 4, calibrated=False), 1), space)
    spec = next(choice for choice in space.plans if choice != AUTO_PLAN and "attention=tp" in choice
                and "base=published" not in choice)
    assert validator.plan_reason(spec).startswith("kernel: ")  # a generic plan: collectives the kernel lacks
    runnable = validator.runnable_plans()
    assert runnable[0] == AUTO_PLAN and len(runnable) > 1
    assert all(choice.startswith("base=published") for choice in runnable[1:])  # the published structure's variants
    off = _Validator(validator.workload, space.model_copy(update={"kernel_runs_winner": False}))
    assert not off.plan_reason(spec).startswith("kernel: ")
    muse = load_model("muse-spark")  # the kernel runs no plan of this model: no gate
    muse_space = default_joint_space(muse, 8)
    gate = _Validator(JointWorkload(muse, make_system("tpu-v7", 4, calibrated=False), 1), muse_space)
    assert not any(gate.plan_reason(choice).startswith("kernel: ") for choice in muse_space.plans)


@pytest.mark.parametrize("algorithms", [{}, REDUCE_ALGORITHMS], ids=["as-written", "changed"])
def test_the_joint_sweeps_vmem_is_the_one_accounting_of_the_candidates_plan(algorithms: dict[str, str]) -> None:
    """The row's static VMEM is vmem_plan(...).total_bytes on the candidate's plan (its own
    collective buffers counted once), the figure tpusim lower sets beside the kernel's scratch."""
    from hwmodels.catalog import make_system
    from tpusim.schedule.vmem import vmem_plan
    from tpusim.sweep.joint import (
        AUTO_PLAN,
        JointWorkload,
        Proposal,
        _Validator,
        default_joint_space,
    )

    nano = load_model("kimi-k3-nano")
    validator = _Validator(JointWorkload(nano, make_system("tpu-v7", 4, calibrated=False), 1),
                           default_joint_space(nano, 8))
    schedule = load_schedule("published")
    validator.check(Proposal(0, "test", AUTO_PLAN, dict(ATTENTION_ALGORITHMS), schedule))  # another plan first
    proposal = Proposal(1, "test", AUTO_PLAN, dict(algorithms), schedule)
    assert validator.check(proposal) == ""
    plan = plan_for(nano, 8).with_algorithms(algorithms)
    assert proposal.static_mib is not None
    assert round(proposal.static_mib * (1 << 20)) == vmem_plan(schedule, nano, plan, 1).total_bytes


def test_an_expert_slice_the_kernel_math_cannot_cut_is_a_kernel_row() -> None:
    """K3 at expert TP 32 leaves 96-column slices: the expert math needs multiples of 64 (found
    when `tpusim lower` of a joint sweep's winner failed); TP 16 (192 columns) lowers."""
    from tpusim.workload.kernel_support import kernel_cannot_run
    from tpusim.workload.model_catalog import plan_for

    k3 = load_model("kimi-k3")
    tp32 = plan_for(k3, 32, devices_per_chip=2, choice="base=published,expert_groups=1,expert_tp=32")
    assert "expert slice width 96" in kernel_cannot_run(k3, tp32)
    assert kernel_cannot_run(k3, plan_for(k3, 32, devices_per_chip=2, choice="base=published,expert_groups=2,expert_tp=16")) == ""
