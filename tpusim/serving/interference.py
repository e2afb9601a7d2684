"""Chunked-prefill interference on decode, in closed form for a closed loop of clients.

In aggregated serving (prefill and decode on the same GPUs: SGLang's and vLLM's default) a
request's prompt is prefilled in chunks that run between, or mixed into, the decode steps of
the requests already running (:mod:`tpusim.serving.simulator` simulates it step by step). A
decoding request waits for every prefill chunk that runs while it decodes, so its time per
output token is the decode step plus its share of other requests' prefill::

    TPOT = step(B) + (C - 1) x prefill_s(ISL) / OSL

with ``C`` closed-loop clients, each of the other ``C - 1`` requests prefilled about once per
``OSL`` decode steps of this one (in steady state every client cycles once per request; the
prefill is short against the decode phase). A stack that mixes the chunk into a decode step
(vLLM V1) loses only the chunk's time beyond that step. Disaggregated serving (prefill on
other GPUs) has no such term. The simulator is the reference; this form is what a published sweep point
is predicted with (calibration.sources.gpu_batch_sweeps), and
tests/test_gpu_batch_mechanisms.py checks it against the simulator on a closed-form step model.
"""

from __future__ import annotations


def prefill_stall_s(concurrency: int, prefill_s: float, output_tokens: float, *,
                    disaggregated: bool = False, mixed_step_s: float | None = None) -> float:
    """Mean stall per output token from other clients' prefill, seconds (module docstring).

    ``mixed_step_s``: the stack mixes prefill chunks into decode steps (vLLM V1's chunked
    prefill: decode requests first, the chunk fills the step's token budget; SGLang's
    ``enable_mixed_chunk``, off by default): the decode rows ride in the chunk's step, whose
    weights are read once, so a prompt costs its decoders ``prefill_s - mixed_step_s`` (the
    decode step they would have run anyway), not the whole prefill."""
    if disaggregated or concurrency <= 1:
        return 0.0
    if output_tokens <= 0:
        raise ValueError("output_tokens must be positive")
    per_prompt_s = prefill_s if mixed_step_s is None else max(0.0, prefill_s - mixed_step_s)
    return (concurrency - 1) * per_prompt_s / output_tokens
