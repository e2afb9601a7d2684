"""A layer's op bodies have one home (:mod:`megakernel.layer_ops`): the single-device kernel and
the multi-device decode both run every body, and neither calls the math a body wraps by itself.

Numerics are the kernels' own tests (tests/test_megakernel_kernel.py, tests/test_megakernel_
multi_device_decode.py); the single-device kernel's program was unchanged by the move (its
Mosaic text compared without locations when the bodies were gathered here).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from megakernel import layer_ops

ROOT = Path(__file__).resolve().parents[1]
KERNELS = {"single-device": ("megakernel/kernel_attention.py", "megakernel/kernel_moe.py"),
           "multi-device": ("megakernel/decode_ops.py",)}
# The math the bodies wrap: a kernel calling one of these itself writes an op's sequence again.
WRAPPED = {"split_qkvgb", "conv_taps", "short_conv", "prepare_qkv", "decay_log", "delta_rule_heads", "kv_entry",
           "split_q", "absorb", "attend_output", "final_hidden", "mix"}


def bodies() -> set[str]:
    return {name for name, value in vars(layer_ops).items()
            if callable(value) and not isinstance(value, type) and getattr(value, "__module__", "") == layer_ops.__name__}


def called(files: tuple[str, ...], module: str | None = None) -> set[str]:
    """Names called as ``module.name(...)`` (any module when None) in ``files``."""
    names = set()
    for path in files:
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and module in (None, node.func.value.id):
                names.add(node.func.attr)
    return names


def test_the_bodies_cover_attention_mixture_head_and_shared_projections() -> None:
    assert {"mix_norm", "head_norm", "kda_qkvgb", "kda_decay", "kda_core", "mla_q_a", "mla_kv_a", "mla_q_b",
            "mla_kv_b", "mla_fold_entry", "mla_gate", "moe_router", "gate_up"} <= bodies()


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_each_kernel_runs_every_body(kernel: str) -> None:
    missing = bodies() - called(KERNELS[kernel], "layer_ops")
    assert not missing, f"{kernel} does not run {sorted(missing)}"


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_no_kernel_calls_the_wrapped_math_itself(kernel: str) -> None:
    again = called(KERNELS[kernel]) & WRAPPED
    assert not again, f"{kernel} writes {sorted(again)} again: call the body in megakernel.layer_ops"
