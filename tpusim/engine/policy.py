"""Which execution policy a chip gets: the one place that chooses between TPU/host and GPU.

:mod:`tpusim.engine.execution` holds the policy type and the two generic modes;
:mod:`tpusim.engine.gpu` refines them for GPU chips. This module sits above both so that
neither imports the other's caller (no import circle).
"""

from __future__ import annotations

from hwmodels.schema import Chip
from tpusim.engine.execution import ExecutionPolicy, base_policy
from tpusim.engine.gpu import gpu_policy


def execution_policy(chip: Chip) -> ExecutionPolicy:
    """The policy for ``chip`` (see :mod:`tpusim.engine.execution`'s table)."""
    if chip.kind == "gpu":
        return gpu_policy(chip)
    return base_policy(chip)
