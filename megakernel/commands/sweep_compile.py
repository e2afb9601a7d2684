"""``tpusim sweep --compile-check N``: choose the fastest simulated schedule Mosaic compiles.

The simulator's VMEM accounting counts the kernel's scratch; the compiler also keeps the
register allocator's spill slots and a little scratch of its own, which depend on the
kernel's body and the batch, not on the schedule's arenas (K3 TP32 on TPU7x at batch 8: 8.1
MiB beside 57.6 MiB of scratch, [multi-device.md](../../../docs/multi-device.md)). A sweep's
fastest schedule can therefore fit the accounting and still be refused. With
``--compile-check N`` the sweep compiles its simulated rows with libtpu's Mosaic, fastest
first (:func:`megakernel.commands.lower.mosaic_report`, a fresh process each, no TPU needed), and
chooses the first that compiles, at most N compiles. After a refusal on VMEM it learns what
the compiler kept beside the accounting (its "used" figure less that candidate's accounting:
measured in this run, not a table) and skips, without compiling, a later candidate whose
accounting plus that exceeds the compiler's capacity; a later refusal can only raise it.

A search that only knew the catalog's usable VMEM may have simulated nothing small enough,
so after a refusal on VMEM the first sweep stops compiling and the sweep runs again in
``<out>/within-compiler-vmem/`` on the chip with its usable VMEM set to what the compiler
leaves (the capacity less what it kept, labelled measured: this run's refusal), whose
simulated rows are compiled in turn (:func:`resweep`). Its compiled pick becomes
``<out>/best.json``; the first sweep's refused pick is kept as ``best-refused-by-mosaic.json``.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwmodels.errors import InputError
from hwmodels.units import MIB

MESH_DEVICES = (8, 16, 32)  # TPU7x compile-only topologies with collectives (megakernel.mosaic_compile)


def compile_check(args: argparse.Namespace, system: Any, plan: Any, compiles: int) -> MosaicCheck:
    """The ``mosaic`` entry point of group ``tpusim.compile_checks`` (what ``tpusim sweep
    --compile-check N`` runs): InputError unless it can compile here (:func:`check_possible`),
    else the acceptor that compiles at most ``compiles`` rows."""
    check_possible(args, system, plan)
    return MosaicCheck(args, system, plan, compiles)


def check_possible(args: argparse.Namespace, system: Any, plan: Any) -> None:
    """InputError unless ``--compile-check`` can compile this workload's kernel here."""
    from megakernel.mosaic_compile import TOPOLOGIES, libtpu_available

    family = system.chip.name.partition("@")[0]
    devices = program_devices(args, plan)
    if args.weight_banks and (args.weight_banks < 0 or devices != 1):
        raise InputError(f"--weight-banks {args.weight_banks}: a count >= 0, for the one-device program of "
                         "--shard-of")
    if args.space == "joint":
        raise InputError("--compile-check: schedule sweeps only (a joint sweep's pick: tpusim lower --schedule "
                         "best.json --hardware tpu-v7)")
    if system.chip.kind != "tpu":
        raise InputError(f"--compile-check: {system.chip.name} is not a TPU; Mosaic compiles TPU kernels")
    if not libtpu_available():
        raise InputError("--compile-check: libtpu is not installed (pip install -e '.[tpu-compile]')")
    if devices == 1 and family not in TOPOLOGIES:
        raise InputError(f"--compile-check: no Mosaic compile topology for {system.chip.name} (one of "
                         + ", ".join(TOPOLOGIES) + ")")
    if devices > 1 and (family != "tpu-v7" or devices not in MESH_DEVICES):
        raise InputError(f"--compile-check: the collective kernel on {devices} devices compiles only on "
                         f"tpu-v7 with {', '.join(map(str, MESH_DEVICES))} devices")


def program_devices(args: argparse.Namespace, plan: Any) -> int:
    """Devices of the program the kernel runs: 1 for ``--shard-of`` (one device's program)."""
    return 1 if getattr(args, "shard_of", None) else plan.devices


class MosaicCheck:
    """An acceptor for :func:`tpusim.sweep.run_sweep`: (schedule, row) -> (compiles, what happened);
    None for a row passed over without a compile."""

    def __init__(self, args: argparse.Namespace, system: Any, plan: Any, compiles: int) -> None:
        self.args, self.chip, self.plan = args, system.chip.name, plan
        self.compiles_left = compiles
        self.beside_bytes: float | None = None  # what the compiler kept beside the accounting (learned)
        self.capacity_bytes = 0.0
        self.learned_from = ""
        self.folder = Path(tempfile.mkdtemp(prefix="tpusim-compile-check-"))
        self.stop_after_learning = True  # the first sweep: after a VMEM refusal, sweep again (resweep)
        self.refusal = ""  # the refusal the usable figure was learned from

    @property
    def learned(self) -> bool:
        return self.beside_bytes is not None

    @property
    def usable_bytes(self) -> float:
        """What the compiler leaves for the kernel's scratch, as the accounting counts it."""
        return self.capacity_bytes - (self.beside_bytes or 0.0)

    def __call__(self, schedule: Any, row: dict[str, Any]) -> tuple[bool | None, str]:
        if self.learned and self.stop_after_learning:
            return None, f"not compiled: swept again within the VMEM the compiler leaves ({SECOND_PASS}/)"
        accounting_mib = row.get("vmem_static_mib")
        if self.beside_bytes is not None and accounting_mib is not None \
                and accounting_mib * MIB + self.beside_bytes > self.capacity_bytes:
            return None, (f"not compiled: {accounting_mib:.2f} MiB + the {self.beside_bytes / MIB:.2f} the compiler "
                           f"kept beside {self.learned_from}'s scratch > {self.capacity_bytes / MIB:.2f} MiB")
        if self.compiles_left <= 0:
            return None, "not compiled: the --compile-check budget is spent"
        self.compiles_left -= 1
        return self._compile(schedule, row)

    def _compile(self, schedule: Any, row: dict[str, Any]) -> tuple[bool, str]:
        from megakernel.commands.lower import mosaic_report
        from tpusim.schedule.schema import save_schedule

        path = self.folder / f"{row['hash']}.json"
        save_schedule(schedule, path)
        report = mosaic_report(model=self.args.model, schedule_path=str(path), batch=self.args.batch,
                               context=self.args.context, chip_name=self.chip, devices=program_devices(self.args, self.plan),
                               shard_of=getattr(self.args, "shard_of", None),
                               weight_banks=getattr(self.args, "weight_banks", 0))
        if "error" in report:
            return False, f"the kernel cannot follow it: {report['message']}"
        compiled = report.get("compile") or {}
        where = f"{self.chip} ({compiled.get('topology', '?')})"
        if compiled.get("ok"):
            return True, f"compile-checked: Mosaic compiled it for {where} in {compiled['seconds']:.1f} s"
        from megakernel.mosaic_compile import vmem_used_bytes

        error = compiled.get("error") or "no error text"
        used = vmem_used_bytes(error)
        if compiled.get("kind") == "vmem" and used:
            return False, self._learn(used, sum(report["accounting_bytes"].values()), row["name"], where)
        return False, f"refused by Mosaic for {where}: {error.splitlines()[0][:240]}"

    def resweep(self, first: Any, sweep_into: Callable[[Path, Any], Any], system: Any, out: Path) -> Any:
        """After a refusal on VMEM (:attr:`learned`): the second sweep, :func:`resweep`."""
        return resweep(first, self, sweep_into, system, out)

    def _learn(self, used: tuple[int, int], accounting_bytes: float, name: str, where: str) -> str:
        used_bytes, capacity = used
        beside = used_bytes - accounting_bytes
        note = (f"refused by Mosaic for {where} on VMEM: {used_bytes / MIB:.2f} MiB used of {capacity / MIB:.2f} "
                f"({beside / MIB:.2f} MiB beside the {accounting_bytes / MIB:.2f} the accounting counts)")
        if self.beside_bytes is None or beside > self.beside_bytes:
            self.beside_bytes, self.learned_from, self.refusal = beside, name, f"{name}: {note}"
        self.capacity_bytes = capacity
        return note


SECOND_PASS = "within-compiler-vmem"
REFUSED_BEST = "best-refused-by-mosaic.json"


def within_compiler_vmem(system: Any, check: MosaicCheck) -> Any:
    """``system`` with its chip's usable VMEM set to what the compiler leaves (measured)."""
    from hwmodels.schema import Figure

    chip = system.chip
    staging = chip.staging_memory
    figure = Figure(value=check.usable_bytes, label="measured",
                    source=f"what Mosaic leaves this kernel at this batch: its capacity less what it kept beside the "
                    f"accounted scratch when it refused {check.refusal}")
    tiers = [t.model_copy(update={"usable_capacity_bytes": figure}) if t is staging else t for t in chip.on_chip]
    return system.model_copy(update={"chip": chip.model_copy(update={"on_chip": tiers})})


def resweep(first: Any, check: MosaicCheck, sweep_into: Callable[[Path, Any], Any], system: Any, out: Path) -> Any:
    """The second sweep (module docstring) -> its result, whose compiled pick is ``out/best.json``
    (the first sweep's pick kept as :data:`REFUSED_BEST`, a section added to its summary)."""
    from hwmodels.atomic import write_text_atomic
    from tpusim.schedule.schema import save_schedule

    check.stop_after_learning = False
    second = sweep_into(out / SECOND_PASS, within_compiler_vmem(system, check))
    save_schedule(first.best, out / REFUSED_BEST)
    verdict = "no schedule compiled there either: `best.json` stays the first sweep's simulated best, unchecked"
    if not second.check_failed:
        save_schedule(second.best, out / "best.json")
        second.paths["best"] = out / "best.json"
        verdict = (f"`best.json` is now its compiled pick, `{second.best.name}` "
                   f"({second.best_row['predicted_ms']:.4f} ms/step, simulated)")
    summary = out / "summary.md"
    text = summary.read_text() if summary.is_file() else ""
    write_text_atomic(summary, text + "\n".join([
        "", "## Swept again within the VMEM the compiler leaves", "",
        f"Mosaic refused {check.refusal}. The sweep ran again with the chip's usable VMEM at "
        f"{check.usable_bytes / MIB:.2f} MiB (measured: {check.capacity_bytes / MIB:.2f} less "
        f"{(check.beside_bytes or 0.0) / MIB:.2f}) in [{SECOND_PASS}/]({SECOND_PASS}/summary.md); {verdict}. "
        f"This sweep's pick: `{REFUSED_BEST}`.", ""]))
    return second

