"""The VMEM limit the megakernel gives Mosaic: the target chip's catalog capacity (one owner)."""

from __future__ import annotations

from hwmodels.catalog import load_chip

# Where no chip is named (interpret mode, a TPU the catalog does not know), the kernel gets the
# VMEM of the chip the published kernel runs on, read from the catalog like every other chip's.
PUBLISHED_KERNEL_CHIP = "tpu-v7"


def vmem_limit_for(chip_name: str) -> int:
    """The VMEM limit the kernel gives Mosaic on ``chip_name``: the catalog's VMEM capacity
    (v5e and v6e 128 MiB, TPU v7 64 MiB); the scratch the accounting admits is its own check."""
    chip = load_chip(chip_name)
    try:
        vmem = chip.memory("vmem")
    except (KeyError, ValueError) as error:
        raise ValueError(f"{chip_name} has no VMEM in the catalog: not a TPU the kernel runs on") from error
    return int(vmem.capacity_bytes.value)
