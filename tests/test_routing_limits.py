"""Routing draws of any batch: chunked keys, the rejection sampler, the derived size limit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tpusim.workload.routing as routing
from hwmodels.errors import InputError
from tpusim.workload.routing import (
    RoutingModel,
    distinct_per_group,
    draw_routing,
    parse_routing,
    tokens_per_expert,
)


@settings(max_examples=15, deadline=None)
@given(layers=st.integers(1, 4), batch=st.integers(1, 40), experts=st.sampled_from([8, 16, 64]),
       chunk=st.integers(1, 300), seed=st.integers(0, 2**16), kind=st.sampled_from(["uniform", "zipf:1.1"]),
       grouped=st.booleans())
def test_chunked_draw_equals_the_one_shot_draw(layers: int, batch: int, experts: int, chunk: int, seed: int,
                                               kind: str, grouped: bool) -> None:
    spec = parse_routing(kind)
    grouping = {"groups": 4, "groups_per_token": 2} if grouped else {}
    one_shot = draw_routing(spec, num_moe_layers=layers, batch=batch, num_experts=experts, top_k=4, seed=seed,
                            **grouping)
    original = routing.KEY_CHUNK_ELEMENTS
    routing.KEY_CHUNK_ELEMENTS = chunk
    try:
        chunked = draw_routing(spec, num_moe_layers=layers, batch=batch, num_experts=experts, top_k=4, seed=seed,
                               **grouping)
    finally:
        routing.KEY_CHUNK_ELEMENTS = original
    assert np.array_equal(one_shot, chunked)
    if grouped:  # every row's experts come from at most 2 of the 4 groups
        assert (np.array([[len(set((row // (experts // 4)).tolist())) for row in layer] for layer in chunked]) <= 2).all()


def test_rejection_sampler_is_uniform_over_distinct_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routing, "REJECTION_ABOVE_KEYS", 0)  # force the large-batch path
    layers, batch, experts, top_k = 2, 20000, 32, 4
    choices = draw_routing(RoutingModel("uniform"), num_moe_layers=layers, batch=batch, num_experts=experts,
                           top_k=top_k, seed=5)
    assert choices.shape == (layers, batch, top_k) and choices.dtype == np.int32
    ordered = np.sort(choices, axis=2)
    assert (ordered[..., 1:] != ordered[..., :-1]).all()  # top_k distinct experts per row
    counts = tokens_per_expert(choices, experts)
    expected = batch * top_k / experts  # every expert equally likely: 2500 rows each
    # binomial sd = sqrt(n p (1-p)) ~ 47; 6 sd is a bound a correct sampler never crosses
    assert np.abs(counts - expected).max() < 6 * np.sqrt(expected * (1 - top_k / experts))
    pairs = np.zeros((experts, experts))
    for row in ordered[0, :5000]:
        pairs[np.ix_(row, row)] += 1
    off_diagonal = pairs[~np.eye(experts, dtype=bool)]
    # each pair together with probability C(30,2)/C(32,4) = 0.01210 per row: 60.5 of 5000
    assert abs(off_diagonal.mean() - 5000 * 435 / 35960) < 1.0


def test_counts_per_layer_match_a_direct_count() -> None:
    choices = draw_routing(RoutingModel("uniform"), num_moe_layers=3, batch=7, num_experts=16, top_k=2, seed=1)
    for layer in range(3):
        direct = [sum(int(e) == expert for row in choices[layer] for e in row) for expert in range(16)]
        assert tokens_per_expert(choices, 16)[layer].tolist() == direct
        groups = [len({int(e) for row in choices[layer] for e in row if int(e) // 4 == g}) for g in range(4)]
        assert distinct_per_group(choices, 16, 4)[layer].tolist() == groups


def test_a_draw_that_cannot_fit_memory_is_refused_with_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routing, "available_memory_bytes", lambda: 2 * 92 * 16 * 4 * 1000)
    with pytest.raises(InputError, match=r"batch 1001: .* the largest batch this host can draw is 1000$"):
        draw_routing(RoutingModel("uniform"), num_moe_layers=92, batch=1001, num_experts=896, top_k=16, seed=0)
    draw_routing(RoutingModel("identical"), num_moe_layers=92, batch=1000, num_experts=896, top_k=16, seed=0)
