"""Weight formats per tensor family from the command line: ``--formats experts=nvfp4,kv=fp8``.

Each ``family=format`` pair sets the format keys of that family (the model file's or
``config.json``'s formats are the defaults). Families, by the names of
:data:`tpusim.workload.registry.names.WEIGHT_FAMILIES` where one exists:

| family (aliases) | format keys it sets |
| --- | --- |
| ``experts`` (``routed_expert``) | routed_gate_up, routed_down |
| ``experts_gate_up`` (``routed_gate_up``), ``experts_down`` (``routed_down``) | that one |
| ``shared_expert`` | shared_expert |
| ``attention`` (``kda_proj``, ``mla_proj``, ``gqa_proj``) | attention |
| ``dense_mlp`` (``mlp``) | dense_mlp |
| ``latent_proj`` | latent_proj |
| ``dense`` | dense: every dense projection without a format of its own |
| ``router``, ``lm_head``, ``embedding``, ``small_params`` | the same key |
| ``kv`` | the KV cache (values per token, block scales included) |

Formats: the layouts of :mod:`tpusim.workload.formats` or their short names (``bf16``,
``fp8``, ``int8``, ``int4``, ``nvfp4``, ``mxfp4``, ...).
"""

from __future__ import annotations

from hwmodels.errors import InputError
from tpusim.workload.formats import canonical_format
from tpusim.workload.modelconfig import ModelConfig

FAMILY_KEYS: dict[str, tuple[str, ...]] = {
    "experts": ("routed_gate_up", "routed_down"),
    "routed_expert": ("routed_gate_up", "routed_down"),
    "experts_gate_up": ("routed_gate_up",),
    "routed_gate_up": ("routed_gate_up",),
    "experts_down": ("routed_down",),
    "routed_down": ("routed_down",),
    "shared_expert": ("shared_expert",),
    "attention": ("attention",),
    "kda_proj": ("attention",),
    "mla_proj": ("attention",),
    "gqa_proj": ("attention",),
    "dense_mlp": ("dense_mlp",),
    "mlp": ("dense_mlp",),
    "latent_proj": ("latent_proj",),
    "dense": ("dense",),
    "router": ("router",),
    "lm_head": ("lm_head",),
    "embedding": ("embedding",),
    "small_params": ("small_params",),
    "kv": ("kv",),
}


def parse_formats(text: str) -> dict[str, str]:
    """Format key -> layout name for ``text`` (``family=format,...``); InputError naming the pair."""
    keys: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        family, sep, name = (piece.strip() for piece in item.partition("="))
        if not sep or family not in FAMILY_KEYS:
            raise InputError(f"--formats {item!r}: unknown family {family!r}; known: {', '.join(FAMILY_KEYS)}")
        try:
            layout = canonical_format(name)
        except KeyError as error:
            raise InputError(f"--formats {item!r}: {error.args[0]}") from None
        keys.update(dict.fromkeys(FAMILY_KEYS[family], layout))
    if not keys:
        raise InputError(f"--formats {text!r}: expected family=format pairs, e.g. experts=nvfp4,kv=fp8")
    return keys


def apply_formats(model: ModelConfig, text: str | None) -> ModelConfig:
    """``model`` with the ``--formats`` choices applied (unchanged when ``text`` is empty)."""
    if not text:
        return model
    return model.with_formats(parse_formats(text))
