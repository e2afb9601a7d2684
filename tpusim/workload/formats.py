"""Weight storage formats and the one function that owns their byte counts.

A format stores ``value_bits`` per weight plus ``scale_bits`` for every
``scale_block_values`` weights (block scales run along the contraction rows, as in the
K3 checkpoint: FP8 gate/up has a bf16 scale per 256 rows; MXFP4 an E8M0 scale per 32
values). ``mxu_dtype`` is the dtype the matrix unit consumes after dequantisation in
on-chip memory (the published kernels dequantise narrow weights and push them at the
bf16 rate).

| format            | value bits | scale                        | source |
| ---               | ---        | ---                          | --- |
| bf16              | 16         | —                            | |
| f32               | 32         | —                            | |
| fp8_e4m3_b256     | 8          | bf16 per 256 contraction rows| K3 routed gate/up |
| fp8_e4m3_b128x128 | 8          | f32 per 128 x 128 block      | DeepSeek-V3 / Kimi K2 checkpoints |
| mxfp4             | 4          | E8M0 (8 bit) per 32 values   | K3 routed down |
| nvfp4             | 4          | e4m3 (8 bit) per 16 values   | Muse Spark experts (3.38 MiB/expert/core) |
| int8_channel      | 8          | bf16 per output column       | Muse Spark int8 dense |
| int4_g128         | 4          | bf16 scale + bf16 offset per 128 | Muse Spark int4 experts (3.19 MiB/expert/core) |

Short names accepted on the command line (``--formats experts=nvfp4``) and in
``quantization_config`` readers resolve through :data:`FORMAT_ALIASES` to one layout each:
``fp8`` is e4m3 with an f32 scale per 128 x 128 block (the DeepSeek-V3 / Kimi K2 / Qwen3-FP8
checkpoint layout), ``int8`` int8 with a bf16 scale per output channel, ``int4`` int4 with
a bf16 scale and offset per group of 128 rows (GPTQ/AWQ-style group quantisation).

Bytes per value of a plain element dtype (an activation, a matmul operand, a transfer) are
:data:`DTYPE_BYTES`, read through :func:`dtype_bytes`; it is the one such table (the
calibration micro models and component payloads read it; ``calibration/gpu_bench``, which
cannot import pydantic, keeps a mirror that a test checks against it):

| dtype | bytes per value |
| ---   | --- |
| f32   | 4 |
| bf16  | 2 |
| fp8   | 1 (e4m3 / e5m2 values, no scale) |
| int8  | 1 |
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DtypeName = Literal["bf16", "fp8", "f32", "int8"]

DTYPE_BYTES: dict[str, int] = {"f32": 4, "bf16": 2, "fp8": 1, "int8": 1}


def dtype_bytes(dtype: str) -> int:
    """Bytes per value of element dtype ``dtype`` (:data:`DTYPE_BYTES`); KeyError naming the known ones."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise KeyError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


FormatName = Literal[
    "bf16", "f32", "fp8_e4m3_b256", "fp8_e4m3_b128x128", "mxfp4", "nvfp4", "int8_channel", "int4_g128"
]


class WeightFormat(BaseModel):
    """How one weight tensor is stored in HBM."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    value_bits: int = Field(ge=1)
    scale_bits: int = Field(default=0, ge=0, description="bits of scale per block")
    scale_block_values: int = Field(
        default=0, ge=0, description="weights per scale (0: no block scale)"
    )
    scale_block_cols: int = Field(
        default=1, ge=1, description="columns one block scale covers (2-D blocks, DeepSeek FP8)"
    )
    per_column_scale_bits: int = Field(
        default=0, ge=0, description="bits of scale per output column (channel-wise formats)"
    )
    mxu_dtype: DtypeName = "bf16"


FORMATS: dict[str, WeightFormat] = {
    "bf16": WeightFormat(name="bf16", value_bits=16),
    "f32": WeightFormat(name="f32", value_bits=32, mxu_dtype="f32"),
    "fp8_e4m3_b256": WeightFormat(
        name="fp8_e4m3_b256", value_bits=8, scale_bits=16, scale_block_values=256
    ),
    "fp8_e4m3_b128x128": WeightFormat(
        name="fp8_e4m3_b128x128", value_bits=8, scale_bits=32, scale_block_values=128,
        scale_block_cols=128,
    ),
    "mxfp4": WeightFormat(name="mxfp4", value_bits=4, scale_bits=8, scale_block_values=32),
    "nvfp4": WeightFormat(name="nvfp4", value_bits=4, scale_bits=8, scale_block_values=16),
    "int8_channel": WeightFormat(
        name="int8_channel", value_bits=8, per_column_scale_bits=16, mxu_dtype="int8"
    ),
    "int4_g128": WeightFormat(name="int4_g128", value_bits=4, scale_bits=32, scale_block_values=128),
}


FORMAT_ALIASES: dict[str, str] = {"fp8": "fp8_e4m3_b128x128", "int8": "int8_channel", "int4": "int4_g128"}


def canonical_format(name: str) -> str:
    """The layout name of ``name`` (an alias or a layout); KeyError naming the known ones."""
    name = FORMAT_ALIASES.get(name, name)
    if name not in FORMATS:
        known = ", ".join([*FORMAT_ALIASES, *FORMATS])
        raise KeyError(f"unknown weight format {name!r}; known: {known}")
    return name


def weight_format(name: str) -> WeightFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}") from None


def value_bytes(fmt: WeightFormat, rows: int, cols: int) -> int:
    """Bytes of the packed values of a ``rows x cols`` tensor (rows = contraction)."""
    return math.ceil(rows * cols * fmt.value_bits / 8)


def scale_bytes(fmt: WeightFormat, rows: int, cols: int) -> int:
    """Bytes of the block and per-column scales of a ``rows x cols`` tensor."""
    total_bits = 0
    if fmt.scale_block_values:
        blocks_per_col = math.ceil(rows / fmt.scale_block_values)
        col_blocks = math.ceil(cols / fmt.scale_block_cols)
        total_bits += blocks_per_col * col_blocks * fmt.scale_bits
    total_bits += cols * fmt.per_column_scale_bits
    return math.ceil(total_bits / 8)


def tensor_bytes(fmt: WeightFormat, rows: int, cols: int) -> int:
    """Total HBM bytes of a ``rows x cols`` tensor in ``fmt``, scales included."""
    return value_bytes(fmt, rows, cols) + scale_bytes(fmt, rows, cols)
