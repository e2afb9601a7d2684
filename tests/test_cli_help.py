"""Help that answers: every subcommand has a description, every flag a help text; --version;
`hardware list` is an alias of `hardware`; `tpusim sources` expands every source tag."""

from __future__ import annotations

import argparse

import pytest

from tpusim.app.cli import build_parser, main


def _parsers(parser: argparse.ArgumentParser, path: str = "tpusim"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def test_every_flag_and_subcommand_has_help() -> None:
    missing = []
    for path, parser in _parsers(build_parser()):
        if path != "tpusim" and not (parser.description or "").strip():
            missing.append(f"{path}: no description")
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith("tpusim ")


def test_hardware_list_alias(capsys) -> None:
    assert main(["hardware", "list"]) == 0
    listed = capsys.readouterr().out
    assert main(["hardware"]) == 0
    assert capsys.readouterr().out == listed and "tpu-v7" in listed


def test_sources_expand_every_tag_used_in_the_catalog(capsys) -> None:
    from hwmodels.catalog import list_chips, load_chip
    from hwmodels.overlay import iter_figures
    from hwmodels.sources import SOURCES, tags_in

    used = set()
    for name in list_chips():
        for _, figure in iter_figures(load_chip(name, calibrated=False)):
            used.update(tags_in(figure.source))
    assert used and used <= set(SOURCES), sorted(used - set(SOURCES))
    assert main(["sources"]) == 0
    out = capsys.readouterr().out
    for tag in used:
        assert f"[{tag}]" in out
