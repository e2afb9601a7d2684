"""The loops of a compiled kernel read from its branches: trip counts and bundles issued."""

from __future__ import annotations

import pytest

from calibration.sources.compiler_loops import branch_loops, issued_bundles, layer_loop
from calibration.sources.compiler_schedule import KernelSchedule, loops, parse_bundles

# An outer loop (bundles 1-12, the "layers", its exit test predicated as libtpu prints it) holds
# a static inner loop of 3 trips (bundles 3-5), a data-dependent loop whose bound is a
# register (bundles 7-9, the "experts") and a forward branch that skips nothing of interest.
# Depth marks are left at 1 on purpose: the outer body is not bounded by them.
PROGRAM = """   0x0   :  { %s1 = smov 0 } /* Start region 1 */
   0x1 LB: > { %s2 = sphi %s1, %s20  ;;  %v1 = vld [vmem:[#a]] } /* Start region 10 */
   0x2   : > { %s3 = smov 0  ;;  %p9 = scmp.eq.s32.totalorder %s2, 0 }
   0x3 LB: > { %s4 = sphi %s3, %s5  ;;  %v2 = vadd.f32 %v1, %v1 } /* Start region 20 */
   0x4   : > { %s5 = sadd.s32 1, %s4  ;;  %p6 = scmp.ge.s32.totalorder %s5, 3 /* loop exit test */ }
   0x5   : > { %7 = sbr.rel (!%p6) target = $region20 }
   0x6   : > { %8 = sbr.rel (%p9) target = $region40  ;;  %s11 = sld [smem:[#n]] }
   0x7 LB: > { %s12 = sphi %s3, %s13  ;;  %v3 = vmul.f32 %v2, %v2 } /* Start region 30 */
   0x8   : > { %s13 = sadd.s32 1, %s12  ;;  %p14 = scmp.ge.s32.totalorder %s13, %s11 /* loop exit test */ }
   0x9   : > { %15 = sbr.rel (!%p14) target = $region30 }
   0xa   : > { %v4 = vadd.f32 %v3, %v3 } /* Start region 40 */
   0xb   : > { %s20 = sadd.s32 1, %s2  ;;  %p21 = scmp.ge.s32.totalorder (%p9), %s20, 92 /* loop exit test */ }
   0xc   : > { %22 = sbr.rel (!%p21) target = $region10 }
   0xd   :  { %23 = vst [vmem:[#b]] %v4 }
"""


def test_loops_come_from_backward_branches_with_their_exit_tests() -> None:
    bundles = parse_bundles(PROGRAM)
    found = branch_loops(bundles)
    assert [(loop.start, loop.end, loop.trips) for loop in found] == [(1, 12, 92), (3, 5, 3), (7, 9, None)]
    # the depth marks see three sibling bodies split at each LB, none nested: not the program's loops
    assert [(b.start, b.end, b.children) for b in loops(bundles)] == [(1, 2, []), (3, 6, []), (7, 12, [])]


def test_one_iteration_issues_each_bundle_times_its_inner_trips() -> None:
    bundles = parse_bundles(PROGRAM)
    found = branch_loops(bundles)
    issued, dependent = issued_bundles(found, 1, 12)
    # bundles 1, 2, 6, 10, 11, 12 once; 3-5 three times; 7-9 (data-dependent) left out
    assert issued == 6 + 3 * 3
    assert [(d.start, d.end) for d in dependent] == [(7, 9)]
    loop = layer_loop(KernelSchedule("step", {}, bundles, loops(bundles)))
    assert (loop.loop.start, loop.loop.end, loop.issued_bundles) == (1, 12, 15)
    assert [(i.start, i.trips) for i in loop.inner] == [(3, 3)]
    assert loop.issue_s(1.5e9) == pytest.approx(15 / 1.5e9)


def test_a_program_without_a_backward_branch_is_refused() -> None:
    bundles = parse_bundles("   0x0   :  { %1 = vsyncpa [#a], 0 }\n")
    with pytest.raises(ValueError, match="no backward branch"):
        layer_loop(KernelSchedule("copy", {}, bundles, loops(bundles)))
