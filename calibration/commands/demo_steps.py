"""The main job on built-in defaults, written up as one report.

The default run answers the main question first and in minutes; ``--full`` adds the long
steps. Each step is an ordinary ``tpusim`` subcommand run in-process; its JSON output feeds
the report. Steps, in order (*full* marks those only ``--full`` runs):

1. **sweep b1** — prefetch schedules for K3 on ``tpu-v7`` x 16 at batch 1 → ``best.json``;
   its answer (the best schedule and its speed-up over ``published``) is printed at once
   (:func:`first_answer`); *full*: its pick compiled with Mosaic (``--compile-check``);
2. **floor** — analytic per-device bytes and floors of the same workload;
3. **sweep bN** — a sweep at every other batch the comparison shows (8; *full*: 4 and 8);
4. **simulate** — the chosen schedule beside ``published`` and ``naive``, with a Perfetto
   trace and a timeline plot of the chosen one;
5. *full* **run-kernel** — the Pallas megakernel with the chosen schedule on ``kimi-k3-mini``
   (TPU interpret mode on a CPU: checked against the reference; its time is *not* a TPU time);
6. **measured tpu-v5e** — the committed K3-shard step times of the megakernel on a real
   TPU v5e against the simulator, re-simulated without a TPU (:mod:`calibration.commands.demo_measured`;
   *full*: also the decoder table);
7. *full* **calibrate** — ``tpu-v7`` on the published TPU7x measurements (one weight format
   held out), and the host CPU model on the CPU closed loop;
8. *full* **joint b1** — the deployment search (plan x collective algorithms x schedule,
   Optuna) at batch 1 on the calibrated ``tpu-v7``: the winner against the published design
   with its interval and P(faster than published), then compiled with Mosaic for 32 TPU7x
   devices beside the comparison;
9. **compare** — K3 on TPU v7 x 16 against GB200 x 16 (serving stack and megakernel) at
   batch 1 and 8 (*full*: 1, 4, 8), each batch with its own sweep's schedule, without
   speculation and at acceptance lengths 3 and 6 (on the calibrated chip after *full*'s step 7);
   then **compiler-priced tpu-v7** — the same batches with the expert parts priced by the TPU7x
   static schedule and a 90 % interval from the v5e first-principles residuals (~20 s);
10. **report** — ``report.md`` opening with the TPU-v7-against-GB200 table, every number
    labelled, plus the plots and the trace; a section whose step did not run says that
    ``--full`` runs it.

While a step runs, its latest :func:`tpusim.progress_notes.note` (a sweep's phase and count,
the comparison's batch) is printed every :data:`HEARTBEAT_S` seconds with the time so far.

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
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calibration.commands.demo_run import DemoConfig, DemoRun, StepRecord
from hwmodels.atomic import write_text_atomic
from tpusim.app.cli import main as cli_main
from tpusim.progress_notes import listening, note

K3_TPU = ["--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16"]
HEARTBEAT_S = 5.0  # a running step's progress line, this often


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
    note("waiting for Mosaic to compile the winner for 32 TPU7x devices (a process of its own)")
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


class _Heartbeat:
    """While a step runs: every ``every_s`` seconds, one line with the time so far and the step's
    latest progress note (:mod:`tpusim.progress_notes`), from a thread of its own."""

    def __init__(self, name: str, progress: Callable[[str], None], every_s: float) -> None:
        self.latest = ""
        self._name, self._progress, self._every_s = name, progress, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"demo heartbeat: {name}", daemon=True)

    def hear(self, text: str) -> None:
        self.latest = text

    def _beat(self) -> None:
        start = time.perf_counter()
        while not self._stop.wait(self._every_s):
            latest = self.latest
            self._progress(f"[demo] {self._name}: {time.perf_counter() - start:.0f} s" + (f", {latest}" if latest else ""))

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _timed(run: DemoRun, name: str, action: Callable[[], Any], progress: Callable[[str], None]) -> StepRecord:
    record = run.step(name)
    progress(f"[demo] {name} ...")
    start, start_cpu = time.perf_counter(), _cpu_s()
    try:
        with _Heartbeat(name, progress, HEARTBEAT_S) as heartbeat, listening(heartbeat.hear):
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
    same chip figures (one answer per question: :mod:`calibration.commands.demo_consistency`)."""
    return ["sweep", *K3_TPU, "--batch", "1", "--space", "joint", "--budget", str(budget), "--jobs",
            str(config.jobs), "--out", str(config.out_dir / "joint-b1"), "--quiet",
            *(["--baseline", schedule] if schedule != "published" else [])]


def compare_per_batch(config: DemoConfig, batches: list[int], *, plot: bool = True) -> list[dict[str, Any]]:
    """The compare step: one ``tpusim compare`` per batch with that batch's sweep choice
    (:func:`batch_schedule`), the rows joined and plotted together."""
    out = config.out_dir
    rows: list[dict[str, Any]] = []
    for index, batch in enumerate(batches):
        note(f"batch {batch} ({index + 1} of {len(batches)})")
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


COMPILER_PRICED_STEP = "compiler-priced tpu-v7"


def compiler_priced(batches: list[int]) -> dict[str, Any]:
    """K3 on 16 TPU v7 priced by the TPU7x static schedule at ``batches``, its interval from the
    v5e first-principles residuals (:mod:`calibration.reports.tpu_v7_compiler_priced`)."""
    from calibration.reports.tpu_v7_compiler_priced import (
        CompilerPricedConfig,
        interval_note,
        predict,
    )

    rows = predict(CompilerPricedConfig(batches=tuple(batches)))
    return {"rows": [row.model_dump() for row in rows], "interval": interval_note()}


def first_answer(sweep: dict[str, Any], elapsed_s: float) -> list[str]:
    """The demo's first answer, printed as soon as the batch-1 sweep is done: K3's best schedule
    on 16 TPU v7 and its speed-up over the published schedule (both simulated)."""
    best, published = sweep["best"], sweep.get("published") or {}
    speedup = sweep.get("speedup_vs_published")
    against = (f", {speedup:.3f}x the published schedule's {published['predicted_ms']:.3f} ms"
               if speedup is not None and published.get("predicted_ms") is not None else "")
    return [f"Kimi K3 on 16 TPU v7, batch 1 (simulated, {sweep.get('figures') or 'published figures'}):",
            f"  best schedule {best['name']}: {best['predicted_ms']:.3f} ms/step, "
            f"{best['tokens_per_s']:.1f} tokens/s{against}",
            f"  (after {elapsed_s:.0f} s; {sweep['counts']['simulated']} of {sweep['counts']['considered']} candidates "
            "simulated in full; the kernel reads best.json; the demo goes on with the cheaper steps)"]


def _sweep(config: DemoConfig, run: DemoRun, batch: int, progress: Callable[[str], None], *, check: bool) -> StepRecord:
    budget = 8 if config.quick else config.sweep_budget
    # 400 random draws by default, the sweep's 1,200 with --full: estimating the draws is most of a
    # sweep's CPU (~40 ms each); docs/benchmarks.md compares the two picks
    samples = ["--samples", "60" if config.quick else str(config.sweep_samples)] if config.quick or not config.full else []
    compile_check = ["--compile-check", "2"] if check else []
    return _timed(run, f"sweep b{batch}", lambda: run_cli_json([
        "sweep", *K3_TPU, "--batch", str(batch), "--budget", str(budget), "--jobs", str(config.jobs),
        "--out", str(config.out_dir / f"sweep-b{batch}"), "--quiet", *samples, *compile_check]), progress)


def run_demo(config: DemoConfig, progress: Callable[[str], None] = lambda _: None,
             answer: Callable[[str], None] = lambda _: None) -> DemoRun:
    """Run the steps (module docstring); ``answer`` gets the first answer's lines
    (:func:`first_answer`) as soon as it is known, ``progress`` every progress line."""
    from hwmodels.files import LOCAL_DIR_ENV

    started = time.perf_counter()
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    local = demo_local_dir(out)
    if LOCAL_DIR_ENV not in os.environ:
        os.environ[LOCAL_DIR_ENV] = str(local)
        _forget_previous_overlays(local, progress)
    run = DemoRun(config)
    from megakernel.mosaic_compile import libtpu_available

    # --full: batch 1's pick is compiled with Mosaic (~10-20 s); at batch 8 the check would sweep again
    # within what the compiler leaves (minutes: docs/sweep.md), beyond the demo's budget
    compiles = config.full and libtpu_available()
    first = _sweep(config, run, 1, progress, check=compiles)
    if first.ok:
        for line in first_answer(first.data, time.perf_counter() - started):
            answer(line)
    schedule = batch_schedule(out, 1)

    _timed(run, "floor", lambda: run_cli_json(["floor", *K3_TPU, "--batch", "1"]), progress)
    for batch in sorted(set(config.batches_compared) - {1}):  # every batch the compare step shows has its own sweep
        _sweep(config, run, batch, progress, check=False)
    _timed(run, "simulate", lambda: simulate_all(out, schedule), progress)
    if config.full:
        measurements = out / "measurements.jsonl"
        _timed(run, "run-kernel", lambda: run_cli([
            "run-kernel", "--model", "kimi-k3-mini", "--schedule", schedule, "--batch", "1",
            "--steps", str(config.kernel_steps), "--out", str(measurements)]), progress)
    from calibration.commands.demo_measured import STEP, measured_step

    # committed v5e records, re-simulated (seconds; the decoder table too with --full: a minute or two)
    _timed(run, STEP, lambda: measured_step(out, decoders=config.full), progress)
    lowering = _calibrate_and_search(config, run, schedule, progress, compiles=compiles) if config.full else None
    # Megakernel rows at each batch run the schedule that batch's sweep above chose (a row it
    # does not fit falls back to a built-in that fits, and says so): a sweep per row, plan and
    # verify size would take the demo from minutes to an hour. `tpusim compare` alone sweeps per row.
    try:
        _timed(run, "compare", lambda: compare_per_batch(config, config.batches_compared), progress)
    except BaseException:
        if lowering is not None:
            lowering.kill()
        raise
    if lowering is not None:  # its wall time here: what it added after the comparison finished
        _timed(run, "compile joint b1", lambda: finish_lower(lowering), progress)
    # ~20 s, after the first answer: K3 on TPU v7 priced by its compiler, with its interval
    _timed(run, COMPILER_PRICED_STEP, lambda: compiler_priced(config.batches_compared), progress)

    from calibration.commands.demo_report import render_report

    write_text_atomic(out / "report.md", render_report(run, reuse=reuse_line(local) if config.full else ""))
    return run


def _calibrate_and_search(config: DemoConfig, run: DemoRun, schedule: str, progress: Callable[[str], None], *,
                          compiles: bool) -> subprocess.Popen[str] | None:
    """``--full``'s calibrations and deployment search; returns the Mosaic compile of the winner
    started in a process of its own (one core each beside the comparison), or None."""
    out = config.out_dir
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
    winner = out / "joint-b1" / "best.json"
    return start_lower(["--hardware", "tpu-v7", "--schedule", str(winner)]) if compiles and winner.is_file() else None
