"""The record layer: what every measurement harness and every reader of its files shares.

Three modules, one concept each, plain dataclasses and the standard library only (no
pydantic, YAML, NumPy or JAX), so the device harnesses (``calibration.gpu_bench`` on a GPU
host with only JAX, ``calibration.tpu_bench`` on a TPU) import them with nothing else of
the house installed (``tests/test_records_layer.py`` imports them with the heavy packages
blocked):

:mod:`~hwmodels.records.timing`
    the timing recipe (warm-up, samples of ``inner`` calls) and its summary (median, half
    the inter-quartile range, fastest): :class:`Timing`, :func:`summarise`, :func:`half_iqr`.
:mod:`~hwmodels.records.jsonl`
    the one JSON-lines writer: the line format (:func:`record_line`), the atomic append of
    whole lines (:func:`append_record`, :func:`append_lines`) and the atomic whole-file
    write (:func:`write_lines`).
:mod:`~hwmodels.records.kernel`
    the megakernel's run record (:class:`KernelRecord`), built by ``megakernel.runner`` and
    ``megakernel.xla_run`` and read back by ``calibration.sources.tpu_chip_records``.

This ``__init__`` imports nothing, so importing one module does not load the others.
"""
