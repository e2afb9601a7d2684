"""Do simulate, sweep, compare, diff and lower agree on VMEM? (issue 23, "One VMEM truth").

For Kimi K3 on 16 tpu-v7 (plan k3-tp32, 32 devices) at batches 1, 2, 4 and 8 and at 16
speculative verify rows (batch 4 x (3 draft + 1), 4 KV sequences), for the ``published``
schedule and the schedule a reduced sweep chooses (compare's chooser), print the VMEM figure
and the fit verdict each command's library path gives:

| column | library path |
| --- | --- |
| simulate / diff | :func:`tpusim.engine.simulate` (both commands call it through ``simulate_data``): ``vmem_static_bytes``, or ``InfeasibleSchedule`` |
| sweep | :class:`tpusim.sweep.prune.VmemAccountant` + :func:`~tpusim.sweep.prune.check_candidate` |
| compare | :func:`tpusim.compare.schedule_choice._fits` and the row's ``vmem_static_mib`` (``vmem_plan(...).total_bytes``) |
| kernel | :meth:`megakernel.kernel.Megakernel.scratch_bytes` of the K3 TP32 ``CollectiveMegakernel`` (shapes only) |
| lower | with ``--lower``: ``tpusim lower --schedule FILE --batch ROWS --json`` in a subprocess: exit code, verdict |

The kernel has no shared-cache verify mode: at verify rows it keeps one KV cache per row, and
the accounting counts those extra caches too (rule 7 of :mod:`tpusim.schedule.vmem`), so every
column is the same figure at verify rows as well. Run::

    .venv/bin/python benchmarks/vmem_agreement.py            # figures and verdicts, no lowering (~5 min)
    .venv/bin/python benchmarks/vmem_agreement.py --lower    # + tpusim lower of every schedule (slow)

Exit 1 when any two verdicts of a case disagree, or a sweep-chosen schedule does not lower.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from hwmodels.units import MIB

CASES = ((1, 1), (2, 2), (4, 4), (8, 8), (16, 4))  # (rows, KV sequences)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--lower", action="store_true", help="also run tpusim lower for every schedule")
    parser.add_argument("--budget", type=int, default=4, help="full simulations of each reduced sweep")
    parser.add_argument("--samples", type=int, default=30, help="random draws of each reduced sweep")
    args = parser.parse_args(argv)

    from hwmodels.catalog import make_system
    from megakernel.kernel_collectives import CollectiveMegakernel
    from tpusim.compare.schedule_choice import _fits, sweep_chooser
    from tpusim.engine import InfeasibleSchedule, simulate
    from tpusim.schedule.schema import load_schedule
    from tpusim.schedule.vmem import vmem_plan
    from tpusim.sweep.prune import VmemAccountant, check_candidate
    from tpusim.sweep.space import default_space
    from tpusim.workload.model_catalog import load_model, plan_for
    from tpusim.workload.program import build_program
    from tpusim.workload.routing import parse_routing

    model = load_model("kimi-k3")
    system = make_system("tpu-v7", 16)
    chip = system.chip
    plan = plan_for(model, system.devices, devices_per_chip=chip.devices_per_chip)
    capacity = chip.staging_memory.usable_bytes
    space = default_space().with_capacity(capacity, "tpu-v7 usable VMEM")
    choose = sweep_chooser(budget=args.budget, jobs=1, seed=0, out_dir=None, context_tokens=1024,
                           routing=parse_routing("uniform"), samples=args.samples)
    folder = Path(tempfile.mkdtemp(prefix="vmem-agreement-"))
    print(f"kimi-k3 on 16 x tpu-v7 ({plan.name}, {plan.devices} devices), usable VMEM {capacity / MIB:.2f} MiB "
          "(published chip figure); VMEM figures in MiB, each command's verdict (fits / NO)")
    header = (f"{'rows':>4} {'seqs':>4} {'schedule':<34} {'simulate/diff':>15} {'sweep':>13} {'compare':>13} "
              f"{'kernel':>13} {'lower':>18}")
    print(header)
    failures = 0
    for rows, sequences in CASES:
        program = build_program(model, plan, batch=rows, sequences=sequences, context_tokens=1024)
        accountant = VmemAccountant(model, plan, rows, sequences)
        chosen, how = choose(model, plan, system, rows, sequences)
        for role, schedule in (("published", load_schedule("published")), ("sweep-chosen", chosen)):
            try:
                sim = (simulate(program, schedule, chip).vmem_static_bytes, True)
            except InfeasibleSchedule:
                sim = (vmem_plan(schedule, model, plan, rows, sequences).total_bytes, False)
            verdict = check_candidate(schedule, space, accountant)
            sweep = (verdict.vmem_static_bytes, verdict.feasible)
            compare = (vmem_plan(schedule, model, plan, rows, sequences).total_bytes,
                       _fits(schedule, model, plan, chip, rows, sequences))
            scratch = sum(CollectiveMegakernel(model, plan, schedule, rows, 1024).scratch_bytes().values())
            kernel = (scratch, scratch <= capacity)
            lowered = "not run"
            lower_ok = None
            if args.lower:
                path = folder / f"{role}-{rows}-{sequences}.json"
                path.write_text(schedule.model_dump_json())
                done = subprocess.run([str(Path(sys.executable).parent / "tpusim"), "lower", "--schedule", str(path),
                                       "--batch", str(rows), "--json"], capture_output=True, text=True, check=False)
                try:
                    data = json.loads(done.stdout)
                    lowered = f"{data['scratch_total_bytes'] / MIB:.2f} {'fits' if data['fits'] else 'NO'} rc{done.returncode}"
                except json.JSONDecodeError:
                    lowered = f"rc{done.returncode} ({(done.stderr.strip().splitlines() or ['?'])[-1][:40]})"
                lower_ok = done.returncode == 0
            name = f"{role} ({schedule.name})"[:34]
            cells = [f"{size / MIB:9.2f} {'fits' if ok else 'NO':>4}" for size, ok in (sim, sweep, compare, kernel)]
            print(f"{rows:>4} {sequences:>4} {name:<34} {cells[0]:>15} {cells[1]:>13} {cells[2]:>13} {cells[3]:>13} "
                  f"{lowered:>18}")
            verdicts = {sim[1], sweep[1], compare[1], kernel[1]} | ({lower_ok} if lower_ok is not None else set())
            if len({sim[0], sweep[0], compare[0], kernel[0]}) > 1:
                failures += 1
                print("     ^ VMEM figures differ")
            if len(verdicts) > 1:
                failures += 1
                print("     ^ verdicts disagree")
            if role == "sweep-chosen" and (not sim[1] or (lower_ok is False)):
                failures += 1
                print(f"     ^ the sweep chose a schedule that does not fit or lower ({how})")
    print(f"{failures} disagreement(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
