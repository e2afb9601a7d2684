"""The megakernel's command-line tools; the kernel's library modules carry none.

``tpusim`` commands: ``run-kernel`` (:mod:`.run_kernel`), ``lower`` (:mod:`.lower`) and the
Mosaic check behind ``tpusim sweep --compile-check`` (:mod:`.sweep_compile`). Declared as entry
points in ``pyproject.toml`` (groups ``tpusim.commands`` and ``tpusim.compile_checks``,
:mod:`tpusim.app.plugins`): the command line in ``tpusim/app`` finds them there and imports
nothing of this layer. Each module imports the kernel inside the functions that run it, so
``tpusim --help`` stays light.

Checks run as ``python -m megakernel.commands.NAME``, each in a fresh process (virtual devices
or libtpu's environment must be set before JAX starts), each printing JSON:

- :mod:`.race_check`: the kernel under the interpreter's race detector;
- :mod:`.multi_device_check`: the collective program on N virtual devices;
- :mod:`.collective_check`: the schedule-driven kernel with collectives against the reference;
- :mod:`.decode_check`: the multi-device K3 decode against the single-device reference;
- :mod:`.lower_check`: the kernel lowered (and, with ``--compile``, Mosaic-compiled) on a plan;
- :mod:`.mosaic_compile`: one device's kernel compiled by libtpu's Mosaic for a chip;
- :mod:`.chip_numerics`: the logits against the reference on a TPU, by depth, and their verdicts;
- :mod:`.reference_spread`: how far the reference moves under one-ulp f32 noise.
"""
