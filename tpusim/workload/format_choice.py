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

from hwmodels import values
from hwmodels.errors import InputError
from tpusim.workload.formats import canonical_format
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry.names import Family, FormatKey

FAMILY_KEYS: dict[str, tuple[str, ...]] = {
    "experts": (FormatKey.ROUTED_GATE_UP, FormatKey.ROUTED_DOWN),
    Family.ROUTED_EXPERT: (FormatKey.ROUTED_GATE_UP, FormatKey.ROUTED_DOWN),
    "experts_gate_up": (FormatKey.ROUTED_GATE_UP,),
    FormatKey.ROUTED_GATE_UP: (FormatKey.ROUTED_GATE_UP,),
    "experts_down": (FormatKey.ROUTED_DOWN,),
    FormatKey.ROUTED_DOWN: (FormatKey.ROUTED_DOWN,),
    Family.SHARED_EXPERT: (Family.SHARED_EXPERT,),
    "attention": ("attention",),
    Family.KDA_PROJ: ("attention",),
    Family.MLA_PROJ: ("attention",),
    Family.GQA_PROJ: ("attention",),
    Family.DENSE_MLP: (Family.DENSE_MLP,),
    "mlp": (Family.DENSE_MLP,),
    Family.LATENT_PROJ: (Family.LATENT_PROJ,),
    "dense": ("dense",),
    Family.ROUTER: (Family.ROUTER,),
    Family.LM_HEAD: (Family.LM_HEAD,),
    "embedding": ("embedding",),
    Family.SMALL_PARAMS: (Family.SMALL_PARAMS,),
    "kv": ("kv",),
}


def parse_formats(text: str) -> dict[str, str]:
    """Format key -> layout name for ``text`` (``family=format,...``); InputError naming the pair."""
    keys: dict[str, str] = {}
    for family, name in values.pairs(text, "--formats"):  # no empty item, no family twice
        item = f"{family}={name}"
        if family not in FAMILY_KEYS:
            raise InputError(f"--formats {item!r}: unknown family {family!r}; known: {', '.join(FAMILY_KEYS)}")
        try:
            layout = canonical_format(name)
        except KeyError as error:
            raise InputError(f"--formats {item!r}: {error.args[0]}") from None
        keys.update(dict.fromkeys(FAMILY_KEYS[family], layout))
    if not keys:
        raise InputError(f"--formats {text!r}: expected family=format pairs, e.g. experts=nvfp4,kv=fp8")
    return keys


def absent_format_keys(model: ModelConfig) -> dict[str, str]:
    """Format keys naming weights ``model`` does not have -> what it lacks, in words."""
    moe = model.moe
    absent: dict[str, str] = {}
    if moe is None:
        absent.update(dict.fromkeys((FormatKey.ROUTED_GATE_UP, FormatKey.ROUTED_DOWN, Family.ROUTER), "routed experts (a dense model)"))
    if moe is None or not moe.shared_intermediate_size:
        absent[Family.SHARED_EXPERT] = "shared expert"
    if moe is None or not moe.latent_size:
        absent[Family.LATENT_PROJ] = "latent projection"
    if not model.dense_layers:
        absent[Family.DENSE_MLP] = "dense MLP layer"
    return absent


def check_families(model: ModelConfig, text: str) -> None:
    """InputError when a ``family=format`` pair of ``text`` names weights ``model`` lacks
    (``experts=fp8`` on a dense model would otherwise change nothing, silently)."""
    absent = absent_format_keys(model)
    for family, name in values.pairs(text, "--formats"):
        item = f"{family}={name}"
        missing = [absent[key] for key in FAMILY_KEYS.get(family, ()) if key in absent]
        if missing and len(missing) == len(FAMILY_KEYS[family]):
            raise InputError(f"--formats {item!r}: {model.name} has no {missing[0]}; the pair would change nothing")


def apply_formats(model: ModelConfig, text: str | None) -> ModelConfig:
    """``model`` with the ``--formats`` choices applied (unchanged when ``text`` is empty);
    a family the model lacks is an InputError (:func:`check_families`)."""
    if not text:
        return model
    keys = parse_formats(text)
    check_families(model, text)
    return model.with_formats(keys)


def formats_for_chip(model: ModelConfig, text: str | None, chip_kind: str) -> tuple[ModelConfig, str]:
    """The model's weight formats on a ``chip_kind`` chip, chosen one way for every command
    (simulate, floor, sweep, plan, compare, serving), and how they were chosen, in words:

    1. ``--formats`` given: those, over the model file's (a ``@variant`` in the name first);
    2. else a ``@variant`` named in ``--model``: that variant;
    3. else the model file's ``deployment_variants`` for this chip kind (K3 on GPUs: its
       ``mxfp4`` variant, as Blackwell serves it), when it names one;
    4. else the model file's formats.
    """
    if text:
        return apply_formats(model, text), f"--formats {text}"
    served = model.for_chip_kind(chip_kind)
    if served is not model and served.variant != model.variant:
        return served, (f"{model.name}@{served.variant}, the format the model file names for {chip_kind}s "
                        "(deployment_variants; --formats overrides)")
    if model.variant is not None:
        return model, f"variant @{model.variant}"
    return model, "the model file's formats"
