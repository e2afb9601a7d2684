"""The CLI fuzz test, bounded for CI (the long form: ``benchmarks/fuzz_cli.py --minutes 10``).

Drawn argument lists for every subcommand, valid and invalid values and corrupt files, run
in-process: exit 0 or 2, no traceback, no half-written file, and every exit-0 result for a
model on a system either fits HBM (recomputed independently) or is labelled ``does not
fit``. What the CI cases cover is listed in the harness's docstring; the cases are drawn in
``benchmarks/fuzz_cli_cases.py``, which the harness loads beside itself.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz_cli.py"


def load_harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_cli", HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # ~30 s: about 80 whole CLI runs, in-process (80 reach every subcommand)
def test_cli_fuzz_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    harness = load_harness()
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path / "local"))
    tally = harness.Tally()
    harness.fuzz(tally, tmp_path, examples=80, heavy=False, seed=0)
    assert tally.cases == 80
    assert len(tally.by_command) >= 9, tally.by_command  # the derandomized draw reaches every subcommand
    assert not tally.failures, "\n".join(f"tpusim {' '.join(a)}: {p}" for a, p in tally.failures)


def test_the_checker_catches_what_it_claims(tmp_path: Path) -> None:
    """The invariants fail on the faults they are for (so the fuzz test can fail)."""
    harness = load_harness()
    (tmp_path / ".best.json.x.tmp").write_text("{")
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n{"a": ')
    bad = harness.Outcome(["simulate", "--model", "kimi-k3", "--hardware", "gb200", "--chips", "2"], 1,
                          "step 24 ms", "Traceback (most recent call last):\n")
    problems = " | ".join(harness.check_outcome(bad, tmp_path))
    for expected in ("exit 1", "traceback printed", "temporary file left", "half-written JSON line"):
        assert expected in problems
    unlabelled = harness.Outcome([*bad.argv, "--force"], 0, "step 24 ms", "")
    assert any("without the label" in p for p in harness.check_outcome(unlabelled, tmp_path / "empty"))
    unforced = harness.Outcome(bad.argv, 0, "does not fit", "")
    assert any("without --force" in p for p in harness.check_outcome(unforced, tmp_path / "empty"))
    fits = harness.Outcome(["simulate", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16"], 0, "ok", "")
    assert harness.check_outcome(fits, tmp_path / "empty") == []


def test_the_issue36_checks_catch_what_they_claim(tmp_path: Path) -> None:
    """Ignored flags, self-contradicting configs and destroyed output paths are caught."""

    harness = load_harness()
    nano = ["--model", "kimi-k3-nano", "--hardware", "tpu-v7", "--chips", "4"]
    accepted = harness.Outcome(["simulate", *nano, "--tokens", "64", "--json"], 0, "{}", "")
    assert any(p.startswith("silently accepted: --tokens") for p in harness.check_outcome(accepted, tmp_path / "o"))
    used = harness.Outcome(["simulate", *nano, "--phase", "prefill", "--tokens", "64"], 0, "{}", "")
    assert not any("silently" in p for p in harness.check_outcome(used, tmp_path / "o"))
    configs = tmp_path / "configs" / "x"
    configs.mkdir(parents=True)
    (configs / "config.json").write_text('{"hidden_size": 1000, "num_attention_heads": 7, "num_key_value_heads": 7}')
    ran = harness.Outcome(["floor", "--model", str(configs / "config.json")], 0, "{}", "")
    assert any(p.startswith("confident wrong answer") for p in harness.check_outcome(ran, tmp_path / "o"))
    special = tmp_path / "corpus" / "special"
    special.mkdir(parents=True)
    (special / "fifo").write_text("a regular file where a FIFO was")
    (special / "link.json").write_text("a file where a link was")
    destroyed = harness.Outcome(["simulate", *nano, "--trace", str(special / "fifo"), "--plot",
                                 str(special / "link.json")], 0, "{}", "")
    problems = harness.check_outcome(destroyed, tmp_path / "o")
    assert sum(p.startswith("destroyed") for p in problems) == 2, problems
