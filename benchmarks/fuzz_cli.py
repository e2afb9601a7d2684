"""Fuzz the ``tpusim`` command line: every subcommand, valid and invalid flags, corrupt files.

Run::

    nice -n 10 .venv/bin/python benchmarks/fuzz_cli.py --minutes 10      # the long form
    .venv/bin/python benchmarks/fuzz_cli.py --minutes 1 --heavy           # + K3 simulations

Each case is an argument list drawn (hypothesis) from the values of each flag of one
subcommand, valid and invalid: unknown names, zero and negative numbers, sizes that would
exhaust memory, and files that are corrupt (truncated JSON lines, YAML with wrong types,
empty files, binary garbage, a schedule with every knob at its extreme). The case runs
in-process through :func:`tpusim.app.cli.main` and must

1. exit 0 or 2 (argparse's own errors are exit 2 too), never raise;
2. print no traceback;
3. leave no half-written file: no atomic-write temporaries, every JSON / JSON-lines output
   parses;
4. if it exits 0 for a model on a system, either fit HBM (checked independently with
   :func:`tpusim.workload.capacity.capacity_report`) or say ``does not fit``;
5. the semantic half: valid-looking inputs misapplied to the model they are used with
   (another model's published plan or a plan file with another head split, ``--formats``
   for a family the model lacks, a schedule whose count is a boolean, a ``config.json``
   whose layer count is text that is not a number) end in exit 2 or a labelled
   ``warning``, never a silent answer. Whether a case is misapplied is decided here
   (:func:`misapplication`, from the raw plan YAML and the model's shapes), not read from
   the output. A ``config.json`` whose numbers are written as text that parses exactly
   (``"48"``) is refused since issue 48 (a count is a JSON integer); a checkpoint folder as
   ``--model`` is valid and must run.

6. the classes of issue 36 (``fuzz_cli_cases._issue36_cases``), each with its own oracle here:

   - **output paths**: ``--trace`` / ``--plot`` / ``--out`` naming a FIFO, a folder, a
     symlink to a file, a dangling symlink or a symlink to a FIFO: exit 0 or 2, and after
     the run the FIFO is still a FIFO, every link still a link, the folder a folder;
   - **ignored flags**: a flag the chosen path does not use (prefill flags on decode, decode
     flags on prefill, a schedule on a GPU serving stack, an execution a TPU does not have,
     drafter flags without speculation): :func:`ignored_flag` says so independently, and
     the case must exit 2 naming the flag; exit 0 is *silently accepted*;
   - **config self-consistency**: a ``config.json`` with drawn head counts, hidden size,
     experts and top-k: :func:`inconsistent_config` decides (hidden not a multiple of the
     heads without ``head_dim``, KV heads not dividing the heads, top-k over the experts);
     exit 0 for one is a *confident wrong answer*;
   - **same question**: ``simulate`` and ``compare --schedule S`` of the same model, system,
     batch and schedule must give the same step time (one answer per question); a
     difference is a *confident wrong answer*.

7. the classes of issue 48 (``fuzz_cli_cases._issue48_cases``): per subcommand, every number a user
   types with a non-finite, negative, fractional, empty or huge value; lists with an empty
   item; ``key=value`` lists with a key twice; a flag that has no effect where it is given
   (executor options without Dask, ``--force`` on a model that fits, ``--quick`` with a
   budget, a schedule diff on a GPU stack, a local dir that is not a folder, an abbreviation);
   ``config.json`` fields of the wrong type or range, an unknown architecture. Each such case
   must exit 2 with one line; exit 0 is *accepted and ignored*; an answer after
   :data:`HANG_S` seconds is a *hang*.

Every run prints the number of cases tried and of failures. Coverage: ``hardware``, ``plan``,
``floor``, ``simulate``, ``sweep`` (tiny budgets), ``compare`` (given schedules; no nested
sweeps), ``report``, ``calibrate`` (its input validation and corrupt measurement files; a
real fit is minutes, tested elsewhere), ``run-kernel`` and ``demo`` (argument validation
only: each case always carries one invalid value, as the real runs take minutes). Without
``--heavy`` the models are the small ones and K3 only in cases refused before simulating.
The CI test (``tests/test_cli_fuzz.py``) runs this harness for a bounded number of cases.

Two modules, one concept each: ``benchmarks/fuzz_cli_cases.py`` draws the cases (the corpus
and the strategies above); this one runs each case in-process and judges it (the oracles,
the tally, the command line).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from hypothesis import HealthCheck, Phase, given, settings

from tpusim.workload.registry.names import Family


def _sibling(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, loaded by path: benchmarks/ is not a package, and this harness
    is both run as a script and loaded by file from ``tests/test_cli_fuzz.py``."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_drawn = _sibling("fuzz_cli_cases")  # what is tried (corpus, strategies); this module judges it
MUST_REFUSE, SAME_QUESTION = _drawn.MUST_REFUSE, _drawn.SAME_QUESTION
HANG_S = 60  # a case answering later than this counts as a hang (issue 48)


@dataclass
class Outcome:
    argv: list[str]
    code: int
    stdout: str
    stderr: str
    problems: list[str] = field(default_factory=list)


def ignored_flag(argv: list[str]) -> str | None:
    """The flag in ``argv`` its path does not use, decided here from the argument list alone."""
    if argv[:1] == ["simulate"]:
        prefill = _value(argv, "--phase", "decode") == "prefill"
        for flag in ("--tokens", "--prefix-tokens") if not prefill else ("--batch", "--context"):
            if flag in argv:
                return flag
        if "--schedule" in argv and _value(argv, "--hardware", "") in ("gb200", "h200", "b200", "b300"):
            return "--schedule"
        if "--plot-layers" in argv and "--plot" not in argv:
            return "--plot-layers"
    if argv[:1] == ["compare"]:
        systems = _value(argv, "--systems", "")
        if "tpu" in systems and any(s.split(":")[2:] not in ([], ["megakernel"]) for s in systems.split(",")
                                    if s.startswith("tpu")):
            return "--systems"
        if "--schedule" in argv and all(not s.startswith("tpu") and ":megakernel" not in s for s in systems.split(",")):
            return "--schedule"
        if "--drafter" in argv and "--spec-acceptance" not in argv:
            return "--drafter"
        if "--sweep-budget" in argv and _value(argv, "--schedule", "best") != "best":
            return "--sweep-budget"
    if argv[:1] == ["serving"] and "--draft-tokens" in argv and "--acceptance-length" not in argv:
        return "--draft-tokens"
    return None


def inconsistent_config(argv: list[str]) -> str | None:
    """What a drawn ``config.json`` contradicts in itself (None: consistent), from its raw keys."""
    path = _value(argv, "--model", "")
    if not path.endswith("config.json") or "/configs/" not in path:
        return None
    data = json.loads(Path(path).read_text())
    hidden, heads, kv = data["hidden_size"], data["num_attention_heads"], data["num_key_value_heads"]
    if "head_dim" not in data and hidden % heads:
        return f"hidden {hidden} not a multiple of {heads} heads (no head_dim)"
    if kv > heads or heads % kv:
        return f"{kv} KV heads for {heads} heads"
    return None


def same_question(argv: list[str]) -> Outcome:
    """``simulate`` and ``compare --schedule S`` of one question; the outcome carries a problem
    when their step times differ (one answer per question)."""
    batch, schedule = argv[1], argv[2]
    workload = ["--model", "kimi-k3-nano", "--batch", batch, "--uncalibrated"]
    one = run_case(["simulate", *workload, "--hardware", "tpu-v7", "--chips", "4", "--schedule", schedule, "--json"])
    two = run_case(["compare", *workload, "--systems", "tpu-v7:4", "--schedule", schedule, "--json"])
    outcome = Outcome(argv, max(one.code, two.code), one.stdout, one.stderr + two.stderr, one.problems + two.problems)
    if one.code == 0 and two.code == 0:
        simulated = json.loads(one.stdout)["step_ms"]
        row = next(r for r in json.loads(two.stdout) if r["acceptance_length"] is None)
        if row.get("fits") and row.get("schedule") in (None, schedule) and abs(row["step_ms"] - simulated) > 1e-9 * simulated:
            outcome.problems.append(f"confident wrong answer: simulate {simulated:.6f} ms vs compare "
                                    f"{row['step_ms']:.6f} ms for the same question")
    return outcome


def _raw_plan(plan_arg: str) -> dict | None:
    """The plan YAML ``--plan`` names, as parsed, or None (none given, a SPEC, an unknown
    name, a corrupt file: nothing misapplied to a model)."""
    import yaml

    from tpusim.workload.model_catalog import MODELS_DIR

    if not plan_arg:
        return None
    path = Path(plan_arg) if plan_arg.endswith(".yaml") else MODELS_DIR / f"plan-{plan_arg}.yaml"
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    wanted = {"name": str, "devices": int, "attention_heads_per_device": int}
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k), t) for k, t in wanted.items()):
        return None
    dp = raw.get("attention_dp", 1)
    return raw if raw["devices"] >= 1 and isinstance(dp, int) and dp >= 1 else None


def misapplication(argv: list[str]) -> str | None:
    """What in ``argv`` is misapplied to its model, decided independently of the CLI's checks:
    the raw plan YAML's ``model`` and head split against the model's shapes, the families
    ``--formats`` names against the model's weights, and the corpus files built to be wrong."""
    import math

    from tpusim.workload.model_catalog import load_model
    from tpusim.workload.sharding import attention_heads

    model_arg = _value(argv, "--model", "")
    if model_arg.endswith("config-text-count.json"):
        return "a layer count written as text that is not a number"
    if _value(argv, "--schedule", "").endswith("schedule-bool.json"):
        return "a schedule count given as a boolean"
    try:
        model = load_model(model_arg)
    except Exception:
        return None
    raw = _raw_plan(_value(argv, "--plan", ""))
    if raw is not None:
        if raw.get("model") not in (None, model.name.partition("@")[0]):
            return f"plan {raw['name']} written for {raw['model']}"
        tp = raw["devices"] // raw.get("attention_dp", 1)
        if raw["attention_heads_per_device"] != math.ceil(attention_heads(model) / tp):
            return f"plan {raw['name']}: another head split"
    moe = model.moe
    lacks = {"experts": moe is None, Family.ROUTER: moe is None,
             Family.SHARED_EXPERT: moe is None or not moe.shared_intermediate_size,
             Family.LATENT_PROJ: moe is None or not moe.latent_size, Family.DENSE_MLP: not model.dense_layers}
    for pair in _value(argv, "--formats", "").split(","):
        family = pair.partition("=")[0].strip()
        if lacks.get(family):
            return f"--formats {pair} for a family {model.name} lacks"
    return None


def run_case(argv: list[str]) -> Outcome:
    """Run one argument list through ``main`` in-process and capture everything."""
    from tpusim.app.cli import main

    if argv[:1] == [SAME_QUESTION]:
        return same_question(argv)
    if argv[:1] == [MUST_REFUSE]:
        started = time.monotonic()
        outcome = run_case(argv[1:])
        seconds = time.monotonic() - started
        outcome.argv = argv
        if seconds > HANG_S:
            outcome.problems.append(f"hang: {seconds:.0f} s (> {HANG_S} s) before answering")
        return outcome
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
        except BaseException:
            return Outcome(argv, -1, stdout.getvalue(), stderr.getvalue(), [traceback.format_exc()])
    return Outcome(argv, code, stdout.getvalue(), stderr.getvalue())


def _value(argv: list[str], flag: str, default: str) -> str:
    """The value after ``flag`` in ``argv`` (``default`` when absent or last)."""
    index = argv.index(flag) + 1 if flag in argv else len(argv)
    return argv[index] if index < len(argv) else default


def _independent_fit(argv: list[str]) -> bool | None:
    """Does the case's model fit its system? Recomputed here, not read from the output."""
    from hwmodels.catalog import make_system
    from tpusim.workload.capacity import capacity_report
    from tpusim.workload.format_choice import apply_formats
    from tpusim.workload.model_catalog import load_model, plan_for_system

    try:
        model = apply_formats(load_model(_value(argv, "--model", "")), _value(argv, "--formats", "") or None)
        system = make_system(_value(argv, "--hardware", ""), int(_value(argv, "--chips", "1")))
        plan = plan_for_system(model, system.chip, system.chips, _value(argv, "--plan", "") or None)
        report = capacity_report(model, plan, system.chip, batch=int(_value(argv, "--batch", "1")),
                                 context_tokens=int(_value(argv, "--context", "1024")))
    except Exception:
        return None
    return report.fits


def check_outcome(outcome: Outcome, out_root: Path) -> list[str]:
    """The invariants of the module docstring; returns the problems found."""
    problems = list(outcome.problems)
    if outcome.argv[:1] == [MUST_REFUSE]:  # issue 48: the case carries one bad value, refused in one line
        errors = [line for line in outcome.stderr.splitlines() if line.strip()]
        if outcome.code == 0:
            problems.append(f"accepted and ignored: exit 0 for {' '.join(outcome.argv[1:])}")
        elif outcome.code != 2 or len(errors) != 1 or ": error: " not in errors[0]:
            problems.append(f"not one line and exit 2: exit {outcome.code}, {len(errors)} stderr lines")
        outcome = Outcome(outcome.argv[1:], outcome.code, outcome.stdout, outcome.stderr)
    if outcome.code not in (0, 2):
        problems.append(f"exit {outcome.code}")
    if "Traceback (most recent call last)" in outcome.stdout + outcome.stderr:
        problems.append("traceback printed")
    if outcome.code == 2 and outcome.argv and outcome.argv[0] in ("simulate", "floor", "sweep", "compare",
                                                                  "calibrate", "report", "run-kernel", "demo"):
        errors = [line for line in outcome.stderr.splitlines() if "error:" in line]
        if len(errors) != 1:
            problems.append(f"expected one error line, got {len(errors)}")
    for path in out_root.rglob("*"):
        if path.is_file() and path.name.endswith(".tmp"):
            problems.append(f"temporary file left: {path}")
        elif path.is_file() and path.suffix == ".json":
            try:
                json.loads(path.read_text())
            except (ValueError, UnicodeDecodeError):
                problems.append(f"half-written JSON: {path}")
        elif path.is_file() and path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                try:
                    json.loads(line)
                except ValueError:
                    problems.append(f"half-written JSON line in {path}")
    if outcome.code == 0 and outcome.argv[:1] and outcome.argv[0] in ("simulate", "floor", "sweep"):
        fits = _independent_fit(outcome.argv)
        if fits is False and "does not fit" not in outcome.stdout:
            problems.append("exit 0 for a deployment that does not fit, without the label 'does not fit'")
        if fits is False and "--force" not in outcome.argv:
            problems.append("exit 0 for a deployment that does not fit, without --force")
    ignored = ignored_flag(outcome.argv)
    if ignored and outcome.code == 0:
        problems.append(f"silently accepted: {ignored} is not used on this path but the run exited 0")
    broken = inconsistent_config(outcome.argv)
    if broken and outcome.code == 0:
        problems.append(f"confident wrong answer: a config that contradicts itself ({broken}) ran")
    problems += _special_paths_intact(outcome.argv)
    wrong = misapplication(outcome.argv) if outcome.argv[:1] in (["floor"], ["simulate"], ["plan"]) else None
    if wrong and outcome.code == 0 and "warning" not in outcome.stdout + outcome.stderr:
        problems.append(f"silent misapplication: {wrong} ran without an error or a warning")
    if outcome.code == 0 and outcome.argv[:1] == ["compare"] and "--json" in outcome.argv:
        for row in json.loads(outcome.stdout):
            if not row.get("fits", True) and row.get("step_ms") is not None:
                problems.append(f"compare row {row['system']} does not fit but has a step time")
    return problems


def _special_paths_intact(argv: list[str]) -> list[str]:
    """The output-path class: what the special paths were, they still are."""
    import stat

    problems = []
    for arg in argv:
        path = Path(arg)
        if path.parent.name != "special" or path.parent.parent.name != "corpus":
            continue
        if path.name in ("fifo",) and not stat.S_ISFIFO(os.lstat(path).st_mode):
            problems.append(f"destroyed: {path} is no longer a FIFO")
        if path.name in ("link.json", "dangling.json", "link-fifo") and not path.is_symlink():
            problems.append(f"destroyed: {path} is no longer a symlink")
    return problems


@dataclass
class Tally:
    cases: int = 0
    failures: list[tuple[list[str], list[str]]] = field(default_factory=list)
    by_command: dict[str, int] = field(default_factory=dict)
    misapplied: int = 0  # cases misapplying an input (module docstring, 5)
    silent: int = 0  # of those, exit 0 without an error or a warning
    tracebacks: int = 0
    silently_accepted: int = 0  # an ignored flag with exit 0
    refusal_cases: int = 0  # issue 48's classes: cases carrying one bad value
    accepted_and_ignored: int = 0  # of those, exit 0
    hangs: int = 0  # cases answering after HANG_S
    wrong_answers: int = 0  # a self-contradicting config that ran, or two answers to one question


def fuzz(tally: Tally, work: Path, *, examples: int, heavy: bool, seed: int | None = None) -> None:
    """Run ``examples`` drawn cases, recording every case and failure in ``tally``."""
    corpus = _drawn.write_corpus(work / "corpus")
    out_root = work / "outputs"
    out_root.mkdir(parents=True, exist_ok=True)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed is not None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(argv=_drawn.cases(corpus, out_root, heavy=heavy))
    def one(argv: list[str]) -> None:
        outcome = run_case(argv)
        tally.cases += 1
        key = (argv[1] if argv[:1] == [MUST_REFUSE] and len(argv) > 1 else argv[0]) if argv else "(none)"
        tally.by_command[key] = tally.by_command.get(key, 0) + 1
        problems = check_outcome(outcome, out_root)
        if argv[:1] in (["floor"], ["simulate"], ["plan"]) and misapplication(argv):
            tally.misapplied += 1
        tally.silent += any(p.startswith("silent misapplication") for p in problems)
        tally.tracebacks += any(p == "traceback printed" or p.startswith("Traceback") for p in problems)
        tally.silently_accepted += any(p.startswith("silently accepted") for p in problems)
        tally.wrong_answers += any(p.startswith("confident wrong answer") for p in problems)
        tally.refusal_cases += argv[:1] == [MUST_REFUSE]
        tally.accepted_and_ignored += any(p.startswith("accepted and ignored") for p in problems)
        tally.hangs += any(p.startswith("hang:") for p in problems)
        if problems:
            tally.failures.append((argv, problems))

    one()


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="wall time to fuzz (default 10)")
    parser.add_argument("--heavy", action="store_true", help="also simulate K3 and Muse Spark (slower cases)")
    args = parser.parse_args()
    tally = Tally()
    deadline = time.monotonic() + args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="tpusim-fuzz-") as tmp:
        os.environ["TPUSIM_LOCAL_DIR"] = str(Path(tmp) / "local")  # overlays never touch the real local dir
        rounds = 0
        while time.monotonic() < deadline:
            fuzz(tally, Path(tmp) / f"round-{rounds}", examples=25, heavy=args.heavy)
            rounds += 1
            print(f"[fuzz] {tally.cases} cases, {len(tally.failures)} failures", file=sys.stderr, flush=True)
    print(f"cases tried: {tally.cases}; by command: {json.dumps(tally.by_command, sort_keys=True)}")
    print(f"failures: {len(tally.failures)}; tracebacks: {tally.tracebacks}; misapplied cases: {tally.misapplied}, "
          f"silent misapplications: {tally.silent}; silently accepted flags: {tally.silently_accepted}; "
          f"confident wrong answers: {tally.wrong_answers}")
    print(f"issue 48 classes: {tally.refusal_cases} cases each carrying one bad value; accepted and ignored: "
          f"{tally.accepted_and_ignored}; hangs (> {HANG_S} s): {tally.hangs}")
    for argv, problems in tally.failures[:20]:
        print(f"- tpusim {' '.join(argv)}\n  " + "\n  ".join(p.strip().splitlines()[-1] for p in problems))
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
