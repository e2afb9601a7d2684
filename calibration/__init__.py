"""Calibration: measurements in, fitted hardware overlays and error reports out.

The pipeline, module by module:

1. :mod:`calibration.sources.measurements` — the :class:`~calibration.sources.measurements.Measurement`
   record (one JSON line per measured configuration), validated reading with file:line
   errors, safe appends and atomic rewrites.
2. Sources: :mod:`calibration.sources.tpu7x_published` (the TPU7x Muse Spark set shipped in ``data/``),
   :mod:`calibration.sources.loaders` (``published:<name>`` or a ``.jsonl`` file, the kernel runner's
   records, which sources may calibrate which chip), :mod:`calibration.sources.profiler`
   (``jax.profiler`` trace-event files → per-kernel durations and step times).
3. :mod:`calibration.sources.predict` — a measurement → model, plan, program, schedule → the engine's
   step time; programs cached so a fit pays only for simulation.
4. :mod:`calibration.core.result` — the one problem type, solver path and result type every
   procedure uses, and the choice of procedure from the chip and the data;
   :mod:`calibration.core.parameters` — which figures are fitted, their physical bounds, and an
   identifiability check; :mod:`calibration.sources.step_times` — bounded least squares on relative error,
   hold-out and leave-one-group-out refits, Jacobian uncertainties, the overlay;
   :mod:`calibration.core.model_error` — the model error out of sample and the intervals' coverage;
   :mod:`calibration.sources.inputs` — which data each calibration reads (priors must not cite it).
5. :mod:`calibration.reports.fit_report` — predicted vs measured tables, MAPE and max error before and
   after, scatter plots, every number labelled.
6. :mod:`calibration.sources.cpu_workload` and :mod:`calibration.sources.cpu_loop` — the closed loop on this
   host: probe, replay programs as jitted XLA steps, measure, fit ``host-cpu``.
7. The GPU loop: :mod:`calibration.gpu_bench` (a harness with jax and numpy only, run on the
   lent machine), :mod:`calibration.sources.gpu_workloads` and :mod:`calibration.sources.step_description`
   (what it runs, from the simulator's programs), :mod:`calibration.sources.gpu_ingest` (its output
   home), :mod:`calibration.sources.gpu_micro` (fit on micro-benchmarks, predict whole steps) and
   :mod:`calibration.sources.gpu_transfer` (an H200 figure to another GPU by published ratios).

This file imports nothing on purpose: ``calibration.gpu_bench`` must import on a machine
that has JAX but not pydantic, simpy or scipy.

The command line is ``tpusim calibrate`` / ``tpusim report`` (:mod:`tpusim.app.cli.calibrate`).
"""
