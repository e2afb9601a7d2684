"""Speculative decoding at batch (issue 50 item 4): the draft + verify rule by hand, the acceptance
fit by hand, the S1a segments' sides by the frozen split's rule (the split file unchanged), the
cached engine steps against a fresh simulation, and the documented figures."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.sources import gpu_batch_speculative as spec
from calibration.sources import gpu_batch_sweeps as sweeps
from tpusim.workload.speculative import speculative_tpot_s


def test_the_rule_by_hand():
    # 3 MTP forwards of 0.2 ms + a verify step of 8 ms, 2.5 tokens accepted per step:
    # (3 x 0.2 + 8) / 2.5 = 8.6 / 2.5 = 3.44 ms per accepted token
    tpot_s = speculative_tpot_s(draft_forward_s=0.2e-3, draft_forwards=3, verify_step_s=8e-3, acceptance_length=2.5)
    assert tpot_s == pytest.approx(3.44e-3)
    # acceptance 1 is the step itself; below 1 is refused
    assert speculative_tpot_s(draft_forward_s=1e-3, draft_forwards=2, verify_step_s=3e-3,
                              acceptance_length=1.0) == pytest.approx(5e-3)
    with pytest.raises(ValueError):
        speculative_tpot_s(draft_forward_s=1e-3, draft_forwards=1, verify_step_s=1e-3, acceptance_length=0.5)


def test_the_acceptance_fit_by_hand():
    # step growth 2 and 4 ms, measured growth 1 and 2 ms (exactly a = 2), TPOTs 4 and 5 ms:
    # u = (2*1/16 + 4*2/25) / (4/16 + 16/25) = (0.125 + 0.32) / (0.25 + 0.64) = 0.5 -> a = 2
    a = spec.fit_acceptance_length(np.array([2.0, 4.0]), np.array([1.0, 2.0]), np.array([4.0, 5.0]), 4.0)
    assert a == pytest.approx(2.0)
    # a growth the steps cannot explain with a <= k + 1 stops at the bound; one that grows less
    # than the step at a = 1 stops at 1
    assert spec.fit_acceptance_length(np.array([1.0]), np.array([0.1]), np.array([3.0]), 4.0) == 4.0
    assert spec.fit_acceptance_length(np.array([1.0]), np.array([2.0]), np.array([3.0]), 4.0) == 1.0


def test_sides_follow_the_frozen_rule_and_leave_the_split_file_alone():
    roles = {p.key: p.role for p in spec.spec_points()}
    assert roles["dsr1-b200-mtp@6"] == "anchor" and roles["dsr1-gb200-mtp@4"] == "anchor"
    assert {r for k, r in roles.items() if k.startswith("dsr1-b200-mtp") and r != "anchor"} == {"fit"}
    assert {r for k, r in roles.items() if k.startswith("dsr1-gb200-mtp") and r != "anchor"} == {"held-out"}
    split = sweeps.load_split()
    keys = {s.key for s in spec.SPEC_SWEEPS}
    assert not keys & (set(split["fit_sweeps"]) | set(split["held_out_sweeps"]))
    assert not keys & {p.sweep.key for p in sweeps.points()}  # the plain figures never see MTP rows


def test_the_cache_matches_a_fresh_simulation():
    point = next(p for p in spec.spec_points() if p.key == "dsr1-gb200-mtp@24")
    fresh, cached = spec.simulate_spec_point(point), spec.spec_baseline()[point.key]
    for part in ("plain", "draft", f"verify_k{spec.MTP_DRAFT_TOKENS}"):
        assert fresh[part]["step_s"] == pytest.approx(cached[part]["step_s"], rel=1e-9)
        for name, value in cached[part]["terms_per_unit_s"].items():
            assert fresh[part]["terms_per_unit_s"][name] == pytest.approx(value, rel=1e-9)


def test_documented_figures():
    """docs/gpu-batch.md, Speculative decoding at batch (k = 3)."""
    summary = spec.spec_summary(sweeps.calibrate().values)
    assert summary["acceptance"] == pytest.approx(2.72, abs=0.01)
    assert summary["fit"]["rule"]["points"] == 7 and summary["held-out"]["rule"]["points"] == 4
    assert summary["held-out"]["rule"]["mape"] == pytest.approx(0.092, abs=0.002)
    assert summary["held-out"]["plain"]["mape"] == pytest.approx(0.156, abs=0.002)
    assert summary["fit"]["rule"]["mape"] == pytest.approx(0.069, abs=0.002)
    assert summary["fit"]["plain"]["mape"] == pytest.approx(0.173, abs=0.002)
