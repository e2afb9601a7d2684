"""Fixtures shared by the test files.

Every ``heavy`` test is also ``slow`` (:func:`pytest_collection_modifyitems`): a ``-m`` on the
command line replaces the ``-m 'not heavy'`` of ``addopts``, so ``pytest -m "not slow"`` would
otherwise run the heavy 8- and 32-device interpret-mode checks (minutes each).

JAX compiles go to one persistent cache per test run (:func:`_share_jax_compiles`).

``local_dir`` is autouse: every test gets its own empty folder for machine-local catalog
entries and calibrated overlays (``TPUSIM_LOCAL_DIR``), so no test reads or writes the
user's own calibration, and no test sees another test's overlay.
"""

from __future__ import annotations

import os
from pathlib import Path

# libtpu is installed (the test extra: Mosaic compiles from this CPU-only machine); JAX must not
# try to open a TPU here, look up cloud metadata, or refuse a second process on libtpu's lock.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import atexit
import gc
import shutil
import tempfile

import pytest


def _share_jax_compiles() -> None:
    """One persistent JAX compilation cache for the whole run, in a fresh temporary folder.

    The interpret-mode kernel checks each start a fresh process (virtual devices need
    ``XLA_FLAGS`` before JAX starts) and compile the same reference and helper functions again:
    a shared cache measured 15 % less CPU on the multi-device decode tests. The controller
    makes the folder before the pytest-xdist workers start; they and every subprocess inherit
    the variables. Every compile is cached (thresholds 0), nothing is read from an earlier run
    (the folder is new and removed at exit), and a user's own ``JAX_COMPILATION_CACHE_DIR``
    is left as it is. Only XLA's compiled executables are reused, keyed by JAX on the
    program, options and backend: results do not change."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return  # a worker (set by the controller) or the user's own cache
    folder = tempfile.mkdtemp(prefix="tpusim-tests-jax-cache-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


_share_jax_compiles()


# Python's default (700, 10, 10): in the test processes the cyclic collector's own passes were
# 47 % of the CPU of the TPU v5e calibration files run in one process (36.8 of 77.9 s, measured
# with ``gc.callbacks``: 2,181 young, 199 middle and 17 full collections, the full ones slower as
# each worker's heap grows over its ~600 tests). A young collection every 100,000 allocations
# (the middle one every 20 of them) gives 55, 2 and 0: 54.3 s in all, the same peak memory
# (0.94 GB). Reference counting still frees everything acyclic at once; cycles wait a little
# longer. Only the collector's schedule changes, never what a test computes or checks; the
# engine pauses it around its own bursts as before (:mod:`tpusim.collector`). Subprocesses the
# tests start keep Python's default.
TEST_GC_THRESHOLDS = (100_000, 20, 10)
gc.set_threshold(*TEST_GC_THRESHOLDS)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every heavy test slow too: heavy means slower than slow. Then run the longest files
    first (:data:`LONGEST_FILES`, longest first), then the other files that hold a slow test,
    then the rest (each file's tests stay together and in order, so a module fixture is still
    made once per worker): alphabetically the long kernel, calibration and VMEM checks come
    last, and a 1-3 minute test starting near the end leaves the other worker idle; first,
    the many short tests fill in beside them."""
    for item in items:
        if item.get_closest_marker("heavy") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: _file_rank(item.path.name, item.path in slow_files))  # stable within a file


# The files whose default-run tests take longest (``pytest --durations=0``, docs/benchmarks.md: the
# 2026-12-06 23:00 run, seconds summed per file), longest first; the TPU v5e calibration files stay
# together after test_tpu_fixed_cost.py, so that they tend to land on one worker and share its
# per-process caches (``committed_fixed_cost``). pytest-xdist's worksteal gives the first worker the
# front half of the list and lets the other steal from the back: these start first, so no 1-3 minute
# test starts near the end while the other worker has nothing left.
LONGEST_FILES = (
    "test_megakernel_races.py",
    "test_megakernel_kernel.py",
    "test_tpu_fixed_cost.py",
    "test_tpu_v5e_guards.py",
    "test_tpu_v5e_records.py",
    "test_tpu_v5e_decoders.py",
    "test_tpu_v5e_plan.py",
    "test_uncertainty_regression.py",
    "test_demo_consistency.py",
    "test_plan_variants_kernel.py",
    "test_kernel_deployment.py",
    "test_megakernel_multi_device_decode.py",
    "test_vmem_truth.py",
    "test_joint_sweep.py",
    "test_tpu_probes.py",
)


def _file_rank(name: str, slow: bool) -> int:
    """0, 1, ...: the longest files in order; then the other files with a slow test; then the rest."""
    if name in LONGEST_FILES:
        return LONGEST_FILES.index(name)
    return len(LONGEST_FILES) + (0 if slow else 1)


@pytest.fixture(autouse=True)
def local_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty local folder for this test (it may not exist until something writes it)."""
    folder = tmp_path / "local"
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(folder))
    return folder


@pytest.fixture
def speculated_misses():  # type: ignore[no-untyped-def]
    """``count(program, schedule)``: routed-expert copies a speculative schedule mispredicts.

    Written from the rule, not the engine: only an expert the issue plan issues ahead of
    routing is speculated, and of the experts counted ``j = 0, 1, ...`` over the step, those
    where ``floor((j + 1) * rate)`` steps up miss."""
    import math

    from tpusim.schedule.program_issue import program_issue_plan

    def count(program, schedule) -> int:  # type: ignore[no-untyped-def]
        plan = program_issue_plan(program, schedule)
        rate, seen, misses = schedule.speculation_miss_rate, 0, 0
        for op in program.ops:
            if not op.tensors or any(t.family != "routed_expert" for t in op.tensors):
                continue
            steps = math.floor((seen + 1) * rate + 1e-9) > math.floor(seen * rate + 1e-9)
            misses += steps and plan.expert_issue(op.layer, op.expert_index or 0)[1]
            seen += 1
        return misses

    return count


@pytest.fixture(autouse=True)
def _default_signal_handlers():
    """Each test starts with Python's default SIGINT/SIGTERM handlers: a command run in-process
    by an earlier test (or a Dask cluster it started) must not decide how a later test's
    interrupt is delivered."""
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    """With ``TPUSIM_TEST_CPU_LOG=FILE``: append one JSON line per test with the CPU seconds its
    setup, call and teardown took in this process (all threads: XLA's and libtpu's included) and
    in the child processes it waited for (the fresh-process compiles). CPU seconds, unlike
    ``--durations``' wall seconds, hardly move with the machine's load: the suite's profile in
    docs/benchmarks.md is read from them."""
    log = os.environ.get("TPUSIM_TEST_CPU_LOG")
    if not log:
        yield
        return
    import json
    import resource
    import time

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own, wall = time.process_time(), time.perf_counter()
    yield
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = {"test": item.nodeid, "cpu_s": round(time.process_time() - own, 3),
            "children_cpu_s": round(after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime, 3),
            "wall_s": round(time.perf_counter() - wall, 3), "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}
    with open(log, "a", encoding="utf-8") as handle:  # one short line per write: O_APPEND keeps workers' lines whole
        handle.write(json.dumps(line) + "\n")
