"""`tpusim schema`: every topic prints a JSON Schema and an example the validator accepts; a
new user can calibrate from the measurement example alone; errors list every missing field."""

from __future__ import annotations

import json

import pytest
import yaml

from calibration.sources.measurements import read_measurements
from hwmodels.errors import InputError
from tpusim.app.cli import main
from tpusim.app.schemas import example_text, json_schema, topic, topic_names


def test_topics_keep_their_order() -> None:
    """calibration's measurement (an entry point) first, as `tpusim schema --help` lists them."""
    assert topic_names() == ("measurement", "model", "plan", "schedule", "hardware")


@pytest.mark.parametrize("name", topic_names())
def test_example_validates_against_its_model(name: str) -> None:
    model = topic(name).model()
    text = example_text(name)
    if name == "measurement":
        documents = [json.loads(line) for line in text.splitlines()]
    elif name == "schedule":
        documents = [json.loads(text)]
    else:
        documents = [yaml.safe_load(text)]
    assert documents
    for document in documents:
        model.model_validate(document)
    schema = json_schema(name)
    assert schema["type"] == "object" and schema["properties"]


@pytest.mark.slow  # a 4-point fit through the CLI
def test_printed_measurement_example_calibrates(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path / "local"))
    assert main(["schema", "measurement"]) == 0
    printed = capsys.readouterr().out
    assert '"properties"' in printed and "execution" in printed
    assert main(["schema", "measurement", "--example"]) == 0
    path = tmp_path / "my.jsonl"
    path.write_text(capsys.readouterr().out)
    records = read_measurements(path)
    assert {r.system.execution for r in records} == {"megakernel"}
    code = main(["calibrate", "--hardware", "tpu-v7", "--measurements", str(path),
                 "--parameters", "execution.per_layer_overhead_s", "--max-evals", "20",
                 "--allow-unconverged", "--out", str(tmp_path / "cal")])
    out = capsys.readouterr().out
    assert code == 0
    assert "solver:" in out and "fitted on: 4 points" in out
    assert (tmp_path / "local" / "calibrated" / "tpu-v7.yaml").is_file()


def test_missing_fields_are_listed_at_once(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"model": "muse-spark", "batch": 1, "ms_per_step_median": 3.0}) + "\n")
    with pytest.raises(InputError) as error:
        read_measurements(path)
    message = str(error.value)
    for field in ("system", "context", "backend"):
        assert field in message
    assert "tpusim schema measurement" in message
    assert "\n" not in message


def test_graphs_execution_is_accepted(tmp_path) -> None:
    record = {"model": "kimi-k3", "system": {"chip": "h200", "chips": 8, "execution": "graphs"},
              "batch": 1, "context": 1024, "backend": "cuda", "ms_per_step_median": 20.0}
    path = tmp_path / "gpu.jsonl"
    path.write_text(json.dumps(record) + "\n")
    assert read_measurements(path)[0].system.execution == "graphs"
