"""Reading libtpu's bundle dump: bundles, units, loop bodies and their nesting."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.sources.compiler_schedule import loops, parse_bundles, parse_utilization, read_dump

BUNDLES = """= control target key start
LH: loop header
= control target key end

     0   :  { %1 = vsyncpa [#a], 0 }
   0x1   :  { %2 = dma.hbm_to_vmem [thread:$0] /*
base_bounds: (32, 1) */ }
   0x2 LB: > { %v1 = vld [vmem:[#b]]  ;;  %v2 = vadd.s32 1, %v1 }
   0x3   : > { %v3 = vxor.u32 %v2, %v1 }
   0x4 LB: >> { %v4 = vmul.f32 %v3, %v3  ;;  %v5 = vadd.f32 %v4, %v3 }
   0x5   : >> { %6 = vmatpush.bf16.msra.mxu0 %v5 }
   0x6   : > { %7 = vst [vmem:[#c]] %v5 }
   0x7   :  { %8 = vsyncadd [#a], 1 }
"""
UTIL = """== CAPACTIY:
MXU, XLU, VALU, VPOP, EUP, VLOAD, VLOAD:FILL, VSTORE, VSTORE:SPILL, SALU
    4     3     4     2     1     3     3     1     1     2
== UTILIZATION:
0 0 0 0 0 0 0 0 0 1
0 0 0 0 0 0 0 0 0 1
0 0 1 0 0 1 0 0 0 0
0 0 1 0 0 0 0 0 0 0
0 0 2 0 0 0 0 0 0 0
1 0 0 0 0 0 0 0 0 0
0 0 0 0 0 0 0 1 0 0
0 0 0 0 0 0 0 0 0 1
"""


def test_bundles_units_and_nested_loops(tmp_path: Path) -> None:
    bundles = parse_bundles(BUNDLES)
    assert [b.depth for b in bundles] == [0, 0, 1, 1, 2, 2, 1, 0]
    assert bundles[1].text.count("\n") == 1  # a comment spanning two lines stays with its bundle
    capacity, rows = parse_utilization(UTIL)
    assert capacity["VALU"] == 4 and capacity["VSTORE"] == 1 and len(rows) == 8
    (tmp_path / "7-tpu_custom_call.1-71-final_bundles.txt").write_text(BUNDLES)
    (tmp_path / "7-tpu_custom_call.1-69-final_hlo-static-per-bundle-utilization.txt").write_text(UTIL)
    schedule = read_dump(tmp_path)
    (outer,) = schedule.loops
    assert (outer.start, outer.end, outer.bundles, outer.own_bundles) == (2, 6, 5, 3)
    assert outer.units == {"VALU": 2, "VLOAD": 1, "VSTORE": 1}
    (inner,) = outer.children
    assert (inner.bundles, inner.units) == (2, {"VALU": 2, "MXU": 1})
    assert schedule.innermost() == [inner] and [(c.start, c.end) for c in loops(bundles)[0].children] == [(4, 5)]
    assert bundles[5].count("vmatpush") == 1 and bundles[4].count("vadd") == 1
    # pushes by weight dtype, and the innermost loops that push (the panel loops' table)
    assert schedule.pushes(outer) == schedule.pushes(inner) == {"bf16": 1}
    assert schedule.inner_table() == [{"start": 4, "bundles": 2, "pushes": {"bf16": 1}, "VALU": 2, "MXU": 1}]
    fp8 = parse_bundles(BUNDLES.replace("vmatpush.bf16.msra", "vmatpush3.f8e4m3.msra"))
    assert fp8[5].count("vmatpush") == 1


def test_a_dump_without_the_kernel_or_rows_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_dump(tmp_path)
    with pytest.raises(ValueError, match="CAPACITY"):
        parse_utilization("nothing")
    with pytest.raises(ValueError, match="no bundles"):
        parse_bundles("= header only")
