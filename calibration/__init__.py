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
4. :mod:`calibration.params` — which figures are fitted, their physical bounds, and an
   identifiability check; :mod:`calibration.fit` — bounded least squares on relative error,
   hold-out and leave-one-out validation, Jacobian uncertainties, the overlay.
5. :mod:`calibration.report` — predicted vs measured tables, MAPE and max error before and
   after, scatter plots, every number labelled.
6. :mod:`calibration.cpu_workload` and :mod:`calibration.cpu_loop` — the closed loop on this
   host: probe, replay programs as jitted XLA steps, measure, fit ``host-cpu``.

The command line is ``tpusim calibrate`` / ``tpusim report`` (:mod:`tpusim.app.cli.calibrate`).
"""
