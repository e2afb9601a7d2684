"""The attention core priced by the kernel's compiled KV loop (``execution.attention_core_s_per_token``):
each KV tile's code as one VPU piece at that tile, the op's vector work with it; without the
figure, the tiles' products and the vector work after them, as before."""

from __future__ import annotations

import math

import pytest

from hwmodels.catalog import load_chip
from hwmodels.schema import Chip, Figure
from tpusim.engine.build import lower
from tpusim.engine.core import execution_policy, step_vmem_plan
from tpusim.engine.items import MXU, VPU
from tpusim.schedule.schema import load_schedule
from tpusim.workload.format_choice import formats_for_chip
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program
from tpusim.workload.registry.names import MlaOp

TOKEN_S, TILE_S = 7e-9, 300e-9


def _coded(chip: Chip) -> Chip:
    figure = {"label": "derived", "source": "test"}
    execution = chip.execution.model_copy(update={"attention_core_s_per_token": Figure(value=TOKEN_S, **figure),
                                                  "attention_core_s_per_tile": Figure(value=TILE_S, **figure)})
    return chip.model_copy(update={"execution": execution})


def _mla_core_pieces(chip: Chip, context: int) -> tuple[list, object]:  # type: ignore[type-arg]
    model = formats_for_chip(load_model("kimi-k3-mini"), None, "tpu")[0]
    program = build_program(model, plan_for(model, 1), batch=2, context_tokens=context)
    schedule = load_schedule("published")
    policy = execution_policy(chip)
    effective = policy.effective_schedule(schedule)
    lowered = lower(program, effective, chip, policy, step_vmem_plan(program, effective))
    index = next(i for i, op in enumerate(program.ops) if op.name == MlaOp.CORE)
    return list(lowered.ops[index].pieces), (program, schedule, program.ops[index])


@pytest.mark.parametrize("context", [300, 1024])
def test_each_tile_costs_its_code_and_the_vector_work_goes_with_it(context: int) -> None:
    chip = load_chip("tpu-v5e", calibrated=False)
    plain, _ = _mla_core_pieces(chip, context)
    coded, (_, schedule, op) = _mla_core_pieces(_coded(chip), context)
    tiles = math.ceil(context / schedule.kv_tile_tokens)
    # before: one MXU piece a tile and the vector work after them
    assert [p.unit for p in plain] == [MXU] * tiles + [VPU]
    # priced by its code: one VPU piece a tile, the last tile short; nothing after
    assert [p.unit for p in coded] == [VPU] * tiles
    tokens = [min(schedule.kv_tile_tokens, context - t * schedule.kv_tile_tokens) for t in range(tiles)]
    assert [p.duration_s for p in coded] == pytest.approx([TILE_S + n * TOKEN_S for n in tokens], rel=1e-9)
    assert all(p.waits and p.frees for p in coded)  # each waits for its tile's copy and frees its buffer
    assert op.kv_read_bytes > 0


def test_no_catalog_chip_carries_the_figure() -> None:
    """Only the compiler-priced chips (the v5e's first principles, TPU7x's) set it: every catalog
    chip's attention core stays priced by its products and vector work."""
    from hwmodels.catalog import list_chips

    assert all(load_chip(name, calibrated=False).execution.attention_core_s_per_token is None for name in list_chips())
