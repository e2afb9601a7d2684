"""The reference-spread yardstick (:mod:`megakernel.reference_spread`): its one-ulp nudge moves
every f32 entry to an adjacent float (checked against ``numpy.spacing``, not ``nextafter``),
and a spread run is reproducible (seeded) with one record per trial and step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from megakernel.reference_spread import nudge_one_ulp, spread
from tpusim.workload.model_catalog import load_model

FINITE = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=50, deadline=None)
@given(arrays(np.float32, st.integers(1, 64), elements=FINITE), st.integers(0, 2**32 - 1))
def test_nudge_moves_every_entry_exactly_one_ulp(values: np.ndarray, seed: int) -> None:
    nudged = nudge_one_ulp(values, np.random.default_rng(seed))
    assert nudged.dtype == np.float32 and nudged.shape == values.shape
    step = np.abs(nudged.astype(np.float64) - values.astype(np.float64))
    # one ulp: the spacing at the value, or (moving down across a power of two) half of it
    ulp = np.spacing(np.abs(values)).astype(np.float64)
    assert np.all((step == ulp) | (step == ulp / 2)), (values, nudged)


@pytest.mark.slow  # ~5 s: two 4-layer reference decodes, compile included
def test_spread_runs_and_repeats_exactly() -> None:
    model = load_model("kimi-k3-nano").with_layers(4)
    first = spread(model, trials=2, steps=1)
    assert first == spread(model, trials=2, steps=1)  # seeded: the yardstick is reproducible
    assert len(first) == 2 and all(len(t) == 1 for t in first)
    for trial in first:
        for step in trial:
            assert 0.0 <= step["logits_relative_error"] < 1.0
            assert isinstance(step["routing_equal"], bool) and isinstance(step["tokens_equal"], bool)
