"""The commands and hooks of the layers above ``tpusim`` come through entry points
(:mod:`tpusim.app.plugins`): one that fails to load is one clear line, exit 1, not a traceback."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from tpusim.app import plugins
from tpusim.app.cli import main


def _only(group_wanted: str, *entries: EntryPoint):  # type: ignore[no-untyped-def]
    real = plugins.entry_points

    def fake(*, group: str) -> list[EntryPoint]:
        return list(entries) if group == group_wanted else list(real(group=group))

    return fake


def test_a_command_that_fails_to_load_is_one_line_exit_1(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    broken = EntryPoint(name="run-kernel", value="megakernel.commands.no_such_module:register",
                        group=plugins.COMMANDS)
    monkeypatch.setattr(plugins, "entry_points", _only(plugins.COMMANDS, broken))
    assert main(["--help"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("tpusim: error: entry point run-kernel = 'megakernel.commands.no_such_module:register' "
                          "(group tpusim.commands")
    assert "ModuleNotFoundError" in err and "pip install -e ." in err


def test_a_command_name_taken_twice_is_refused(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    twice = EntryPoint(name="simulate", value="calibration.commands.demo:register", group=plugins.COMMANDS)
    monkeypatch.setattr(plugins, "entry_points", _only(plugins.COMMANDS, twice))
    assert main(["--help"]) == 1
    assert "the command simulate is declared twice" in capsys.readouterr().err


def test_a_command_without_its_entry_point_says_reinstall(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Metadata older than the code (no entry point for a command): not argparse's 'invalid choice'."""
    monkeypatch.setattr(plugins, "entry_points", _only(plugins.COMMANDS))
    assert main(["lower", "--schedule", "published"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("tpusim: error: the command lower is not installed (no entry point of group tpusim.commands "
                   "declares it); reinstall the project (pip install -e .) so its entry points are current")


def test_a_schema_topic_that_fails_to_load_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``tpusim schema`` lists its topics when the parser is built: the parser says so."""
    broken = EntryPoint(name="measurement", value="calibration.commands.no_such_module:topic",
                        group=plugins.SCHEMAS)
    monkeypatch.setattr(plugins, "entry_points", _only(plugins.SCHEMAS, broken))
    assert main(["--help"]) == 1
    assert "entry point measurement" in capsys.readouterr().err


def test_a_hook_that_fails_while_a_command_runs_is_its_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str],
                                                                tmp_path) -> None:  # type: ignore[no-untyped-def]
    broken = EntryPoint(name="mosaic", value="megakernel.commands.no_such_module:check",
                        group=plugins.COMPILE_CHECKS)
    monkeypatch.setattr(plugins, "entry_points", _only(plugins.COMPILE_CHECKS, broken))
    code = main(["sweep", "--model", "kimi-k3-nano", "--hardware", "tpu-v7", "--chips", "4",
                 "--compile-check", "1", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith("tpusim sweep: error: entry point mosaic") and "group tpusim.compile_checks" in err


def test_no_compile_check_installed_is_an_input_error(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str],
                                                      tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(plugins, "entry_points", _only(plugins.COMPILE_CHECKS))
    code = main(["sweep", "--model", "kimi-k3-nano", "--hardware", "tpu-v7", "--chips", "4",
                 "--compile-check", "1", "--out", str(tmp_path / "out")])
    assert code == 2
    assert "--compile-check: 0 compile checks installed" in capsys.readouterr().err


def test_hooks_are_found() -> None:
    assert sorted(plugins.load(plugins.SCHEMAS)) == ["measurement"]
    assert sorted(plugins.load(plugins.COMPARE_NOTES)) == ["compiler-priced"]
    assert sorted(plugins.load(plugins.COMPILE_CHECKS)) == ["mosaic"]
