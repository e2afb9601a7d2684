"""The request-level serving simulation: arrivals, a continuous-batching scheduler, KV capacity.

SimPy runs two kinds of process, like SimPy's bank example runs customers and counters:

- **clients** (:func:`_clients`): a fixed ``concurrency`` of closed-loop clients (each sends
  its next request when the last finishes, as benchmark tools do), Poisson arrivals at a
  rate, or a trace's arrivals. A request enters the waiting queue;
- **the engine loop** (:meth:`ServingSim._engine`), one step at a time:

  1. *Admit* (FCFS): move waiting requests into the running set while fewer than
     ``max_running_requests`` run and the KV pool holds the request's whole cache
     (``input + output`` tokens, reserved at admission, so the pool is never
     over-committed and no request is ever preempted). A request bigger than the whole
     pool is *refused*; one that does not fit *now* waits (head-of-line: nothing behind it
     is admitted first). Invariant: reserved KV bytes <= pool bytes at every instant.
  2. *Prefill* (when a running request has prompt tokens left and ``prefill_first``, or when
     nothing decodes): take prompt pieces in admission order up to ``chunk_tokens`` in all,
     run one prefill step of them, priced as the sum of each piece's prefill (its own
     sequence's causal attention over its prefix; the weights counted once per piece, an
     over-estimate of weight traffic that a compute-bound prefill hides). Decoding
     requests stall meanwhile.
  3. *Decode* otherwise: every request whose prompt is done runs one decode step at the
     batch's mean context (the KV bytes a step reads are linear in context, so the mean is
     exact for them) and emits ``acceptance_length`` tokens (1 without speculation).
  4. *Idle* until the next arrival when nothing is running.

Step times come from a :class:`~tpusim.serving.steps.StepModel` (grid-cached engine runs).
Every request records when it arrived, was admitted, finished its prompt, emitted its
first and last tokens, and how its waiting splits (queue for a slot or for KV, its own
prefill, other requests' prefill, decode steps, prefill stalls while decoding).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

from tpusim.serving.config import SchedulerConfig, Traffic
from tpusim.serving.steps import StepModel


@dataclass
class Request:
    """One request and what happened to it (times in seconds from the start)."""

    rid: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    kv_bytes: float = 0.0
    admitted_s: float | None = None
    prompt_done_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    refused: bool = False
    prefilled: int = 0
    emitted: float = 0.0
    waited_for_kv: bool = False  # was ever first in line and held back by the KV pool
    own_prefill_s: float = 0.0  # prefill steps that included this request's prompt
    other_prefill_s: float = 0.0  # other requests' prefill steps between admission and its first token
    decode_s: float = 0.0  # decode steps it took part in
    stall_s: float = 0.0  # prefill steps while it was decoding (after its first token)
    tokens_at_first: float = 0.0
    done: simpy.Event | None = None

    @property
    def ttft_s(self) -> float:
        assert self.first_token_s is not None
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """(last token - first token) / (tokens after the first); None for one-token outputs."""
        assert self.first_token_s is not None and self.finish_s is not None
        later = self.output_tokens - self.tokens_at_first
        return (self.finish_s - self.first_token_s) / later if later > 0 else None

    @property
    def queue_s(self) -> float:
        assert self.admitted_s is not None
        return self.admitted_s - self.arrival_s


@dataclass
class ServingRun:
    """Everything one simulation produced."""

    requests: list[Request]
    end_s: float
    prefill_steps: int = 0
    decode_steps: int = 0
    decode_batch_sum: int = 0
    busy_s: float = 0.0
    in_system_integral: float = 0.0  # ∫ requests in the system dt (Little's law: L = this / end_s)
    kv_pool_bytes: float = 0.0
    kv_peak_bytes: float = 0.0
    peak_running: int = 0
    first_arrival_s: float = 0.0
    request_overhead_s: float = 0.0  # added to every TTFT by the metrics (SchedulerConfig.request_overhead_s)

    @property
    def completed(self) -> list[Request]:
        return [r for r in self.requests if r.finish_s is not None]

    @property
    def mean_decode_batch(self) -> float:
        return self.decode_batch_sum / self.decode_steps if self.decode_steps else 0.0


@dataclass
class ServingSim:
    """One served workload on one system (see the module docstring)."""

    steps: StepModel
    traffic: Traffic
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_pool_bytes: float = math.inf
    kv_bytes_of: Callable[[int], float] | None = None  # context tokens -> KV bytes of one request; None: 0

    def run(self) -> ServingRun:
        env = simpy.Environment()
        self._env = env
        self._waiting: list[Request] = []
        self._running: list[Request] = []
        self._arrived = env.event()
        self._kv_used = 0.0
        self._last_change = 0.0
        self._in_system = 0
        self._result = ServingRun([], 0.0, kv_pool_bytes=self.kv_pool_bytes,
                                  request_overhead_s=self.scheduler.request_overhead_s)
        self._clients_done = False
        env.process(_clients(self, env))
        engine = env.process(self._engine(env))
        env.run(until=engine)
        self._account(env.now)
        self._result.end_s = env.now
        arrivals = [r.arrival_s for r in self._result.requests]
        self._result.first_arrival_s = min(arrivals) if arrivals else 0.0
        return self._result

    # bookkeeping -----------------------------------------------------------------------
    def _account(self, now: float) -> None:
        self._result.in_system_integral += self._in_system * (now - self._last_change)
        self._last_change = now

    def submit(self, request: Request) -> None:
        self._account(self._env.now)
        self._in_system += 1
        request.kv_bytes = float(self.kv_bytes_of(request.input_tokens + request.output_tokens)) \
            if self.kv_bytes_of is not None else 0.0
        request.done = self._env.event()
        self._result.requests.append(request)
        self._waiting.append(request)
        if not self._arrived.triggered:
            self._arrived.succeed()

    def _finish(self, request: Request, now: float, *, refused: bool = False) -> None:
        self._account(now)
        self._in_system -= 1
        request.refused = refused
        if not refused:
            request.finish_s = now
            self._kv_used -= request.kv_bytes
        assert request.done is not None
        request.done.succeed()

    def _admit(self, now: float) -> None:
        limit = self.scheduler.max_running_requests or math.inf
        while self._waiting and len(self._running) < limit:
            head = self._waiting[0]
            if head.kv_bytes > self.kv_pool_bytes:
                self._waiting.pop(0)
                self._finish(head, now, refused=True)
                continue
            if self._kv_used + head.kv_bytes > self.kv_pool_bytes:
                head.waited_for_kv = True
                break
            self._waiting.pop(0)
            self._kv_used += head.kv_bytes
            head.admitted_s = now
            self._running.append(head)
        self._result.kv_peak_bytes = max(self._result.kv_peak_bytes, self._kv_used)
        self._result.peak_running = max(self._result.peak_running, len(self._running))

    # the engine loop -------------------------------------------------------------------
    def _engine(self, env: simpy.Environment):  # type: ignore[no-untyped-def]
        config = self.scheduler
        while True:
            self._admit(env.now)
            prefilling = [r for r in self._running if r.prefilled < r.input_tokens]
            decoding = [r for r in self._running if r.prefilled >= r.input_tokens]
            if prefilling and (config.prefill_first or not decoding):
                yield from self._prefill_step(env, prefilling, decoding)
            elif decoding:
                yield from self._decode_step(env, decoding)
            elif self._clients_done and not self._waiting:
                return
            else:
                self._arrived = env.event()
                yield self._arrived

    def _prefill_step(self, env: simpy.Environment, prefilling: list[Request], decoding: list[Request]):  # type: ignore[no-untyped-def]
        budget, pieces = self.scheduler.chunk_tokens, []
        for request in prefilling:
            if budget <= 0:
                break
            take = min(budget, request.input_tokens - request.prefilled)
            pieces.append((request, take))
            budget -= take
        step_s = sum(self.steps.prefill_s(take, request.prefilled) for request, take in pieces)
        yield env.timeout(step_s)
        self._result.prefill_steps += 1
        self._result.busy_s += step_s
        in_step = {request.rid for request, _ in pieces}
        for request in prefilling:
            if request.rid in in_step:
                request.own_prefill_s += step_s
            else:
                request.other_prefill_s += step_s
        for request in decoding:  # prompt done: before its first token the step delays TTFT, after it TPOT
            if request.first_token_s is None:
                request.other_prefill_s += step_s
            else:
                request.stall_s += step_s
        for request, take in pieces:
            request.prefilled += take
            if request.prefilled >= request.input_tokens:
                request.prompt_done_s = env.now
                if self.scheduler.first_token_from_prefill:
                    self._emit(request, 1.0, env.now)

    def _decode_step(self, env: simpy.Environment, decoding: list[Request]):  # type: ignore[no-untyped-def]
        batch = len(decoding)
        context = float(np.mean([r.input_tokens + r.emitted for r in decoding]))
        step_s = self.steps.decode_s(batch, context)
        yield env.timeout(step_s)
        self._result.decode_steps += 1
        self._result.decode_batch_sum += batch
        self._result.busy_s += step_s
        for request in decoding:
            request.decode_s += step_s
            self._emit(request, self.scheduler.acceptance_length, env.now)

    def _emit(self, request: Request, tokens: float, now: float) -> None:
        if request.first_token_s is None:
            request.first_token_s = now
            request.tokens_at_first = min(tokens, request.output_tokens)
            request.decode_s = 0.0  # TPOT's decode steps count from the first token on
        request.emitted = min(request.output_tokens, request.emitted + tokens)
        if request.emitted >= request.output_tokens:
            self._running.remove(request)
            self._finish(request, now)

    _clients_done = False


def _clients(sim: ServingSim, env: simpy.Environment):  # type: ignore[no-untyped-def]
    """Send the traffic's requests (module docstring), then mark the clients done."""
    traffic = sim.traffic
    if traffic.mode == "trace":
        for rid, item in enumerate(traffic.trace):
            yield env.timeout(max(0.0, item.arrival_s - env.now))
            sim.submit(Request(rid, env.now, item.input_tokens, item.output_tokens))
    elif traffic.mode == "rate":
        rng = np.random.default_rng(traffic.seed)
        assert traffic.rate_per_s is not None
        lengths = traffic.request_lengths()
        for rid in range(traffic.requests):
            yield env.timeout(float(rng.exponential(1.0 / traffic.rate_per_s)))
            sim.submit(Request(rid, env.now, *lengths[rid]))
    else:
        assert traffic.concurrency is not None
        sent = [0]
        lengths = traffic.request_lengths()

        def client(env: simpy.Environment):  # type: ignore[no-untyped-def]
            while sent[0] < traffic.requests:
                request = Request(sent[0], env.now, *lengths[sent[0]])
                sent[0] += 1
                sim.submit(request)
                assert request.done is not None
                yield request.done

        yield simpy.AllOf(env, [env.process(client(env)) for _ in range(traffic.concurrency)])
    sim._clients_done = True
    if not sim._arrived.triggered:  # wake an idle engine loop so it can end
        sim._arrived.succeed()
