"""libtpu's Mosaic compiler compiles the whole kernel from this CPU-only machine (compile-only
devices of a named topology, nothing allocated) for TPU v5e and TPU7x, and fails, with the
compiler's alignment error in one paragraph, on a dynamic slice it cannot prove aligned.

Each compile takes ~2-13 s on the 2-core machine (the whole file ~45 s, two tests marked slow; the
in-process compile of the whole kernel ``-m heavy``, the same compiles running by default in a fresh
process, named in its docstring); tests/conftest.py sets
libtpu's environment before JAX starts (megakernel.mosaic_compile.ENVIRONMENT).
"""

from __future__ import annotations

import json

import pytest

from megakernel.mosaic_compile import describe_error, libtpu_available, topology_for

needs_libtpu = pytest.mark.skipif(not libtpu_available(), reason="libtpu is not installed: Mosaic cannot compile here")

ALIGNMENT = "cannot statically prove that index in dimension 0 is a multiple of 8"


def test_topology_for_each_chip() -> None:
    assert topology_for("tpu-v5e") == "v5e:2x2"
    assert topology_for("tpu-v6e") == "v6e:2x2"
    assert topology_for("tpu-v7") == "tpu7x:2x2x1"
    assert topology_for("tpu-v7", 32) == "tpu7x:2x2x4"
    with pytest.raises(ValueError, match="no Mosaic compile topology"):
        topology_for("h100-sxm")


def test_describe_error_is_one_paragraph() -> None:
    error = RuntimeError("INTERNAL: Mosaic failed to compile TPU kernel: E2003: bad\nSee docs\n\n"
                         "The MLIR operation involved:\n  %7 = \"tpu.vector_load\"(%arg3) : () -> ()\n")
    text = describe_error(error)
    assert "\n" not in text
    assert text.startswith("Mosaic failed to compile TPU kernel: E2003: bad")
    assert 'MLIR op: %7 = "tpu.vector_load"' in text


def _mini_kernel(chip: str):
    from megakernel.dims import model_dims
    from megakernel.expert_products import expert_products_for
    from megakernel.kernel import Megakernel
    from megakernel.vmem_limit import vmem_limit_for
    from tpusim.schedule.schema import load_schedule
    from tpusim.workload.model_catalog import load_model, plan_for

    model = load_model("kimi-k3-mini")
    return Megakernel(model_dims(model, plan_for(model, 1)), load_schedule("published"), 1, 1024,
                      vmem_limit_bytes=vmem_limit_for(chip), expert_products=expert_products_for(chip))


@needs_libtpu
@pytest.mark.parametrize("chip", ["tpu-v5e", "tpu-v7"])
@pytest.mark.heavy  # traces and compiles kimi-k3-mini (~10-20 s)
def test_kimi_k3_mini_compiles_with_mosaic(chip: str) -> None:
    """In process. The same two compiles run by default in a fresh process each (the kernel of
    ``megakernel.commands.mosaic_compile``'s defaults: kimi-k3-mini, published, batch 1, context
    1024, the chip's VMEM limit and expert products, as ``_mini_kernel`` builds it): for tpu-v5e
    through the CLI (:func:`test_lower_cli_compiles_for_the_chip`), for tpu-v7 in
    ``tests/test_expert_products_mxu.py::test_mini_compiles_for_tpu7x_with_fp8_pushes``."""
    from megakernel.mosaic_compile import compile_for

    report = compile_for(_mini_kernel(chip), topology_for(chip))
    assert report.ok, report.error
    assert report.seconds > 0 and report.error is None


@needs_libtpu
@pytest.mark.parametrize("chip", ["tpu-v5e", "tpu-v7"])
@pytest.mark.slow  # two Mosaic compiles (~10-25 s)
def test_compilers_scoped_vmem_is_the_accounting_plus_its_internal_scratch(chip: str) -> None:
    """The compiler's own figure (its refusal at half the scratch names the allocation it
    needed) against tpusim.schedule.vmem's total for the same kernel (kimi-k3-mini, batch 1):
    the accounting plus Mosaic's internal scratch, a few tens of KiB (K3's shard: 0.04 MiB
    on 50.25, +0.08 %; mini: +1.1 % of its 3.8 MiB)."""
    from megakernel.mosaic_compile import scoped_vmem_bytes
    from tpusim.schedule.schema import load_schedule
    from tpusim.schedule.vmem import vmem_plan
    from tpusim.workload.model_catalog import load_model, plan_for

    model = load_model("kimi-k3-mini")
    accounting = vmem_plan(load_schedule("published"), model, plan_for(model, 1), 1).total_bytes
    compiler = scoped_vmem_bytes(_mini_kernel(chip), topology_for(chip))
    assert compiler is not None
    assert 0 <= compiler - accounting <= 64 * 1024 + 0.005 * (1 << 20), (compiler, accounting)  # + rounding to 0.01 MiB


@needs_libtpu
def test_misaligned_dynamic_slice_fails_with_the_alignment_error() -> None:
    """A tiny Pallas kernel through the same path: a uint16 VMEM slice at ``i * 8 + 1``."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from megakernel.mosaic_compile import compile_function

    def body(x_ref, o_ref, buf):
        buf[...] = x_ref[...]
        o_ref[...] = buf[pl.ds(pl.program_id(0) * 8 + 1, 16), :]

    def misaligned(x):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.uint16), grid=(1,),
                              in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
                              out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
                              scratch_shapes=[pltpu.VMEM((64, 128), jnp.uint16)])(x)

    report = compile_function(misaligned, (jax.ShapeDtypeStruct((64, 128), jnp.uint16),), "v5e:2x2")
    assert not report.ok and report.kind == "mosaic"
    assert ALIGNMENT in report.error and "MLIR op:" in report.error and "\n" not in report.error
    assert "test_mosaic_compile.py:" in report.error


@needs_libtpu
def test_kernel_without_its_alignment_hints_fails(monkeypatch) -> None:
    """The kernel's copies and streamed products (megakernel.kernel_dma, megakernel.kernel_products)
    with ``pl.multiple_of`` planted as a no-op and each routed expert's arena slot one row off:
    Mosaic refuses the expert slices it cannot prove aligned, and the paragraph points into
    megakernel/."""
    import types

    from jax.experimental import pallas as pl

    from megakernel import kernel_dma, kernel_products
    from megakernel.mosaic_compile import compile_for

    planted = types.SimpleNamespace(**{name: getattr(pl, name) for name in dir(pl) if not name.startswith("__")})
    planted.multiple_of = lambda value, _multiple: value
    monkeypatch.setattr(kernel_dma, "pl", planted)
    monkeypatch.setattr(kernel_products, "pl", planted)  # the expert panels' slices (panel_products)
    aligned = kernel_dma.Ctx.expert_row
    monkeypatch.setattr(kernel_dma.Ctx, "expert_row", lambda self, j: aligned(self, j) + 1)  # one row off
    report = compile_for(_mini_kernel("tpu-v5e"), "v5e:2x2")
    assert not report.ok and report.kind == "mosaic", report.error
    assert "cannot statically prove" in report.error and "at megakernel/" in report.error


@needs_libtpu
@pytest.mark.slow  # a fresh process: imports, traces and compiles kimi-k3-mini (~14 s)
def test_lower_cli_compiles_for_the_chip(capsys) -> None:
    """The default run's Mosaic compile of the whole kernel for TPU v5e (``megakernel.commands.mosaic_compile``
    builds the kernel of ``_mini_kernel("tpu-v5e")``); the in-process one is ``-m heavy``."""
    from tpusim.app.cli import main

    assert main(["lower", "--model", "kimi-k3-mini", "--schedule", "published", "--hardware", "tpu-v5e",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["compiled"] and data["compile"]["ok"] and data["compile"]["topology"] == "v5e:2x2"
    assert data["scratch_total_bytes"] == data["accounting_total_bytes"] or data["fits"]


@pytest.mark.slow  # traces the kimi-k3-mini kernel (~3 s)
def test_without_libtpu_the_cli_says_not_compiled(capsys, monkeypatch) -> None:
    from megakernel import mosaic_compile
    from tpusim.app.cli import main

    monkeypatch.setattr(mosaic_compile, "libtpu_available", lambda: False)
    assert main(["lower", "--model", "kimi-k3-mini", "--schedule", "published", "--hardware", "tpu-v5e"]) == 0
    out = capsys.readouterr().out
    assert "traced to MLIR only: not compiled" in out and "compiled by Mosaic" not in out
