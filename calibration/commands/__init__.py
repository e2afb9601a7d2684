"""Calibration's ``tpusim`` commands, and the demo that runs every layer.

- ``calibrate`` and ``report`` (:mod:`.calibrate`, with :mod:`.calibrate_kernel`,
  :mod:`.calibrate_stacks`, :mod:`.calibrate_outputs` and the terminal summary
  :mod:`.fit_summary`);
- ``demo`` (:mod:`.demo`; its steps :mod:`.demo_steps`, their record :mod:`.demo_run`, the
  report :mod:`.demo_report`, :mod:`.demo_consistency`, :mod:`.demo_measured`): it runs
  commands of every layer, so it lives on the top floor;
- what ``tpusim`` commands show from this layer: the ``measurement`` format of
  ``tpusim schema`` (:mod:`.schemas`) and the compiler-priced TPU v7 lines under
  ``tpusim compare`` (:mod:`.compare_notes`).

Declared as entry points in ``pyproject.toml`` (groups ``tpusim.commands``,
``tpusim.schemas``, ``tpusim.compare_notes``; :mod:`tpusim.app.plugins`): the command line in
``tpusim/app`` finds them there and imports nothing of this layer. Each module imports
scipy, JAX and the fits inside the functions that run them, so ``tpusim --help`` stays light.
"""
