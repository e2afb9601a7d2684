"""The GPU harness (calibration.gpu_bench): jax-only imports, its CPU mode on tiny sizes, the
record format (validated with the pydantic Measurement model), the shipped workloads, and the
profiler loader on a recorded trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.gpu_bench import WORKLOADS_PATH
from calibration.gpu_bench.__main__ import main as bench_main
from calibration.gpu_bench.micro import copy_sizes, hlo_kernel_count, rotation
from calibration.sources.gpu_ingest import ingest, trace_records
from calibration.sources.gpu_workloads import bench_workloads, render
from calibration.sources.measurements import read_measurements
from tests.test_records_layer import HEAVY, LAYER, import_blocking

DATA = Path(__file__).parent / "data" / "gpu_bench"
ROOT = Path(__file__).resolve().parents[1]


def test_harness_imports_only_jax_and_numpy() -> None:
    """The lent machine has JAX but no pydantic/simpy/scipy/yaml: the harness imports with
    them blocked (nor tpusim, which needs pydantic), and of the house only the record layer
    (standard library: hwmodels.records and what it stands on)."""
    loaded = import_blocking("calibration.gpu_bench.__main__, calibration.gpu_bench.replay", HEAVY)
    assert loaded <= LAYER and "hwmodels.records.jsonl" in loaded


def test_shipped_workloads_match_the_simulator() -> None:
    """workloads.json is what the simulator's programs give today (one owner of shapes)."""
    assert WORKLOADS_PATH.read_text(encoding="utf-8") == render(bench_workloads())


def test_shipped_h200_set_covers_the_issue() -> None:
    h200 = json.loads(WORKLOADS_PATH.read_text(encoding="utf-8"))["sets"]["h200"]
    names = {(s["name"], s["batch"]) for s in h200["steps"]}
    models = {"llama-3.2-1b", "llama-3.1-8b", "qwen3-30b-a3b", "kimi-k3-tp8-slice"}
    assert names == {(m, b) for m in models for b in (1, 8, 32)}
    assert h200["rows"] == [1, 8, 64, 256] and h200["dtypes"] == ["bf16", "fp8"]
    # Llama-3.2-1B: 1.236e9 parameters in bf16 (tied embeddings read once, as the lm_head)
    llama = next(s for s in h200["steps"] if s["name"] == "llama-3.2-1b")
    assert abs(llama["weight_bytes"] / 2 - 1.236e9) / 1.236e9 < 0.01
    assert {"k": 2048, "n": 128256, "source": "llama-3.2-1b head.lm_head"} in h200["matmuls"]


def test_copy_sizes_and_rotation() -> None:
    sizes = copy_sizes(4 << 30)
    assert sizes[0] == 64 << 10 and sizes[-1] == 4 << 30 and len(sizes) == 17
    assert copy_sizes(300 << 10) == [64 << 10, 128 << 10, 256 << 10]
    assert rotation(1 << 20, 256 << 20) == 256 and rotation(1 << 30, 256 << 20) == 1
    assert rotation(64 << 10, 256 << 20) == 4096 and rotation(1, 1 << 40) == 4096  # capped


def test_hlo_kernel_count() -> None:
    text = """HloModule m
ENTRY %main (y: f32[8]) -> f32[8] {
  %y = f32[8]{0} parameter(0)
  %c = f32[] constant(1)
  %f = f32[8]{0} fusion(%y, %c), kind=kLoop, calls=%fc
  %d = f32[1,8]{1,0} dot(%b, %m), lhs_contracting_dims={1}
  %b2 = f32[8]{0} bitcast(%d)
  ROOT %t = (f32[8]{0}) tuple(%b2)
}
"""
    assert hlo_kernel_count(text) == 2


def test_hlo_kernel_count_enters_command_buffers() -> None:
    """XLA's GPU command buffers move kernels into a called computation: they still count;
    fusion bodies do not."""
    text = """HloModule m, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%fused_computation (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %s = f32[8]{0} sine(%p)
}

%command_buffer (a: f32[8]) -> (f32[8], f32[8]) {
  %a = f32[8]{0} parameter(0)
  %f1 = f32[8]{0} fusion(%a), kind=kLoop, calls=%fused_computation
  %g = (f32[8]{0}, s8[4]{0}) custom-call(%f1), custom_call_target="__cublas$gemm"
  %f2 = f32[8]{0} fusion(%f1), kind=kLoop, calls=%fused_computation
  ROOT %t = (f32[8]{0}, f32[8]{0}) tuple(%f1, %f2)
}

ENTRY %main (y: f32[8]) -> f32[8] {
  %y = f32[8]{0} parameter(0)
  %call = (f32[8]{0}, f32[8]{0}) call(%y), to_apply=%command_buffer
  %gte = f32[8]{0} get-tuple-element(%call), index=0
  ROOT %r = f32[8]{0} fusion(%gte), kind=kLoop, calls=%fused_computation
}
"""
    assert hlo_kernel_count(text) == 4


def _tiny_workloads(path: Path) -> Path:
    data = json.loads(WORKLOADS_PATH.read_text(encoding="utf-8"))
    cpu = data["sets"]["cpu"]
    cpu["steps"] = [s for s in cpu["steps"] if s["name"] == "kimi-k3-mini-tp8-slice" and s["batch"] == 1]
    cpu["matmuls"] = cpu["matmuls"][:2]
    path.write_text(json.dumps({"generated_by": "test", "sets": {"cpu": cpu}}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bench")
    workloads = _tiny_workloads(folder / "workloads.json")
    code = bench_main(["--out", str(folder / "out"), "--workloads", str(workloads), "--set", "cpu",
                       "--max-bytes", str(256 << 10), "--warmup", "1", "--repeats", "3", "--trace-steps", "2",
                       "--gap-ops", "1,8,32"])
    assert code == 0
    return folder / "out"


@pytest.mark.slow
def test_cpu_mode_records_are_valid_measurements(cpu_run: Path) -> None:
    records = read_measurements(cpu_run / "records.jsonl")  # the pydantic model validates each line
    kinds = [r.extra["kind"] for r in records]
    assert kinds.count("copy") == 3 and kinds.count("gap_eager") == 1 and kinds.count("gap_compiled") == 3
    assert kinds.count("matmul") == 4 and kinds.count("decode_step") == 1
    for record in records:
        assert record.label == "measured-on-cpu" and record.system.name == "host-cpu" + "x1"
        assert record.backend == "cpu-xla" and record.ms_per_step_median > 0 and record.steps
        assert {"date", "jax_version", "device"} <= record.extra.keys()
    kernels = [r.extra["kernels"] for r in records if r.extra["kind"] == "gap_compiled"]
    assert kernels == sorted(kernels) and kernels[0] < kernels[-1]
    step = next(r for r in records if r.extra["kind"] == "decode_step")
    shipped = next(s for s in json.loads(WORKLOADS_PATH.read_text())["sets"]["cpu"]["steps"]
                   if s["name"] == "kimi-k3-mini-tp8-slice" and s["batch"] == 1)
    assert step.extra["weight_bytes"] == shipped["weight_bytes"] and step.extra["plan_devices"] == 8
    run = json.loads((cpu_run / "run.json").read_text())
    assert run["records"] == len(records) and run["label"] == "measured-on-cpu" and run["traces"] == 1


@pytest.mark.slow
def test_cpu_run_ingests_with_its_trace(cpu_run: Path) -> None:
    records, run = ingest(cpu_run)
    profile = [r for r in records if r.extra.get("kind") == "profile"]
    assert len(profile) == 1 and profile[0].phases and profile[0].steps == 2
    assert run["chip"] == "host-cpu"


def test_loader_on_a_recorded_trace() -> None:
    """A trace recorded by the harness (tests/data/gpu_bench/SOURCE) becomes a profile record."""
    (record,) = trace_records(DATA)
    assert record.extra["kind"] == "profile" and record.label == "measured-on-cpu"
    assert record.steps == 3 and record.model == "kimi-k3-mini[layers=2,formats=f32]"
    assert record.extra["modules"][0] == "jit_step" and record.extra["kernel_events"] > 3 * 20
    assert 0 < sum(p.ms for p in record.phases) <= record.ms_per_step_median * 1.5


TINY_DESCRIPTION = {"batch": 2, "hidden": 64, "ops": [
    {"kind": "vector", "cols": [64]},
    {"kind": "matmul", "mats": [[2, 64, 128, "bf16"], [2, 64, 32, "f32"]]},
    {"kind": "attention", "pairs": [[4, 32, 16, 32]], "shares_latent": False},
    {"kind": "state", "heads": 2, "dim": 8},
    {"kind": "topk", "experts": 8, "k": 2},
    {"kind": "experts", "count": 3, "rows": 2, "mats": [[64, 96, "bf16"], [48, 64, "bf16"]]},
]}


@pytest.mark.parametrize("on_host", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_replay_allocates_every_op_kind(on_host: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every op kind replays, with values drawn on the host (CPU backend) or on the device
    (the accelerator path, forced here); bytes counted by hand from the description."""
    from calibration.gpu_bench import replay

    original = replay._Arrays.__init__

    def init(self: replay._Arrays, seed: int) -> None:
        original(self, seed)
        self.on_host = on_host

    monkeypatch.setattr(replay._Arrays, "__init__", init)
    step = replay.build_step(TINY_DESCRIPTION)
    # vector 64 f32; matmul 64x128 bf16 + 64x32 f32; experts 3 x (64x96 + 48x64) bf16
    assert step.weight_bytes == 64 * 4 + 64 * 128 * 2 + 64 * 32 * 4 + 3 * (64 * 96 + 48 * 64) * 2
    # attention K and V caches 2 x 16 x 32 bf16 each; KDA-style state 2 x 2 x 8 x 8 f32
    assert step.cache_bytes == 2 * (2 * 16 * 32 * 2) + 2 * 2 * 8 * 8 * 4
    assert step.ops == 6 and len(step.time_steps(warmup=0, repeats=1)) == 1
    with pytest.raises(ValueError, match="unknown op kind"):
        replay.build_step({"batch": 1, "hidden": 8, "ops": [{"kind": "conv"}]})
