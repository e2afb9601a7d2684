"""The loops of a compiled kernel read from its branches: trip counts, if/else arms and bundles
issued."""

from __future__ import annotations

import pytest

from calibration.sources.compiler_loops import (
    branch_loops,
    forward_branches,
    issued_bundles,
    layer_loop,
)
from calibration.sources.compiler_schedule import KernelSchedule, loops, parse_bundles

# An outer loop (bundles 1-17, the "layers", its exit test predicated as libtpu prints it) holds
# a static inner loop of 3 trips (bundles 3-5), a data-dependent loop whose bound is a register
# (bundles 7-9, the "experts") and an if/else: bundle 10 branches over the first arm (11-12) to
# the "empty region" at 13, whose branch (reached at the end of the first arm) skips the
# second arm (14-15), which holds a loop of 2 trips (14-15). Depth marks are left at 1 on
# purpose: the outer body is not bounded by them.
PROGRAM = """   0x0   :  { %s1 = smov 0 } /* Start region 1 */
   0x1 LB: > { %s2 = sphi %s1, %s20  ;;  %v1 = vld [vmem:[#a]] } /* Start region 10 */
   0x2   : > { %s3 = smov 0  ;;  %p9 = scmp.eq.s32.totalorder %s2, 0 }
   0x3 LB: > { %s4 = sphi %s3, %s5  ;;  %v2 = vadd.f32 %v1, %v1 } /* Start region 20 */
   0x4   : > { %s5 = sadd.s32 1, %s4  ;;  %p6 = scmp.ge.s32.totalorder %s5, 3 /* loop exit test */ }
   0x5   : > { %7 = sbr.rel (!%p6) target = $region20 }
   0x6   : > { %s11 = sld [smem:[#n]] }
   0x7 LB: > { %s12 = sphi %s3, %s13  ;;  %v3 = vmul.f32 %v2, %v2 } /* Start region 30 */
   0x8   : > { %s13 = sadd.s32 1, %s12  ;;  %p14 = scmp.ge.s32.totalorder %s13, %s11 /* loop exit test */ }
   0x9   : > { %15 = sbr.rel (!%p14) target = $region30 }
   0xa   : > { %16 = sbr.rel (%p9) target = $region40 }
   0xb   : > { %v4 = vadd.f32 %v3, %v3 }
   0xc   : > { %v5 = vmul.f32 %v4, %v4 }
   0xd PF: > { %17 = sbr.rel (!%p9) target = $region50 } /* Start/End empty region 40 */
   0xe LB: > { %s18 = sphi %s3, %s19  ;;  %v6 = vadd.f32 %v3, %v3 } /* Start region 45 */
   0xf   : > { %s19 = sadd.s32 1, %s18  ;;  %p22 = scmp.ge.s32.totalorder %s19, 2 /* loop exit test */  ;;  %23 = sbr.rel (!%p22) target = $region45 }
  0x10   : > { %s20 = sadd.s32 1, %s2  ;;  %p21 = scmp.ge.s32.totalorder (%p9), %s20, 92 /* loop exit test */ } /* Start region 50 */
  0x11   : > { %24 = sbr.rel (!%p21) target = $region10 }
  0x12   :  { %25 = vst [vmem:[#b]] %v4 }
"""


def test_loops_and_skips_come_from_the_branches() -> None:
    bundles = parse_bundles(PROGRAM)
    found = branch_loops(bundles)
    assert [(loop.start, loop.end, loop.trips) for loop in found] == [(1, 17, 92), (3, 5, 3), (7, 9, None), (14, 15, 2)]
    assert forward_branches(bundles) == [(10, 13), (13, 16)]
    # the depth marks see sibling bodies split at each LB, none nested: not the program's loops
    assert all(not body.children for body in loops(bundles)) and len(loops(bundles)) == 4


def test_one_iteration_issues_each_bundle_times_its_inner_trips_outside_the_arms() -> None:
    bundles = parse_bundles(PROGRAM)
    found = branch_loops(bundles)
    outer = found[0]
    issued, dependent = issued_bundles(found, 1, 17, iteration_of=outer)  # one iteration, both arms
    # once: 1, 2, 6, 10, 11, 12, 13, 16, 17; 3 x (3-5); 2 x (14-15); 7-9 data-dependent, left out
    assert issued == 9 + 3 * 3 + 2 * 2
    assert [(d.start, d.end) for d in dependent] == [(7, 9)]
    assert issued_bundles(found, 1, 17)[0] == 92 * issued  # the whole loop, every iteration alike
    loop = layer_loop(KernelSchedule("step", {}, bundles, loops(bundles)))
    assert (loop.loop.start, loop.loop.end) == (1, 17)
    assert [(a.start, a.end, a.issued_bundles) for a in loop.arms] == [(11, 12, 2), (14, 15, 2 * 2)]
    assert loop.issued_bundles == 7 + 3 * 3  # outside the arms: 1, 2, 6, 10, 13, 16, 17 and the 3-trip loop
    assert loop.issue_s(1.0, arm=1) == 7 + 3 * 3 + 4
    assert [(i.start, i.trips) for i in loop.inner] == [(3, 3), (14, 2)]


def test_a_program_without_a_backward_branch_is_refused() -> None:
    bundles = parse_bundles("   0x0   :  { %1 = vsyncpa [#a], 0 }\n")
    with pytest.raises(ValueError, match="no backward branch"):
        layer_loop(KernelSchedule("copy", {}, bundles, loops(bundles)))
