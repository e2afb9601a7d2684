"""The compiled engine against the interpreted one: every simulated number equal, to the bit.

The install compiles the event loop's hot modules with Cython (``setup.py``,
:mod:`tpusim.engine.native`); the ``.py`` files stay the source and the reference. This test
runs the same cases in this process (compiled) and in a subprocess with
``TPUSIM_ENGINE=interpreted`` and requires every ``SimResult`` field ``==`` (floats exact, the
engine's event count too; a refused schedule's message), and, where recorded, every timeline
interval and kernel event. Cases: K3 and its mini, TPU v7 (shared copy engine, collectives as
messages) and TPU v5e (copies in issue order), batch 1 and 8, the built-in schedules, the
lowered step fresh and kept (:mod:`tpusim.engine.reuse`), the reference event-by-event loop
once. Skipped where this process does not run the compiled engine (no build: no C compiler or
no Cython at install time; a stale build; ``TPUSIM_ENGINE=interpreted``).

Also: which engine :mod:`tpusim.engine.native` picks from the files (a stale or partial build
is never used), and ``TPUSIM_ENGINE=interpreted``. Run as a script, this file prints the cases'
results (pickled) for the subprocess.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.machinery
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_programs import program_on

from tpusim.engine import InfeasibleSchedule, native, simulate
from tpusim.schedule.schema import load_schedule

ROOT = Path(__file__).resolve().parents[1]

# (model, hardware, batch, schedule, options): each run twice (fresh, then the kept lowered step)
CASES: tuple[tuple[str, str, int, str, str], ...] = (
    ("kimi-k3", "tpu-v7", 1, "published", ""),
    ("kimi-k3", "tpu-v7", 8, "published", ""),
    ("kimi-k3", "tpu-v7", 1, "k3-ring", ""),
    ("kimi-k3", "tpu-v5e", 1, "published", ""),
    ("kimi-k3", "tpu-v5e", 8, "naive", ""),
    ("kimi-k3-mini", "tpu-v7", 1, "naive", ""),
    ("kimi-k3-mini", "tpu-v7", 8, "layer-double-buffer", ""),
    ("kimi-k3-mini", "tpu-v7", 8, "k3-ring", "timeline"),
    ("kimi-k3-mini", "tpu-v5e", 1, "published", "timeline"),
    ("kimi-k3-mini", "tpu-v5e", 8, "published", "event_by_event"),
    ("kimi-k3-mini", "tpu-v5e", 8, "layer-double-buffer", "no_capacity_check"),
)



def _everything(model: str, hardware: str, batch: int, schedule: str, options: str) -> object:
    """Every simulated number of one case (a refused one: its message)."""
    program, chip = program_on(model, hardware, batch)
    try:
        result = simulate(program, load_schedule(schedule), chip, record_timeline=options == "timeline",
                          event_by_event=options == "event_by_event",
                          check_capacity=options != "no_capacity_check")
    except InfeasibleSchedule as error:
        return f"infeasible: {error}"
    out: dict[str, Any] = dataclasses.asdict(dataclasses.replace(result, timeline=None, events=None))
    out["timeline"] = None if result.timeline is None else dataclasses.asdict(result.timeline)
    out["events"] = result.events
    return out


def results() -> list[object]:
    """The cases' results, each case fresh and then again (the kept lowered step, reset)."""
    return [_everything(*case) for case in CASES for _ in range(2)]


@pytest.mark.skipif(native.ENGINE != "compiled",
                    reason=f"the compiled engine is not in use here ({native.REASON}): install with a C "
                           "compiler and Cython (pip install -e .) to build it")
def test_compiled_engine_equals_interpreted_exactly() -> None:
    env = {**os.environ, "TPUSIM_ENGINE": "interpreted",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, check=True)
    interpreted = pickle.loads(done.stdout)
    compiled = results()
    assert len(compiled) == len(interpreted) == 2 * len(CASES)
    for index, (mine, theirs) in enumerate(zip(compiled, interpreted, strict=True)):
        assert mine == theirs, CASES[index // 2]
    # the cases ran something: refusals are results too, but not all of them
    assert sum(isinstance(result, dict) for result in compiled) >= len(compiled) - 4


if __name__ == "__main__":
    assert native.ENGINE == "interpreted", native.description()
    sys.stdout.buffer.write(pickle.dumps(results()))


def _fake_build(folder: Path, modules: tuple[str, ...], record: bool = True) -> None:
    """Sources for every engine module, an (empty) extension file for each of ``modules``,
    and the build's record of their hashes."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    built = {}
    for module in native.ENGINE_MODULES:
        (folder / f"{module}.py").write_text(f"# {module}\n")
        if module in modules:
            (folder / f"{module}{suffix}").write_bytes(b"")
            built[module] = {"file": f"{module}{suffix}",
                             ".py": hashlib.sha256(f"# {module}\n".encode()).hexdigest()}
    if record:
        (folder / "_compiled.json").write_text(json.dumps({"cython": "3.x", "modules": built}))


def test_a_stale_or_partial_build_is_never_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """native's decision from the files alone (no module imported): no build, a complete one
    whose hashes match, then each way of being out of date."""
    monkeypatch.setattr(native, "HERE", tmp_path)
    monkeypatch.setattr(native, "RECORD", tmp_path / "_compiled.json")
    _fake_build(tmp_path, ())
    assert native._compiled_state()[0] == "absent"
    _fake_build(tmp_path, native.ENGINE_MODULES)
    assert native._compiled_state()[0] == "compiled"
    (tmp_path / "hbm.py").write_text("# hbm, edited\n")
    assert native._compiled_state() == ("stale", "hbm.py changed after it was compiled")
    _fake_build(tmp_path, native.ENGINE_MODULES)
    (tmp_path / "staging.pxd").write_text("# a declaration added since\n")
    assert native._compiled_state() == ("stale", "staging.pxd changed after it was compiled")
    (tmp_path / "staging.pxd").unlink()
    record = json.loads((tmp_path / "_compiled.json").read_text())
    record["modules"]["loop"]["file"] = "loop.cpython-399-other.so"  # another interpreter's build
    (tmp_path / "_compiled.json").write_text(json.dumps(record))
    assert native._compiled_state()[0] == "stale"
    (tmp_path / "_compiled.json").unlink()
    assert native._compiled_state()[0] == "stale"
    for path in tmp_path.iterdir():
        path.unlink()
    _fake_build(tmp_path, native.ENGINE_MODULES[:2])
    assert native._compiled_state()[0] == "partial"


def test_the_environment_variable_forces_the_interpreted_engine() -> None:
    env = {**os.environ, "TPUSIM_ENGINE": "interpreted",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    code = ("import tpusim.engine.hbm as hbm; from tpusim.engine import native; "
            "print(native.description(), hbm.__file__.endswith('.py'))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "engine: interpreted (TPUSIM_ENGINE=interpreted) True"
