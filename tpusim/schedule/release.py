"""When a routed expert's copy is released: the rules the engine and the estimate share.

The issue plan (:mod:`tpusim.schedule.issue_plan`) says at which op a copy is issued; for
routed experts released by their layer's routing decision, the schedule's ``expert_issue``
says *when* within that decision:

- ``after_routing``: as the routing op (``moe.topk``) ends;
- ``during_selection``: the selection finds the layer's winners one by one, so winner ``k``
  of ``n`` is released when :func:`selection_fraction` of the selection's vector work is
  done;
- ``speculative``: at the op the plan names, ahead of routing; a deterministic fraction
  ``speculation_miss_rate`` of those copies are mispredicted (:func:`is_mispredicted`): the
  wasted copy holds a slot until it lands and routing is known, and the right expert is
  fetched when the routing op ends.

Refills (slab ``k >= buffers`` issued inside its consumer) are the issue plan's
``refills``, read by both.
"""

from __future__ import annotations

import math

# Floor guard: k * rate computed in floating point may land a hair under an integer.
_MISS_EPS = 1e-9


def is_mispredicted(experts_before: int, miss_rate: float) -> bool:
    """Whether the speculative copy of the step's expert number ``experts_before`` (0-based,
    counted over the whole step) is a miss: exactly ``floor(n * rate)`` of the first ``n``
    experts are, spread evenly (deterministic, so a result does not depend on a seed)."""
    if not miss_rate:
        return False
    return math.floor((experts_before + 1) * miss_rate + _MISS_EPS) > math.floor(experts_before * miss_rate + _MISS_EPS)


def selection_fraction(winner: int, winners: int) -> float:
    """Fraction of the selection's work done when winner ``winner`` (0-based) of ``winners``
    is known: its copy is released then (``during_selection``)."""
    return (winner + 1) / max(1, winners)
