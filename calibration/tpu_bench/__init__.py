"""Pallas micro-benchmark probes for TPU v5e (:mod:`calibration.tpu_bench.probes`).

``python -m calibration.tpu_bench run --budget 90 --out probes.jsonl`` times them on the
chip (one JSON record a line, written as measured); ``python -m calibration.tpu_bench
compile v5e:2x2`` compiles them for a TPU topology from any machine with libtpu.
"""
