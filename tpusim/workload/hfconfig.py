"""Reading a Hugging Face ``config.json`` into a :class:`ModelConfig`.

The architecture comes from ``architectures[0]`` (else ``model_type``); each has a reader in
:mod:`tpusim.workload.hf_architectures` (Llama, Qwen3 dense / MoE / Next, DeepSeek-V3 and
Kimi K2). Unknown keys are ignored; a missing required key, an unknown architecture or a
quantisation this module cannot read is one :class:`InputError` line naming the file.

Weight formats default to the checkpoint's ``quantization_config``:

| quantization_config | formats of the linear layers in the blocks (attention, MLP, experts) |
| --- | --- |
| absent | bf16 |
| ``quant_method: fp8`` (e4m3, ``weight_block_size`` 128 x 128) | ``fp8_e4m3_b128x128`` |
| ``quant_method: mxfp4`` | routed experts ``mxfp4`` (the rest bf16) |
| ``quant_method: modelopt``, ``quant_algo: NVFP4`` / ``FP8`` | ``nvfp4`` / ``fp8_e4m3_b128x128`` |
| ``quant_method: gptq`` / ``awq``, ``bits: 4`` / ``8`` | ``int4_g128`` / ``int8_channel`` |

Embedding, lm_head and router stay bf16 and norms f32 in every case (the checkpoints keep
them unquantised). ``--formats`` overrides any of this per family.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hwmodels.errors import InputError
from hwmodels.textfile import read_user_json
from tpusim.workload.hf_architectures import READERS, MissingKey
from tpusim.workload.model_checks import hf_violations
from tpusim.workload.modelconfig import MAX_EXPERTS, MAX_LAYERS, ModelConfig
from tpusim.workload.registry.names import Family, FormatKey

LINEAR_KEYS = ("dense", FormatKey.ROUTED_GATE_UP, FormatKey.ROUTED_DOWN)
EXPERT_KEYS = (FormatKey.ROUTED_GATE_UP, FormatKey.ROUTED_DOWN)


def architecture_of(data: dict[str, Any], source: str) -> str:
    """The reader key of ``data``: ``architectures[0]`` when the file names architectures
    (an unknown one is refused, whatever ``model_type`` says: a ``FooBarForCausalLM`` is not
    read as the Qwen3-MoE its ``model_type`` may claim), else ``model_type``."""
    architectures = data.get("architectures")
    if architectures is not None and not (isinstance(architectures, list)
                                          and all(isinstance(a, str) for a in architectures)):
        raise InputError(f"{source}: architectures: expected a list of class names, got {architectures!r}")
    names = architectures[:1] if architectures else [data.get("model_type")]
    for name in names:
        if isinstance(name, str) and name in READERS:
            return name
    given = ", ".join(str(n) for n in names if n) or "none given"
    known = ", ".join(sorted(k for k in READERS if k[0].isupper()))
    hint = " (Kimi K3 is the catalog model `kimi-k3`)" if "k3" in given.lower() else ""
    raise InputError(f"{source}: unknown architecture ({given}); known: {known}{hint}")


def formats_from_quantization(quant: dict[str, Any], source: str) -> dict[str, str]:
    """Format keys a ``quantization_config`` sets (see the module table)."""
    if not quant:
        return {}
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8" or quant.get("fmt") == "e4m3":
        block = quant.get("weight_block_size")
        if block not in (None, [128, 128]):
            raise InputError(f"{source}: quantization_config.weight_block_size {block}: only [128, 128] is modelled")
        return dict.fromkeys(LINEAR_KEYS, "fp8_e4m3_b128x128")
    if method == "mxfp4":
        return dict.fromkeys(EXPERT_KEYS, "mxfp4")
    if method == "modelopt":
        algo = str(quant.get("quant_algo", "")).upper()
        by_algo = {"NVFP4": "nvfp4", "FP8": "fp8_e4m3_b128x128"}
        if algo not in by_algo:
            raise InputError(f"{source}: quantization_config.quant_algo {algo!r} not read; known: NVFP4, FP8")
        return dict.fromkeys(LINEAR_KEYS, by_algo[algo])
    if method in ("gptq", "awq"):
        bits = quant.get("bits") or quant.get("w_bit")
        by_bits = {4: "int4_g128", 8: "int8_channel"}
        if bits not in by_bits:
            raise InputError(f"{source}: quantization_config.bits {bits!r} not read; known: 4, 8")
        return dict.fromkeys(LINEAR_KEYS, by_bits[bits])
    raise InputError(f"{source}: quantization_config.quant_method {method!r} is not read "
                     "(fp8, mxfp4, modelopt, gptq, awq are); pass --formats to say how the weights are stored")


# Keys holding a count or a size (``num_hidden_layers``, ``hidden_size``, ``head_dim``, ...):
# a JSON integer, nothing else (not text, a boolean or ``1e9``: Hugging Face's own classes
# would fail on each at model construction), inside COUNT_RANGE. ``null`` is "not given".
COUNT_KEY = re.compile(r"^(num_|n_)|_(size|dim|rank|heads|layers|experts|interval|step|replace|tok)$|"
                       r"^(vocab_size|topk_group|max_position_embeddings)$")
# Counts that must be at least 1 when given (``head_dim: 0`` would otherwise be read as
# "derive it"); every other count may be 0 (``n_shared_experts``, ``first_k_dense_replace``).
POSITIVE_COUNTS = frozenset({
    "hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "n_routed_experts",
    "kv_lora_rank", "qk_nope_head_dim", "v_head_dim", "linear_num_key_heads", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "n_group", "topk_group",
    "full_attention_interval", "max_position_embeddings"})
# Upper bounds, so that a typo (10**9 layers) is refused before any loop over layers runs.
COUNT_MAX = {"num_hidden_layers": MAX_LAYERS, "num_experts": MAX_EXPERTS, "n_routed_experts": MAX_EXPERTS,
             "max_position_embeddings": 2**31 - 1}
COUNT_MAX_DEFAULT = 2**24  # widths, heads, vocabulary: 16.7 M, ~100x the widest published model
# Real-valued keys read: finite numbers above 0.
REAL_KEYS = frozenset({"rms_norm_eps", "routed_scaling_factor"})


def check_values(data: dict[str, Any], source: str) -> None:
    """InputError naming ``source`` and the key when a top-level count key (or an item of a
    count list such as ``mlp_only_layers``) is not a JSON integer inside its range, or a real
    key not a finite number > 0. Nested objects (``rope_scaling``, ``quantization_config``)
    are read, where at all, by their own rules."""
    for key, value in data.items():
        for item in value if isinstance(value, list) else [value]:
            _check_value(item, source, str(key))


def _check_value(value: Any, source: str, key: str) -> None:
    leaf = key
    if value is None or isinstance(value, dict | list) or not (COUNT_KEY.search(leaf) or leaf in REAL_KEYS):
        return
    shown = f"{value!r} (text)" if isinstance(value, str) else json.dumps(value)
    if leaf in REAL_KEYS:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise InputError(f"{source}: {key}: expected a finite number > 0, got {shown}")
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{source}: {key}: expected a whole number (a JSON integer), got {shown}")
    lowest = 1 if leaf in POSITIVE_COUNTS else 0
    highest = COUNT_MAX.get(leaf, COUNT_MAX_DEFAULT)
    if not lowest <= value <= highest:
        raise InputError(f"{source}: {key}: {value} outside {lowest}..{highest}")


def model_from_hf_dict(data: dict[str, Any], *, source: str, name: str) -> ModelConfig:
    """The ModelConfig of a parsed ``config.json`` (``source`` names it in errors); every count
    and size typed and bounded first (:func:`check_values`), before any reader loops over them."""
    check_values(data, source)
    arch = architecture_of(data, source)
    problems = hf_violations(data)  # raw-key rules (derived head_dim, layer lists), before deriving
    if problems:
        raise InputError(f"{source}: " + "; ".join(problems))
    try:
        fields = READERS[arch](data)
    except MissingKey as missing:
        raise InputError(f"{source}: missing key {missing.key!r} (needed for {missing.why})") from None
    except (TypeError, ValueError, ArithmeticError) as error:  # a value of the wrong kind the checks above let by
        raise InputError(f"{source}: a value has the wrong type or range for {arch}: {error}") from None
    formats = {"dense": "bf16", FormatKey.ROUTER: "bf16", FormatKey.SMALL_PARAMS: "f32", FormatKey.ROUTED_GATE_UP: "bf16",
               FormatKey.ROUTED_DOWN: "bf16", Family.LM_HEAD: "bf16", "embedding": "bf16"}
    quant = data.get("quantization_config") or {}
    if not isinstance(quant, dict):
        raise InputError(f"{source}: quantization_config: expected an object")
    formats.update(formats_from_quantization(quant, source))
    config = {
        "name": name,
        "description": f"read from {source} ({arch})",
        "source": f"Hugging Face config.json: {source}",
        "max_context_tokens": data.get("max_position_embeddings"),
        "formats": formats,
        **fields,
    }
    try:
        return ModelConfig.model_validate(config)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputError(f"{source}: {where}: {first['msg']}") from None


def load_hf_config(path: Path) -> ModelConfig:
    """Read ``path`` (a config.json) into a ModelConfig named after its folder or file."""
    data = read_user_json(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    stem = Path(path).parent.name if Path(path).name == "config.json" else Path(path).stem
    name = "".join(c if c.isalnum() or c in ".-_" else "-" for c in stem.lower()).strip("-.") or "hf-model"
    return model_from_hf_dict(data, source=str(path), name=name)
