"""The DMA engine serving copies in the order issued (``DmaSpec.service = "in_order"``).

Hand-worked: the HBM server alone, bandwidth 1e9 B/s, issue latency 1 µs, no penalty.
Two copies of 4000 B are issued at t = 0, then a more urgent 100 B copy (a lower
``seq``: consumed first) at t = 0 too, issued last.

- in order: copy A spends 1 µs of latency, streams alone 4 µs (lands at 5 µs); B's
  latency ran alongside, it streams next (lands at 9 µs); the urgent copy, issued last,
  streams last: 9.1 µs. What the ``dma_order`` probe saw on TPU v5e: a 64 KiB copy issued
  behind eight 1 MiB copies lands after all eight.
- shared (the round-robin): after the 1 µs latency all three stream at 1/3 each; the
  100 B copy lands at 1 + 0.3 = 1.3 µs, then A and B share: 1.3 + 2 x 3900 / 1e9 = 9.1 µs.
"""

from __future__ import annotations

from typing import Any

import pytest
from hbm_serve import serve

from hwmodels.schema import DmaSpec
from tpusim.engine.items import Descriptor, Pool, Ring, Slab

US = 1e-6


def _dma(service: str) -> DmaSpec:
    figure: dict[str, Any] = {"value": 1e-6, "source": "test: hand-computed case"}
    return DmaSpec.model_validate({"issue_latency_s": figure, "efficient_in_flight": 8,
                                   "concurrency_penalty_per_dma": {**figure, "value": 0.0},
                                   "service": service})


def _land_times(service: str) -> list[float]:
    pool, ring = Pool("arena", 1 << 30), Ring("ring", 4)
    copies = []
    for seq, nbytes in ((1, 4000), (2, 4000), (0, 100)):  # the urgent copy (seq 0) issued last
        slab = Slab(seq, "gqa_proj", f"w[{seq}]", 0, 0, pool, ring)
        copies.append(Descriptor(seq, "gqa_proj", "w", 0, seq, nbytes, slab))
    return serve(_dma(service), copies)


def test_in_order_serves_the_order_of_issue_worked_by_hand() -> None:
    assert _land_times("in_order") == pytest.approx([5 * US, 9 * US, 9.1 * US], rel=1e-9)


def test_shared_serves_all_at_once_worked_by_hand() -> None:
    assert _land_times("shared") == pytest.approx([9.1 * US, 9.1 * US, 1.3 * US], rel=1e-9)


def test_in_order_moves_the_same_bytes_in_the_same_total_time() -> None:
    # one engine at the whole rate either way: the last copy lands when all bytes have moved
    assert max(_land_times("in_order")) == pytest.approx(max(_land_times("shared")), rel=1e-9)


def test_the_v5e_catalog_states_what_its_probe_records_show() -> None:
    from calibration.sources.tpu_probes import dma_service, load_probes
    from hwmodels.catalog import load_chip

    dma = load_chip("tpu-v5e", calibrated=False).dma
    assert (dma.service, dma.service_source) == dma_service(load_probes())


def test_a_shared_engine_reads_as_shared() -> None:
    from calibration.sources.tpu_probes import dma_service

    def record(large: int, small: int, chain: int, seconds: float) -> dict[str, Any]:
        return {"probe": "dma_order", "date": "2026-12-05", "seconds_median": seconds,
                "params": {"large_copies": large, "small_copy": small, "chain_iterations": chain, "iterations": 1}}

    # the small copy costs 0.6 µs alone and 0.7 µs behind 8 MiB that take 12 µs: it passed them
    records = [record(0, 0, 0, 1e-6), record(8, 0, 0, 13e-6), record(0, 0, 100, 30e-6), record(0, 1, 100, 30.6e-6),
               record(8, 0, 100, 30e-6), record(8, 1, 100, 30.7e-6)]
    assert dma_service(records)[0] == "shared"
    records[-1] = record(8, 1, 100, 42.5e-6)  # it waited for them
    assert dma_service(records)[0] == "in_order"
