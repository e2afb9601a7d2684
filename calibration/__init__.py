"""Calibration: measurements in, fitted hardware overlays and error reports out.

The pipeline, module by module:

1. :mod:`calibration.measurements` — the :class:`~calibration.measurements.Measurement`
   record (one JSON line per measured configuration), validated reading with file:line
   errors, safe appends and atomic rewrites.
2. Sources: :mod:`calibration.published` (the TPU7x Muse Spark set shipped in ``data/``),
   :mod:`calibration.loaders` (``published:<name>`` or a ``.jsonl`` file, the kernel runner's
   records, which sources may calibrate which chip), :mod:`calibration.profiler`
   (``jax.profiler`` trace-event files → per-kernel durations and step times).
3. :mod:`calibration.predict` — a measurement → model, plan, program, schedule → the engine's
   step time; programs cached so a fit pays only for simulation.
4. :mod:`calibration.core` — the one problem type, solver path and result type every
   procedure uses, and the choice of procedure from the chip and the data;
   :mod:`calibration.params` — which figures are fitted, their physical bounds, and an
   identifiability check; :mod:`calibration.fit` — bounded least squares on relative error,
   hold-out and leave-one-group-out refits, Jacobian uncertainties, the overlay;
   :mod:`calibration.discrepancy` — the model error out of sample and the intervals' coverage;
   :mod:`calibration.inputs` — which data each calibration reads (priors must not cite it).
5. :mod:`calibration.report` — predicted vs measured tables, MAPE and max error before and
   after, scatter plots, every number labelled.
6. :mod:`calibration.cpu_workload` and :mod:`calibration.cpu_loop` — the closed loop on this
   host: probe, replay programs as jitted XLA steps, measure, fit ``host-cpu``.
7. The GPU loop: :mod:`calibration.gpu_bench` (a harness with jax and numpy only, run on the
   lent machine), :mod:`calibration.gpu_workloads` and :mod:`calibration.step_description`
   (what it runs, from the simulator's programs), :mod:`calibration.gpu_ingest` (its output
   home), :mod:`calibration.gpu_fit` (fit on micro-benchmarks, predict whole steps) and
   :mod:`calibration.gpu_transfer` (an H200 figure to another GPU by published ratios).

This file imports nothing on purpose: ``calibration.gpu_bench`` must import on a machine
that has JAX but not pydantic, simpy or scipy.

The command line is ``tpusim calibrate`` / ``tpusim report`` (:mod:`tpusim.app.cli.calibrate`).
"""
