"""`tpusim calibrate` tells the truth on the terminal: convergence, leave-one-out error,
intervals, identifiability, what it was fitted on; an unconverged solve exits 2."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from calibration.commands.fit_summary import identifiability_word
from tpusim.app.cli import main
from tpusim.app.schemas import example_text


@pytest.fixture
def one_point(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path / "local"))
    path = tmp_path / "one.jsonl"
    path.write_text(example_text("measurement").splitlines()[0] + "\n")
    return path


def _calibrate(path, out, *extra: str) -> int:
    return main(["calibrate", "--hardware", "tpu-v7", "--measurements", str(path), "--parameters",
                 "execution.per_layer_overhead_s", "--max-evals", "1", "--out", str(out), *extra])


@pytest.mark.slow  # two fits of one point (~4 s of CPU; longer on a loaded machine)
def test_unconverged_solve_exits_2_unless_allowed(one_point, tmp_path, capsys) -> None:
    overlay = tmp_path / "local" / "calibrated" / "tpu-v7.yaml"
    assert _calibrate(one_point, tmp_path / "a") == 2
    captured = capsys.readouterr()
    assert "DID NOT CONVERGE" in captured.out
    assert "--allow-unconverged" in captured.err
    assert not overlay.exists()
    assert _calibrate(one_point, tmp_path / "b", "--allow-unconverged") == 0
    out = capsys.readouterr().out
    for words in ("leave-one-out", "95 % interval", "execution.per_layer_overhead_s: 1e-06 ->",
                  "fitted on: 1 points", "chip counts 4"):
        assert words in out
    assert overlay.exists()


@pytest.mark.parametrize(("uncertainty", "at_bound", "word"), [
    (0.05, False, "identified"), (0.3, False, "weakly identified"), (31.0, False, "NOT identified"),
    (None, True, "at a bound"), (None, False, "no interval"),
])
def test_identifiability_words(uncertainty, at_bound, word) -> None:
    parameter = SimpleNamespace(value=1.0, uncertainty=uncertainty, at_bound=at_bound)
    assert identifiability_word(parameter).startswith(word)
