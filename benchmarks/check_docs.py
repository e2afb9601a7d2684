"""Keep the documentation honest: every documented ``tpusim`` command still parses.

What it checks, in order:

1. **Parse**: every ``tpusim ...`` command in README.md and docs/*.md, both on a line of a
   fenced code block and in an inline code span of the prose (the command behind a
   measured figure), is parsed by the real CLI parser
   (:func:`tpusim.app.cli.build_parser`, nothing re-declared). A fenced line continued with
   ``\\`` is joined to the next; ``# comments`` are dropped; ``.venv/bin/tpusim`` counts as
   ``tpusim``. Placeholders are rule-substituted before parsing (:data:`PLACEHOLDERS`:
   ``M`` -> ``kimi-k3``, ``H`` -> ``tpu-v7``, ``FILE`` -> ``file.json``, ...); in a
   documented choice ``a|b|c`` (or ``a\\|b`` inside a table) the first alternative is
   parsed; ``[optional ...]`` groups, an ``...`` ellipsis and anything after a shell
   redirection or pipe (`` > my.jsonl``) are dropped. A fenced line is a command to copy
   and run, so it must parse completely. An inline span is a *reference* (``tpusim sweep``,
   ``tpusim floor --json``): its subcommand, flags and values must parse, but required
   flags it leaves out are not asked for. A span holding ``: error:`` quotes output and is
   skipped.
2. **Run** (unless ``--parse-only``): a few cheap commands (:data:`CHEAP_COMMANDS`, each
   a few seconds at most) run in full in this process, must exit 0, and their output must
   still hold the figures the docs quote from them.
3. **Generated sections**: text between ``<!-- generated:NAME -->`` and
   ``<!-- end generated:NAME -->`` in a docs page is rebuilt from the parser
   (:data:`GENERATORS`: ``tpusim-help`` is ``tpusim --help`` and every subcommand's usage
   line; ``simulate-json-keys`` the keys table of ``tpusim/app/cli/simulate.py``'s docstring). Default mode checks and fails on drift; ``--write`` rewrites the sections.

Exit status 0 when everything holds, 1 otherwise; the last line is a one-line summary::

    .venv/bin/python benchmarks/check_docs.py            # parse + run + generated sections
    .venv/bin/python benchmarks/check_docs.py --write    # regenerate the generated sections
    .venv/bin/python benchmarks/check_docs.py --parse-only
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Placeholder words in documented commands -> a sample value the parser accepts. A token
# equal to a key (or ``KEY=...``-free token ending in a known extension) is replaced.
PLACEHOLDERS: dict[str, str] = {
    "M": "kimi-k3",
    "H": "tpu-v7",
    "N": "16",
    "B": "1",
    "K": "8",
    "J": "1",
    "S": "0",
    "DIR": "out",
    "OUT": "out",
    "FILE": "file.json",
    "F.png": "plot.png",
    "A": "naive",
    "NAME": "tpu-v7",
    "SPEC": "tp=16,expert_groups=4,expert_tp=4",
    "TAG": "GC",
    "TAG...": "GC",
    "COMMAND": "simulate",
    "FAMILY=FORMAT,...": "experts=fp8",
}
# A token that still looks like a placeholder after substitution (all capitals) is reported.
_LEFTOVER = re.compile(r"^[A-Z][A-Z_]*$")

# Commands run in full: (argv, substrings its output must contain). Each takes a few seconds
# at most. The substrings are figures the docs quote, so a change that moves them fails here:
# the worked example of docs/own-model.md and the 8-slot check of docs/calibration.md.
CHEAP_COMMANDS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("--version",), ("tpusim",)),
    (("hardware", "list"), ("tpu-v7",)),
    (("hardware", "show", "tpu-v7"), ()),
    (("sources", "GC"), ()),
    (("schema", "model"), ()),
    (("schema", "measurement", "--example"), ()),
    (("floor", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16", "--batch", "1"), ()),
    (("plan", "--model", "kimi-k3", "--plan", "k3-tp32"), ()),
    (("plan", "--model", "tests/data/qwen3-30b-a3b/config.json", "--formats", "experts=fp8", "--hardware", "tpu-v7",
      "--chips", "2", "--batch", "8", "--context", "4096"),
     ("30.53 B parameters", "plan generic-4", "weights 8.04 GB", "needs 8.8 GB of 94.7 GB per device: fits")),
    (("simulate", "--model", "muse-spark@int4+bf16", "--hardware", "tpu-v7", "--chips", "4", "--batch", "1",
      "--schedule", "muse-published", "--json", "--uncalibrated"), ('"step_ms": 3.510',)),
)

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE = re.compile(r"`([^`]+)`")
_COMMAND_START = re.compile(r"^(?:\.venv/bin/)?tpusim(?:\s|$)")
_GENERATED = re.compile(r"<!-- generated:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- end generated:(?P=name) -->",
                        re.DOTALL)


@dataclass(frozen=True)
class Command:
    """One documented command: where it is and its text as written."""

    path: str
    line: int
    text: str
    inline: bool = False  # an inline code span of the prose (a reference), not a fenced line

    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Problem:
    command: Command
    why: str

    def __str__(self) -> str:
        return f"{self.command.where()}: `{self.command.text}`: {self.why}"


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md page."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _fenced_commands(path: str, lines: list[str]) -> Iterator[Command]:
    in_fence = False
    pending: tuple[int, str] | None = None
    for number, line in enumerate(lines, start=1):
        if _FENCE.match(line):
            in_fence, pending = not in_fence, None
            continue
        if not in_fence:
            continue
        text = line.strip()
        if pending is not None:
            start, before = pending
            text, start_line = before + " " + text, start
        elif _COMMAND_START.match(text):
            start_line = number
        else:
            continue
        if text.endswith("\\"):
            pending = (start_line, text[:-1].rstrip())
            continue
        pending = None
        yield Command(path, start_line, text)


def _inline_commands(path: str, lines: list[str]) -> Iterator[Command]:
    """Inline code spans of the prose (fences excluded); a span may wrap onto the next line."""
    in_fence = False
    prose: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            prose.append((number, line))
    # Join the prose into one string, remembering where each line starts.
    starts, text = [], ""
    for number, line in prose:
        starts.append((len(text), number))
        text += line + "\n"
    for match in _INLINE.finditer(text):
        span = " ".join(match.group(1).split())
        if _COMMAND_START.match(span):
            line_number = max(n for offset, n in starts if offset <= match.start())
            if ": error:" not in span:  # quoted output, not a command
                yield Command(path, line_number, span, inline=True)


def commands_in(markdown: str, path: str = "<text>") -> list[Command]:
    """Every documented ``tpusim`` command of one markdown text, in line order."""
    lines = markdown.split("\n")
    found = [*_fenced_commands(path, lines), *_inline_commands(path, lines)]
    return sorted(found, key=lambda command: command.line)


def argv_of(text: str) -> list[str]:
    """The argv after ``tpusim`` with the placeholder rule of the module docstring applied."""
    text = text.replace("\\|", "|")
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # optional groups
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # nested once
    text = re.split(r"\s(?:>|\||&&|;|2>)\s", text)[0]  # shell redirections and pipes
    words = shlex.split(text, comments=True)
    argv: list[str] = []
    for word in words[1:]:
        if word in ("...", "|"):
            continue
        word = PLACEHOLDERS.get(word, word)
        if "|" in word:
            word = word.split("|")[0]
        word = PLACEHOLDERS.get(word, word)
        if "=" in word and word.startswith("--"):
            flag, _, value = word.partition("=")
            word = f"{flag}={PLACEHOLDERS.get(value, value)}"
        argv.append(word)
    return argv


def parse_problem(command: Command, parser: argparse.ArgumentParser) -> str | None:
    """Why ``command`` does not parse, or None when it does."""
    try:
        argv = argv_of(command.text)
    except ValueError as error:  # shlex: unbalanced quotes
        return f"cannot split: {error}"
    leftover = [word for word in argv if _LEFTOVER.match(word) and word not in PLACEHOLDERS.values()]
    if leftover:
        return f"unknown placeholder(s) {leftover}: add them to PLACEHOLDERS"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as stop:
        if stop.code not in (0, None):  # --help and --version exit 0
            message = stderr.getvalue().strip().splitlines()
            why = message[-1] if message else f"exit {stop.code}"
            if command.inline and "the following arguments are required" in why:
                return None  # a reference names the command and some flags, not every required one
            return why
    return None


def check_parse(files: list[Path] | None = None, *, texts: dict[str, str] | None = None,
                root: Path = ROOT) -> tuple[int, list[Problem]]:
    """(commands checked, problems) over ``files`` (default: :func:`doc_files`) or ``texts``
    (name -> markdown, for tests)."""
    from tpusim.app.cli import build_parser

    parser = build_parser()
    if texts is None:
        texts = {}
        for path in files or doc_files(root):
            texts[str(path.relative_to(root)) if path.is_relative_to(root) else str(path)] = path.read_text()
    checked, problems = 0, []
    for name, markdown in texts.items():
        for command in commands_in(markdown, name):
            checked += 1
            why = parse_problem(command, parser)
            if why:
                problems.append(Problem(command, why))
    return checked, problems


def run_cheap_commands() -> list[str]:
    """Run :data:`CHEAP_COMMANDS` in this process; one line per failure."""
    from tpusim.app.cli import main

    failures = []
    cwd = Path.cwd()
    os.chdir(ROOT)  # documented paths (tests/data/...) are relative to the repository root
    try:
        for argv, expected in CHEAP_COMMANDS:
            out, err = io.StringIO(), io.StringIO()
            start = time.perf_counter()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code = main(list(argv))
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
            seconds = time.perf_counter() - start
            text = " ".join(out.getvalue().split())  # tables wrap with the terminal width
            name = f"tpusim {' '.join(argv)}"
            if code != 0:
                failures.append(f"{name}: exit {code}: {err.getvalue().strip()[-300:]}")
            elif not text:
                failures.append(f"{name}: printed nothing")
            elif seconds > 10:
                failures.append(f"{name}: took {seconds:.1f} s (a cheap command must stay cheap)")
            missing = [want for want in expected if want not in text]
            if code == 0 and missing:
                failures.append(f"{name}: output no longer contains the documented {missing}")
    finally:
        os.chdir(cwd)
    return failures


def _help_section() -> str:
    """``tpusim --help`` and one usage line per subcommand, at a fixed width of 100."""
    from tpusim.app.cli import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        parser = build_parser()
        parts = ["```text", "$ tpusim --help", parser.format_help().rstrip(), "```", ""]
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parts += ["Usage of every command (`tpusim COMMAND --help` adds what each flag does and its default):", ""]
        parts.append("```text")
        for child in subparsers.choices.values():
            parts.append(child.format_usage().strip())
        parts.append("```")
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(parts) + "\n"


def _simulate_keys_section() -> str:
    """The ``--json`` keys table of ``tpusim simulate``, from its module docstring (reST roles
    and double backticks turned into markdown code)."""
    from tpusim.app.cli import simulate

    rows = [line for line in (simulate.__doc__ or "").split("\n") if line.startswith("|")]
    text = "\n".join(rows).replace("``", "`")
    return re.sub(r":(?:mod|func|class|data):`~?([^`]+)`", r"`\1`", text) + "\n"


GENERATORS = {"tpusim-help": _help_section, "simulate-json-keys": _simulate_keys_section}


def check_generated(*, write: bool, root: Path = ROOT) -> list[str]:
    """Drifted (or, with ``write``, rewritten) generated sections as ``path: name`` lines."""
    drifted = []
    for path in sorted((root / "docs").glob("*.md")):
        text = path.read_text()

        def rebuild(match: re.Match[str], path: Path = path) -> str:
            name = match.group("name")
            if name not in GENERATORS:
                drifted.append(f"{path.relative_to(root)}: unknown generated section {name!r}")
                return match.group(0)
            body = GENERATORS[name]()
            if body != match.group("body"):
                drifted.append(f"{path.relative_to(root)}: generated:{name}")
            return f"<!-- generated:{name} -->\n{body}<!-- end generated:{name} -->"

        new = _GENERATED.sub(rebuild, text)
        if write and new != text:
            path.write_text(new)
    return drifted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the generated sections instead of checking them")
    parser.add_argument("--parse-only", action="store_true", help="only check that documented commands parse")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    checked, problems = check_parse()
    lines = [str(problem) for problem in problems]
    ran = 0
    if not args.parse_only:
        failures = run_cheap_commands()
        ran = len(CHEAP_COMMANDS)
        lines += failures
        drift = check_generated(write=args.write)
        if args.write:
            lines += [f"rewrote {item}" for item in drift if "unknown" not in item]
            lines += [item for item in drift if "unknown" in item]
            drift = [item for item in drift if "unknown" in item]
        else:
            lines += [f"{item} drifted: run benchmarks/check_docs.py --write" for item in drift]
    else:
        failures, drift = [], []
    for line in lines:
        print(line)
    bad = len(problems) + len(failures) + len(drift)
    print(f"check_docs: {checked} documented commands parsed ({len(problems)} failed), {ran} run "
          f"({len(failures)} failed), {len(drift)} generated sections drifted; "
          f"{time.perf_counter() - start:.1f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
