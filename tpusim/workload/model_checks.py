"""A model config checked against itself before anything runs.

Field-level ranges (``>= 1``) live on the pydantic fields; this module holds the rules that
tie fields together, in two places where the facts enter:

1. :func:`config_violations` on a built :class:`~tpusim.workload.modelconfig.ModelConfig`
   (every model: catalog YAML, a user's YAML, a Hugging Face ``config.json``), called by its
   validator, so no program, plan or simulation ever sees a model that breaks one:

   - GQA: query heads a multiple of KV heads (KV heads <= query heads);
   - Gated DeltaNet / KDA: value heads a multiple of key heads;
   - MLA: head dims positive where the cache needs them (the field ranges);
   - MoE: ``top_k <= num_experts``, routing groups dividing the experts, the shared width
     divisible by the shared-expert count;
   - the layer pattern against the layer count: explicit attention-rule layers inside
     ``0..num_layers-1``, ``offset < every``, dense layers not repeated (inside the range and
     every used attention kind configured: the validator's own checks). An attention kind
     configured but used by no layer is allowed: a model cut to a few layers
     (:meth:`ModelConfig.with_layers`, a drafter's MTP layer) keeps its other blocks.

2. :func:`hf_violations` on a raw ``config.json`` (before the reader derives fields), for
   rules that only the raw keys show:

   - ``head_dim`` absent: Llama/Qwen derive it as ``hidden_size / num_attention_heads``, so
     the heads must divide the hidden size (HF's attention refuses the same config);
   - ``layer_types`` has one entry per layer; ``mlp_only_layers`` and
     ``first_k_dense_replace`` inside the layer count.

Every violation is one short clause; the caller joins them with ``; `` into the one-line
error the CLI prints (``tpusim CMD: error: MODEL: clause; clause``), so the user sees them
all at once rather than one per run.
"""

from __future__ import annotations

from typing import Any


def config_violations(model: Any) -> list[str]:
    """Every cross-field rule (module docstring, 1) ``model`` (a ModelConfig, typed ``Any``
    because modelconfig imports this module: imports point one way) breaks."""
    problems: list[str] = []
    layers = model.num_layers
    gqa, kda, moe = model.gqa, model.kda, model.moe
    if gqa is not None and gqa.num_kv_heads > gqa.num_query_heads:
        problems.append(f"gqa.num_kv_heads ({gqa.num_kv_heads}) exceeds num_query_heads ({gqa.num_query_heads})")
    elif gqa is not None and gqa.num_query_heads % gqa.num_kv_heads:
        problems.append(f"gqa.num_query_heads ({gqa.num_query_heads}) is not a multiple of num_kv_heads "
                        f"({gqa.num_kv_heads})")
    if kda is not None and kda.value_heads % kda.num_heads:
        problems.append(f"kda.num_value_heads ({kda.value_heads}) is not a multiple of num_heads ({kda.num_heads})")
    if moe is not None:
        if moe.top_k > moe.num_experts:
            problems.append(f"moe.top_k ({moe.top_k}) exceeds num_experts ({moe.num_experts})")
        if moe.num_experts % moe.routing_groups:
            problems.append(f"moe.routing_groups ({moe.routing_groups}) does not divide num_experts "
                            f"({moe.num_experts})")
        if moe.num_shared_experts and moe.shared_intermediate_size % moe.num_shared_experts:
            problems.append(f"moe.shared_intermediate_size ({moe.shared_intermediate_size}) is not divisible by "
                            f"num_shared_experts ({moe.num_shared_experts})")
    for index, rule in enumerate(model.attention_pattern.rules):
        outside = [layer for layer in rule.layers if not 0 <= layer < layers]
        if outside:
            problems.append(f"attention_pattern.rules[{index}].layers: {outside} outside 0..{layers - 1}")
        if rule.every is not None and rule.offset >= rule.every:
            problems.append(f"attention_pattern.rules[{index}]: offset {rule.offset} >= every {rule.every} "
                            "(no layer matches)")
    repeated = sorted({layer for layer in model.dense_layers if model.dense_layers.count(layer) > 1})
    if repeated:
        problems.append(f"dense_layers: {repeated} listed twice")
    return problems


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def hf_violations(data: dict[str, Any]) -> list[str]:
    """Every rule (module docstring, 2) the raw ``config.json`` breaks."""
    problems: list[str] = []
    hidden, heads = _int(data.get("hidden_size")), _int(data.get("num_attention_heads"))
    layers = _int(data.get("num_hidden_layers"))
    if data.get("head_dim") is None and hidden and heads and hidden % heads:
        problems.append(f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads}) and no "
                        f"head_dim is given (head_dim = hidden_size / heads would be {hidden / heads:.3f})")
    if layers is None or layers < 1:
        return problems
    types = data.get("layer_types")
    if isinstance(types, list) and types and len(types) != layers:
        problems.append(f"layer_types has {len(types)} entries for num_hidden_layers {layers}")
    only = data.get("mlp_only_layers")
    if isinstance(only, list):
        outside = [layer for layer in only if not isinstance(layer, int) or not 0 <= layer < layers]
        if outside:
            problems.append(f"mlp_only_layers: {outside} outside 0..{layers - 1}")
    first = _int(data.get("first_k_dense_replace"))
    if first is not None and first > layers:
        problems.append(f"first_k_dense_replace ({first}) exceeds num_hidden_layers ({layers})")
    return problems
