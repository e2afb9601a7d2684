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

import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hwmodels.errors import InputError
from hwmodels.textfile import read_user_json
from tpusim.workload.hf_architectures import READERS, MissingKey
from tpusim.workload.model_checks import hf_violations
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry.names import Family, FormatKey

LINEAR_KEYS = ("dense", FormatKey.ROUTED_GATE_UP, FormatKey.ROUTED_DOWN)
EXPERT_KEYS = (FormatKey.ROUTED_GATE_UP, FormatKey.ROUTED_DOWN)


def architecture_of(data: dict[str, Any], source: str) -> str:
    """The reader key of ``data``: ``architectures[0]`` if known, else ``model_type``."""
    names = [*(data.get("architectures") or []), data.get("model_type")]
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


# Keys holding a count or a size (``num_hidden_layers``, ``hidden_size``, ``head_dim``, ...): a
# boolean or a text that is not a number there is refused, naming the key.
COUNT_KEY = re.compile(r"^(num_|n_)|_(size|dim|rank|heads|layers|experts|interval|step|replace|tok)$|"
                       r"^(vocab_size|topk_group|max_position_embeddings)$")
INTEGER_TEXT = re.compile(r"[+-]?\d+")
REAL_TEXT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


def read_numbers(value: Any, source: str, key: str = "") -> Any:
    """``value`` with numbers written as text read exactly (``"48"`` -> 48, ``"1e-6"`` -> 1e-06),
    in nested objects and lists too; a count key holding a boolean or other text is an
    InputError naming ``source`` and the key."""
    if isinstance(value, dict):
        return {k: read_numbers(v, source, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [read_numbers(v, source, key) for v in value]
    leaf = key.rpartition(".")[2]
    if isinstance(value, str):
        text = value.strip()
        if INTEGER_TEXT.fullmatch(text):
            return int(text)
        if REAL_TEXT.fullmatch(text):
            return float(text)
        if COUNT_KEY.search(leaf):
            raise InputError(f"{source}: {key}: expected a number, got {value!r}")
    if isinstance(value, bool) and COUNT_KEY.search(leaf):
        raise InputError(f"{source}: {key}: expected a number, got {str(value).lower()}")
    return value


def model_from_hf_dict(data: dict[str, Any], *, source: str, name: str) -> ModelConfig:
    """The ModelConfig of a parsed ``config.json`` (``source`` names it in errors); numbers
    written as text are read when they parse exactly (:func:`read_numbers`)."""
    data = read_numbers(data, source)
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
