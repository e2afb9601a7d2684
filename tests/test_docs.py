"""The documentation stays honest: every documented command parses, the README stays a quick start.

The checker is ``benchmarks/check_docs.py`` (its docstring states the extraction and
placeholder rules); here it runs in parse-only mode over README.md and docs/*.md (about a
second), the generated sections are compared with the parser, and a planted bogus flag
proves the check can fail.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKER = ROOT / "benchmarks" / "check_docs.py"
README_LINES_MAX = 250
# The two commands the README starts with, byte for byte: the first runs the demo, the second
# the tests (what .ci/run runs).
DEMO_COMMAND = 'python3 -m venv .venv && .venv/bin/pip install -q -e ".[test]" && .venv/bin/tpusim demo --out report'
TEST_COMMAND = 'python3 -m venv .venv && .venv/bin/pip install -q -e ".[test]" && .venv/bin/python -m pytest'


@pytest.fixture(scope="module")
def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_docs", CHECKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_documented_command_parses(checker: ModuleType) -> None:
    checked, problems = checker.check_parse()
    assert checked >= 50, f"only {checked} documented commands found: did the extraction break?"
    assert not problems, "documented commands that no longer parse:\n" + "\n".join(map(str, problems))


def test_generated_sections_are_current(checker: ModuleType) -> None:
    drifted = checker.check_generated(write=False)
    assert not drifted, f"{drifted}: run .venv/bin/python benchmarks/check_docs.py --write"


def test_the_checker_fails_on_a_bogus_flag(checker: ModuleType) -> None:
    markdown = "\n".join([
        "# page",
        "",
        "```bash",
        "tpusim floor --model kimi-k3 --hardware tpu-v7 --chips 16 --batch 1",
        "tpusim simulate --model kimi-k3 --hardware tpu-v7 --chips 16 \\",
        "    --no-such-flag",
        "```",
        "",
        "Prose naming `tpusim sweep --jobs two` and `tpusim floor --json`.",
    ])
    checked, problems = checker.check_parse(texts={"page.md": markdown})
    assert checked == 4
    where = {problem.command.where(): str(problem) for problem in problems}
    assert set(where) == {"page.md:5", "page.md:9"}, where
    assert "--no-such-flag" in where["page.md:5"]
    assert "--jobs" in where["page.md:9"]  # an inline reference's values are parsed too


def test_fenced_commands_must_be_complete_but_references_need_not(checker: ModuleType) -> None:
    markdown = "```bash\ntpusim simulate --model kimi-k3\n```\n\nSee `tpusim simulate --model M`.\n"
    _, problems = checker.check_parse(texts={"page.md": markdown})
    assert [problem.command.line for problem in problems] == [2]
    assert "required" in problems[0].why


def test_placeholders_are_substituted(checker: ModuleType) -> None:
    assert checker.argv_of("tpusim floor --model M --hardware H --chips N --batch B") == [
        "floor", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16", "--batch", "1"]
    assert checker.argv_of("tpusim hardware [list \\| show NAME \\| probe]") == ["hardware"]
    assert checker.argv_of("tpusim schema measurement --example > my.jsonl") == ["schema", "measurement", "--example"]
    assert checker.argv_of("tpusim simulate --schedule naive|published|FILE") == ["simulate", "--schedule", "naive"]


def test_readme_is_a_quick_start() -> None:
    lines = (ROOT / "README.md").read_text().split("\n")
    assert len(lines) <= README_LINES_MAX, f"README.md has {len(lines)} lines; move detail to docs/"
    assert lines[:6] == ["# tpusim", "", "```bash", DEMO_COMMAND, TEST_COMMAND, "```"]


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv .venv" in ci
    assert '-e ".[test]"' in ci
    assert ci.rstrip().endswith(".venv/bin/python -m pytest"), "CI's last step is the README's test command"


def test_readme_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [page.name for page in sorted((ROOT / "docs").glob("*.md")) if f"docs/{page.name}" not in readme]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_runner_fails_when_a_documented_figure_moves(checker: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checker, "CHEAP_COMMANDS", ((("--version",), ("tpusim",)), (("--version",), ("9.99 ms",))))
    failures = checker.run_cheap_commands()
    assert len(failures) == 1 and "9.99 ms" in failures[0], failures


def test_simulate_json_keys_table_names_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    """The keys table (generated into docs/cli-reference.md from simulate.py's docstring)
    names every key ``tpusim simulate --json`` prints, and no other."""
    import json
    import re

    from tpusim.app.cli import main, simulate

    documented: set[str] = set()
    for line in (simulate.__doc__ or "").split("\n"):
        if line.startswith("| ``"):
            documented |= set(re.findall(r"``([a-z_]+)``", line.split("|")[1]))
    assert main(["simulate", "--model", "llama-3.2-1b", "--hardware", "tpu-v7", "--chips", "1", "--batch", "1",
                 "--json", "--uncalibrated"]) == 0
    printed = set(json.loads(capsys.readouterr().out))
    assert printed - documented == set(), "printed but not documented"
    assert documented - printed == set(), "documented but not printed"


def _documented_keys(markdown: str, heading: str) -> set[str]:
    """Keys named in the first column of the table under ``heading`` (up to the next heading)."""
    import re

    section = markdown.split(heading, 1)[1].split("\n## ", 1)[0]
    keys: set[str] = set()
    for line in section.split("\n"):
        if line.startswith("| `"):
            keys |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return keys


def test_floor_json_keys_table_names_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tpusim.app.cli import main

    documented = _documented_keys((ROOT / "docs" / "cli-reference.md").read_text(), "## `tpusim floor --json` keys")
    assert main(["floor", "--model", "llama-3.2-1b", "--hardware", "tpu-v7", "--chips", "1", "--batch", "1",
                 "--json"]) == 0
    printed = set(json.loads(capsys.readouterr().out))
    assert printed - documented == set(), "printed but not documented in docs/cli-reference.md"
    assert documented - printed == set(), "documented in docs/cli-reference.md but not printed"
