"""The issue's "Why" examples: each is one line on stderr and exit 2, or, with ``--force``,
a result labelled ``does not fit``; run in-process through ``tpusim.app.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpusim.app.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"tpusim {command}: error: ")
    assert "Traceback" not in err
    return lines[0]


def test_speculative_acceptance_above_draft_tokens_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "compare", "--model", "kimi-k3", "--systems", "tpu-v7:16", "--batch", "1",
                         "--spec-acceptance", "9", "--schedule", "published")
    line = one_error_line(err, "compare")
    assert code == 2 and out == ""
    assert "acceptance_length 9.0 exceeds draft_tokens + 1 = 8" in line


@pytest.mark.parametrize(("hardware", "chips", "extra", "per_device_gb"), [
    ("tpu-v7", "16", ["--batch", "100000"], "4580.3"),     # KV cache and state of 100000 sequences
    ("gb200", "2", ["--batch", "1"], "781.6"),              # K3's weights (MXFP4, as GPUs serve it) on two GPUs
    ("tpu-v7", "3", [], "406.3"),                           # three chips: HBM, not VMEM, is the limit
    ("tpu-v7", "16", ["--context", "100000000"], "3150.0"),  # a 10^8-token cache
])
def test_deployments_that_do_not_fit_are_refused_before_simulating(
        capsys: pytest.CaptureFixture[str], hardware: str, chips: str, extra: list[str], per_device_gb: str) -> None:
    code, out, err = run(capsys, "simulate", "--model", "kimi-k3", "--hardware", hardware, "--chips", chips, *extra)
    line = one_error_line(err, "simulate")
    assert code == 2 and out == ""
    assert f"kimi-k3 does not fit on {chips} x {hardware}: each device needs {per_device_gb} GB" in line
    assert "VMEM" not in line and "--force" in line


def test_floor_checks_capacity_too(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "floor", "--model", "kimi-k3", "--hardware", "gb200", "--chips", "2")
    assert code == 2 and "does not fit on 2 x gb200" in one_error_line(err, "floor")


def test_force_simulates_and_labels_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "floor", "--model", "kimi-k3", "--hardware", "gb200", "--chips", "2", "--force",
                         "--json")
    assert code == 0 and "warning" in err and "does not fit" in err
    data = json.loads(out)
    assert data["capacity"]["fits"] is False and data["capacity"]["label"] == "does not fit"
    # 781.6 GB per device for K3 (MXFP4 on GPUs) on 2 GPUs against 186 GB of HBM (the refusal above)
    assert data["capacity"]["needed_bytes_per_device"] > 4 * data["capacity"]["hbm_bytes_per_device"]


def test_a_deployment_that_fits_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "floor", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16", "--json")
    assert code == 0
    capacity = json.loads(out)["capacity"]
    assert capacity["fits"] is True and capacity["label"] == "fits"
    assert capacity["needed_bytes_per_device"] <= capacity["hbm_bytes_per_device"]


def test_schedule_validation_error_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "", "max_dmas_in_flight": 0}')
    code, _, err = run(capsys, "simulate", "--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "1",
                       "--schedule", str(bad))
    assert code == 2 and str(bad) in one_error_line(err, "simulate")


def test_unwritable_output_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = run(capsys, "sweep", "--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "1",
                       "--out", str(blocker / "sub"))
    assert code == 2 and str(blocker) in one_error_line(err, "sweep")


@pytest.mark.parametrize(("flag", "name"), [("--model", "garbage.yaml"), ("--model", "config.json"),
                                            ("--schedule", "garbage.json"), ("--routing", "garbage.json")])
def test_binary_garbage_files_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str,
                                           name: str) -> None:
    garbage = tmp_path / name
    garbage.write_bytes(b"\x00\xff\xfe\x80 : : [\n" + bytes(range(256)))
    argv = {"--model": "kimi-k3-mini", "--schedule": "published", "--routing": "uniform"}
    argv[flag] = f"trace:{garbage}" if flag == "--routing" else str(garbage)
    code, _, err = run(capsys, "simulate", "--hardware", "tpu-v7", "--chips", "1",
                       *[token for pair in argv.items() for token in pair])
    assert code == 2 and str(garbage) in one_error_line(err, "simulate")


def test_context_beyond_the_models_maximum_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    config = Path(__file__).parent / "data" / "deepseek-v3" / "config.json"  # max_position_embeddings 163840
    code, _, err = run(capsys, "floor", "--model", str(config), "--hardware", "tpu-v7", "--chips", "64",
                       "--context", "163841")
    assert code == 2
    assert "--context 163841: deepseek-v3 supports at most 163840 tokens of context" in one_error_line(err, "floor")


def test_negative_draft_tokens_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Found by the fuzz: --draft-tokens -1 made a verify step of batch x 0 rows (a traceback)."""
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--systems", "tpu-v7:16", "--spec-acceptance", "1", "--draft-tokens", "-1"])
    assert exit_.value.code == 2
    assert "--draft-tokens: must be >= 1, got -1" in capsys.readouterr().err
