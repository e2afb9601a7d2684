"""Shared by the DMA-engine tests: serve hand-built copies on the HBM server alone."""

from __future__ import annotations

from hwmodels.schema import DmaSpec
from tpusim.engine.hbm import HbmServer
from tpusim.engine.items import Descriptor
from tpusim.engine.loop import EventLoop


def serve(dma: DmaSpec, copies: list[Descriptor]) -> list[float]:
    """Landing times of ``copies`` queued in order at t = 0 on the HBM server alone (1e9 B/s)."""
    env = EventLoop()
    server = HbmServer(env, 1e9, dma, 8, lambda desc: None, None, None)
    for desc in copies:
        server.enqueue(desc)
    server.pump()
    env.run()
    return [desc.land_s for desc in copies]
