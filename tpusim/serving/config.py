"""What a served workload is: the traffic and the scheduler's policy and limits.

:class:`Traffic` says how requests arrive (a fixed number of closed-loop clients as
benchmark tools run them, Poisson arrivals at a rate, or a trace of arrival time, input and
output lengths); :class:`SchedulerConfig` the serving engine's knobs, named and defaulted
as SGLang exposes them (shared/reference/k3-on-sglang.md section 5).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hwmodels.errors import InputError

# SGLang's chunked_prefill_size on >= 160 GB GPUs ("B200, MI300") and the K3 prefill recipes
# (k3-on-sglang.md section 5); 8192 on 90-160 GB parts.
DEFAULT_CHUNK_TOKENS = 16384
# Request lengths as the usual benchmark client draws them: SGLang's bench_serving random
# dataset takes each length uniformly in [floor(L x ratio), L] with --random-range-ratio 0 by
# default (shared/reference/gpu-batch-scaling.md S4: its default-ratio runs average ~0.6x /
# ~0.4x the nominal input / output lengths). Closed-loop clients with fixed lengths all move
# in lockstep (mean = p50 = p99); drawn lengths desynchronise them as real runs are.
DEFAULT_RANGE_RATIO = 0.0
LENGTH_STREAM = 1  # the length draw's seed stream, apart from the Poisson arrivals'


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TraceRequest(_Frozen):
    """One request of a trace file."""

    arrival_s: float = Field(ge=0.0, description="arrival time, seconds from the start")
    input_tokens: int = Field(ge=1, description="prompt tokens")
    output_tokens: int = Field(ge=1, description="tokens to generate")


class Traffic(_Frozen):
    """How requests arrive: ``concurrency`` clients each sending its next request when the
    last one finishes, Poisson arrivals at ``rate_per_s``, or a ``trace``."""

    mode: Literal["concurrency", "rate", "trace"]
    concurrency: int | None = Field(default=None, ge=1, description="closed-loop clients (mode concurrency)")
    rate_per_s: float | None = Field(default=None, gt=0.0, description="Poisson arrival rate (mode rate)")
    trace: tuple[TraceRequest, ...] = Field(default=(), description="requests (mode trace)")
    input_tokens: int = Field(default=8192, ge=1, description="prompt tokens (concurrency / rate)")
    output_tokens: int = Field(default=1024, ge=1, description="tokens generated (concurrency / rate)")
    requests: int = Field(default=64, ge=1, description="requests sent in all (concurrency / rate)")
    seed: int = Field(default=0, description="seed of the Poisson and length draws")
    range_ratio: float = Field(
        default=DEFAULT_RANGE_RATIO, ge=0.0, le=1.0,
        description="lengths as SGLang bench_serving's random dataset draws them: each request's input and "
        "output lengths uniform integers in [max(1, floor(L x ratio)), L] for L = input_tokens, output_tokens "
        "(1: fixed lengths; default 0, bench_serving's --random-range-ratio default)")

    @model_validator(mode="after")
    def _check(self) -> Traffic:
        needed = {"concurrency": self.concurrency, "rate": self.rate_per_s, "trace": self.trace or None}[self.mode]
        if needed is None:
            raise ValueError(f"traffic mode {self.mode} needs its {self.mode} given")
        return self

    @property
    def label(self) -> str:
        if self.mode == "concurrency":
            return f"concurrency {self.concurrency}"
        if self.mode == "rate":
            return f"Poisson {self.rate_per_s:g} req/s"
        return f"trace of {len(self.trace)} requests"

    @property
    def lengths_label(self) -> str:
        """How request lengths are drawn, in words (printed with every result)."""
        if self.mode == "trace":
            return "from the trace"
        if self.range_ratio >= 1.0:
            return f"fixed: {self.input_tokens} in, {self.output_tokens} out (--random-range-ratio 1)"
        low_in, low_out = self._low(self.input_tokens), self._low(self.output_tokens)
        return (f"uniform in [{low_in}, {self.input_tokens}] in, [{low_out}, {self.output_tokens}] out, seed "
                f"{self.seed} (SGLang bench_serving random dataset, --random-range-ratio {self.range_ratio:g})")

    @property
    def arrivals_label(self) -> str:
        """How requests arrive, in words, as the benchmark clients name it."""
        if self.mode == "concurrency":
            return (f"closed loop: {self.concurrency} clients, each sending its next request when the last "
                    "finishes (bench_serving --max-concurrency, --request-rate inf)")
        if self.mode == "rate":
            return f"Poisson at {self.rate_per_s:g} req/s, seed {self.seed} (bench_serving --request-rate)"
        return "from the trace"

    def _low(self, length: int) -> int:
        return max(1, int(length * self.range_ratio))

    def request_lengths(self) -> list[tuple[int, int]]:
        """``(input, output)`` tokens of request 0, 1, ... (concurrency and rate traffic): drawn
        as :attr:`range_ratio` says, from a stream of its own (the Poisson draw is unchanged)."""
        if self.range_ratio >= 1.0:
            return [(self.input_tokens, self.output_tokens)] * self.requests
        rng = np.random.default_rng([self.seed, LENGTH_STREAM])
        inputs = rng.integers(self._low(self.input_tokens), self.input_tokens + 1, size=self.requests)
        outputs = rng.integers(self._low(self.output_tokens), self.output_tokens + 1, size=self.requests)
        return [(int(i), int(o)) for i, o in zip(inputs, outputs, strict=True)]

    @property
    def max_context_tokens(self) -> int:
        if self.mode == "trace":
            return max(r.input_tokens + r.output_tokens for r in self.trace)
        return self.input_tokens + self.output_tokens


class SchedulerConfig(_Frozen):
    """Continuous batching with chunked prefill, as SGLang runs it by default."""

    max_running_requests: int | None = Field(
        default=None, ge=1, description="requests decoding or prefilling at once (None: only KV bounds it, "
        "SGLang's default)")
    chunk_tokens: int = Field(default=DEFAULT_CHUNK_TOKENS, ge=1,
                              description="prompt tokens per prefill step (SGLang chunked_prefill_size)")
    prefill_first: bool = Field(
        default=True, description="run a prefill step whenever one can be formed, before decoding (SGLang: "
        "mixed chunk off); False: prefill only when no request is decoding")
    first_token_from_prefill: bool = Field(
        default=False, description="the prefill step emits the first token (SGLang); default False: the first "
        "decode step after the prompt's prefill does (TTFT = prefill + one step)")
    request_overhead_s: float = Field(
        default=0.0, ge=0.0, description="a request's time outside the scheduler's steps, added to its TTFT "
        "(HTTP, tokenizing, streaming the token: execution.gpu.request_overhead_s on a calibrated GPU, "
        "tpusim.serving.first_token); 0: not priced")
    acceptance_length: float = Field(default=1.0, ge=1.0,
                                     description="tokens each sequence emits per decode step (speculative: the "
                                     "accepted draft tokens + 1; 1: plain decode)")


def load_trace(path: Path) -> tuple[TraceRequest, ...]:
    """A trace file: JSON lines or a JSON list of ``{arrival_s, input_tokens, output_tokens}``."""
    try:
        text = path.read_text()
    except OSError as error:
        raise InputError(f"--trace {path}: cannot read ({error.strerror or error})") from None
    try:
        stripped = text.strip()
        records = json.loads(stripped) if stripped.startswith("[") else [
            json.loads(line) for line in stripped.splitlines() if line.strip()]
        requests = tuple(TraceRequest.model_validate(record) for record in records)
    except (ValueError, TypeError) as error:
        first = str(error).splitlines()[0]
        raise InputError(f"--trace {path}: not a list of {{arrival_s, input_tokens, output_tokens}} ({first})") from None
    if not requests:
        raise InputError(f"--trace {path}: no requests")
    return tuple(sorted(requests, key=lambda r: r.arrival_s))
