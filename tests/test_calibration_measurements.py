"""Measurement records and their loaders: JSONL (ours and the kernel runner's), the published
TPU7x set, and jax.profiler traces recorded by the test itself."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from calibration.sources.loaders import load_measurements, read_kernel_records, usable_for
from calibration.sources.measurements import (
    Measurement,
    SystemRef,
    append_measurement,
    read_measurements,
    write_measurements,
)
from calibration.sources.profiler import load_trace, trace_measurement
from calibration.sources.tpu7x_published import load_published
from hwmodels.errors import InputError


def record(**changes: object) -> Measurement:
    base = {
        "model": "muse-spark@int4+bf16", "system": {"chip": "tpu-v7", "chips": 4}, "batch": 2,
        "context": 215, "routing": "identical", "schedule": "muse-published",
        "backend": "tpu7x (published)", "ms_per_step_median": 3.71, "label": "published",
    }
    base.update(changes)
    return Measurement.model_validate(base)


def test_round_trip_and_append(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    write_measurements(path, [record(), record(batch=4, ms_per_step_median=3.91)])
    append_measurement(path, record(batch=8, ms_per_step_median=4.29, ms_per_step_spread=0.01, steps=128))
    loaded = read_measurements(path)
    assert [r.batch for r in loaded] == [2, 4, 8]
    assert loaded[2].ms_per_step_spread == 0.01 and loaded[2].step_s == pytest.approx(4.29e-3)
    assert loaded[0] == record()


def test_kernel_runner_records_are_accepted(tmp_path: Path) -> None:
    """The runner writes ``schedule_name``, a ``system`` string and extra keys."""
    line = {
        "model": "kimi-k3-mini", "system": "tpu-v7x16", "batch": 1, "context": 64,
        "routing": "uniform", "schedule_hash": "807e3376737d6061", "schedule_name": "published",
        "backend": "cpu-interpret", "ms_per_step_median": 1234.5, "ms_per_step_spread": 12.0,
        "steps": 3, "provenance": "megakernel.runner on host", "label": "measured",
        "git_commit": "abc123", "host": "vm",
    }
    path = tmp_path / "kernel.jsonl"
    path.write_text(json.dumps(line) + "\n")
    (loaded,) = read_kernel_records(path, backend="cpu-interpret")
    assert loaded.system == SystemRef(chip="tpu-v7", chips=16)
    assert loaded.schedule == "published" and loaded.extra == {"git_commit": "abc123", "host": "vm"}
    with pytest.raises(InputError, match="cannot calibrate tpu-v7"):
        usable_for([loaded], "tpu-v7", "tpu")
    with pytest.raises(InputError, match="no records with backend 'cpu-xla'"):
        read_kernel_records(path, backend="cpu-xla")


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"model": "muse-spark", "system": {"chip": "tpu-v7", "chips": 4}, "batch": 1', "line 2: invalid JSON"),
        (json.dumps({**json.loads(record().to_json_line()), "batch": 0}), "line 2: batch: Input should be greater"),
        (json.dumps({**json.loads(record().to_json_line()), "system": "tpu-v7"}), "line 2: system"),
        ("[1, 2]", "line 2: expected a JSON object"),
    ],
)
def test_corrupt_line_names_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(record().to_json_line() + "\n" + bad_line + "\n" + record().to_json_line() + "\n")
    with pytest.raises(InputError, match=message) as caught:
        read_measurements(path)
    assert "bad.jsonl" in str(caught.value) and "\n" not in str(caught.value)


def test_partial_last_line_is_reported_and_blocks_append(tmp_path: Path) -> None:
    path = tmp_path / "partial.jsonl"
    full = record().to_json_line()
    path.write_text(full + "\n" + full[: len(full) // 2])  # a write cut short
    with pytest.raises(InputError, match=r"line 2: invalid JSON \(truncated line\? a partial write\)"):
        read_measurements(path)
    with pytest.raises(InputError, match="line 2: the last line has no newline"):
        append_measurement(path, record())
    assert path.read_text().endswith(full[: len(full) // 2])  # nothing appended


def test_empty_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n# only a comment\n")
    with pytest.raises(InputError, match="no measurements"):
        read_measurements(tmp_path / "empty.jsonl")
    with pytest.raises(InputError, match="no such file"):
        load_measurements(str(tmp_path / "nope.jsonl"))


def test_published_set_is_twelve_labelled_records() -> None:
    records = load_measurements("published:tpu7x-musespark")
    assert records == load_published()
    assert len(records) == 12
    assert {r.format for r in records} == {"nvfp4+int8", "nvfp4+bf16", "int4+bf16"}
    assert {r.batch for r in records} == {1, 2, 4, 8}
    for r in records:
        assert r.system == SystemRef(chip="tpu-v7", chips=4)
        assert (r.routing, r.context, r.steps, r.label) == ("identical", 151 + 64, 128, "published")
        assert r.backend == "tpu7x (published)" and r.schedule == "muse-published"
    first = records[0]
    assert (first.format, first.batch, first.ms_per_step_median) == ("nvfp4+int8", 1, 3.26)
    phases = {(p.name, p.scope): p.ms for p in first.phases}
    assert phases[("layer_total", "per_layer")] == pytest.approx(0.055)
    assert phases[("lm_head", "per_step")] == pytest.approx(0.126)
    with pytest.raises(InputError, match="unknown published dataset"):
        load_measurements("published:nothing")


def test_jax_profiler_trace_is_read(tmp_path: Path) -> None:
    """Record a real trace with jax.profiler on the CPU and read per-kernel durations."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def decode_step(x: jax.Array, w: jax.Array) -> jax.Array:  # f32[8, 256], f32[256, 256]
        return jnp.tanh(x @ w) + 1.0

    x = jnp.ones((8, 256), jnp.float32)
    w = jnp.ones((256, 256), jnp.float32) / 256
    decode_step(x, w).block_until_ready()
    with jax.profiler.trace(str(tmp_path / "trace")):
        for step in range(4):
            with jax.profiler.StepTraceAnnotation("decode", step_num=step):
                decode_step(x, w).block_until_ready()
    trace = load_trace(tmp_path / "trace")
    assert trace.path.name.endswith(".trace.json.gz")
    assert trace.step_durations_us("decode") and len(trace.step_durations_us("decode")) == 4
    stats = trace.kernel_stats()
    assert stats and all(s.count >= 1 and s.total_us > 0 for s in stats.values())
    module = trace.modules()[0]
    assert "decode_step" in module
    runs = trace.executions(module)
    assert len(runs) == 4 and all(run.span_us > 0 for run in runs)
    measured = trace_measurement(trace, model="toy", system="host-cpux1", batch=8, context=1,
                                 backend="cpu-xla", step_name="decode")
    assert measured.steps == 4 and measured.ms_per_step_median > 0
    assert measured.phases and "jax.profiler trace" in measured.provenance


def test_corrupt_trace_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "host.trace.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [')[:-4])
    with pytest.raises(InputError, match=r"host\.trace\.json\.gz"):
        load_trace(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match=r"no \*\.trace\.json\.gz under it"):
        load_trace(empty)
