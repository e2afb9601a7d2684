"""Inputs are errors or are checked against each other (issue 23, items 2 and 4), through the CLI.

Each test drives one "Why" example: a file that cannot be read or validated, or an input
misapplied to the model it is used with, ends in one ``tpusim CMD: error:`` line naming the
file or flag and exit 2, never a result (a ``does not fit`` row, a silent no-op, a traceback).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tpusim.app.cli import main
from tpusim.schedule.schema import load_schedule

DATA = Path(__file__).parent / "data"
QWEN_MOE = DATA / "qwen3-30b-a3b" / "config.json"  # 32 query / 4 KV heads, 48 layers, 128 experts


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"tpusim {command}: error: ") and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("kind", ["missing", "misspelt", "invalid"])
def test_compare_schedule_that_cannot_be_read_is_an_error_not_a_row(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str) -> None:
    """It printed 'does not fit — no schedule fits on-chip memory' and exited 0."""
    invalid = tmp_path / "invalid.json"
    invalid.write_text('{"name": "x", "max_dmas_in_flight": 0}')
    schedule = {"missing": str(tmp_path / "nope.json"), "misspelt": "publshed", "invalid": str(invalid)}[kind]
    code, out, err = run(capsys, "compare", "--model", "kimi-k3-mini", "--systems", "tpu-v7:1", "--batch", "1",
                         "--schedule", schedule, "--json")
    line = one_error_line(err, "compare")
    assert code == 2 and out == "" and "does not fit" not in line
    assert (str(invalid) if kind == "invalid" else schedule) in line


@pytest.mark.parametrize("fmt", ["csv", "table", "markdown"])
def test_json_with_a_different_format_is_refused(capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    code, out, err = run(capsys, "floor", "--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "1",
                         "--json", "--format", fmt)
    assert code == 2 and out == ""
    assert f"--json and --format {fmt}" in one_error_line(err, "floor")


def test_json_with_format_json_is_one_request(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "floor", "--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "1",
                       "--json", "--format", "json")
    assert code == 0 and json.loads(out)["model"] == "kimi-k3-mini"


def test_another_models_published_plan_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """`--plan muse-tp8` on Qwen3-30B-A3B ran with 16 heads per device, labelled 'published deployment'."""
    code, out, err = run(capsys, "floor", "--model", str(QWEN_MOE), "--hardware", "tpu-v7", "--chips", "4",
                         "--plan", "muse-tp8")
    assert code == 2 and out == ""
    assert "plan muse-tp8 was written for muse-spark, not qwen3-30b-a3b" in one_error_line(err, "floor")


def test_a_plan_file_with_another_head_split_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Without a `model` field the plan's widths are still checked: heads per device."""
    plan = tmp_path / "plan-mine.yaml"
    text = (Path(__file__).parents[1] / "tpusim" / "models" / "plan-muse-tp8.yaml").read_text()
    plan.write_text("\n".join(line for line in text.splitlines() if not line.startswith("model:")) + "\n")
    code, _, err = run(capsys, "floor", "--model", str(QWEN_MOE), "--hardware", "tpu-v7", "--chips", "4",
                       "--plan", str(plan))
    assert code == 2
    assert "16 attention heads per device, but qwen3-30b-a3b's 32 heads over 8 devices are 4" in one_error_line(
        err, "floor")


def test_formats_for_a_family_the_model_lacks_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """`--formats experts=fp8` on a dense model changed nothing, silently."""
    code, out, err = run(capsys, "floor", "--model", "llama-3.2-1b", "--hardware", "tpu-v7", "--chips", "1",
                         "--formats", "experts=fp8")
    assert code == 2 and out == ""
    assert "--formats 'experts=fp8': llama-3.2-1b has no routed experts" in one_error_line(err, "floor")
    code, _, _ = run(capsys, "floor", "--model", "llama-3.2-1b", "--hardware", "tpu-v7", "--chips", "1",
                     "--formats", "attention=fp8,kv=fp8")
    assert code == 0  # families it has


def test_a_boolean_schedule_count_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`"buffers": true` read as 1 and changed the step."""
    schedule = tmp_path / "bool.json"
    schedule.write_text(json.dumps({"name": "b", "families": {"routed_expert": {"buffers": True}}}))
    code, out, err = run(capsys, "simulate", "--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "1",
                         "--schedule", str(schedule))
    line = one_error_line(err, "simulate")
    assert code == 2 and out == ""
    assert str(schedule) in line and "families.routed_expert.buffers" in line and "expected a number" in line


def test_integral_float_schedule_counts_still_load(tmp_path: Path) -> None:
    schedule = tmp_path / "float.json"
    schedule.write_text(json.dumps({"name": "f", "max_dmas_in_flight": 4.0, "families": {"router": {"buffers": 2.0}}}))
    loaded = load_schedule(str(schedule))
    assert loaded.max_dmas_in_flight == 4 and loaded.family("router").buffers == 2


def _qwen_with(tmp_path: Path, value: object) -> Path:
    data = json.loads(QWEN_MOE.read_text())
    data["num_hidden_layers"] = value
    folder = tmp_path / "qwen3-30b-a3b"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(data))
    return folder / "config.json"


def test_config_numbers_written_as_text_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`"num_hidden_layers": "48"` ended in a TypeError traceback (issue 23), then was read as 48;
    issue 48: a count is a JSON integer, as Hugging Face's own classes need, or it is refused
    with the key named (text there is a file nobody else could load)."""
    argv = ["floor", "--hardware", "tpu-v7", "--chips", "4", "--json"]
    code, out, err = run(capsys, *argv, "--model", str(_qwen_with(tmp_path, "48")))
    assert code == 2 and out == ""
    assert "num_hidden_layers" in one_error_line(err, "floor") and "'48' (text)" in err


@pytest.mark.parametrize(("value", "shown"), [("4x8", "'4x8'"), (True, "true")])
def test_config_counts_that_are_not_numbers_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         value: object, shown: str) -> None:
    config = _qwen_with(tmp_path, value)
    code, _, err = run(capsys, "floor", "--model", str(config), "--hardware", "tpu-v7", "--chips", "4")
    assert code == 2
    assert f"{config}: num_hidden_layers: expected a whole number (a JSON integer), got {shown}" in one_error_line(err, "floor")


def test_a_folder_as_model_reads_its_config_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A directory given as `--model` said 'unknown model'."""
    folder = tmp_path / "qwen3-30b-a3b"
    folder.mkdir()
    shutil.copy(QWEN_MOE, folder / "config.json")
    code, out, _ = run(capsys, "floor", "--model", str(folder), "--hardware", "tpu-v7", "--chips", "4", "--json")
    assert code == 0 and json.loads(out)["model"] == "qwen3-30b-a3b"
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(capsys, "floor", "--model", str(empty), "--hardware", "tpu-v7", "--chips", "4")
    assert code == 2 and f"{empty}: a folder without a config.json" in one_error_line(err, "floor")
