"""Python's cyclic garbage collector paused around allocation bursts that free nothing.

Lowering and running a step (:mod:`tpusim.engine.core`) and building an issue plan
(:mod:`tpusim.schedule.program_issue`) each allocate tens of thousands of long-lived, acyclic
objects (copies, buffers, pieces, plan tuples); their allocation bursts trigger generational
collections that scan the whole heap again without freeing anything (measured: a third of the
engine time at batch 8; 10.5 of the 34.5 s CPU of a budget-300 K3 joint sweep's simulations in
one process). Reference counting still frees everything acyclic at once; the few cycles (SimPy
processes) go at the next collection after.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector; its previous state is restored after (nested pauses keep it
    off until the outermost ends)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
