"""``tpusim run-kernel`` on the CPU: interpret mode, checked against the reference, one
appended record labelled as not a TPU timing (run on a 4-layer variant of kimi-k3-mini,
written as a model YAML, to keep CI fast)."""

from __future__ import annotations

import json

import pytest
import yaml

from calibration.sources.measurements import read_measurements
from hwmodels.errors import InputError
from megakernel.examples import ring_schedule
from tpusim.app.cli import main
from tpusim.schedule.schema import save_schedule
from tpusim.workload.model_catalog import load_model

pytestmark = pytest.mark.slow


def test_run_kernel_appends_a_cpu_interpret_record(tmp_path, capsys):
    model_file = tmp_path / "k3-mini-4.yaml"
    model_file.write_text(yaml.safe_dump(load_model("kimi-k3-mini").with_layers(4).model_dump(mode="json")))
    out = tmp_path / "measurements.jsonl"
    out.write_text('{"keep": "this line"}\n')
    code = main(["run-kernel", "--model", str(model_file), "--schedule", "published", "--batch", "2",
                 "--steps", "2", "--backend", "interpret", "--out", str(out)])
    assert code == 0
    assert "NOT a TPU timing" in capsys.readouterr().out
    lines = out.read_text().splitlines()
    assert lines[0] == '{"keep": "this line"}'  # appended, never truncated
    record = json.loads(lines[1])
    assert record["backend"] == "cpu-interpret" and "NOT a TPU timing" in record["timing_note"]
    assert record["schedule"] == "published" and len(record["schedule_hash"]) == 16
    assert record["steps"] == 2 and record["ms_per_step_median"] > 0
    assert record["max_abs_error"] < 1e-2
    assert record["routing"].startswith("trace:")
    (measurement,) = read_measurements_from(tmp_path, lines[1])
    assert measurement.extra["max_abs_error"] == record["max_abs_error"]


@pytest.mark.heavy  # the same kernel as test_megakernel_kernel's ring run; here the CLI path
def test_run_kernel_runs_a_ring_pool_schedule(tmp_path, capsys):
    """The Muse layout (every dense tensor through one ring of banks) at kimi-k3-mini sizes."""
    model_file = tmp_path / "k3-mini-4.yaml"
    model_file.write_text(yaml.safe_dump(load_model("kimi-k3-mini").with_layers(4).model_dump(mode="json")))
    schedule_file = tmp_path / "ring.json"
    save_schedule(ring_schedule(), schedule_file)
    out = tmp_path / "measurements.jsonl"
    code = main(["run-kernel", "--model", str(model_file), "--schedule", str(schedule_file), "--steps", "1",
                 "--backend", "interpret", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    record = json.loads(out.read_text())
    assert record["schedule"] == ring_schedule().name and record["backend"] == "cpu-interpret"
    assert record["max_abs_error"] < 1e-4  # batch 1, 4 layers: f32 rounding of the slab sums


def read_measurements_from(tmp_path, line: str):
    path = tmp_path / "one.jsonl"
    path.write_text(line + "\n")
    return read_measurements(path)


def test_bad_schedule_is_a_one_line_input_error(tmp_path, capsys):
    code = main(["run-kernel", "--schedule", str(tmp_path / "missing.json"), "--backend", "interpret",
                 "--out", str(tmp_path / "m.jsonl")])
    assert code == 2
    assert "unknown schedule" in capsys.readouterr().err


def test_capped_routing_keeps_the_kernels_first_experts_for_every_row():
    import numpy as np

    from megakernel.runner import capped_routing

    # one MoE layer, 3 rows, top-3; the kernel lists distinct ids rank by rank, row by row:
    # rank 0 gives 5, 7 (row 2 repeats 5), rank 1 gives 9, 1 (row 1's 5 is listed), ...
    routing = np.array([[[5, 9, 2], [7, 5, 4], [5, 1, 8]]])
    capped = capped_routing(routing, 4)
    assert capped.shape == (1, 3, 4)
    assert (capped == np.array([5, 7, 9, 1])).all()  # every row runs the same four
    single = np.array([[[3, 1, 2]], [[6, 4, 0]]])  # batch 1: the row's first picks in rank order
    assert (capped_routing(single, 2) == single[:, :, :2]).all()
    with pytest.raises(InputError, match="layer 0 routes only 3 distinct"):
        capped_routing(np.array([[[1, 2, 3]]]), 4)
