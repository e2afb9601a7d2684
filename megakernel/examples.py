"""Example schedules that exercise every streaming feature of the kernel at kimi-k3-mini sizes.

The built-in schedules (``naive``, ``published``, ``layer-double-buffer``) never split a
kimi-k3-mini tensor (its largest is 576 KiB, their slabs are >= 1 MiB). :func:`chunked_schedule`
does: row slabs with more slabs than buffers (in-op refills), a pool shared by the shared
expert, two expert slots and the dense MLP, deep prefetch of small parameters, after-routing
expert issue and 64-token KV tiles. :func:`ring_schedule` is the Muse kernel's layout
(``tpusim/schedules/muse-published.json``: one ring of banks shared by every dense tensor,
unbounded distances, 4 expert slots issued after routing, 3 KV tiles in flight) scaled to
kimi-k3-mini: by default 4 banks of 128 KiB, so ``kda.qkvgb`` (6 slabs) refills banks inside
its op and every tensor's bank wraps around the ring from layer to layer.
"""

from __future__ import annotations

from tpusim.schedule.schema import Schedule
from tpusim.workload.registry.names import Family


def chunked_schedule() -> Schedule:
    return Schedule.model_validate({
        "name": "megakernel-chunked",
        "description": "kimi-k3-mini test schedule: row slabs with in-op refills, a shared mlp pool, "
                       "deep prefetch, after-routing expert issue",
        "families": {
            Family.KDA_PROJ: {"prefetch_distance_ops": 3, "chunk_bytes": 65536, "buffers": 2, "pool": "attention"},
            Family.MLA_PROJ: {"prefetch_distance_ops": 2, "chunk_bytes": 131072, "buffers": 2, "pool": "attention"},
            Family.SMALL_PARAMS: {"prefetch_distance_ops": 6, "buffers": 2},
            Family.ROUTER: {"prefetch_distance_ops": 2, "chunk_bytes": 16384, "buffers": 2},
            Family.LATENT_PROJ: {"prefetch_distance_ops": 1, "chunk_bytes": 32768, "buffers": 3},
            Family.SHARED_EXPERT: {"prefetch_distance_ops": 2, "chunk_bytes": 65536, "buffers": 2, "pool": "mlp"},
            Family.ROUTED_EXPERT: {"buffers": 2, "pool": "mlp"},
            Family.DENSE_MLP: {"prefetch_distance_ops": 1, "chunk_bytes": 65536, "buffers": 3, "pool": "mlp"},
            Family.LM_HEAD: {"prefetch_distance_ops": 3, "chunk_bytes": 65536, "buffers": 2},
        },
        "expert_issue": "after_routing",
        "kv_tile_tokens": 64,
        "kv_buffers": 2,
    })


RING_MEMBERS = (Family.KDA_PROJ, Family.MLA_PROJ, Family.ROUTER, Family.LATENT_PROJ, Family.SHARED_EXPERT, Family.DENSE_MLP, Family.LM_HEAD)


def ring_schedule(banks: int = 4, bank_bytes: int = 131072, *, members: tuple[str, ...] = RING_MEMBERS) -> Schedule:
    """A ring-pool schedule: ``members`` share one ring of ``banks`` x ``bank_bytes``."""
    families: dict[str, dict[str, object]] = {name: {"prefetch_distance_ops": 4096, "pool": "ring"} for name in members}
    families[Family.SMALL_PARAMS] = {"prefetch_distance_ops": 8, "buffers": 2}
    families[Family.ROUTED_EXPERT] = {"buffers": 4}
    return Schedule.model_validate({
        "name": f"megakernel-ring-{banks}x{bank_bytes // 1024}k",
        "description": f"the Muse kernel's shared ring ({banks} banks of {bank_bytes} bytes for every dense "
                       "tensor) with 4 expert slots issued after routing and 3 KV tiles in flight",
        "families": families,
        "pools": {"ring": {"mode": "ring", "banks": banks, "bank_bytes": bank_bytes}},
        "max_dmas_in_flight": 32,
        "expert_issue": "after_routing",
        "kv_tile_tokens": 64,
        "kv_buffers": 3,
    })
