"""Golden results: every number ``tpusim simulate --json`` prints over a matrix of models,
systems, built-in schedules and batches, to prove a refactor changes no result.

Run::

    .venv/bin/python benchmarks/golden_results.py --out /tmp/before.json      # before the change
    (change the code)
    .venv/bin/python benchmarks/golden_results.py --check /tmp/before.json    # after: exit 1 on a difference

The matrix: Kimi K3 on 16 tpu-v7, Muse Spark (nvfp4+int8 and int4+bf16) on 4 tpu-v7, every
built-in schedule (``naive``, ``published``, ``layer-double-buffer``, ``k3-ring``,
``muse-published``) at batch 1, 8 and 32; the other catalog models on one or two tpu-v7 at
batch 1 and 8; K3 and Qwen3.5 on gb200, b200 and h100 (GPU stacks). Published figures only
(``--uncalibrated``); a case that is refused keeps its one-line error, so an error that
changes is a difference too. Numbers compare to ``--rel-tol`` (default 1e-9) relative; the
``source`` line is left out (it names file paths) and ``event_count`` is not compared (the
engine's own cost, not a result). About 45 s on an idle 2-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

from tpusim.app.cli import main as cli

SCHEDULES = ("naive", "published", "layer-double-buffer", "k3-ring", "muse-published")
OTHER_MODELS = (("qwen3.5-35b-a3b-fp8", 1), ("llama-3.1-8b", 1), ("qwen3-30b-a3b", 2), ("kimi-k3-mini", 1),
                ("kimi-k3-draft", 1))
GPUS = (("gb200", 16), ("b200", 8), ("h100", 8))
# Not results: how many events the engine queued is a diagnostic of its own cost (speed work
# drops events that changed no time, e.g. the SimPy process's start/end; tpusim.engine.result).
DIAGNOSTIC_KEYS = frozenset({"event_count"})


def cases() -> list[tuple[str, str, int, str, int]]:
    out = [(model, "tpu-v7", chips, schedule, batch) for schedule in SCHEDULES for batch in (1, 8, 32)
           for model, chips in (("kimi-k3", 16), ("muse-spark", 4), ("muse-spark@int4+bf16", 4))]
    out += [(model, "tpu-v7", chips, "published", batch) for model, chips in OTHER_MODELS for batch in (1, 8)]
    out += [(model, gpu, chips if model == "kimi-k3" else 1, "published", batch) for gpu, chips in GPUS
            for batch in (1, 8) for model in ("kimi-k3", "qwen3.5-35b-a3b-fp8")]
    return out


def simulate(model: str, hardware: str, chips: int, schedule: str, batch: int) -> dict[str, Any]:
    argv = ["simulate", "--model", model, "--hardware", hardware, "--chips", str(chips), "--schedule", schedule,
            "--batch", str(batch), "--uncalibrated", "--json", "--force"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli(argv)
    if not out.getvalue().strip():
        return {"exit": code, "error": err.getvalue().strip()}
    data = json.loads(out.getvalue())
    data.pop("source", None)
    return data


def differences(before: Any, after: Any, rel_tol: float, path: str = "") -> list[str]:
    """Where two result trees differ (numbers: by more than ``rel_tol`` relative). A key the
    new results add is not a difference (new output); a key they lose is."""
    if isinstance(before, dict) and isinstance(after, dict):
        if set(before) - set(after):
            return [f"{path}: lost keys {sorted(set(before) - set(after))}"]
        return [line for key in before if key not in DIAGNOSTIC_KEYS
                for line in differences(before[key], after[key], rel_tol, f"{path}/{key}")]
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return [f"{path}: {len(before)} != {len(after)} entries"]
        return [line for i, (b, a) in enumerate(zip(before, after, strict=True))
                for line in differences(b, a, rel_tol, f"{path}[{i}]")]
    numbers = (int, float)
    if isinstance(before, numbers) and isinstance(after, numbers) and not isinstance(before, bool):
        return [] if math.isclose(before, after, rel_tol=rel_tol, abs_tol=1e-15) else [f"{path}: {before!r} -> {after!r}"]
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    parser.add_argument("--check", type=Path, help="compare with results written before")
    parser.add_argument("--rel-tol", type=float, default=1e-9)
    args = parser.parse_args()
    results = {f"{model}|{hardware}:{chips}|{schedule}|b{batch}": simulate(model, hardware, chips, schedule, batch)
               for model, hardware, chips, schedule, batch in cases()}
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str))
    if args.check:
        found = differences(json.loads(args.check.read_text()), json.loads(json.dumps(results, default=str)),
                            args.rel_tol)
        print("\n".join(found[:40]) if found else f"{len(results)} cases: every number within {args.rel_tol:g} "
              f"relative of {args.check}")
        return 1 if found else 0
    print(f"{len(results)} cases written to {args.out}" if args.out else f"{len(results)} cases simulated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
