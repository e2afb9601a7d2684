"""Every flag changes the answer or is refused (:mod:`tpusim.app.cli.flag_rules`).

Table-driven: every rule of :func:`~tpusim.app.cli.flag_rules.every_rule` has a case here that
types the flag on a path that ignores it (exit 2, one line naming the flag), and the table
fails if a rule is added without one. The controls run the same flags where they are used.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpusim.app.cli import build_parser, given_options, main
from tpusim.app.cli.flag_rules import every_rule, flag_name

NANO = ["--model", "kimi-k3-nano", "--hardware", "tpu-v7", "--chips", "4"]
GPU_NANO = ["--model", "kimi-k3-nano", "--hardware", "gb200", "--chips", "2"]

# (command, dest) -> an argument list typing that flag on a path that ignores it
IGNORED: dict[tuple[str, str], list[str]] = {
    ("simulate", "tokens"): ["simulate", *NANO, "--tokens", "100"],
    ("simulate", "prefix_tokens"): ["simulate", *NANO, "--prefix-tokens", "5"],
    ("simulate", "batch"): ["simulate", *NANO, "--phase", "prefill", "--batch", "4"],
    ("simulate", "context"): ["simulate", *NANO, "--phase", "prefill", "--context", "64"],
    ("simulate", "schedule"): ["simulate", *GPU_NANO, "--schedule", "naive"],
    ("simulate", "plot_layers"): ["simulate", *NANO, "--plot-layers", "1:2"],
    ("compare", "schedule"): ["compare", "--systems", "gb200:16", "--schedule", "published"],
    ("compare", "sweep_budget"): ["compare", "--systems", "tpu-v7:16", "--schedule", "published",
                                  "--sweep-budget", "3"],
    ("compare", "sweep_samples"): ["compare", "--systems", "tpu-v7:16", "--schedule", "naive",
                                   "--sweep-samples", "3"],
    ("compare", "jobs"): ["compare", "--systems", "gb200:16", "--jobs", "2"],
    ("compare", "out"): ["compare", "--systems", "tpu-v7:16", "--schedule", "published", "--out", "OUT"],
    ("compare", "drafter"): ["compare", "--systems", "gb200:16", "--drafter", "mtp"],
    ("compare", "draft_tokens"): ["compare", "--systems", "gb200:16", "--draft-tokens", "3"],
    ("serving", "drafter"): ["serving", "--systems", "tpu-v7:16", "--drafter", "mtp"],
    ("serving", "draft_tokens"): ["serving", "--systems", "tpu-v7:16", "--draft-tokens", "3"],
    ("serving", "input_tokens"): ["serving", "--systems", "tpu-v7:16", "--trace", "TRACE", "--input-tokens", "9"],
    ("serving", "output_tokens"): ["serving", "--systems", "tpu-v7:16", "--trace", "TRACE", "--output-tokens", "9"],
    ("serving", "random_range_ratio"): ["serving", "--systems", "tpu-v7:16", "--trace", "TRACE",
                                        "--random-range-ratio", "0.5"],
    ("serving", "requests"): ["serving", "--systems", "tpu-v7:16", "--trace", "TRACE", "--requests", "4"],
    # issue 48: executor options without a distributed executor, joint-only and schedule-only flags
    ("sweep", "batches"): ["sweep", *NANO, "--out", "OUT", "--batches", "1,2"],
    ("sweep", "executor"): ["sweep", *NANO, "--out", "OUT", "--executor", "dask"],
    ("sweep", "baseline"): ["sweep", *NANO, "--out", "OUT", "--baseline", "best.json"],
    ("sweep", "no_kernel_gate"): ["sweep", *NANO, "--out", "OUT", "--no-kernel-gate"],
    ("sweep", "scheduler"): ["sweep", *NANO, "--out", "OUT", "--scheduler", "tcp://127.0.0.1:1"],
    ("sweep", "workers"): ["sweep", *NANO, "--out", "OUT", "--workers", "3"],
    ("sweep", "jobs"): ["sweep", *NANO, "--out", "OUT", "--space", "joint", "--executor", "dask", "--jobs", "1"],
    ("sweep", "batch"): ["sweep", *NANO, "--out", "OUT", "--space", "joint", "--batches", "1,2", "--batch", "2"],
    ("sweep", "samples"): ["sweep", *NANO, "--out", "OUT", "--space", "joint", "--samples", "3"],
    ("sweep", "screen_factor"): ["sweep", *NANO, "--out", "OUT", "--space", "joint", "--screen-factor", "2"],
    ("sweep", "screen_layers"): ["sweep", *NANO, "--out", "OUT", "--space", "joint", "--screen-layers", "2"],
    ("sweep", "compile_check"): ["sweep", *NANO, "--out", "OUT", "--space", "joint", "--compile-check", "2"],
    ("sweep", "weight_banks"): ["sweep", *NANO, "--out", "OUT", "--weight-banks", "2"],
    ("plan", "devices"): ["plan", *NANO, "--devices", "3"],
    ("plan", "chips"): ["plan", "--model", "kimi-k3-nano", "--chips", "2"],
    ("demo", "sweep_budget"): ["demo", "--quick", "--sweep-budget", "3", "--out", "OUT"],
    ("calibrate", "quick"): ["calibrate", "--hardware", "tpu-v7", "--measurements", "published:tpu7x-musespark",
                             "--quick", "--out", "OUT"],
    ("calibrate", "no_probe"): ["calibrate", "--hardware", "tpu-v7", "--measurements", "published:tpu7x-musespark",
                                "--no-probe", "--out", "OUT"],
    ("calibrate", "max_evals"): ["calibrate", "--hardware", "host-cpu", "--measurements", "cpu-loop",
                                 "--max-evals", "3", "--out", "OUT"],
    ("diff", "plot_layers"): ["diff", "published", "naive", "--plot-layers", "1:2"],
    **{("diff", dest): ["diff", "RESULT", "RESULT", *typed] for dest, typed in {
        "model": ["--model", "kimi-k3-nano"], "hardware": ["--hardware", "tpu-v5e"], "chips": ["--chips", "2"],
        "batch": ["--batch", "2"], "context": ["--context", "64"], "routing": ["--routing", "identical"],
        "seed": ["--seed", "1"], "uncalibrated": ["--uncalibrated"], "plot": ["--plot", "PNG"]}.items()},
}


def test_every_rule_has_a_case() -> None:
    rules = {(command, dest) for command, table in every_rule(build_parser()).items() for dest, _ in table}
    assert rules == set(IGNORED)


@pytest.mark.parametrize(("command", "dest"), sorted(IGNORED))
def test_an_ignored_flag_is_refused_in_one_line(command: str, dest: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"arrival_s": 0, "input_tokens": 10, "output_tokens": 2}) + "\n")
    result = tmp_path / "result.json"  # a simulate --json result, as diff reads one
    result.write_text(json.dumps({"step_ms": 1.0, "tokens_per_s": 1000.0}))
    where = {"TRACE": trace, "OUT": tmp_path / "out", "RESULT": result, "PNG": tmp_path / "p.png"}
    argv = [str(where[a]) if a in where else a for a in IGNORED[command, dest]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"tpusim {command}: error: {flag_name(dest)}: "), err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.json"))  # nothing written


def test_an_execution_a_tpu_does_not_have_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: ``compare --systems tpu-v7:16:eager`` ran the megakernel."""
    assert main(["compare", "--systems", "tpu-v7:16:eager", "--schedule", "published", "--batch", "1"]) == 2
    assert "a TPU runs only the megakernel" in capsys.readouterr().err


def test_used_flags_run(capsys: pytest.CaptureFixture[str]) -> None:
    """Controls: the same flags on the path that uses them change the answer."""
    def step(argv: list[str]) -> dict:
        assert main([*argv, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    small, large = (step(["simulate", *NANO, "--phase", "prefill", "--tokens", str(t)]) for t in (64, 256))
    assert small["step_ms"] < large["step_ms"] and small["batch"] == 64
    gpu = step(["simulate", *GPU_NANO])
    assert gpu["schedule"] is None and gpu["execution_mode"] != "megakernel"  # no schedule named where none ran


def test_given_options_sees_typed_flags_only() -> None:
    parser = build_parser()
    argv = ["simulate", *NANO, "--tokens=12", "--seed", "3"]
    args = parser.parse_args(argv)
    given = given_options(parser, args, argv)
    assert {"model", "hardware", "chips", "tokens", "seed"} <= given
    assert "batch" not in given and "schedule" not in given


def test_a_schedule_leaving_families_out_names_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"name": "partial", "families": {"routed_expert": {"buffers": 2}}}))
    assert main(["simulate", *NANO, "--schedule", str(partial), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "routed_expert" not in data["schedule_default_families"]
    assert data["schedule_default_families"]  # every other family the program reads took the defaults
