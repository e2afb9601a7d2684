""":func:`tpusim.schedule.kernel_layout.vmem_array_bytes` is what Mosaic allocates: a probe
kernel with one scratch buffer is compiled for TPU7x with a 1 MiB VMEM limit, and the
compiler's refusal names the scoped allocation the buffer needed; it must equal the rule
(odd row counts of f32 and bf16, a one-row bf16 buffer, lanes short of 128). Each compile
runs in a fresh process (libtpu's environment is set before JAX starts)."""

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
shape, dtype = tuple(int(x) for x in sys.argv[1].split("x")), jnp.dtype(sys.argv[2])
def kernel(x_ref, o_ref, buf):
    buf[...] = jnp.zeros(buf.shape, buf.dtype) + x_ref[0, 0].astype(buf.dtype)
    o_ref[...] = jnp.sum(buf[...].astype(jnp.float32)).reshape(1, 1) * jnp.ones((8, 128), jnp.float32)
def f(x):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)], scratch_shapes=[pltpu.VMEM(shape, dtype)],
                          compiler_params=pltpu.CompilerParams(vmem_limit_bytes=1 << 20))(x)
print(compile_function(f, (jax.ShapeDtypeStruct((1, 1), jnp.float32),), "tpu7x:2x2x1").error)
'''


@pytest.mark.parametrize(("shape", "dtype", "itemsize"), [
    ((512, 3, 512), "float32", 4), ((256, 9, 512), "float32", 4), ((2048, 1, 512), "bfloat16", 2),
    ((128, 17, 512), "bfloat16", 2), ((1024, 8, 32), "float32", 4),
])
@pytest.mark.slow  # a Mosaic compile in a fresh process (~6-12 s)
def test_the_rule_is_the_compilers_allocation(shape, dtype, itemsize):
    done = subprocess.run([sys.executable, "-c", PROBE, "x".join(map(str, shape)), dtype],
                          capture_output=True, text=True, timeout=300, check=False)
    found = re.search(r"Scoped allocation with size ([0-9.]+)M", done.stdout)
    assert found, done.stdout[-1500:] + done.stderr[-1500:]
    assert float(found.group(1)) * (1 << 20) == pytest.approx(vmem_array_bytes(shape, itemsize), rel=5e-3)
