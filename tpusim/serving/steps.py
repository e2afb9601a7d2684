"""Step times for the serving simulator: exact at grid points, interpolated between.

A served workload runs thousands of steps whose batch and context change every step; the
engine takes about a second per step program, so :class:`StepTable` asks its
:class:`StepPricer` (the engine, :mod:`tpusim.serving.engine_steps`; a test's closed form)
only at **grid points** and interpolates between them:

- decode ``(batch, context)``: batch on powers of two (1, 2, 4, ...), context on multiples
  of ``context_bucket_tokens``; a query between points is **bilinear** in (batch, context)
  between the four surrounding points (linear in context is exact for the KV bytes, which
  grow linearly; linear in batch slightly *under*-estimates between points, because the
  distinct experts a batch loads grow concavely);
- prefill ``(tokens, prefix)``: tokens on powers of two, prefix on multiples of the
  bucket; bilinear in the same way (a prefill chunk's work is close to linear in tokens).

A query that lands on a grid point returns the pricer's value unchanged (``exact``). Each
grid point is priced once per table (:attr:`StepTable.priced` counts them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from tpusim.workload.program import StepPhase

DEFAULT_CONTEXT_BUCKET_TOKENS = 1024
INTERPOLATION = ("bilinear between grid points: batch / prefill tokens on powers of two, context / prefix on "
                 "multiples of {bucket} tokens; exact at the points")


class StepPricer(Protocol):
    """Exact step seconds at one point (a grid point when called from :class:`StepTable`)."""

    def decode_s(self, batch: int, context_tokens: int) -> float: ...

    def prefill_s(self, tokens: int, prefix_tokens: int) -> float: ...


class StepModel(Protocol):
    """What the serving simulator reads: step seconds at any batch / context."""

    def decode_s(self, batch: int, context_tokens: float) -> float: ...

    def prefill_s(self, tokens: int, prefix_tokens: float) -> float: ...


def power_of_two_bracket(value: int) -> tuple[int, int]:
    """The powers of two ``lo <= value <= hi`` (equal when ``value`` is one)."""
    if value < 1:
        raise ValueError(f"value {value} must be >= 1")
    lo = 1 << (value.bit_length() - 1)
    return lo, lo if lo == value else lo * 2


def bucket_bracket(value: float, bucket: int, lowest: int) -> tuple[int, int]:
    """Multiples of ``bucket`` around ``value`` (``lowest`` stands in for zero)."""
    lo = math.floor(value / bucket) * bucket
    hi = lo if lo == value else lo + bucket
    return max(lo, lowest), max(hi, lowest)


def _lerp(x: float, lo: float, hi: float, at_lo: float, at_hi: float) -> float:
    return at_lo if hi == lo else at_lo + (at_hi - at_lo) * (x - lo) / (hi - lo)


@dataclass
class StepTable:
    """Grid-cached step times (see the module docstring)."""

    pricer: StepPricer
    context_bucket_tokens: int = DEFAULT_CONTEXT_BUCKET_TOKENS
    _exact: dict[tuple[str, int, int], float] = field(default_factory=dict)

    @property
    def priced(self) -> int:
        """Grid points priced so far (engine runs, for an engine pricer)."""
        return len(self._exact)

    @property
    def interpolation(self) -> str:
        return INTERPOLATION.format(bucket=self.context_bucket_tokens)

    def _point(self, phase: StepPhase, rows: int, context: int) -> float:
        key = (str(phase), rows, context)
        if key not in self._exact:
            price = self.pricer.decode_s if phase == StepPhase.DECODE else self.pricer.prefill_s
            self._exact[key] = price(rows, context)
        return self._exact[key]

    def _bilinear(self, phase: StepPhase, rows: int, context: float, lowest_context: int) -> float:
        r_lo, r_hi = power_of_two_bracket(rows)
        c_lo, c_hi = bucket_bracket(context, self.context_bucket_tokens, lowest_context)
        at_r_lo = _lerp(context, c_lo, c_hi, self._point(phase, r_lo, c_lo), self._point(phase, r_lo, c_hi))
        if r_hi == r_lo:
            return at_r_lo
        at_r_hi = _lerp(context, c_lo, c_hi, self._point(phase, r_hi, c_lo), self._point(phase, r_hi, c_hi))
        return _lerp(rows, r_lo, r_hi, at_r_lo, at_r_hi)

    def decode_s(self, batch: int, context_tokens: float) -> float:
        """One decode step of ``batch`` sequences whose mean context is ``context_tokens``."""
        return self._bilinear(StepPhase.DECODE, batch, max(1.0, context_tokens), 1)

    def prefill_s(self, tokens: int, prefix_tokens: float) -> float:
        """One prefill chunk of ``tokens`` after ``prefix_tokens`` cached ones."""
        return self._bilinear(StepPhase.PREFILL, tokens, max(0.0, prefix_tokens), 0)
