"""Calibration: measurements in, fitted hardware overlays, intervals and error reports out.

Four folders by role, imports pointing down only (``tests/test_layers.py`` checks it):

``commands/``
    this layer's ``tpusim`` commands, found by the command line through entry points
    (:mod:`tpusim.app.plugins`): ``calibrate``, ``report`` and ``demo`` (it runs every
    layer), the ``measurement`` topic of ``tpusim schema`` and the compiler-priced lines
    under ``tpusim compare`` (:mod:`calibration.commands`).
``reports/``
    what a fit looks like to a reader: predicted-vs-measured tables and scatter plots
    (:mod:`~calibration.reports.fit_report`), the checks that refuse a fit
    (:mod:`~calibration.reports.trust`), the table of calibratable figures
    (:mod:`~calibration.reports.explain`, ``tpusim calibrate --explain``).
``sources/``
    one module per kind of measurement, each turning its data into a
    :class:`calibration.core.Problem` and reading back the solution:
    published TPU7x step times (:mod:`~calibration.sources.tpu7x_published`,
    :mod:`~calibration.sources.step_times`), TPU component measurements and the
    stage-by-stage TPU calibration (:mod:`~calibration.sources.tpu_components`,
    :mod:`~calibration.sources.tpu_stages`, :mod:`~calibration.sources.tpu_calibration`),
    the GPU serving stack's published split (:mod:`~calibration.sources.gpu_stack`), the
    published K3 rows on B300 (:mod:`~calibration.sources.k3_b300`), GPU micro-benchmarks
    (:mod:`~calibration.sources.gpu_micro`, with :mod:`~calibration.sources.gpu_ingest`,
    :mod:`~calibration.sources.gpu_workloads`, :mod:`~calibration.sources.step_description`,
    :mod:`~calibration.sources.profiler`, :mod:`~calibration.sources.gpu_transfer`), the host
    CPU loop (:mod:`~calibration.sources.cpu_loop`, :mod:`~calibration.sources.cpu_workload`);
    shared by them: the measurement record (:mod:`~calibration.sources.measurements`,
    :mod:`~calibration.sources.loaders`), the engine's prediction of a record
    (:mod:`~calibration.sources.predict`), hold-out splits and groups
    (:mod:`~calibration.sources.splits`), format contrasts, the fitted range, which data
    each calibration reads (:mod:`~calibration.sources.inputs`); and the one door, the registry of
    every source (:mod:`~calibration.sources.registry`: recognise, load, fit through the
    core, overlay through the one builder), which also picks the procedure a chip and its
    data get.
``core/``
    the fit and its statistics, knowing nothing of any source: the parameter table, the one
    solver, covariance, leave-one-group-out, model error and coverage, interval samples,
    the result type (:mod:`calibration.core`).

Beside them: ``data/`` (the committed published sets) and ``gpu_bench/`` (a device
harness that ships with the package and needs only JAX and numpy).

This file imports nothing on purpose: ``calibration.gpu_bench`` must import on a machine
that has JAX but not pydantic, simpy or scipy.

The command line is ``tpusim calibrate`` / ``tpusim report`` (:mod:`calibration.commands.calibrate`),
declared in ``pyproject.toml`` (``[project.entry-points."tpusim.commands"]``).
"""
