"""The record layer (hwmodels.records): importable bare, the timing summary against an
independent computation, the one JSON-lines writer, and the typed kernel record against
every committed row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hwmodels.errors import InputError
from hwmodels.records.jsonl import (
    LineAppender,
    append_lines,
    append_record,
    record_line,
    write_lines,
)
from hwmodels.records.kernel import KernelRecord
from hwmodels.records.timing import half_iqr, sample_seconds, summarise

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "calibration" / "data"
KERNEL_FILES = ("tpu-v5e-kernel.jsonl", "tpu-v5e-kernel-variants.jsonl", "tpu-v5e-fixed-cost.jsonl",
                "tpu-v5e-xla.jsonl", "tpu-v5e-xla-capped.jsonl")
HEAVY = ("pydantic", "simpy", "scipy", "yaml", "tpusim", "megakernel", "optuna")
# what the device harnesses may load of the house: the record layer and what it stands on
LAYER = {"hwmodels", "hwmodels.records", "hwmodels.records.timing", "hwmodels.records.jsonl",
         "hwmodels.records.kernel", "hwmodels.atomic", "hwmodels.errors"}


def import_blocking(modules: str, blocked: tuple[str, ...]) -> set[str]:
    """The ``hwmodels`` modules a fresh interpreter loads importing ``modules`` while every
    package of ``blocked`` raises ImportError (as on a host where it is not installed)."""
    code = (
        "import importlib.abc, sys\n"
        f"BLOCKED = {blocked!r}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ImportError(f'{name} is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"import {modules}\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'hwmodels')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.strip().split(","))


def test_the_layer_imports_with_the_standard_library_only() -> None:
    loaded = import_blocking("hwmodels.records.timing, hwmodels.records.jsonl, hwmodels.records.kernel",
                              (*HEAVY, "numpy", "jax"))
    assert loaded == LAYER


def test_the_tpu_harness_writers_import_the_layer_without_the_simulator() -> None:
    """``calibration.tpu_bench``'s record writer (``__main__``) needs no pydantic or tpusim."""
    loaded = import_blocking("calibration.tpu_bench.__main__", HEAVY)
    assert loaded <= LAYER


# --------------------------------------------------------------------------- timing


@pytest.mark.parametrize("seed,size", [(0, 1), (1, 2), (2, 3), (3, 4), (4, 7), (5, 10), (6, 31)])
def test_summary_matches_numpy(seed: int, size: int) -> None:
    samples = list(np.random.default_rng(seed).lognormal(-6.0, 0.5, size))
    timing = summarise(samples, inner=3)
    q1, median, q3 = np.percentile(samples, [25, 50, 75])  # linear interpolation = "inclusive"
    assert timing.median_s == pytest.approx(median, rel=1e-12)
    assert timing.spread_s == pytest.approx((q3 - q1) / 2 if size > 1 else 0.0, rel=1e-12, abs=1e-18)
    assert timing.min_s == min(samples) and timing.repeats == size and timing.inner == 3
    assert half_iqr(samples) == timing.spread_s


def test_summary_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no timing samples"):
        summarise([])


def test_sample_seconds_counts_calls_and_waits() -> None:
    calls: list[int] = []
    waited: list[int] = []
    samples = sample_seconds(lambda i: calls.append(i) or i, warmup=2, repeats=3, inner=4, wait=waited.append)
    assert calls == list(range(2 + 3 * 4))  # call numbers run on through the warm-up
    assert waited == [0, 1, 5, 9, 13]  # each warm-up call, then the last call of each sample
    assert len(samples) == 3 and all(s >= 0 for s in samples)


def test_sample_seconds_takes_fewer_samples_past_the_budget() -> None:
    import time

    samples = sample_seconds(lambda _i: time.sleep(0.01), warmup=1, repeats=50, max_s=0.02, min_repeats=3)
    assert len(samples) == 3  # 50 x 10 ms is over 20 ms: down to min_repeats


# --------------------------------------------------------------------------- JSON lines


def test_append_writes_whole_lines_in_the_records_format(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "runs.jsonl"
    append_record(path, {"a": 1, "b": [1, 2]})
    append_lines(path, [record_line({"c": "é"}, ensure_ascii=False), record_line({"d": None})], sync=False)
    assert path.read_text(encoding="utf-8") == '{"a": 1, "b": [1, 2]}\n{"c": "é"}\n{"d": null}\n'
    write_lines(path, [record_line({"e": 2})])
    assert path.read_text() == '{"e": 2}\n'


def test_append_refuses_a_partial_last_line(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text('{"a": 1}\n{"b": ')
    with pytest.raises(InputError, match=r"runs.jsonl: line 2: the last line has no newline \(a partial write\?\)"):
        append_record(path, {"c": 3})
    assert path.read_text() == '{"a": 1}\n{"b": '  # untouched


def test_append_refuses_a_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a regular file"):
        append_record(tmp_path, {"a": 1})


# --------------------------------------------------------------------------- the kernel record


def _rows(name: str) -> list[str]:
    return [line for line in (DATA / name).read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", KERNEL_FILES)
def test_every_committed_row_reads_and_writes_back_exactly(name: str) -> None:
    lines = _rows(name)
    assert lines
    for line in lines:
        record = KernelRecord.from_row(json.loads(line))
        assert record_line(record.to_dict()) == line


def test_a_committed_row_round_trips_through_the_typed_record() -> None:
    """The newest kernel decode: its fields typed, a record built from them anew writes the
    same line (the runner's order; the harness's ``ahead_compile_s`` kept in ``extra``), and
    the measurement reader sees the same numbers."""
    from calibration.sources.measurements import Measurement

    row = json.loads(_rows("tpu-v5e-kernel.jsonl")[-1])
    record = KernelRecord.from_row(row)
    assert (record.model, record.batch, record.shard_of, record.schedule_hash) == \
        (row["model"], row["batch"], row["shard_of"], row["schedule_hash"])
    assert record.ms_per_step_median == row["ms_per_step_median"] and record.expert_decoder == row["decoder"]
    assert record.unroll == tuple(row["panel_unroll"]) and record.extra == {"ahead_compile_s": row["ahead_compile_s"]}
    fields = {key: value for key, value in row.items() if key != "ahead_compile_s"}
    anew = KernelRecord(**fields, extra={"ahead_compile_s": row["ahead_compile_s"]})
    assert anew == record and record_line(anew.to_dict()) == record_line(row)
    measured = Measurement.model_validate(anew.to_dict())
    assert (measured.model, measured.batch, measured.ms_per_step_median, measured.schedule_hash) == \
        (row["model"], row["batch"], row["ms_per_step_median"], row["schedule_hash"])
    assert measured.extra["shard_of"] == row["shard_of"]


def test_a_new_record_omits_the_other_implementations_fields() -> None:
    record = KernelRecord(model="m", system={"chip": "tpu-v5e", "chips": 1}, batch=1, context=8, routing=None,
                          implementation="xla", backend="cpu", ms_per_step_median=1.0, ms_per_step_spread=0.0,
                          steps=2, provenance="p", label="l", extra={"xla_bytes_accessed": None})
    keys = list(record.to_dict())
    assert keys[:6] == ["model", "system", "batch", "context", "routing", "implementation"]
    assert "schedule" not in keys and "decoder" not in keys and "expert_cap" in keys
    assert keys[-1] == "xla_bytes_accessed"


def test_a_row_without_a_required_field_is_refused() -> None:
    with pytest.raises(ValueError, match="lacks ms_per_step_median"):
        KernelRecord.from_row({"model": "m", "system": {}, "batch": 1, "context": 1, "routing": None,
                               "backend": "b", "ms_per_step_spread": 0.0, "steps": 1, "provenance": "",
                               "label": ""})


def test_line_appender_writes_what_append_lines_writes_and_refuses_a_partial_line(tmp_path: Path) -> None:
    kept, once = tmp_path / "kept.jsonl", tmp_path / "once.jsonl"
    appender = LineAppender(kept)
    for record in ({"a": 1}, {"b": "é"}, {"c": None}):
        appender.append([record_line(record)])
        append_lines(once, [record_line(record)], sync=False)
    appender.append([])
    appender.close()
    assert kept.read_bytes() == once.read_bytes()
    kept.write_text('{"a": 1}\n{"b": ')
    with pytest.raises(InputError, match="the last line has no newline"):
        LineAppender(kept).append([record_line({"c": 3})])
    assert kept.read_text() == '{"a": 1}\n{"b": '  # untouched
