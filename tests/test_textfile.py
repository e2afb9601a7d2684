"""hwmodels.textfile: every user file read with a one-line InputError naming it."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from hwmodels.errors import InputError
from hwmodels.textfile import read_user_json, read_user_jsonl, read_user_text, read_user_yaml


def test_a_missing_file_a_folder_and_binary_bytes_are_one_line_each(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^.*nope\.json: file not found$"):
        read_user_json(tmp_path / "nope.json")
    with pytest.raises(InputError, match=r"cannot read"):
        read_user_text(tmp_path)
    binary = tmp_path / "x.yaml"
    binary.write_bytes(b"a: 1\n\xff\xfe")
    with pytest.raises(InputError, match=r"x\.yaml: not a YAML file \(byte 5 is not UTF-8 text\)"):
        read_user_yaml(binary)


def test_shown_names_the_file_in_the_message(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^catalog/x\.yaml: file not found$"):
        read_user_yaml(tmp_path / "x.yaml", shown="catalog/x.yaml")


def test_syntax_errors_name_the_line(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{\n  "a": 1,\n}\n')
    with pytest.raises(InputError, match=r"a\.json: line 3: invalid JSON"):
        read_user_json(tmp_path / "a.json")
    (tmp_path / "a.yaml").write_text("a: [1, 2\nb: 3\n")
    with pytest.raises(InputError, match=r"a\.yaml: line \d+, column \d+: YAML syntax error"):
        read_user_yaml(tmp_path / "a.yaml")
    (tmp_path / "a.jsonl").write_text('{"a": 1}\n\n# note\n{"a": \n')
    with pytest.raises(InputError, match=r"a\.jsonl: line 4: invalid JSON"):
        read_user_jsonl(tmp_path / "a.jsonl")


def test_json_lines_skip_blank_and_comment_lines(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"a": 1}\n\n# note\n{"a": 2}\n')
    assert read_user_jsonl(tmp_path / "a.jsonl") == [(1, {"a": 1}), (4, {"a": 2})]


def test_gzip_is_opened_only_where_asked_and_a_truncated_stream_is_named(tmp_path: Path) -> None:
    packed = gzip.compress(b'{"traceEvents": []}')
    (tmp_path / "t.json.gz").write_bytes(packed)
    assert read_user_json(tmp_path / "t.json.gz", gzipped=True) == {"traceEvents": []}
    with pytest.raises(InputError, match="not a JSON file"):
        read_user_json(tmp_path / "t.json.gz")
    (tmp_path / "cut.json.gz").write_bytes(packed[:-6])
    with pytest.raises(InputError, match=r"cut\.json\.gz: truncated gzip stream"):
        read_user_json(tmp_path / "cut.json.gz", gzipped=True)


def test_text_is_read_with_universal_newlines(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"a\r\nb\rc\n")
    assert read_user_text(tmp_path / "a.txt") == "a\nb\nc\n"
