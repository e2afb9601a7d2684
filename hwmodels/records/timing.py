"""How a harness times a call, and the one summary every timing record keeps.

The recipe (:func:`sample_seconds`): ``warmup`` untimed calls (compile, allocate, warm
caches), each waited for; then ``repeats`` samples, each the wall time of ``inner``
back-to-back calls and one final wait, divided by ``inner`` (dispatch of call ``i+1``
overlaps execution of call ``i``, as in a serving loop).

The summary (:func:`summarise`): the median, half the inter-quartile range (the records'
``spread_kind: iqr/2``; quartiles by :func:`statistics.quantiles` ``method="inclusive"``)
and the fastest sample. It is unit-agnostic: seconds in, seconds out (the field names say
seconds because every harness but the kernel runner samples seconds).

Standard library only: the GPU harness imports this on a host with JAX and nothing else.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median, half the IQR, fastest; how many samples and calls each."""

    median_s: float
    spread_s: float
    min_s: float
    repeats: int
    inner: int = 1


def half_iqr(samples: Sequence[float]) -> float:
    """Half the inter-quartile range of ``samples`` (0 for fewer than two)."""
    if len(samples) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / 2.0


def summarise(samples: Sequence[float], inner: int = 1) -> Timing:
    """Median, half the inter-quartile range and minimum of ``samples`` (per-call values)."""
    if not samples:
        raise ValueError("no timing samples")
    return Timing(statistics.median(samples), half_iqr(samples), min(samples), len(samples), inner)


def _same(result: Any) -> Any:
    return result


def sample_seconds(call: Callable[[int], Any], *, warmup: int, repeats: int, inner: int = 1,
                   wait: Callable[[Any], Any] = _same, max_s: float | None = None,
                   min_repeats: int = 3) -> list[float]:
    """Seconds per call of ``call(i)`` (``i`` counts every call, warm-up included), by the
    recipe of the module docstring; ``wait(result)`` blocks until a result is ready (e.g.
    ``jax.block_until_ready``; the default: ``call`` already blocks).

    ``max_s``: when the last warm-up call says the samples would take longer, fewer are
    taken (not below ``min_repeats``); ``len`` of the result says how many."""
    counter, last = 0, 0.0
    for _ in range(warmup):
        start = time.perf_counter()
        wait(call(counter))
        last = time.perf_counter() - start
        counter += 1
    if max_s is not None and last * repeats * inner > max_s:
        repeats = max(min(repeats, min_repeats), int(max_s / (last * inner)))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = None
        for _ in range(inner):
            result = call(counter)
            counter += 1
        wait(result)
        samples.append((time.perf_counter() - start) / inner)
    return samples
