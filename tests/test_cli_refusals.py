"""Every input refused or used (issue 48): the 26 cases a new user found, and the classes behind them.

Each case of the issue is one row of :data:`CASES`: the argument list, and a piece of the
one ``tpusim CMD: error:`` line that names the input. Every one must exit 2 with exactly that
one line on stderr, nothing on stdout, and quickly (validation comes before any work). The
class tests below walk the parser so that a flag added later meets the same rules: no
abbreviations, every number through :mod:`hwmodels.values`, every written file's suffix
checked, every parse error one line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import pytest

from tpusim.app.cli import Parser, build_parser, main

DATA = Path(__file__).parent / "data"
QWEN_MOE = DATA / "qwen3-30b-a3b" / "config.json"
K3 = ["--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16"]
MUSE = ["calibrate", "--hardware", "tpu-v7", "--measurements", "published:tpu7x-musespark", "--no-save"]

# (case id, argv, what the one error line must name). Placeholders: CFG:<key>=<json> writes the
# Qwen3-MoE config.json with that key changed; OUT a fresh folder; FILE a plain file.
CASES: list[tuple[str, list[str], str]] = [
    # tracebacks
    ("floor-seed-negative", ["floor", *K3, "--seed", "-1"], "--seed"),
    ("calibrate-max-evals-0", [*MUSE, "--max-evals", "0", "--out", "OUT"], "--max-evals"),
    ("calibrate-max-evals-negative", [*MUSE, "--max-evals", "-1", "--out", "OUT"], "--max-evals"),
    # wrong answers
    ("floor-zipf-nan", ["floor", *K3, "--routing", "zipf:nan"], "zipf:nan"),
    ("floor-zipf-nan-json", ["floor", *K3, "--routing", "zipf:nan", "--json"], "zipf:nan"),
    # hang
    ("plan-1e9-layers", ["plan", "--hardware", "tpu-v7", "--chips", "2", "--batch", "8", "--model",
                         "CFG:num_hidden_layers=1e9"], "num_hidden_layers"),
    # accepted without effect
    ("formats-duplicate", ["floor", *K3, "--formats", "experts=fp8,experts=bf16"], "experts given twice"),
    ("simulate-plot-txt", ["simulate", *K3, "--plot", "out.txt"], "--plot"),
    ("simulate-plot-layers-outside", ["simulate", *K3, "--plot-layers", "200:3", "--plot", "PNG"],
     "--plot-layers 200:3"),
    ("simulate-force-fits", ["simulate", *K3, "--force"], "--force"),
    ("sweep-scheduler-local", ["sweep", *K3, "--out", "OUT", "--scheduler", "tcp://127.0.0.1:1"], "--scheduler"),
    ("sweep-workers-local", ["sweep", *K3, "--out", "OUT", "--workers", "3"], "--workers"),
    ("sweep-abbreviation", ["sweep", *K3, "--out", "OUT", "--schedule", "published"], "--schedule"),
    ("sweep-jobs-1000", ["sweep", *K3, "--out", "OUT", "--jobs", "1000"], "--jobs"),
    ("config-unknown-architecture", ["plan", "--devices", "2", "--model",
                                     'CFG:architectures=["FooBarForCausalLM"]'], "FooBarForCausalLM"),
    ("config-text-size", ["plan", "--devices", "2", "--model", 'CFG:hidden_size="2048"'], "hidden_size"),
    ("config-zero-head-dim", ["plan", "--devices", "2", "--model", "CFG:head_dim=0"], "head_dim"),
    ("plan-devices-and-chips", ["plan", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "2",
                                "--devices", "3"], "--devices"),
    ("compare-empty-batch", ["compare", "--batch", "1,,2"], "--batch"),
    ("local-dir-file", ["--local-dir", "FILE", "hardware", "list"], "--local-dir"),
    ("local-dir-device", ["overlays", "list", "--local-dir", "/dev/full"], "--local-dir /dev/full"),
    ("diff-schedules-on-gpu", ["diff", "published", "naive", "--hardware", "gb200", "--chips", "16"],
     "no prefetch schedule"),
    ("demo-quick-budget", ["demo", "--quick", "--sweep-budget", "200", "--out", "OUT"], "--sweep-budget"),
    ("calibrate-quick-not-cpu-loop", [*MUSE, "--quick", "--out", "OUT"], "--quick"),
    ("compare-spec-acceptance-nan", ["compare", "--spec-acceptance", "nan"], "--spec-acceptance"),
    ("diff-neither-kind", ["diff", "FILE", "FILE"], "not a schedule or a simulate --json result"),
]


def _config(tmp_path: Path, change: str) -> str:
    key, _, value = change.partition("=")
    data = json.loads(QWEN_MOE.read_text())
    data[key] = json.loads(value)
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(data))
    return str(folder / "config.json")


def _argv(argv: list[str], tmp_path: Path) -> list[str]:
    (tmp_path / "file.txt").write_text("not a folder, not a schedule\n")
    out: list[str] = []
    for arg in argv:
        if arg.startswith("CFG:"):
            arg = _config(tmp_path, arg[4:])
        where = {"OUT": tmp_path / "out", "FILE": tmp_path / "file.txt", "PNG": tmp_path / "p.png"}
        out.append(str(where[arg]) if arg in where else arg)
    return out


def run(argv: list[str]) -> int:
    """``main``'s exit code, argparse's own refusals (SystemExit) included."""
    try:
        return main(argv)
    except SystemExit as stopped:
        return int(stopped.code or 0)


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tpusim") and ": error: " in lines[0] and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(("argv", "named"), [pytest.param(a, n, id=i) for i, a, n in CASES])
def test_each_case_is_one_line_and_exit_2_before_any_work(argv: list[str], named: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    argv = _argv(argv, tmp_path)
    started = time.perf_counter()
    code = run(argv)
    seconds = time.perf_counter() - started
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert named in one_error_line(err)
    assert seconds < 5, f"refused after {seconds:.1f} s: validate before work"
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.*"))  # nothing written


def test_spec_acceptance_nan_fails_in_under_two_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    """It was refused after 68 s of simulation; now before the first system is loaded."""
    run(["compare", "--batch", "1", "--spec-acceptance", "x"])  # warm the imports, so the clock measures validation alone
    capsys.readouterr()
    started = time.perf_counter()
    assert main(["compare", "--spec-acceptance", "1,nan"]) == 2
    assert time.perf_counter() - started < 2
    assert "--spec-acceptance" in one_error_line(capsys.readouterr().err)


def test_diff_reads_simulate_results_by_content_not_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`diff A.stdout B.stdout` gave a wall of schedule errors; it works as A.json does."""
    assert main(["simulate", "--model", "kimi-k3-nano", "--hardware", "tpu-v7", "--chips", "4", "--json"]) == 0
    (tmp_path / "a.stdout").write_text(capsys.readouterr().out)
    shutil.copy(tmp_path / "a.stdout", tmp_path / "a.json")
    assert main(["diff", str(tmp_path / "a.stdout"), str(tmp_path / "a.stdout"), "--json"]) == 0
    by_content = list(json.loads(capsys.readouterr().out).values())  # keyed by titles naming the files
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out).values()) == by_content


@pytest.mark.parametrize("routing", ["zipf:inf", "zipf:-1", "zipf:0", "zipf:1e9", "zipf:x"])
def test_zipf_exponents_outside_the_range_are_refused(routing: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["floor", *K3, "--routing", routing]) == 2
    assert routing in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("change", ["num_hidden_layers=1000000000", "num_hidden_layers=48.0",
                                    'num_attention_heads="32"', "vocab_size=true", "num_experts=-1",
                                    "rms_norm_eps=0", 'rms_norm_eps="1e-6"', "mlp_only_layers=[1.5]",
                                    'architectures="Qwen3MoeForCausalLM"'])
def test_config_fields_are_typed_and_bounded(change: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Class: a config.json count is a JSON integer inside its range, a real a finite number > 0,
    named in one line before any reader loops over it."""
    started = time.perf_counter()
    assert main(["plan", "--devices", "2", "--model", _config(tmp_path, change)]) == 2
    assert change.partition("=")[0] in one_error_line(capsys.readouterr().err)
    assert time.perf_counter() - started < 5


# ----------------------------------------------------------------------------- the classes, walked


def _parsers() -> list[argparse.ArgumentParser]:
    found, todo = [], [build_parser()]
    while todo:
        parser = todo.pop()
        found.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return found


def _options() -> list[tuple[str, argparse.Action]]:
    return [(parser.prog, action) for parser in _parsers() for action in parser._actions if action.option_strings]


def test_every_parser_refuses_abbreviations() -> None:
    parsers = _parsers()
    assert len(parsers) > 15
    assert all(isinstance(p, Parser) and not p.allow_abbrev for p in parsers), [p.prog for p in parsers
                                                                                  if p.allow_abbrev]


def test_no_option_reads_a_bare_int_or_float() -> None:
    """Every number goes through :mod:`hwmodels.values` (finite, whole where it counts, in range)."""
    bare = [f"{prog} {action.option_strings[0]}" for prog, action in _options() if action.type in (int, float)]
    assert not bare


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1.5", "", "1e400"])
def test_every_numeric_option_refuses_non_finite_negative_and_fractional(value: str) -> None:
    numeric = [(prog, a) for prog, a in _options() if getattr(a.type, "__name__", "") in
               ("whole number", "number", "jobs")]
    assert len(numeric) > 40
    for prog, action in numeric:
        with pytest.raises(argparse.ArgumentTypeError):
            result = action.type(value)
            if getattr(action.type, "__name__", "") == "number" and value in ("-1", "1.5"):
                # a finite real: refused only outside its range (serving's ratio and acceptance)
                raise argparse.ArgumentTypeError(f"{prog} {action.option_strings[0]} {value} -> {result}")


def test_every_written_file_checks_its_suffix() -> None:
    """--plot is a PNG, --trace trace-event JSON, run-kernel --out JSON lines: the name says so."""
    writers = [(prog, a) for prog, a in _options()
               if (a.dest in ("plot", "trace") and prog != "tpusim serving")  # serving's --trace is read
               or (prog.endswith("run-kernel") and a.dest == "out")]
    assert len(writers) >= 5
    for prog, action in writers:
        assert getattr(action.type, "__name__", "").endswith(" file"), f"{prog} {action.option_strings[0]}"
        with pytest.raises(argparse.ArgumentTypeError):
            action.type("out.txt")


def test_a_parse_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["floor", *K3, "--chips", "0"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("tpusim floor: error: argument --chips: must be >= 1, got 0")


@pytest.mark.parametrize("argv", [["compare", "--spec-acceptance", ""], ["compare", "--batch", ""],
                                  ["serving", "--concurrency", ""], ["serving", "--rate", "1,,2"],
                                  ["compare", "--batch", "1,"], ["floor", *K3, "--formats", "experts=fp8,"],
                                  ["floor", *K3, "--plan", "tp=4,tp=2"]])
def test_a_typed_empty_item_or_repeated_key_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Class: a list typed empty (even where empty is the default), an empty item, a key twice."""
    assert run(argv) == 2
    assert argv[-2] in one_error_line(capsys.readouterr().err)
