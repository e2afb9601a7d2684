"""How a collective's receiving rank combines what arrived (:meth:`megakernel.multi_device_decode.DecodeKernel.wait`).

A phase's contributions are the messages in the receive slots (slot ``k``: the k-th other
participant in rank order) and this rank's own part in its send buffer, which belongs before
slot ``at`` (its position among the participants, a traced scalar). :func:`ranked` puts them in
rank order block by block of lanes; a reduction sums them in that order (:func:`sum_blocks`), so
every member computes the same value; a gather concatenates them. Everything stays vector
selects and loads: Mosaic has no dynamic slice of a value, and in interpret mode each ref
access is a callback and an entry of the race detector.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# Lanes the combine handles at once: a [8, 512] f32 block is 4 vector registers, so the
# contributions of one block stay in registers. Combining a whole K3 payload at once (8 x 7168
# values, 7 arrivals) held megabytes of f32 values that Mosaic spilled: at batch 8 on 32 TPU7x
# devices 38.1 MiB of spill slots, 28 MiB of them the two one-shot reductions' combines;
# by blocks (and [B, w] messages) 10.5 MiB (docs/multi-device.md).
COMBINE_LANES = 512


def ranked(recv: Any, par: Any, count: int, own_ref: Any, at: Any, cols: int) -> list[list[jax.Array]]:
    """The ``count + 1`` contributions of a phase in rank order, each f32[rows, cols] as
    COMBINE_LANES-column blocks: ``recv`` [copies, count, rows, cols] holds the others' (slot
    ``k`` the k-th other rank), ``own_ref`` [rows, cols] this rank's, which goes before slot
    ``at`` (traced). Vector selects, one load per block and source (each access is an
    interpreter callback and a race-detector entry)."""
    terms: list[list[jax.Array]] = [[] for _ in range(count + 1)]
    for lo in range(0, cols, COMBINE_LANES):
        size = min(COMBINE_LANES, cols - lo)
        slots = recv[par, :, :, pl.ds(lo, size)].astype(jnp.float32)  # [count, rows, size]
        own = own_ref[:, pl.ds(lo, size)].astype(jnp.float32)  # [rows, size]
        for k in range(count + 1):
            before = slots[k] if k < count else own  # rank k is slot k when k < at
            after = slots[k - 1] if k > 0 else own  # slot k - 1 when k > at
            terms[k].append(jnp.where(k < at, before, jnp.where(k == at, own, after)))
    return terms


def sum_blocks(terms: list[list[jax.Array]]) -> jax.Array:
    """The contributions summed in rank order -> f32[rows, cols]."""
    return joined([jnp.sum(jnp.stack([t[j] for t in terms]), axis=0) for j in range(len(terms[0]))])


def fold(value: jax.Array, parts: int) -> jax.Array:
    """[B, w] -> [B·parts, w / parts]: token ``t``'s columns ``[k·w/parts, (k+1)·w/parts)`` in
    row ``t·parts + k``. A one-token bf16 message is padded by Mosaic to the two rows a
    sublane packs; folded into two half-width rows it fills its tiles (K3 at batch 1: 0.62 of
    the collectives' 1.24 MiB were that padding). Lane slices at multiples of 128 and a
    concatenation of rows: no shape cast across the tiled dimensions."""
    if parts == 1:
        return value
    cols = value.shape[1] // parts
    return jnp.concatenate([value[t: t + 1, k * cols: (k + 1) * cols]
                            for t in range(value.shape[0]) for k in range(parts)], axis=0)


def unfold(value: jax.Array, parts: int) -> jax.Array:
    """The inverse of :func:`fold`: [B·parts, c] -> [B, c·parts]."""
    if parts == 1:
        return value
    tokens = value.shape[0] // parts
    rows = [jnp.concatenate([value[t * parts + k: t * parts + k + 1] for k in range(parts)], axis=1)
            for t in range(tokens)]
    return jnp.concatenate(rows, axis=0) if tokens > 1 else rows[0]


def joined(blocks: list[jax.Array]) -> jax.Array:
    """One contribution's lane blocks side by side -> [rows, cols]."""
    return jnp.concatenate(blocks, axis=1) if len(blocks) > 1 else blocks[0]


def unflatten(flat: jax.Array, rows: int, width: int) -> jax.Array:
    """``flat`` [1, rows·width] -> [rows, width] by lane slices: Mosaic has no shape cast from a
    long vector to [rows, width] (K3 at batch 8: 3072 -> 8 x 384)."""
    if rows == 1:
        return flat
    return jnp.concatenate([flat[:, r * width: (r + 1) * width] for r in range(rows)], axis=0)
