"""Measure this host and describe it as a catalog chip named ``host-cpu``.

The simulator's models are only as good as their inputs; the one machine we can always
measure is the one we run on. The probe times three things and reads two more:

1. **Memory copy bandwidth.** ``numpy.copyto`` of a large float64 array, median of several
   copies. Convention: a copy of ``B`` bytes *reads* B and *writes* B, so the reported rate
   is ``2 * B / t`` — read + write bytes per second, the same convention as the H200
   "4.3 TB/s device-to-device copy" in the catalog. The array is sized to at least twice the
   last-level cache (capped at 1/8 of memory) so the copy streams from DRAM; in ``quick``
   mode it is small (32 MiB) and may partly hit cache, which the source then says.
2. **Matmul FLOP/s per dtype** (f32, bf16). A jitted ``jnp.dot`` of two ``n x n`` matrices
   on the JAX CPU backend: one warm-up call (compile), then the median of several timed
   calls; ``2 * n**3 / t``.
3. **Dispatch cost.** A jitted ``x + 1`` on a 4-element array, ``block_until_ready`` each
   time, median over many calls: what one op launch costs through JAX on this host.
4. **Core count and memory size** from the OS (``sched_getaffinity``, ``/proc/meminfo``
   capped by a cgroup ``memory.max``).
5. **L2 size** from ``/sys/devices/system/cpu/cpu*/cache`` (every distinct L2 instance the
   usable CPUs reach, summed).

:func:`probe_host` returns a :class:`~hwmodels.schema.Chip` whose figures are labelled
``measured`` with a source ``"probed on <hostname> <date>: <method>"``; values that cannot
be measured (DMA issue cost, per-layer overhead) are ``assumed`` and say so.
:func:`write_host_entry` saves it atomically as ``<local dir>/host-cpu.yaml``, where
:func:`hwmodels.catalog.list_chips` and ``load_chip("host-cpu")`` find it.

A full probe takes a few seconds (< 20 s); ``quick=True`` uses small sizes and few repeats
(~1–3 s) for tests.
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from hwmodels.atomic import write_text_atomic
from hwmodels.catalog import HOST_CHIP_NAME, chip_to_yaml, local_dir
from hwmodels.schema import Chip
from hwmodels.units import GIB, KIB, MIB

SYS_CPU_DIR = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class ProbeSettings:
    """Sizes and repeat counts; :meth:`for_mode` picks the full or quick set."""

    min_copy_array_bytes: int
    max_copy_array_bytes: int
    copy_repeats: int
    matmul_n: int
    matmul_repeats: int
    dispatch_repeats: int

    @classmethod
    def for_mode(cls, *, quick: bool) -> ProbeSettings:
        if quick:
            return cls(32 * MIB, 32 * MIB, 3, 256, 3, 100)
        return cls(256 * MIB, 1024 * MIB, 5, 1536, 5, 1000)


@dataclass(frozen=True)
class ProbeResult:
    """Raw numbers from one probe run (SI units)."""

    hostname: str
    date: str
    cpu_model: str
    cpu_count: int
    memory_bytes: int
    memory_source: str
    copy_bytes_per_s: float
    copy_array_bytes: int
    copy_repeats: int
    matmul_flops_per_s: dict[str, float]
    matmul_n: int
    matmul_repeats: int
    dispatch_s: float
    dispatch_repeats: int
    l2_bytes: int | None
    l2_source: str
    llc_bytes: int | None
    quick: bool
    elapsed_s: float = field(default=0.0)


# --------------------------------------------------------------------------- OS facts


def usable_cpu_ids() -> list[int]:
    """CPU ids this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def memory_size() -> tuple[int, str]:
    """Usable memory in bytes and where the number came from (MemTotal, cgroup-capped)."""
    total = 0
    source = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                source = "/proc/meminfo MemTotal"
                break
    except OSError:
        pass
    if total == 0:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        source = "sysconf(SC_PHYS_PAGES)"
    try:
        limit_text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit_text.isdigit() and 0 < int(limit_text) < total:
            return int(limit_text), "cgroup memory.max (below MemTotal)"
    except OSError:
        pass
    return total, source


def _parse_size(text: str) -> int:
    """``"2048K"`` -> 2097152 (sysfs cache sizes)."""
    text = text.strip().upper()
    multiplier = {"K": KIB, "M": MIB, "G": GIB}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * multiplier


def cache_sizes(cpu_ids: list[int]) -> dict[int, tuple[int, int]]:
    """level -> (total bytes over distinct instances reachable from ``cpu_ids``, instances).

    Data and unified caches only; an instance shared by several CPUs counts once.
    """
    seen: dict[int, dict[str, int]] = {}
    for cpu in cpu_ids:
        cache_dir = SYS_CPU_DIR / f"cpu{cpu}" / "cache"
        if not cache_dir.is_dir():
            continue
        for index in sorted(cache_dir.glob("index*")):
            try:
                level = int((index / "level").read_text())
                kind = (index / "type").read_text().strip()
                size = _parse_size((index / "size").read_text())
                shared = (index / "shared_cpu_list").read_text().strip()
            except (OSError, ValueError):
                continue
            if kind not in ("Data", "Unified"):
                continue
            seen.setdefault(level, {})[shared] = size
    return {level: (sum(inst.values()), len(inst)) for level, inst in seen.items()}


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


# --------------------------------------------------------------------------- timings


def _median_time_s(call: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure_copy_bandwidth(array_bytes: int, repeats: int) -> float:
    """Read + write bytes per second of ``numpy.copyto`` on ``array_bytes``-byte arrays."""
    elements = max(1, array_bytes // 8)
    source = np.ones(elements, dtype=np.float64)
    destination = np.empty_like(source)
    np.copyto(destination, source)  # warm-up: faults in every destination page
    time_s = _median_time_s(lambda: np.copyto(destination, source), repeats)
    return 2.0 * source.nbytes / time_s


def measure_matmul_flops(dtype_name: str, n: int, repeats: int) -> float:
    """FLOP/s of a jitted ``n x n @ n x n`` matmul in ``dtype_name`` on the JAX CPU backend."""
    import jax
    import jax.numpy as jnp

    dtype = {"f32": jnp.float32, "bf16": jnp.bfloat16}[dtype_name]
    cpu = jax.devices("cpu")[0]
    key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
    a = jax.device_put(jax.random.normal(key_a, (n, n), dtype=dtype), cpu)
    b = jax.device_put(jax.random.normal(key_b, (n, n), dtype=dtype), cpu)
    matmul = jax.jit(jnp.dot)
    matmul(a, b).block_until_ready()  # compile + warm-up
    time_s = _median_time_s(lambda: matmul(a, b).block_until_ready(), repeats)
    return 2.0 * n**3 / time_s


def measure_dispatch_s(repeats: int) -> float:
    """Median seconds for one tiny jitted op through JAX on CPU, including the sync."""
    import jax
    import jax.numpy as jnp

    cpu = jax.devices("cpu")[0]
    x = jax.device_put(jnp.ones((4,), dtype=jnp.float32), cpu)
    add_one = jax.jit(lambda v: v + 1.0)
    for _ in range(10):  # compile + warm caches
        add_one(x).block_until_ready()
    return _median_time_s(lambda: add_one(x).block_until_ready(), repeats)


# --------------------------------------------------------------------------- probe


def run_probe(*, quick: bool = False) -> ProbeResult:
    """Take every measurement; see the module docstring for the methods."""
    start = time.perf_counter()
    settings = ProbeSettings.for_mode(quick=quick)
    cpu_ids = usable_cpu_ids()
    memory_bytes, memory_source = memory_size()
    caches = cache_sizes(cpu_ids)
    l2 = caches.get(2)
    llc_bytes = caches[max(caches)][0] if caches else None
    l2_source = (
        f"{l2[1]} L2 instance(s), {l2[0] // l2[1] // 1024} KiB each, from {SYS_CPU_DIR}/cpu*/cache"
        if l2
        else "no L2 reported in /sys"
    )
    wanted = max(settings.min_copy_array_bytes, 2 * (llc_bytes or 0))
    copy_array_bytes = min(wanted, settings.max_copy_array_bytes, max(memory_bytes // 8, MIB))
    copy_bytes_per_s = measure_copy_bandwidth(copy_array_bytes, settings.copy_repeats)
    matmul = {
        dtype: measure_matmul_flops(dtype, settings.matmul_n, settings.matmul_repeats)
        for dtype in ("f32", "bf16")
    }
    dispatch_s = measure_dispatch_s(settings.dispatch_repeats)
    return ProbeResult(
        hostname=socket.gethostname(),
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        cpu_model=cpu_model_name(),
        cpu_count=len(cpu_ids),
        memory_bytes=memory_bytes,
        memory_source=memory_source,
        copy_bytes_per_s=copy_bytes_per_s,
        copy_array_bytes=copy_array_bytes,
        copy_repeats=settings.copy_repeats,
        matmul_flops_per_s=matmul,
        matmul_n=settings.matmul_n,
        matmul_repeats=settings.matmul_repeats,
        dispatch_s=dispatch_s,
        dispatch_repeats=settings.dispatch_repeats,
        l2_bytes=l2[0] if l2 else None,
        l2_source=l2_source,
        llc_bytes=llc_bytes,
        quick=quick,
        elapsed_s=time.perf_counter() - start,
    )


def chip_from_probe(result: ProbeResult) -> Chip:
    """Describe a probe result as the ``host-cpu`` catalog chip."""
    where = f"probed on {result.hostname} {result.date}"
    copy_note = (
        f"{where}: numpy.copyto of a {result.copy_array_bytes / MIB:.0f} MiB float64 array, "
        f"median of {result.copy_repeats}; counts read + write bytes (2 x array bytes per copy)"
    )
    if result.llc_bytes and result.copy_array_bytes < 2 * result.llc_bytes:
        copy_note += (
            f"; array is under 2x the {result.llc_bytes / MIB:.0f} MiB last-level cache, so "
            "the rate may be cache-inflated"
        )
    if result.quick:
        copy_note += " (quick probe)"
    matmul_note = (
        f"jitted jnp.dot of {result.matmul_n}x{result.matmul_n} matrices on the JAX CPU "
        f"backend, warm-up then median of {result.matmul_repeats}; 2*n^3 FLOP per call"
    )
    dispatch_us = result.dispatch_s * 1e6
    dispatch_note = (
        f"{where}: jitted x+1 on a 4-element array with block_until_ready, median of "
        f"{result.dispatch_repeats} calls ({dispatch_us:.1f} µs)"
    )
    l2_bytes = result.l2_bytes
    l2_figure = (
        {"value": l2_bytes, "source": f"{where}: {result.l2_source}", "label": "measured"}
        if l2_bytes
        else {"value": MIB, "source": "assumed: 1 MiB; the OS reported no L2", "label": "assumed"}
    )
    data = {
        "name": HOST_CHIP_NAME,
        "vendor": "host",
        "kind": "cpu",
        "description": (
            f"{result.cpu_model}; {result.cpu_count} usable CPUs, "
            f"{result.memory_bytes / GIB:.1f} GiB memory"
            + (f", {result.llc_bytes / MIB:.0f} MiB last-level cache" if result.llc_bytes else "")
        ),
        "devices_per_chip": 1,
        "hbm": {
            "capacity_bytes": {
                "value": result.memory_bytes,
                "source": f"{where}: {result.memory_source}",
                "label": "measured",
            },
            "peak_bandwidth_bytes_per_s": {
                "value": result.copy_bytes_per_s,
                "source": f"no published peak for this host; set to the measured copy rate ({copy_note})",
                "label": "measured",
            },
            "sustained_bandwidth_bytes_per_s": {
                "value": result.copy_bytes_per_s,
                "source": copy_note,
                "label": "measured",
            },
        },
        "on_chip": [{"name": "l2", "capacity_bytes": l2_figure}],
        "compute": [
            {
                "name": "cpu",
                "peak_flops_per_s": {
                    dtype: {
                        "value": flops,
                        "source": f"{where}: {dtype} {matmul_note}",
                        "label": "measured",
                    }
                    for dtype, flops in result.matmul_flops_per_s.items()
                },
            }
        ],
        "dma": {
            "issue_latency_s": {
                "value": 1.0e-7,
                "source": "assumed: a CPU has no DMA engine; a core's memcpy starts in ~0.1 µs",
                "label": "assumed",
            },
            "engines": 1,
            "efficient_in_flight": result.cpu_count,
            "concurrency_penalty_per_dma": {
                "value": 0.0,
                "source": "assumed: one copy per core runs without contention",
                "label": "assumed",
            },
        },
        "links": [],
        "execution": {
            "mode": "per_op_launch",
            "launch_overhead_s": {
                "value": result.dispatch_s,
                "source": dispatch_note,
                "label": "measured",
            },
            "per_step_overhead_s": {
                "value": result.dispatch_s,
                "source": f"derived: one jitted step call costs one dispatch ({dispatch_note})",
                "label": "derived",
            },
            "per_layer_overhead_s": {
                "value": 0.0,
                "source": "assumed: per-layer cost is carried by the per-op launches",
                "label": "assumed",
            },
            "per_op_efficiency": {
                "value": 1.0,
                "source": "derived: the compute and copy rates above are achieved rates, not peaks",
                "label": "derived",
            },
        },
    }
    return Chip.model_validate(data)


def probe_host(*, quick: bool = False) -> Chip:
    """Measure this host and return it as the ``host-cpu`` chip (nothing is written)."""
    return chip_from_probe(run_probe(quick=quick))


def host_entry_path() -> Path:
    """Where :func:`write_host_entry` saves: ``<local dir>/host-cpu.yaml``."""
    return local_dir() / f"{HOST_CHIP_NAME}.yaml"


def write_host_entry(chip: Chip) -> Path:
    """Save the probed chip atomically as ``<local dir>/host-cpu.yaml``; returns the path."""
    if chip.name != HOST_CHIP_NAME:
        raise ValueError(f"the host entry must be named {HOST_CHIP_NAME!r}, not {chip.name!r}")
    header = (
        "Machine-local catalog entry written by `tpusim hardware probe` (hwmodels.probe).\n"
        "Measured on this host; re-run the probe rather than editing by hand."
    )
    return write_text_atomic(host_entry_path(), chip_to_yaml(chip, header))
