"""`tpusim diff`: knobs that differ, step/exposed DMA/VMEM for both, one image with both
timelines; also two `simulate --json` results."""

from __future__ import annotations

import json

import pytest

from tpusim.app.cli import main
from tpusim.schedule.diff import knob_differences, knobs
from tpusim.schedule.schema import FamilySchedule, load_schedule

WORKLOAD = ["--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "1"]


def test_knob_differences_treat_an_omitted_family_as_its_defaults() -> None:
    published = load_schedule("published")
    assert knob_differences(published, published) == []
    spelled = published.model_copy(update={"families": {**published.families, "gqa_proj": FamilySchedule()}})
    implicit = published.model_copy(update={"families": {k: v for k, v in published.families.items()
                                                         if k != "gqa_proj"}})
    assert knobs(spelled)["families.gqa_proj.buffers"] == 1
    assert knob_differences(spelled, implicit) == []
    changed = published.model_copy(update={"max_dmas_in_flight": 3})
    assert knob_differences(published, changed) == [("max_dmas_in_flight", 16, 3)]


@pytest.mark.slow  # two simulations with timelines and a two-panel image
def test_diff_two_builtin_schedules_with_one_image(tmp_path, capsys) -> None:
    image = tmp_path / "both.png"
    assert main(["diff", "published", "layer-double-buffer", *WORKLOAD, "--plot", str(image),
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    knobs_table, numbers = data["tables"].values()
    assert {"what": "max_dmas_in_flight", "A": "16", "B": "8"} in knobs_table
    quantities = {row["quantity"]: row for row in numbers}
    assert {"step ms", "exposed DMA ms", "VMEM peak MiB"} <= set(quantities)
    assert any(key.startswith("exposed DMA ") and key.endswith(" ms") and key != "exposed DMA ms"
               for key in quantities)
    step = quantities["step ms"]
    assert abs(float(step["B"]) - float(step["A"]) - float(step["B - A"])) < 2e-3
    assert image.stat().st_size > 10_000


def test_diff_two_simulate_results(tmp_path, capsys) -> None:
    paths = []
    for batch in ("1", "2"):
        assert main(["simulate", *WORKLOAD, "--batch", batch, "--json"]) == 0
        path = tmp_path / f"b{batch}.json"
        path.write_text(capsys.readouterr().out)
        paths.append(str(path))
    assert main(["diff", *paths, "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| batch | 1 | 2 |" in out and "| step ms |" in out
