"""The megakernel's ``tpusim`` commands: ``run-kernel`` (:mod:`.run_kernel`), ``lower``
(:mod:`.lower`) and the Mosaic check behind ``tpusim sweep --compile-check``
(:mod:`.sweep_compile`).

Declared as entry points in ``pyproject.toml`` (groups ``tpusim.commands`` and
``tpusim.compile_checks``, :mod:`tpusim.app.plugins`): the command line in ``tpusim/app``
finds them there and imports nothing of this layer. Each module imports the kernel inside
the functions that run it, so ``tpusim --help`` stays light.
"""
