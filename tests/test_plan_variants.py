"""Plan structure variants: the generic latent-MoE collectives, the published structure with
another expert split, the fused expert reduction and the deferred shared wait."""

from __future__ import annotations

import pytest

from hwmodels.errors import InputError
from tpusim.engine.collective_messages import consumer_index
from tpusim.schedule.vmem import collective_bytes
from tpusim.sweep.joint import plan_choices
from tpusim.workload.collectives import messages
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.plan_variants import kernel_cannot_run
from tpusim.workload.program import build_program
from tpusim.workload.registry.names import AttnOp, Collective, MoeOp, Role

K3 = "kimi-k3"


def _k3(choice: str) -> object:
    return plan_for(load_model(K3), 32, devices_per_chip=2, choice=choice)


def test_generic_latent_moe_reduces_the_latent_and_the_shared_output_and_gathers_latent_up() -> None:
    model = load_model(K3)
    plan = _k3("expert_groups=8,expert_tp=4")
    moe = {spec.name: spec for spec in plan.moe_collectives}
    assert list(moe) == [Collective.MOE_LATENT_ALLGATHER, Collective.MOE_SHARED_REDUCE,
                         Collective.MOE_ROUTED_REDUCE, Collective.MOE_OUTPUT_ALLGATHER]
    # what a device holds: a partial of the hidden-wide shared output, a partial of the
    # latent-wide routed sum, then hidden / 32 columns of latent_up's output (224 -> 256 lanes)
    assert moe[Collective.MOE_SHARED_REDUCE].bytes_per_token == model.hidden_size * 2
    assert moe[Collective.MOE_ROUTED_REDUCE].bytes_per_token == model.moe.latent_size * 2
    assert moe[Collective.MOE_OUTPUT_ALLGATHER].bytes_per_token == plan.latent_up_cols_per_device * 2 == 512
    assert [s.peers for s in moe[Collective.MOE_OUTPUT_ALLGATHER].stages] == [31]
    assert (moe[Collective.MOE_ROUTED_REDUCE].after, moe[Collective.MOE_ROUTED_REDUCE].consumed_by) == (
        MoeOp.COMBINE, MoeOp.LATENT_UP)
    assert moe[Collective.MOE_SHARED_REDUCE].after == Role.MOE_SHARED


def test_a_moe_without_latent_keeps_one_output_reduction() -> None:
    model = load_model("qwen3-30b-a3b")
    plan = plan_for(model, 8, choice="generic")
    assert [spec.name for spec in plan.moe_collectives] == [Collective.MOE_ALLREDUCE]


def test_published_base_takes_another_expert_split_and_keeps_every_collective() -> None:
    published = _k3("auto")
    for groups, tp in ((4, 8), (16, 2), (32, 1)):
        plan = _k3(f"base=published,expert_groups={groups},expert_tp={tp}")
        assert (plan.expert_groups, plan.expert_tp) == (groups, tp)
        assert plan.all_collectives == published.all_collectives
        assert plan.shared_intermediate_per_device == published.shared_intermediate_per_device
    with pytest.raises(InputError, match="no published plan"):
        plan_for(load_model(K3), 16, devices_per_chip=2, choice="base=published")
    with pytest.raises(InputError, match="attention DP"):
        _k3("base=published,attention=dp")
    with pytest.raises(InputError, match="expected generic or published"):
        _k3("base=mine")


def test_the_fused_reduction_carries_both_partials_in_one_set_of_messages() -> None:
    model = load_model(K3)
    separate, fused = _k3("auto"), _k3("base=published,expert_reduce=fused")
    names = [spec.name for spec in fused.moe_collectives]
    assert Collective.MOE_SHARED_REDUCE not in names and Collective.MOE_ROUTED_REDUCE not in names
    for batch in (1, 8):
        specs = {spec.name: spec for spec in separate.collectives_at(batch)}
        one = next(spec for spec in fused.collectives_at(batch) if spec.name == Collective.MOE_FUSED_REDUCE)
        shared, routed = specs[Collective.MOE_SHARED_REDUCE], specs[Collective.MOE_ROUTED_REDUCE]
        assert one.bytes_per_token == shared.bytes_per_token + routed.bytes_per_token
        assert (one.after, one.consumed_by, one.algorithm) == (routed.after, routed.consumed_by, routed.algorithm)
        sent = messages(one.algorithm, one.group, one.bytes_per_token * batch, 0, fused.topology)
        alone = messages(routed.algorithm, routed.group, routed.bytes_per_token * batch, 0, separate.topology)
        extra = messages(shared.algorithm, shared.group, shared.bytes_per_token * batch, 0, separate.topology)
        assert [(m.dst, m.phase) for m in sent] == [(m.dst, m.phase) for m in alone]  # the routed one's copies
        assert len(extra) == 10 and len(sent) == (10 if batch == 1 else 62)  # K3: 7 + 3, or 2 x 31
        # each copy carries both partials (a reduce-scatter's chunk rounds up by < 1 byte per chunk)
        assert 0 <= sum(m.bytes for m in sent) - sum(m.bytes for m in alone) * one.bytes_per_token / routed.bytes_per_token < len(sent)
        # VMEM: the one accounting counts the fused buffers (and mlp.allreduce loses its host)
        assert collective_bytes(model, fused, batch) > 0
    assert _k3("base=published,expert_reduce=fused").with_algorithms(
        {Collective.MOE_FUSED_REDUCE: "reduce_scatter_all_gather"})
    generic = _k3("expert_groups=32,expert_tp=1,expert_reduce=fused")
    assert [s.name for s in generic.moe_collectives].count(Collective.MOE_FUSED_REDUCE) == 1
    with pytest.raises(InputError, match="needs both"):
        plan_for(load_model("qwen3-30b-a3b"), 8, choice="expert_reduce=fused")
    with pytest.raises(InputError, match="needs a separate"):
        _k3("base=published,expert_reduce=fused,shared_wait=deferred")


def test_the_deferred_shared_wait_moves_to_the_next_layers_first_op() -> None:
    model = load_model(K3)
    for choice, layer_delta in (("auto", 0), ("base=published,shared_wait=deferred", 1)):
        plan = _k3(choice)
        ops = build_program(model, plan, batch=1, context_tokens=1024).ops
        index = next(i for i, op in enumerate(ops) if op.layer == 5
                     and any(call.spec.name == Collective.MOE_SHARED_REDUCE for call in op.collectives))
        spec = next(c.spec for c in ops[index].collectives if c.spec.name == Collective.MOE_SHARED_REDUCE)
        consumer = ops[consumer_index(ops, index, spec.consumed_by)]
        assert consumer.layer == 5 + layer_delta
        assert consumer.name == (AttnOp.MIX_NORM if layer_delta else MoeOp.COMBINE)


def test_kernel_limits_and_plan_choices_name_the_variants() -> None:
    for choice in ("auto", "base=published,expert_groups=4,expert_tp=8", "base=published,expert_reduce=fused",
                   "base=published,shared_wait=deferred"):
        assert kernel_cannot_run(_k3(choice)) == ""
    flat = _k3("base=published,expert_reduce=fused").with_algorithms({Collective.MOE_FUSED_REDUCE: "direct_all_gather"})
    assert "direct_all_gather" in kernel_cannot_run(flat)
    choices = plan_choices(load_model(K3), 32)
    assert "base=published,expert_groups=4,expert_tp=8" in choices
    assert "base=published,expert_groups=8,expert_tp=4,expert_reduce=fused" in choices
    assert "base=published,expert_groups=8,expert_tp=4" not in choices  # that is auto
    assert not [c for c in plan_choices(load_model("qwen3-30b-a3b"), 8) if "published" in c]
