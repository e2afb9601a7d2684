"""Code-size probe: does the core issue a long straight-line body as fast as a short loop?

The kernel's layer loop issues ~15,600 bundles of distinct code an iteration outside its
MLA/KDA arms plus ~27,600–36,400 in an arm (libtpu's static schedule, batch 1,
:mod:`calibration.tpu_bench.static_layer`), most of it straight-line; libtpu's bundle counts
are what the core issues when nothing stalls, and way (b) finds ~50 µs a layer the counts do
not hold. If instructions are fetched into the core as it runs (an instruction memory smaller
than the program), a long straight-line body would issue slower than the same operations
looped in a short body. This probe measures exactly that and nothing else.

``code_size``: a grid-less ``pallas_call`` whose body repeats ``R`` times (``R`` an SMEM
scalar) ``rounds`` rounds of ``x = (x ^ (x >> 3)) + c_k`` on ``u32[256, 128]`` (32 vregs of
independent lanes: enough parallel work to fill the VALU slots, the worked example of
``../shared/reference/compiler-static-schedule.md``), ``c_k`` cycling over 8 constants.
``form="straight"``: the rounds written out (``rounds`` × 3 × 32 VALU operations of distinct
code); ``form="looped"``: the same rounds as a ``fori_loop`` of 8 written-out rounds (a short
body run ``rounds / 8`` times). Same operations, same results; only the code size differs.
Each point records the whole-call seconds at one ``R``; ``(t(R2) - t(R1)) / (R2 - R1)`` is
one repetition, the launch and copy-in differenced out. Repetition ``i`` starts from slot
``i mod 2`` of the input so the work cannot be hoisted. ``elements`` = VALU lane-operations
(3 × 256 × 128 per round). The static bundles of each form's repetition come from libtpu's
schedule (:func:`calibration.tpu_bench.static_code.count`), so bundles ÷ measured seconds is
the issue rate the chip reached on each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calibration.tpu_bench.common import Point, Probe
from calibration.tpu_bench.probes_compute import SLOTS, _call, _last_slot, _slot
from tpusim.schedule.kernel_layout import LANES

ROWS = 256
INNER_ROUNDS = 8  # rounds written out in the looped form's body (and the constants' cycle)
CONSTANTS = tuple(0x9E3779B1 * (k + 1) & 0xFFFFFFFF for k in range(INNER_ROUNDS))
CODE_ROUNDS = (32, 256, 1024, 2048)  # ~0.8k, ~6.2k, ~24.6k, ~49k bundles of straight-line code a repetition (v5e)
TARGET_ROUNDS_TOTAL = 131072  # R2 × rounds: ~2-3 ms of issue at the longest R


def _round(x: jax.Array, k: int) -> jax.Array:
    return (x ^ (x >> 3)) + jnp.uint32(CONSTANTS[k % INNER_ROUNDS])


def _rounds_numpy(x: np.ndarray, rounds: int) -> np.ndarray:
    x = x.astype(np.uint32)
    for k in range(rounds):
        x = (x ^ (x >> np.uint32(3))) + np.uint32(CONSTANTS[k % INNER_ROUNDS])
    return x


def code_call(rounds: int, form: str, interpret: Any) -> Callable[..., Any]:
    """``fn(int32[1] = (R,), x u32[2, 256, 128]) -> u32[256, 128]``: the last repetition's result."""
    if rounds % INNER_ROUNDS:
        raise ValueError(f"rounds must be a multiple of {INNER_ROUNDS}, got {rounds}")

    def kernel(s_ref: Any, x_ref: Any, o_ref: Any) -> None:
        def repetition(i: Any, c: Any) -> Any:
            x = x_ref[_slot(i)]
            if form == "straight":
                for k in range(rounds):
                    x = _round(x, k)
            else:
                def eight(j: Any, y: jax.Array) -> jax.Array:
                    for k in range(INNER_ROUNDS):
                        y = _round(y, k)
                    return y
                x = lax.fori_loop(0, rounds // INNER_ROUNDS, eight, x)
            o_ref[...] = x
            return c
        lax.fori_loop(0, s_ref[0], repetition, 0)

    vmem = 4 * ROWS * LANES * (SLOTS + 1)
    return _call(kernel, jax.ShapeDtypeStruct((ROWS, LANES), jnp.uint32), 1, vmem, interpret)


def _code_probe(rounds: int, form: str, repeats: tuple[int, ...], interpret: Any) -> Probe:
    def make() -> list[jax.Array]:
        key = jax.random.key(11)
        return [jax.random.bits(key, (SLOTS, ROWS, LANES), jnp.uint32)]

    def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
        want = _rounds_numpy(np.asarray(inputs[0][_last_slot(point)]), rounds)
        return None if np.array_equal(np.asarray(out), want) else "rounds differ from numpy"

    lane_ops = 3 * ROWS * LANES * rounds
    return Probe(
        name="code_size", params={"rounds": rounds, "form": form, "rows": ROWS, "dtype": "u32"},
        fn=code_call(rounds, form, interpret),
        input_shapes=[jax.ShapeDtypeStruct((SLOTS, ROWS, LANES), jnp.uint32)],
        make_inputs=make, n_scalars=1, check=check,
        points=[Point({"repeats_in_kernel": r}, (r,), elements=lane_ops * r) for r in repeats],
        extra={"what": "whole-call seconds of R repetitions of `rounds` xor-shift-add rounds on u32[256,128], "
                       "written out (straight) or as a loop of 8 (looped); difference two R"})


def code_size_probes(interpret: Any, quick: bool) -> list[Probe]:
    """Both forms at each size, largest last (its compile is the slowest)."""
    sizes = (INNER_ROUNDS * 2,) if quick else CODE_ROUNDS
    probes = []
    for rounds in sizes:
        longest = 2 if quick else max(8, TARGET_ROUNDS_TOTAL // rounds)
        repeats = (1, 2) if quick else (1, longest // 2, longest)
        probes += [_code_probe(rounds, form, repeats, interpret) for form in ("looped", "straight")]
    return probes
