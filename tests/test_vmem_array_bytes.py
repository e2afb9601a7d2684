""":func:`tpusim.schedule.kernel_layout.vmem_array_bytes` is what Mosaic allocates: a probe
kernel with one scratch buffer is compiled for TPU7x with a 1 MiB VMEM limit, and the
compiler's refusal names the scoped allocation the buffer needed; it must equal the rule
(odd row counts of f32 and bf16, a one-row bf16 buffer, lanes short of 128). The five compiles
run in one fresh process (libtpu's environment is set before JAX starts), one line each."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tpusim.schedule.kernel_layout import vmem_array_bytes

pytest.importorskip("libtpu", reason="libtpu is not installed: Mosaic cannot compile here")

PROBE = r'''
import sys
from megakernel.mosaic_compile import prepare_environment
prepare_environment()
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from megakernel.mosaic_compile import compile_function
def kernel(x_ref, o_ref, buf):
    buf[...] = jnp.zeros(buf.shape, buf.dtype) + x_ref[0, 0].astype(buf.dtype)
    o_ref[...] = jnp.sum(buf[...].astype(jnp.float32)).reshape(1, 1) * jnp.ones((8, 128), jnp.float32)
for arg in sys.argv[1:]:  # SHAPE:DTYPE, e.g. 512x3x512:float32
    text, name = arg.split(":")
    shape, dtype = tuple(int(x) for x in text.split("x")), jnp.dtype(name)
    def f(x, shape=shape, dtype=dtype):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                              in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                              scratch_shapes=[pltpu.VMEM(shape, dtype)],
                              compiler_params=pltpu.CompilerParams(vmem_limit_bytes=1 << 20))(x)
    error = compile_function(f, (jax.ShapeDtypeStruct((1, 1), jnp.float32),), "tpu7x:2x2x1").error
    print(arg, "=>", " ".join(str(error).split()), flush=True)
'''
CASES = [((512, 3, 512), "float32", 4), ((256, 9, 512), "float32", 4), ((2048, 1, 512), "bfloat16", 2),
         ((128, 17, 512), "bfloat16", 2), ((1024, 8, 32), "float32", 4)]


def _arg(shape: tuple[int, ...], dtype: str) -> str:
    return "x".join(map(str, shape)) + ":" + dtype


@pytest.fixture(scope="module")
def refusals() -> tuple[dict[str, str], str]:
    """``{SHAPE:DTYPE: the compiler's message}`` of every case, compiled in one process (starting
    JAX and libtpu costs ~3 s of CPU, paid once, not five times), and the process's output tail."""
    done = subprocess.run([sys.executable, "-c", PROBE, *(_arg(shape, dtype) for shape, dtype, _ in CASES)],
                          capture_output=True, text=True, timeout=600, check=False)
    lines = dict(line.split(" => ", 1) for line in done.stdout.splitlines() if " => " in line)
    return lines, done.stdout[-1500:] + done.stderr[-1500:]


@pytest.mark.parametrize(("shape", "dtype", "itemsize"), CASES)
@pytest.mark.slow  # the module's one process: five Mosaic compiles (~15-25 s of CPU in all)
def test_the_rule_is_the_compilers_allocation(refusals, shape, dtype, itemsize):
    lines, tail = refusals
    found = re.search(r"Scoped allocation with size ([0-9.]+)M", lines.get(_arg(shape, dtype), ""))
    assert found, tail
    assert float(found.group(1)) * (1 << 20) == pytest.approx(vmem_array_bytes(shape, itemsize), rel=5e-3)
