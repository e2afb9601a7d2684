"""The main job: the whole loop on built-in defaults, written up as one report.

Steps (each one is an ordinary ``tpusim`` subcommand run in-process; its JSON output feeds
the report):

1. **floor** — analytic per-device bytes and floors of Kimi K3 on 16 TPU v7 chips;
2. **sweep** — prefetch schedules for K3 on ``tpu-v7`` x 16 at batch 1 and 8 and every batch the
   compare step shows → ``best.json`` each;
3. **simulate** — the chosen schedule beside ``published`` and ``naive``, with a Perfetto
   trace and a timeline plot of the chosen one;
4. **run-kernel** — the Pallas megakernel with the chosen schedule on ``kimi-k3-mini`` (TPU
   interpret mode on a CPU: checked against the reference; its time is *not* a TPU time);
5. **measured tpu-v5e** — the committed K3-shard step times of the megakernel on a real
   TPU v5e against the simulator (probe figures, and the committed held-out fits),
   re-simulated without a TPU (:mod:`tpusim.app.demo_measured`);
   **calibrate** — ``tpu-v7`` on the published TPU7x measurements (one weight format held
   out), and the host CPU model on the CPU closed loop;
6. **joint b1** — the deployment search (plan x collective algorithms x schedule, Optuna) for K3
   at batch 1 on the calibrated ``tpu-v7``: the winner against the published design with its
   interval and P(faster than published) over the calibration's samples;
7. **compare** — K3 on TPU v7 x 16 against GB200 x 16 (serving stack and megakernel) at
   batch 1/2/4/8, each batch with its own sweep's schedule, without speculation and at acceptance lengths 3 and 6;
8. **report** — ``report.md`` opening with the TPU-v7-against-GB200 table, every number
   labelled, plus the plots and the trace.

Calibrated overlays and the probed host entry go to ``<out>/local`` (``TPUSIM_LOCAL_DIR``)
(:func:`demo_local_dir`) unless that variable (or ``--local-dir``) is already set, so the demo
never changes the user's catalog; :func:`reuse_line` is the command, printed at the end and
written into the report, that runs later commands with the demo's calibration. Overlays
a previous demo left there are removed first (a second run into the same folder starts from
published figures too). Calibrations keep an overlay even when the solver stops early
(``--allow-unconverged``; the host CPU's too when a noisy loop on a shared machine pushes a
figure to a bound, ``--allow-at-bounds``), and the report says so; the other checks of
:mod:`calibration.reports.trust` (units, plausibility, error on the fitted points) still refuse.
A step that fails is reported in ``report.md`` and makes the demo exit non-zero, after the
remaining steps have run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwmodels.atomic import write_text_atomic
from tpusim.app.cli import main as cli_main
from tpusim.app.demo_run import DemoConfig, DemoRun, StepRecord

K3_TPU = ["--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16"]


def _stop_if_interrupted(code: int) -> None:
    """A step that stopped on Ctrl-C / SIGTERM (exit 130 / 143) stops the demo, which then
    writes no report: the previous report.md stays as it was."""
    if code in (130, 143):
        raise KeyboardInterrupt(f"a demo step was interrupted (exit {code})")


def run_cli_json(argv: list[str]) -> Any:
    """Run a subcommand in-process with ``--json``; return its parsed output."""
    buffer, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(errors):
        code = cli_main([*argv, "--json"])
    _stop_if_interrupted(code)
    if code != 0:
        raise RuntimeError(f"tpusim {' '.join(argv)} exited {code}: {errors.getvalue().strip()[-400:]}")
    return json.loads(buffer.getvalue())


def start_lower(argv: list[str]) -> subprocess.Popen[str]:
    """``tpusim lower ARGV --json`` in a process of its own (it compiles in a fresh one anyway)."""
    return subprocess.Popen([sys.executable, "-m", "tpusim", "lower", *argv, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish_lower(process: subprocess.Popen[str]) -> Any:
    """Its report whether Mosaic compiled the kernel (exit 0) or refused it (exit 1, the refusal in
    the report); bad input (exit 2) or a crash fails the step."""
    out, err = process.communicate()
    _stop_if_interrupted(process.returncode)
    if process.returncode not in (0, 1) or not out.strip():
        raise RuntimeError(f"tpusim lower exited {process.returncode}: {err.strip()[-400:]}")
    return json.loads(out)


def run_cli(argv: list[str]) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = cli_main(argv)
    _stop_if_interrupted(code)
    if code != 0:
        raise RuntimeError(f"tpusim {' '.join(argv)} exited {code}: {buffer.getvalue().strip()[-400:]}")
    return buffer.getvalue()


def _timed(run: DemoRun, name: str, action: Callable[[], Any], progress: Callable[[str], None]) -> StepRecord:
    record = run.step(name)
    progress(f"[demo] {name} ...")
    start, start_cpu = time.perf_counter(), _cpu_s()
    try:
        record.data = action()
    except Exception as error:  # a failed step is reported; the remaining steps still run
        record.ok = False
        record.error = f"{type(error).__name__}: {error}"
        record.data = {"traceback": traceback.format_exc(limit=6)}
    record.wall_s = time.perf_counter() - start
    record.cpu_s = _cpu_s() - start_cpu
    progress(f"[demo] {name}: {'done' if record.ok else 'FAILED: ' + record.error} "
             f"({record.wall_s:.1f} s wall, {record.cpu_s:.1f} s CPU)")
    return record


def _cpu_s() -> float:
    """CPU seconds used so far by this process and its waited-for children (sweep workers):
    on a machine shared with other jobs, wall time also counts waiting for a core."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _forget_previous_overlays(local: Path, progress: Callable[[str], None]) -> None:
    """Remove the calibrated overlays an earlier demo left in ``local`` (the demo's own
    folder), so this run's simulations start from published figures and its calibrations
    from published values, as the report says."""
    folder = local / "calibrated"
    for overlay in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        overlay.unlink()
        progress(f"[demo] removed the previous run's overlay {overlay}")


def demo_local_dir(out: Path) -> Path:
    """Where the demo's overlays and probed host go: ``$TPUSIM_LOCAL_DIR`` (``--local-dir``)
    if set, else ``<out>/local``."""
    from hwmodels.files import LOCAL_DIR_ENV

    chosen = os.environ.get(LOCAL_DIR_ENV)
    return Path(chosen).expanduser() if chosen else (out / "local").resolve()


def reuse_line(local: Path) -> str:
    """The exact command that reuses the demo's calibration (any command takes --local-dir)."""
    folder = shlex.quote(str(local))
    return (f"to reuse this calibration: tpusim simulate {' '.join(K3_TPU)} --local-dir {folder} "
            f"(any command takes --local-dir, or export TPUSIM_LOCAL_DIR={folder}; "
            f"`tpusim overlays list --local-dir {folder}` lists the overlays)")


def batch_schedule(out: Path, batch: int) -> str:
    """The schedule the demo's sweep at ``batch`` chose (``published`` if it wrote none)."""
    best = out / f"sweep-b{batch}" / "best.json"
    return str(best) if best.exists() else "published"


def simulate_all(out: Path, schedule: str, *, plots: bool = True) -> dict[str, Any]:
    """The simulate step: the batch-1 sweep's choice beside ``published`` and ``naive`` (its
    trace and timeline written when ``plots``)."""
    results = {}
    for name in (schedule, "published", "naive"):
        extra = (["--trace", str(out / "trace.json"), "--plot", str(out / "timeline.png")]
                 if name == schedule and plots else [])
        results["best" if name == schedule else name] = run_cli_json(
            ["simulate", *K3_TPU, "--batch", "1", "--schedule", name, *extra])
    return results


def joint_step(config: DemoConfig, schedule: str, *, budget: int) -> list[str]:
    """The deployment search's command: K3 at batch 1, with the schedule sweep's winner as a
    baseline, so the search's best is never slower than the compare row that runs it on the
    same chip figures (one answer per question: :mod:`tpusim.app.demo_consistency`)."""
    return ["sweep", *K3_TPU, "--batch", "1", "--space", "joint", "--budget", str(budget), "--jobs",
            str(config.jobs), "--out", str(config.out_dir / "joint-b1"), "--quiet",
            *(["--baseline", schedule] if schedule != "published" else [])]


def compare_per_batch(config: DemoConfig, batches: list[int], *, plot: bool = True) -> list[dict[str, Any]]:
    """The compare step: one ``tpusim compare`` per batch with that batch's sweep choice
    (:func:`batch_schedule`), the rows joined and plotted together."""
    out = config.out_dir
    rows: list[dict[str, Any]] = []
    for batch in batches:
        # a given --schedule runs no sweep, so the sweep flags would be refused (flag_rules)
        argv = ["compare", "--model", "kimi-k3", "--systems", config.compare_systems, "--batch", str(batch),
                "--schedule", batch_schedule(out, batch)]
        if config.compare_acceptance:
            argv += ["--spec-acceptance", config.compare_acceptance]
        rows += run_cli_json(argv)
    order = {system: index for index, system in enumerate(dict.fromkeys(row["system"] for row in rows))}
    rows.sort(key=lambda row: order[row["system"]])  # grouped by system, batches in order, as one compare prints
    if plot:
        from tpusim.compare.plot import plot_comparison

        plot_comparison(rows, out / "compare.png", title="kimi-k3: simulated decode throughput")
    return rows


def run_demo(config: DemoConfig, progress: Callable[[str], None] = lambda _: None) -> DemoRun:
    from hwmodels.files import LOCAL_DIR_ENV

    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    local = demo_local_dir(out)
    if LOCAL_DIR_ENV not in os.environ:
        os.environ[LOCAL_DIR_ENV] = str(local)
        _forget_previous_overlays(local, progress)
    run = DemoRun(config)
    budget = 8 if config.quick else config.sweep_budget
    samples = ["--samples", "60"] if config.quick else []

    _timed(run, "floor", lambda: run_cli_json(["floor", *K3_TPU, "--batch", "1"]), progress)
    compare_batches = sorted({int(b) for b in config.compare_batches.split(",") if b.strip()})
    from megakernel.mosaic_compile import libtpu_available

    compiles = libtpu_available()
    for batch in sorted({1, 8, *compare_batches}):  # every batch the compare step shows has its own sweep
        # batch 1's pick is compiled with Mosaic (~10-20 s); at batch 8 the check would sweep again
        # within what the compiler leaves (minutes: docs/sweep.md), beyond the demo's budget
        check = ["--compile-check", "2"] if compiles and batch == 1 else []
        _timed(run, f"sweep b{batch}", lambda b=batch, c=check: run_cli_json([
            "sweep", *K3_TPU, "--batch", str(b), "--budget", str(budget), "--jobs", str(config.jobs),
            "--out", str(out / f"sweep-b{b}"), "--quiet", *samples, *c]), progress)
    schedule = batch_schedule(out, 1)

    _timed(run, "simulate", lambda: simulate_all(out, schedule), progress)
    measurements = out / "measurements.jsonl"
    _timed(run, "run-kernel", lambda: run_cli([
        "run-kernel", "--model", "kimi-k3-mini", "--schedule", schedule, "--batch", "1",
        "--steps", str(config.kernel_steps), "--out", str(measurements)]), progress)
    from tpusim.app.demo_measured import STEP, measured_step

    _timed(run, STEP, lambda: measured_step(out), progress)  # committed v5e records, re-simulated (seconds)
    _timed(run, "calibrate tpu-v7", lambda: run_cli_json([
        "calibrate", "--hardware", "tpu-v7", "--measurements", "published:tpu7x-musespark",
        "--holdout", "format=int4+bf16", "--allow-unconverged", "--out", str(out / "calibration-tpu-v7"),
        # quick: the model error from the format folds only (2 refits, not 6: ~2.5 of ~4.5 minutes saved)
        *(["--holdout-dimensions", "format"] if config.quick else [])]),
        progress)
    _timed(run, "calibrate host-cpu", lambda: run_cli_json([
        "calibrate", "--hardware", "host-cpu", "--measurements", "cpu-loop",
        *(["--quick"] if config.quick else []), "--allow-unconverged", "--allow-at-bounds", "--out", str(out / "calibration-host-cpu")]),
        progress)
    joint = 8 if config.quick else config.joint_budget  # after calibrate: chosen on the calibrated chip
    _timed(run, "joint b1", lambda: run_cli_json(joint_step(config, schedule, budget=joint)), progress)
    # the winner compiled for 32 TPU7x devices, in a process of its own beside the comparison (one core each)
    winner = out / "joint-b1" / "best.json"
    lowering = start_lower(["--hardware", "tpu-v7", "--schedule", str(winner)]) if compiles and winner.is_file() else None
    # Megakernel rows at each batch run the schedule that batch's sweep above chose (a row it
    # does not fit falls back to a built-in that fits, and says so): a sweep per row, plan and
    # verify size would take the demo from minutes to an hour. `tpusim compare` alone sweeps per row.
    try:
        _timed(run, "compare", lambda: compare_per_batch(config, compare_batches), progress)
    except BaseException:
        if lowering is not None:
            lowering.kill()
        raise
    if lowering is not None:  # its wall time here: what it added after the comparison finished
        _timed(run, "compile joint b1", lambda: finish_lower(lowering), progress)

    from tpusim.app.demo_report import render_report

    write_text_atomic(out / "report.md", render_report(run, reuse=reuse_line(local)))
    return run
