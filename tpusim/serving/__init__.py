"""Serving: a request-level simulation on top of the step model.

Requests arrive (:mod:`~tpusim.serving.config`), a continuous-batching scheduler with chunked
prefill and a KV pool runs them step by step (:mod:`~tpusim.serving.simulator`, SimPy), each
step's time comes from the engine at grid points and is interpolated between them
(:mod:`~tpusim.serving.steps`, :mod:`~tpusim.serving.engine_steps`), and
:mod:`~tpusim.serving.metrics` reports TTFT, TPOT, throughput and what bounds each;
:mod:`~tpusim.serving.serve` runs it over systems and traffic levels (``tpusim serving``).
"""
