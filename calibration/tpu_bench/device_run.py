"""The kernel sets of one device call on a TPU host: correctness set and K3-shard timing set.

``python -m calibration.tpu_bench.device_run --out DIR --set NAME [--budget-s S]``

Runs in one process (one program may hold the chip at a time), appending as it goes, so a
budget cut loses nothing already measured:

- ``DIR/records.jsonl``: one :mod:`megakernel.runner` record per kernel run (the routing
  the run's router chose is embedded as ``routing_layers``; :mod:`calibration.tpu_bench.ingest`
  splits it into trace files when the records are committed);
- ``DIR/xla.jsonl``: for cases of a group with ``"xla_baseline": true``, the plain-JAX/XLA
  step on the same weights, state and tokens, timed right after the kernel
  (:mod:`megakernel.xla_run`): what a user would run instead, side by side, in one run;
- ``DIR/env.json``: device kind, versions, the set and its cases.

Kernels are compiled ahead in a thread pool (Mosaic compiles on the host's cores while the
chip runs the previous case); JAX's persistent compilation cache hands each compiled
executable to the run, whose own compile then only loads it (``compile_s`` says how long
that took; ``ahead_compile_s`` the real compile).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

SETS_FILE = Path(__file__).with_name("sets.json")
SCRATCH = Path(os.environ.get("TMPDIR", "/tmp")) / "tpu-bench-scratch.jsonl"  # the runner's own copy


@dataclasses.dataclass(frozen=True)
class Case:
    model: str
    schedule: str
    batch: int
    shard_of: str | None = None
    weight_banks: int = 0
    steps: int = 10
    check_steps: int = 8
    context: int = 1024
    purpose: str = "timing"  # correctness | timing
    xla_baseline: bool = False  # also time the plain-JAX/XLA step (megakernel.xla_baseline) next to it
    expert_cap: int | None = None  # a fixed-cost probe: at most this many experts a layer (no numerics check)
    panel_unroll: int | None = None  # a kernel variant: panels per panel-loop iteration (None: the kernel's)
    expert_panel_unroll: int | None = None
    # after the kernel case, the plain-XLA step at these expert caps (0: no routed expert, its
    # non-expert work; not checked), beside the kernel's own capped cases
    xla_expert_caps: tuple[int, ...] = ()

    def schedule_path(self, root: Path) -> str:
        path = root / self.schedule
        return str(path) if self.schedule.endswith(".json") and path.exists() else self.schedule


def say(text: str) -> None:
    """One progress line, flushed (the device tool returns the output's tail)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def load_cases(name: str) -> list[Case]:
    """The cases of set ``name`` in ``sets.json``: each entry expands models x schedules x batches."""
    sets = json.loads(SETS_FILE.read_text())
    if name not in sets:
        raise SystemExit(f"--set {name}: not in {SETS_FILE.name} (have: {', '.join(sorted(sets))})")
    cases = []
    for group in sets[name]["groups"]:
        if group.get("purpose") == "numerics":
            continue  # numerics_groups
        fixed = {k: v for k, v in group.items() if k not in ("schedules", "batches", "expert_caps")}
        for schedule in group["schedules"]:
            for batch in group["batches"]:
                for cap in group.get("expert_caps", [None]):
                    cases.append(Case(schedule=schedule, batch=batch, expert_cap=cap,
                                      **{**fixed, "xla_expert_caps": tuple(fixed.get("xla_expert_caps", ()))}))
    return cases


def run_config(case: Case, root: Path) -> Any:
    """The :class:`megakernel.runner.RunConfig` of ``case`` on the chip."""
    from megakernel.runner import RunConfig

    return RunConfig(model=case.model, schedule=case.schedule_path(root), batch=case.batch, steps=case.steps,
                     context=case.context, backend="tpu", shard_of=case.shard_of,
                     weight_banks=case.weight_banks, check_steps=case.check_steps, expert_cap=case.expert_cap,
                     label=f"measured ({case.purpose} set)",
                     **{knob: value for knob in ("panel_unroll", "expert_panel_unroll")
                        if (value := getattr(case, knob)) is not None})


def numerics_groups(name: str) -> list[dict[str, Any]]:
    """The set's ``purpose: numerics`` groups (:mod:`megakernel.chip_numerics` runs, by depth)."""
    return [g for g in json.loads(SETS_FILE.read_text())[name]["groups"] if g.get("purpose") == "numerics"]


def run_numerics(group: dict[str, Any], out: Path) -> None:
    """One numerics group: per schedule and batch, teacher-forced errors at each depth."""
    from hwmodels.records.jsonl import append_record
    from megakernel.chip_numerics import depth_record
    from megakernel.runner import RunConfig

    for schedule in group["schedules"]:
        for batch in group["batches"]:
            for layers in group["layers"]:
                config = RunConfig(model=group["model"], schedule=schedule, batch=batch, steps=group["steps"],
                                   context=group["context"], backend="tpu", layers=layers,
                                   check_steps=group["steps"])
                record = depth_record(config, "tpu")
                append_record(out, record)
                worst = max(record["steps"], key=lambda s: s["kernel"])
                say(f"numerics {group['model']} {schedule} b{batch} {record['layers']} layers: "
                    + " ".join(f"{s['kernel']:.2e}/{s['reference_default']:.2e}/{s['reference_cpu']:.2e}"
                               for s in record["steps"])
                    + f" (kernel/ref-default/ref-cpu per step; worst kda state {worst['kernel_kda_state']:.2e})")


def ahead_compile(case: Case, root: Path) -> float:
    """Compile ``case``'s kernel from shapes (fills the persistent cache); seconds. The kernel
    is :func:`megakernel.runner.build_kernel`'s, so the run finds this compile in the cache."""
    import jax

    from megakernel.dims import model_dims
    from megakernel.mosaic_compile import step_inputs
    from megakernel.runner import KERNEL_PRECISION, build_kernel, run_plan

    config = run_config(case, root)
    model, plan = run_plan(config)
    dims = dataclasses.replace(model_dims(model, plan), weight_banks=case.weight_banks)
    kernel = build_kernel(config, dims, "tpu")
    started = time.perf_counter()
    with jax.default_matmul_precision(KERNEL_PRECISION):
        jax.jit(kernel.step).lower(*step_inputs(kernel)).compile()
    return time.perf_counter() - started


def run_case(case: Case, root: Path, out: Path, ahead_s: float) -> dict[str, Any]:
    from hwmodels.records.jsonl import append_record
    from megakernel.runner import run

    record = run(run_config(case, root), SCRATCH)  # not under $OUT: only 8 files come back
    trace = record["routing"].removeprefix("trace:")
    record["routing_layers"] = json.loads(Path(trace).read_text())["layers"]
    record["routing"] = f"trace:{Path(trace).name}"
    record["ahead_compile_s"] = ahead_s
    append_record(out, record)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--set", default="v5e-first")
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--compile-workers", type=int, default=6)
    args = parser.parse_args(argv)
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ.get("TMPDIR", "/tmp")) / "tpusim-jax-cache"
    import jax

    jax.config.update("jax_compilation_cache_dir", str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    root = Path.cwd()
    cases = load_cases(args.set)
    env = {"device_kind": jax.devices()[0].device_kind, "devices": len(jax.devices()), "set": args.set,
           "cases": [dataclasses.asdict(c) for c in cases], "jax": jax.__version__}
    (args.out / "env.json").write_text(json.dumps(env, indent=1))
    records = args.out / "records.jsonl"
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.compile_workers)
    ahead = {i: pool.submit(ahead_compile, case, root) for i, case in enumerate(cases)}
    for group in numerics_groups(args.set):
        try:
            run_numerics(group, args.out / "numerics.jsonl")
        except Exception as error:
            say(f"NUMERICS FAIL {group['model']}: {type(error).__name__}: {str(error)[:600]}")
            traceback.print_exc()
    done = 0
    for i, case in enumerate(cases):
        if time.monotonic() - started > args.budget_s:
            say(f"budget spent: {len(cases) - i} cases not run")
            break
        try:
            ahead_s = ahead[i].result()
        except Exception as error:
            say(f"COMPILE FAIL {case}: {type(error).__name__}: {str(error)[:600]}")
            continue
        try:
            record = run_case(case, root, records, ahead_s)
        except Exception as error:
            say(f"RUN FAIL {case}: {type(error).__name__}: {str(error)[:600]}")
            traceback.print_exc()
            continue
        done += 1
        report(case, record, ahead_s, started)
        if case.xla_baseline and time.monotonic() - started <= args.budget_s:
            try:
                from megakernel.xla_run import run_xla

                xla = run_xla(run_config(case, root), record, args.out / "xla.jsonl")
                say(f"  XLA baseline b{case.batch}: {xla['ms_per_step_median']:.3f} ms (±{xla['ms_per_step_spread']:.3f}), "
                    f"rel err {xla['relative_error'] or 0:.2%}, tokens {'same' if xla['tokens_identical'] else 'DIFFER'}, "
                    f"compile {xla['compile_s']:.1f} s; kernel/XLA {record['ms_per_step_median'] / xla['ms_per_step_median']:.3f}"
                    f"  [{time.monotonic() - started:.0f} s]")
            except Exception as error:
                say(f"XLA FAIL {case}: {type(error).__name__}: {str(error)[:600]}")
                traceback.print_exc()
        for cap in case.xla_expert_caps:
            if time.monotonic() - started > args.budget_s:
                break
            try:
                from megakernel.xla_run import run_xla

                xla = run_xla(run_config(case, root), record, args.out / "xla.jsonl", expert_cap=cap)
                say(f"  XLA b{case.batch} expert cap {cap}: {xla['ms_per_step_median']:.3f} ms "
                    f"(±{xla['ms_per_step_spread']:.3f}), {xla['hbm_bytes_per_step'] / 1e9:.2f} GB, "
                    f"compile {xla['compile_s']:.1f} s  [{time.monotonic() - started:.0f} s]")
            except Exception as error:
                say(f"XLA FAIL {case} cap {cap}: {type(error).__name__}: {str(error)[:600]}")
                traceback.print_exc()
    pool.shutdown(wait=False, cancel_futures=True)
    say(f"{done}/{len(cases)} cases in {time.monotonic() - started:.0f} s")
    os._exit(0)  # compile threads still running must not hold the call open


def report(case: Case, record: dict[str, Any], ahead_s: float, started: float) -> None:
    say(f"{case.model} {case.shard_of or ''} {record['schedule']} b{case.batch}: "
        f"{record['ms_per_step_median']:.3f} ms (±{record['ms_per_step_spread']:.3f}), "
        + (f"variant {record['kernel_variant']}, " if record.get("kernel_variant") else "")
        + (f"expert cap {record['expert_cap']} (fixed-cost probe, not checked), " if record.get("expert_cap")
           else f"err {record['max_abs_error']:.3g} (rel {record['relative_error'] or 0:.2%}), "
                f"tokens {'same' if record['tokens_identical'] else 'DIFFER'}, ") +
        f"compile {ahead_s:.1f}+{record['compile_s']:.1f} s, "
        f"{record['effective_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s  [{time.monotonic() - started:.0f} s]")


if __name__ == "__main__":
    sys.exit(main())
