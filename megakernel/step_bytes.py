"""The HBM bytes one decode step of the kernel moves, read off its own layout.

Every figure is a copy the kernel issues (:mod:`megakernel.kernel_dma`,
:mod:`megakernel.kernel_attention`), sized by the same geometry it allocates from
(:mod:`megakernel.dma_plan`), so it can be set beside the simulator's ``dma_bytes`` for the
same program and routing (``run-kernel`` prints both):

- weights: each ring's HBM stack is read once per tensor instance per step, every slab of it,
  at its VMEM size (columns padded to 128-lane panels, a last partial slab zero-padded), and
  the small-parameter row of every layer (tile-padded);
- routed experts: ``n_l`` slots per MoE layer (the distinct experts the batch routes to on
  this device), each slot its two tile-padded copies;
- MLA KV cache: the ``ceil(position / tile)`` whole tiles the attention streams, and the
  :data:`tpusim.schedule.vmem.KV_WRITE_TOKENS`-token tile that holds the new row, read back
  and written (:func:`megakernel.kernel_attention.mla_layer`);
- KDA: the recurrent state and the short-convolution state, read and written per layer.

Weight banks (:attr:`megakernel.dims.ModelDims.weight_banks`) change no figure: a banked
stack is still read once per instance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from megakernel.kernel import Megakernel
from tpusim.schedule.kernel_layout import KV_WRITE_TOKENS, LANES
from tpusim.workload.registry.names import StateFamily

ROW_BYTES = LANES * 2  # one 128-lane row of 16-bit words


def step_hbm_bytes(kernel: Megakernel, experts_per_layer: Sequence[int], position: int) -> dict[str, int]:
    """Bytes by kind for one step at cache ``position`` (tokens already cached), with
    ``experts_per_layer[i]`` distinct local experts loaded in MoE layer ``i + 1``."""
    d, geo, b = kernel.dims, kernel.geo, kernel.batch
    if len(experts_per_layer) != len(d.moe_layers):
        raise ValueError(f"experts_per_layer has {len(experts_per_layer)} entries; the model has "
                         f"{len(d.moe_layers)} MoE layers")
    weights = 0
    for name, ring in geo.rings.items():
        if name == "expert":
            continue
        instances = d.num_layers if name == "small" else ring.instances
        weights += instances * ring.num_slabs * ring.slab_arena_rows * ROW_BYTES
    slot = geo.expert_slot
    experts = int(sum(experts_per_layer)) * slot.total * ROW_BYTES
    tile = geo.kv_tile_tokens
    kv_row = d.mla.kv_cols * 2  # bf16
    tiles = -(-position // tile)
    kv_read = len(d.mla_layers) * b * tiles * tile * kv_row
    kv_write = len(d.mla_layers) * 2 * b * KV_WRITE_TOKENS * kv_row
    states = kernel.state_shapes()
    per_kda = sum(int(np.prod(states[n].shape[1:])) * states[n].dtype.itemsize for n in ("state.kda", "state.conv"))
    kda_state = len(d.kda_layers) * 2 * per_kda
    return {"weights": weights, "routed_experts": experts, "kv_read": kv_read, "kv_write": kv_write,
            StateFamily.KDA_STATE: kda_state}
