"""The one dtype byte table (``tpusim.workload.formats.DTYPE_BYTES``) and its checked mirror."""

from __future__ import annotations

import pytest

from calibration.gpu_bench.micro import ITEMSIZE
from tpusim.workload.formats import DTYPE_BYTES, FORMATS, dtype_bytes


def test_the_gpu_bench_mirror_agrees_with_the_one_table() -> None:
    # gpu_bench runs without pydantic, so it cannot import formats; its table is a mirror
    assert {dtype: DTYPE_BYTES[dtype] for dtype in ITEMSIZE} == ITEMSIZE


def test_plain_dtypes_agree_with_the_value_bits_of_their_formats() -> None:
    for dtype, layout in {"bf16": "bf16", "f32": "f32", "fp8": "fp8_e4m3_b256", "int8": "int8_channel"}.items():
        assert dtype_bytes(dtype) * 8 == FORMATS[layout].value_bits


def test_every_mxu_dtype_has_a_byte_count() -> None:
    assert {fmt.mxu_dtype for fmt in FORMATS.values()} <= set(DTYPE_BYTES)


def test_an_unknown_dtype_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known: f32, bf16, fp8, int8"):
        dtype_bytes("fp6")
