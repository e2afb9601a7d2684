"""TPU v5e micro-benchmark probes (calibration.tpu_bench): they compile with libtpu's Mosaic
for v5e, and a quick interpret-mode run gives well-formed, checked records."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from calibration.tpu_bench import probes_dma
from calibration.tpu_bench.common import INTERPRET_NOTE, Point
from calibration.tpu_bench.probes import all_probes, run_probes
from calibration.tpu_bench.probes_products import FLUSHED

ROOT = Path(__file__).resolve().parents[1]
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
REQUIRED = {"kind", "probe", "params", "seconds_median", "seconds_spread", "spread_kind", "repeats",
            "bytes", "flops", "device_kind", "jax", "libtpu", "date", "backend"}


def _compile(subset: str, timeout: int) -> dict[str, float]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TPU_SKIP_MDS_QUERY": "1", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    proc = subprocess.run([sys.executable, "-m", "calibration.tpu_bench", "compile", "v5e:2x2", "--subset", subset],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: no Mosaic compiler for TPU on this machine")
@pytest.mark.slow  # Mosaic compiles of the probes (~7-10 s)
def test_representative_probes_compile_for_v5e() -> None:
    """One probe of each kernel (DMA at 4 KiB and 16 MiB, the empty call (twice), layer loop, a matmul,
    the norm, a dequantisation) through libtpu's Mosaic compiler for TPU v5e."""
    seconds = _compile("representative", timeout=300)
    names = {label.split("[")[0] for label in seconds}
    assert names == {"empty_call", "dma_stream", "layer_loop", "matmul", "rmsnorm_silu", "dequant_mxfp4_down"}
    assert len(seconds) == 8 and all(s > 0 for s in seconds.values())


@pytest.mark.heavy
@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: no Mosaic compiler for TPU on this machine")
def test_every_probe_compiles_for_v5e() -> None:
    """The whole set at full size (a few minutes: the whole-slice dequantisations and the
    single-dot matmuls compile slowly)."""
    seconds = _compile("all", timeout=1800)
    assert len(seconds) == len(all_probes(None, quick=False))


@pytest.fixture(scope="module")
def quick_records() -> list[dict]:
    records: list[dict] = []
    run_probes(300.0, records, quick=True, interpret=True)
    return records


@pytest.mark.slow
def test_quick_run_gives_well_formed_checked_records(quick_records: list[dict]) -> None:
    assert quick_records, "no records"
    errors = [r for r in quick_records if r["kind"] != "probe"]
    assert not errors, errors[0]
    probes = {r["probe"] for r in quick_records}
    assert {"empty_call", "dma_latency", "dma_stream", "layer_loop", "matmul", "rmsnorm_silu",
            "dequant_fp8_gate_up", "dequant_mxfp4_down", "dma_order", "routing", "mla_core", "mla_core_env",
            "kda_core"} <= probes
    expected = sum(len(p.points) for p in all_probes(None, quick=True))
    assert len(quick_records) == expected
    for r in quick_records:
        assert set(r) >= REQUIRED, REQUIRED - set(r)
        assert r["backend"] == "cpu-interpret" and r["note"] == INTERPRET_NOTE
        assert r["spread_kind"] == "iqr/2" and r["repeats"] >= 2
        assert r["seconds_median"] > 0 and r["seconds_spread"] >= 0
        ok = r["check"] == "ok" or (r["probe"] == "mxu_subnormal" and r["check"] == FLUSHED)  # a finding
        assert ok, (r["probe"], r["params"], r["check"])
        json.dumps(r)
    dma = [r for r in quick_records if r["probe"] in ("dma_stream", "dma_issue", "dma_latency")]
    assert all(r["bytes"] == r["params"]["copies"] * r["params"]["size_bytes"] for r in dma)
    order = [r for r in quick_records if r["probe"] == "dma_order"]
    assert all(r["bytes"] == r["params"]["iterations"] * (r["params"]["large_copies"] * r["params"]["large_bytes"]
                                                          + r["params"]["small_copy"] * r["params"]["small_bytes"])
               for r in order)
    assert all(r["flops"] > 0 for r in quick_records if r["probe"] == "matmul")


@pytest.mark.slow
def test_budget_stops_new_probes() -> None:
    records: list[dict] = []
    run_probes(0.0, records, quick=True, interpret=True)
    assert records == []


@pytest.mark.slow
def test_dma_copy_check_catches_a_wrong_copy() -> None:
    """The DMA probe's check compares the slots with the source tiles that landed last: the
    real kernel output passes, a corrupted or stale one fails."""
    import jax
    from jax.experimental.pallas import tpu as pltpu

    probe = probes_dma.dma_probes(pltpu.InterpretParams(), quick=True)[1]
    inputs = probe.make_inputs()
    point = probe.points[-1]  # 4 in flight
    out = np.asarray(probe.fn(jax.numpy.asarray(point.scalars, jax.numpy.int32), *inputs))
    assert probe.check is not None and probe.check(point, inputs, out) is None
    bad = out.copy()
    bad[1, 1, 3, 7] ^= 1
    assert "slot 1" in (probe.check(point, inputs, bad) or "")
    n, f = point.scalars
    earlier = Point(point.params, (n - f, f))  # a kernel that stopped one round early
    assert probe.check(earlier, inputs, out) is not None


@pytest.mark.slow
def test_cli_run_writes_json_lines(tmp_path: Path) -> None:
    """``python -m calibration.tpu_bench run`` appends one JSON record a line as it goes."""
    out = tmp_path / "probes.jsonl"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "calibration.tpu_bench", "run", "--quick", "--budget", "120",
                           "--probe", "empty_call", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["params"]["position"] for r in lines] == ["first", "last"]
    assert all(r["kind"] == "probe" and r["check"] == "ok" for r in lines)
