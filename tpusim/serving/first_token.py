"""Time to first token under load, in closed form, as SGLang's scheduler serves a closed loop.

What a request waits for between reaching the scheduler and its first token, with ``C``
closed-loop clients (``sglang.bench_serving --max-concurrency C``, request rate infinite: a
client sends its next request as soon as its last one finishes). Read from SGLang's defaults
and scheduler (``shared/reference/k3-on-sglang.md`` section 5, SGLang ``server_args.py`` and
``managers/scheduler.py`` at the snapshot cited there):

- **prefill first, not mixed**: ``get_next_batch_to_run`` runs a prefill batch before decode
  whenever one can be formed; ``enable_mixed_chunk`` is off by default, so a prefill step holds
  prompts only (scheduler.py L3017-3131, server_args.py L976-980);
- **one prefill step takes the waiting prompts FCFS up to ``chunked_prefill_size``** (16384 on
  >= 160 GB GPUs such as B200; ``max_prefill_tokens`` 16384; ``schedule_policy`` fcfs); a
  longer prompt is cut into chunks that run as consecutive prefill steps (server_args.py
  L4766-4856, L811-842);
- **the overlap scheduler** (on by default, ``event_loop_overlap``): iteration ``i`` receives
  new requests, forms and launches batch ``i``, then waits for batch ``i - 1``'s result. So the
  loop receives requests once per step, at the end of a step, and the batch it forms queues on
  the GPU behind the one launched before it (scheduler.py L1756-1800);
- **the first token comes from the prefill step** (the extend forward samples it);
- a prefill runs **without a CUDA graph** (graphs are captured for decode batches), so it lasts
  the longer of its GPU time and the host's time to issue its kernels
  (:func:`tpusim.engine.gpu_batch.prefill_step_s`); the host issues them from the moment the
  batch is formed, while the GPU may still run the step before it.

The rule (:func:`first_token_wait_s`), numbered as a request lives it, every time in seconds:

1. **An idle server** (``C = 1``): the prompt's prefill starts when it arrives;
   ``wait = max(prefill_host, prefill_gpu)``.
2. **Receipt** (``C > 1``, decode running): the client's previous request ended at a step
   boundary ``t0``; its next request reaches the scheduler ``turnaround`` later (detokenize,
   the HTTP response, the client's next send, tokenizing). The loop receives at step
   boundaries ``t0 + k step``: the first one at or after the arrival,
   ``receive = step x max(1, ceil(turnaround / step)) - turnaround``.
3. **Joined prompts**: the other ``C - 1`` clients each send one request per cycle of
   ``output_tokens x TPOT``; those that reached the scheduler in the same step are prefilled in
   the same step (FCFS, the chunk budget caps them):
   ``joined = min((C - 1) x step / (output_tokens x TPOT), chunk_tokens / prompt_tokens - 1)``.
   Their tokens lengthen the step's GPU time, ``gpu = prefill_gpu x (1 + joined)``; the host
   issues each kernel once per step, ``host = prefill_host x chunks`` (``chunks = ceil(prompt /
   chunk_tokens)``).
4. **The step launched before it** (overlap scheduler): the GPU first finishes one decode step,
   while the host already issues the prefill's kernels:
   ``wait = receive + max(host, step + gpu)``.

The request's time outside the scheduler at an idle server (HTTP, tokenizing, streaming the
token) is not part of this wait; a TTFT is that overhead plus the wait. Not modelled: prefill
steps of other prompts queued ahead of it beyond its own step window (their share is small
while ``C / output_tokens`` prompts arrive per step, far below one), the start-up burst of a
benchmark (all ``C`` clients send at once: it moves the *mean* TTFT of a short run, not the
median), KV-capacity queueing, decode steps between chunks of a prompt longer than the chunk.
"""

from __future__ import annotations

import math

# SGLang's chunked_prefill_size on >= 160 GB GPUs (B200, B300, MI300) and the K3 prefill recipes
# (k3-on-sglang.md section 5; the serving simulator's default, tpusim.serving.config)
from tpusim.serving.config import DEFAULT_CHUNK_TOKENS


def receive_wait_s(decode_step_s: float, turnaround_s: float) -> float:
    """Step 2: from a request's arrival to the step boundary at which the loop receives it."""
    if decode_step_s <= 0:
        raise ValueError("decode_step_s must be positive")
    steps = max(1, math.ceil(turnaround_s / decode_step_s))
    return steps * decode_step_s - turnaround_s


def joined_prompts(concurrency: int, decode_step_s: float, output_tokens: float, tpot_s: float,
                   prompt_tokens: float, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> float:
    """Step 3: the other clients' prompts expected in the same prefill step (a mean, >= 0)."""
    if concurrency <= 1:
        return 0.0
    cycle_s = output_tokens * tpot_s
    if cycle_s <= 0 or prompt_tokens <= 0:
        raise ValueError("output_tokens, tpot_s and prompt_tokens must be positive")
    room = max(0.0, chunk_tokens / prompt_tokens - 1.0)
    return min((concurrency - 1) * decode_step_s / cycle_s, room)


def first_token_wait_s(*, concurrency: int, decode_step_s: float, prefill_gpu_s: float, prefill_host_s: float,
                       prompt_tokens: float, output_tokens: float, tpot_s: float, turnaround_s: float,
                       chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> float:
    """Seconds from a request reaching the scheduler to its first token (module docstring).

    ``decode_step_s``: the decode step of the running batch (``concurrency`` sequences, no
    prefill stall); ``prefill_gpu_s``: the engine's prefill of the prompt on the GPU;
    ``prefill_host_s``: the host's time to issue one prefill step's kernels (kernels x
    ``eager_host_op_s``); ``tpot_s``: the time per output token at this concurrency (with the
    stall); ``turnaround_s``: a closed-loop client's turnaround (step 2)."""
    if turnaround_s < 0:
        raise ValueError("turnaround_s must be >= 0")
    chunks = max(1, math.ceil(prompt_tokens / chunk_tokens))
    host_s = prefill_host_s * chunks
    if concurrency <= 1:
        return max(host_s, prefill_gpu_s)
    joined = joined_prompts(concurrency, decode_step_s, output_tokens, tpot_s, prompt_tokens, chunk_tokens)
    gpu_s = prefill_gpu_s * (1.0 + joined)
    return receive_wait_s(decode_step_s, turnaround_s) + max(host_s, decode_step_s + gpu_s)
