"""Example schedules that exercise every streaming feature of the kernel at kimi-k3-mini sizes.

The built-in schedules (``naive``, ``published``, ``layer-double-buffer``) never split a
kimi-k3-mini tensor (its largest is 576 KiB, their slabs are >= 1 MiB). :func:`chunked_schedule`
does: row slabs with more slabs than buffers (in-op refills), a pool shared by the shared
expert, two expert slots and the dense MLP, deep prefetch of small parameters, after-routing
expert issue and 64-token KV tiles.
"""

from __future__ import annotations

from tpusim.schedule.schema import Schedule


def chunked_schedule() -> Schedule:
    return Schedule.model_validate({
        "name": "megakernel-chunked",
        "description": "kimi-k3-mini test schedule: row slabs with in-op refills, a shared mlp pool, "
                       "deep prefetch, after-routing expert issue",
        "families": {
            "kda_proj": {"prefetch_distance_ops": 3, "chunk_bytes": 65536, "buffers": 2, "pool": "attention"},
            "mla_proj": {"prefetch_distance_ops": 2, "chunk_bytes": 131072, "buffers": 2, "pool": "attention"},
            "small_params": {"prefetch_distance_ops": 6, "buffers": 2},
            "router": {"prefetch_distance_ops": 2, "chunk_bytes": 16384, "buffers": 2},
            "latent_proj": {"prefetch_distance_ops": 1, "chunk_bytes": 32768, "buffers": 3},
            "shared_expert": {"prefetch_distance_ops": 2, "chunk_bytes": 65536, "buffers": 2, "pool": "mlp"},
            "routed_expert": {"buffers": 2, "pool": "mlp"},
            "dense_mlp": {"prefetch_distance_ops": 1, "chunk_bytes": 65536, "buffers": 3, "pool": "mlp"},
            "lm_head": {"prefetch_distance_ops": 3, "chunk_bytes": 65536, "buffers": 2},
        },
        "expert_issue": "after_routing",
        "kv_tile_tokens": 64,
        "kv_buffers": 2,
    })
