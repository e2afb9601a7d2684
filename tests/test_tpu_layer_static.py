"""The layer's own work from the static schedule of the kernel's layer loop: which record
prices a build and batch, and the remainder over the engine's ops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.sources.tpu_layer_static import (
    V5E_CLOCK_HZ,
    layer_issue,
    layer_remainder,
    loop_iterations,
)
from hwmodels.catalog import load_chip


def _write(path: Path, rows: list[tuple[int, list[int], int, str]], arms: tuple[int, int] = (30_000, 20_000)) -> Path:
    mla, kda = arms
    lines = [json.dumps({"kind": "static_schedule", "probe": "layer_body", "params": {"batch": b, "panel_unroll": u},
                         "issued_bundles": n, "arms": {"mla": {"issued_bundles": mla}, "kda": {"issued_bundles": kda}},
                         "date": d}) for b, u, n, d in rows]
    lines.append(json.dumps({"kind": "static_schedule", "probe": "expert_product", "params": {"rows": 1}}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_builds_own_record_else_the_nearest_else_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.jsonl", [(1, [8, 2], 87_000, "2026-12-06T19:00"), (1, [4, 2], 86_000, "2026-12-06T19:10"),
                                         (1, [8, 2], 87_500, "2026-12-06T20:00"), (8, [4, 4], 99_000, "2026-12-06T19:00")])
    assert layer_issue(1, (8, 2), path).issued_bundles == 87_500  # its own build, the latest
    assert layer_issue(1, (4, 2), path).issued_bundles == 86_000
    assert layer_issue(1, (16, 2), path).panel_unroll == (8, 2)  # same expert loop, nearest dense loop
    assert layer_issue(8, (8, 2), path).issued_bundles == 99_000  # the only build at that batch
    with pytest.raises(KeyError, match="no layer-loop record at batch 2"):
        layer_issue(2, (8, 2), path)


def test_the_expert_list_build_is_matched_before_the_panel_loops(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.jsonl", [(1, [8, 2], 87_000, "2026-12-06T19:00"), (1, [4, 2], 86_000, "2026-12-06T19:10")])
    rows = path.read_text().splitlines()
    vector = json.loads(rows[0])
    vector["params"]["expert_list"], vector["issued_bundles"], vector["date"] = "vector", 85_000, "2026-12-07T00:00"
    path.write_text("\n".join([*rows, json.dumps(vector)]) + "\n")
    assert layer_issue(1, (8, 2), path).issued_bundles == 87_000  # the walk build unless asked: older kernels' records
    assert layer_issue(1, (8, 2), path, "vector").issued_bundles == 85_000
    assert layer_issue(1, (4, 2), path, "vector").issued_bundles == 85_000  # the list first, then the panel loops
    assert layer_issue(1, (4, 2), path).issued_bundles == 86_000
    only_walk = _write(tmp_path / "w.jsonl", [(1, [8, 2], 87_000, "d")])
    assert layer_issue(1, (8, 2), only_walk, "vector").expert_list == "walk"  # nearest: no vector record yet


def test_a_schedules_own_kernel_is_matched_first_else_publisheds(tmp_path: Path) -> None:
    """A schedule changes the kernel's code (the ring pool's bookkeeping, its copies' issues):
    within the build, its own record first, published's otherwise, never a third schedule's; a
    record of another build is no match (the build is chosen first)."""
    path = _write(tmp_path / "s.jsonl", [(1, [8, 2], 87_000, "2026-12-06T19:00"), (8, [8, 2], 99_000, "2026-12-06T19:00")])
    rows = path.read_text().splitlines()
    def under(row: str, schedule: str, bundles: int, unroll: list[int] | None = None) -> str:
        record = json.loads(row)
        record["params"]["schedule"], record["issued_bundles"] = schedule, bundles
        record["params"]["panel_unroll"] = unroll or record["params"]["panel_unroll"]
        return json.dumps(record)
    path.write_text("\n".join([*rows, under(rows[0], "k3-ring", 95_000), under(rows[1], "k3-ring", 96_000, [4, 2]),
                               under(rows[0], "layer-double-buffer", 91_000)]) + "\n")
    assert layer_issue(1, (8, 2), path).issued_bundles == 87_000  # published unless asked
    ring = layer_issue(1, (8, 2), path, schedule="k3-ring")
    assert (ring.issued_bundles, ring.schedule, ring.panel_unroll) == (95_000, "k3-ring", (8, 2))
    assert layer_issue(8, (8, 2), path, schedule="k3-ring").schedule == "published"  # none of its own at batch 8
    assert layer_issue(1, (8, 2), path, schedule="naive").schedule == "published"  # not layer-double-buffer's


@pytest.mark.slow  # lowers K3's per-device program once (~5 s)
def test_the_remainder_is_the_issue_time_less_the_engines_own_compute(tmp_path: Path) -> None:
    chip = load_chip("tpu-v5e", calibrated=False)
    path = _write(tmp_path / "s.jsonl", [(1, [8, 2], 90_000, "d"), (1, [4, 2], 60_000, "d")])
    high, source = layer_remainder(chip, 1, (8, 2), path)
    low, _ = layer_remainder(chip, 1, (4, 2), path)
    # the engine's part is the same program on the same chip: the difference is the bundles'
    assert high - low == pytest.approx(30_000 / V5E_CLOCK_HZ, rel=1e-9)
    assert "KDA 73.3 µs, MLA 80.0 µs at batch 1 (1.500 G bundles/s" in source  # (90,000 + 20,000 or 30,000) / 1.5 GHz
    # the arms weigh by the program's layers: layers 1-91 of K3 hold 68 KDA and 23 MLA layers
    arm_path = _write(tmp_path / "a.jsonl", [(1, [8, 2], 90_000, "d")], arms=(30_000 + 9_000, 20_000))
    assert layer_remainder(chip, 1, (8, 2), arm_path)[0] - high == pytest.approx(9_000 / V5E_CLOCK_HZ * 23 / 91, rel=1e-9)
    tiny = _write(tmp_path / "t.jsonl", [(1, [8, 2], 1, "d")], arms=(1, 1))
    assert layer_remainder(chip, 1, (8, 2), tiny)[0] == 0.0  # less than the engine's ops: clipped


def test_loop_iterations_of_a_hand_built_layer() -> None:
    """Outside the arms: a loop of 4 holding one of 3 (4 + 12) and the layer's own back edge;
    a loop inside the data-dependent expert loop is left out (as its bundles are); the KDA arm
    runs a loop of 7, the MLA arm one of 2 holding one of 5 (2 + 10)."""
    record = {"inner_loops": [{"start": 10, "bundles": 50, "trips": 4}, {"start": 20, "bundles": 10, "trips": 3},
                              {"start": 110, "bundles": 5, "trips": 9},
                              {"start": 210, "bundles": 20, "trips": 7},
                              {"start": 310, "bundles": 30, "trips": 2}, {"start": 320, "bundles": 5, "trips": 5}],
              "data_dependent_loops": [{"start": 100, "bundles": 40}],
              "arms": {"kda": {"start": 200, "end": 299, "data_dependent_loops": []},
                       "mla": {"start": 300, "end": 399, "data_dependent_loops": []}}}
    assert loop_iterations(record) == (4 + 12 + 1, {"kda": 7, "mla": 2 + 10})


def test_a_loop_iteration_cost_adds_to_what_a_layer_issues(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.jsonl", [(1, [8, 2], 87_000, "2026-12-06T19:00")])
    issue = layer_issue(1, (8, 2), path)
    assert issue.iterations == 1 and issue.arm_iterations == {"mla": 0, "kda": 0}  # records without loop spans
    assert issue.issue_s("mla", 1.0e9, 20e-9) == pytest.approx((87_000 + 30_000) / 1.0e9 + 20e-9)


def test_the_mla_cores_kv_loop_of_a_hand_built_layer() -> None:
    """The MLA arm's data-dependent loop (bundles 300-499) holds the part loop (100 bundles, 8
    trips) with a loop of 4 x 10 inside it, and a loop of 3 x 6 beside it: a part 100 + 3 x 10
    bundles and 4 iterations beyond its own; a tile 200 - 100 + 2 x 6 and 3 iterations."""
    record = {"inner_loops": [{"start": 320, "bundles": 100, "trips": 8}, {"start": 330, "bundles": 10, "trips": 4},
                              {"start": 450, "bundles": 6, "trips": 3}, {"start": 20, "bundles": 50, "trips": 9}],
              "data_dependent_loops": [],
              "arms": {"mla": {"start": 250, "end": 599, "data_dependent_loops": [{"start": 300, "bundles": 200}]}}}
    from calibration.sources.tpu_layer_static import kv_loops

    assert kv_loops(record) == (200 - 100 + 2 * 6, 100 + 3 * 10, 8, 3, 4)
    assert kv_loops({"arms": {"mla": {"data_dependent_loops": []}}}) == (0, 0, 0, 0, 0)


def test_the_attention_cores_figures_are_its_kv_loops_bundles_over_the_clock(tmp_path: Path) -> None:
    from calibration.sources.tpu_layer_static import attention_core_figures
    from megakernel.math_mla import KV_FOLD_TOKENS

    row = {"kind": "static_schedule", "probe": "layer_body", "params": {"batch": 8, "panel_unroll": [8, 2]},
           "issued_bundles": 1, "date": "2026-12-07",
           "inner_loops": [{"start": 20, "bundles": 1_000, "trips": 8}],
           "arms": {"kda": {"issued_bundles": 1}, "mla": {"issued_bundles": 1, "start": 0, "end": 2_000,
                                                         "data_dependent_loops": [{"start": 10, "bundles": 1_040}]}}}
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(row) + "\n")
    token_s, tile_s, source = attention_core_figures(8, (8, 2), path, clock_hz=1.0e9, loop_iteration_s=20e-9)
    assert token_s == pytest.approx((1_000e-9 + 20e-9) / KV_FOLD_TOKENS)
    assert tile_s == pytest.approx(40e-9 + 20e-9)
    assert "1000 bundles a 16-token part (8 parts a tile as compiled) and 40 a tile" in source
    row["arms"]["mla"]["data_dependent_loops"] = []
    path.write_text(json.dumps(row) + "\n")
    assert attention_core_figures(8, (8, 2), path) is None
