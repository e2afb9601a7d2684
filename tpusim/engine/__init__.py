"""The discrete-event engine: one decode step of one device, simulated under a schedule.

``simulate(program, schedule, chip) -> SimResult`` plays the per-device program
(:mod:`tpusim.workload.program`) through a model of the chip built from SimPy pieces. Like SimPy's
gas station — cars (copies) queue for pumps (in-flight DMA slots) and share the station's
fuel line (HBM bandwidth) while a cashier (the compute stream) serves customers in order —
each resource has one job:

- **HBM / DMA** (:mod:`~tpusim.engine.hbm`): copies are issued in consumption order while
  fewer than ``max_dmas_in_flight`` are out; each pays ``dma.issue_latency_s``, then the
  streaming copies share the sustained bandwidth (efficiency falls past
  ``dma.efficient_in_flight``: the concurrency penalty the hardware model declares).
- **VMEM** (:mod:`~tpusim.engine.staging`): buffers are reserved when their copies are
  issued and freed when the op reading them is done; pools (arenas) and rings (buffers per
  tensor kind, expert slots) bound how far ahead copies run. A schedule whose static buffers
  overflow the chip raises :class:`VmemOverflow` naming the moment, layer and buffers.
- **MXU and VPU** (:mod:`~tpusim.engine.stream`): the in-order compute stream, waiting on a
  slab's copies before computing on it (that wait is the *exposed DMA* time).
- **Links** (:mod:`~tpusim.engine.stream`): collectives after ops, blocking or overlapped.
- **Data dependencies**: routed-expert copies wait for routing unless the schedule issues
  them during selection or speculatively (:mod:`~tpusim.engine.build`).
- **Execution mode** (:mod:`~tpusim.engine.execution`): megakernel vs. per-op launch.

Costs are in :mod:`~tpusim.engine.costs`; results in :mod:`~tpusim.engine.result`; the
per-resource timeline for traces and plots in :mod:`~tpusim.engine.timeline`. Seconds and
bytes inside; convert at the edges. The event loop's hot modules may run compiled (Cython, built
by the install from these same files) or interpreted, with the same results:
:mod:`~tpusim.engine.native` chooses (``TPUSIM_ENGINE=interpreted`` forces the interpreted one).
"""

from tpusim.engine import native

native.choose()  # compiled or interpreted: before any engine module is imported (native)

from tpusim.engine.core import VmemOverflow, simulate  # noqa: E402
from tpusim.engine.execution import ExecutionPolicy  # noqa: E402
from tpusim.engine.policy import execution_policy  # noqa: E402
from tpusim.engine.result import BREAKDOWN_KEYS, SimResult  # noqa: E402
from tpusim.engine.timeline import Timeline  # noqa: E402
from tpusim.schedule.vmem import InfeasibleSchedule  # noqa: E402

__all__ = [
    "BREAKDOWN_KEYS",
    "ExecutionPolicy",
    "InfeasibleSchedule",
    "SimResult",
    "Timeline",
    "VmemOverflow",
    "execution_policy",
    "simulate",
]
