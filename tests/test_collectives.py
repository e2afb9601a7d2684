"""Collective algorithms as messages, worked by hand (tpusim.workload.collectives).

The expected counts and bytes below are written from the algorithm descriptions (the K3
TP32 layout: 32 ranks, 8 per host, sibling r ^ 1; Muse: 8 ranks on one host), not from
the module's code.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpusim.workload import collectives as c
from tpusim.workload.model_catalog import load_plan

K3 = c.Topology(devices=32, devices_per_host=8, devices_per_chip=2)
MUSE = c.Topology(devices=8, devices_per_host=8, devices_per_chip=2)


def test_link_kinds_follow_host_and_sibling() -> None:
    assert K3.link_kind(4, 5) == "sibling"
    assert K3.link_kind(4, 6) == "same_host"
    assert K3.link_kind(4, 12) == "cross_host"
    assert K3.host(23) == 2 and K3.lane(23) == 7


def test_pair_exchange_one_message_to_the_sibling() -> None:
    out = c.messages("pair_exchange", "sibling", 2048, 6, K3)
    assert out == (c.Message(6, 7, 2048, "sibling", 0),)
    assert c.consumer_waits("pair_exchange", "sibling", 2048, 6, K3) == (1,)


def test_direct_all_gather_31_copies_of_256_bytes() -> None:
    out = c.messages("direct_all_gather", "all", 256, 0, K3)
    assert len(out) == 31 and {m.bytes for m in out} == {256}
    kinds = [m.link for m in out]
    # rank 0: sibling 1; 6 other lanes on host 0; 24 ranks on hosts 1..3
    assert (kinds.count("sibling"), kinds.count("same_host"), kinds.count("cross_host")) == (1, 6, 24)
    assert c.consumer_waits("direct_all_gather", "all", 256, 0, K3) == (31,)


def test_two_level_reduce_7_local_then_3_remote() -> None:
    out = c.messages("one_shot_two_level", "all", 14336, 10, K3)
    phase0 = [m.dst for m in out if m.phase == 0]
    phase1 = [m.dst for m in out if m.phase == 1]
    assert phase0 == [8, 9, 11, 12, 13, 14, 15]
    assert phase1 == [2, 18, 26]  # lane 2 on hosts 0, 2, 3
    assert all(m.bytes == 14336 for m in out)
    assert c.consumer_waits("one_shot_two_level", "all", 14336, 10, K3) == (7, 3)


def test_same_parity_reduce_is_16_way_two_level() -> None:
    assert c.group_ranks("same_parity", 3, K3) == tuple(range(1, 32, 2))
    out = c.messages("one_shot_two_level", "same_parity", 7168, 3, K3)
    assert [m.dst for m in out if m.phase == 0] == [1, 5, 7]
    assert [m.dst for m in out if m.phase == 1] == [11, 19, 27]
    assert c.consumer_waits("one_shot_two_level", "same_parity", 7168, 3, K3) == (3, 3)


def test_reduce_scatter_all_gather_14_messages_in_2_phases_on_8_cores() -> None:
    payload = 8 * 8192 * 2  # bf16[8, 8192], the published microbenchmark
    out = c.messages("reduce_scatter_all_gather", "all", payload, 0, MUSE)
    assert len(out) == 14 and {m.bytes for m in out} == {payload // 8}
    assert [m.phase for m in out].count(1) == 7
    assert c.consumer_waits("reduce_scatter_all_gather", "all", payload, 0, MUSE) == (7, 7)


def test_one_host_two_level_is_one_phase() -> None:
    assert c.phase_count("one_shot_two_level", "all", 0, MUSE) == 1
    assert c.link_stages("one_shot_two_level", "all", 0, MUSE) == [("ici", 7)]


def test_single_device_has_no_messages() -> None:
    solo = c.Topology(devices=1)
    assert c.messages("direct_all_gather", "all", 100, 0, solo) == ()
    assert c.consumer_waits("one_shot_two_level", "all", 100, 0, solo) == ()


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError):
        c.messages("ring", "all", 10, 0, K3)
    with pytest.raises(ValueError):
        c.messages("pair_exchange", "all", 10, 0, K3)
    with pytest.raises(ValueError):
        c.messages("direct_all_gather", "all", 10, 32, K3)


@settings(max_examples=40, deadline=None)
@given(algorithm=st.sampled_from(c.ALGORITHMS), group=st.sampled_from(["all", "same_parity", "host"]),
       hosts=st.integers(1, 4), rank_seed=st.integers(0, 10**6), payload=st.integers(0, 1 << 16))
def test_every_message_sent_is_received(algorithm: str, group: str, hosts: int, rank_seed: int,
                                        payload: int) -> None:
    """Symmetry: what a rank receives per phase equals what it sends per phase."""
    if algorithm == "pair_exchange":
        group = "sibling"
    topology = c.Topology(devices=8 * hosts, devices_per_host=8, devices_per_chip=2)
    rank = rank_seed % topology.devices
    sent = c.messages(algorithm, group, payload, rank, topology)
    waits = c.consumer_waits(algorithm, group, payload, rank, topology)
    assert tuple(sum(1 for m in sent if m.phase == p) for p in range(len(waits))) == waits
    assert all(m.dst in c.group_ranks(group, rank, topology) for m in sent)


def test_k3_plan_batch_variants() -> None:
    plan = load_plan("k3-tp32")
    algo = {b: {s.name: s.algorithm for s in plan.collectives_at(b)} for b in (1, 6, 8)}
    assert algo[1]["moe.routed_reduce"] == "one_shot_two_level"
    assert algo[6]["moe.routed_reduce"] == "reduce_scatter_all_gather"
    assert algo[6]["attn.partial_reduce"] == "one_shot_two_level"
    assert algo[8]["attn.partial_reduce"] == "reduce_scatter_all_gather"
    shared = next(s for s in plan.collectives_at(1) if s.name == "moe.shared_reduce")
    assert (shared.after, shared.consumed_by) == ("moe.shared", "moe.combine")
