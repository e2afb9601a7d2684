"""Sweeping prefetch schedules: search a space, rank by estimate, simulate the best, choose.

What a kernel engineer runs first: "of all the ways I could schedule the weight copies for
this model on this system, which is fastest, and why?"

Modules, in the order a sweep uses them:

- :mod:`~tpusim.sweep.space`: the :class:`SweepSpace` (choices for every schedule knob, the
  constraints) and the seeded candidate list;
- :mod:`~tpusim.sweep.prune`: cheap rejection with the static VMEM accounting;
- :mod:`~tpusim.sweep.estimate`: the fast analytic estimate used to rank;
- :mod:`~tpusim.sweep.evaluate`: the engine adapter and the process-pool worker;
- :mod:`~tpusim.sweep.search`: :func:`run_sweep`, the successive-halving search and the
  refine round; :mod:`~tpusim.sweep.defaults` its default sizes;
- :mod:`~tpusim.sweep.progress`: the rich progress bars;
- :mod:`~tpusim.sweep.result`: :class:`SweepResult`, what a sweep found;
- :mod:`~tpusim.sweep.outputs`, :mod:`~tpusim.sweep.report`, :mod:`~tpusim.sweep.plots`:
  ``sweep.csv``, ``summary.md``, ``pareto.png`` and ``sensitivity.png``.

Library use::

    result = run_sweep(model, plan, system, 1, out_dir="sweeps/k3-b1", jobs=2)
    result.best            # the chosen Schedule (also out_dir/best.json)
    result.best_row["predicted_ms"], result.published_row["predicted_ms"]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpusim.sweep.result import SweepResult
    from tpusim.sweep.search import SweepInterrupted, run_sweep
    from tpusim.sweep.space import SweepSpace, default_space

__all__ = ["SweepInterrupted", "SweepResult", "SweepSpace", "default_space", "run_sweep"]

# Imported on first use, so `tpusim --help` (which registers the sweep subcommand and reads
# tpusim.sweep.defaults) does not pay for numpy, the engine and matplotlib.
_LAZY = {"SweepInterrupted": "search", "SweepResult": "result", "run_sweep": "search",
         "SweepSpace": "space", "default_space": "space"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"tpusim.sweep.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'tpusim.sweep' has no attribute {name!r}")
