"""Loading model configs and sharding plans from YAML, with one-line errors.

``load_model("kimi-k3")`` reads ``tpusim/models/kimi-k3.yaml``; ``load_model("muse-spark@int4+bf16")``
selects a format variant; a path to a ``.yaml`` file or a Hugging Face ``config.json`` loads
that file. ``plan_for(model, devices)`` picks the published plan when model and device count
match one (``k3-tp32`` for K3 on 32 devices, ``muse-tp8`` for Muse Spark on 8) and derives a
generic plan otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hwmodels.errors import InputError
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.sharding import ShardingPlan, generic_plan

T = TypeVar("T", bound=BaseModel)

MODELS_DIR = Path(__file__).resolve().parents[1] / "models"

# (model name without variant, devices) -> published plan file stem
PUBLISHED_PLANS = {("kimi-k3", 32): "plan-k3-tp32", ("muse-spark", 8): "plan-muse-tp8",
                   ("kimi-k3-nano", 8): "plan-k3-nano-tp8", ("kimi-k3-nano", 32): "plan-k3-nano-tp32"}


def format_validation_error(path: Path | str, error: ValidationError) -> str:
    """One line: ``file: field.path: message`` for the first error (count of the rest)."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    more = len(error.errors()) - 1
    suffix = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
    return f"{path}: {where}: {first['msg']}{suffix}"


def read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise InputError(f"{path}:{where}: invalid YAML: {getattr(error, 'problem', error)}") from None


def validate_file(cls: type[T], path: Path, data: Any) -> T:
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping at the top level")
    try:
        return cls.model_validate(data)
    except ValidationError as error:
        raise InputError(format_validation_error(path, error)) from None


def list_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml") if not p.stem.startswith("plan-"))


def load_model(name: str) -> ModelConfig:
    """Load a model by catalog name (optionally ``name@variant``) or by file path."""
    base, _, variant = name.partition("@")
    path = Path(base)
    if path.suffix == ".json":
        from tpusim.workload.hfconfig import load_hf_config

        model = load_hf_config(path)
    elif path.suffix in (".yaml", ".yml"):
        model = validate_file(ModelConfig, path, read_yaml(path))
    else:
        candidate = MODELS_DIR / f"{base}.yaml"
        if base.startswith("plan-") or not candidate.exists():
            raise InputError(f"unknown model {base!r}; known: {', '.join(list_models())}")
        model = validate_file(ModelConfig, candidate, read_yaml(candidate))
    if variant:
        try:
            model = model.with_variant(variant)
        except KeyError as error:
            raise InputError(str(error.args[0])) from None
    return model


def load_plan(name_or_path: str) -> ShardingPlan:
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = MODELS_DIR / f"plan-{name_or_path.removeprefix('plan-')}.yaml"
        if not path.exists():
            known = ", ".join(p.stem.removeprefix("plan-") for p in MODELS_DIR.glob("plan-*.yaml"))
            raise InputError(f"unknown sharding plan {name_or_path!r}; known: {known}")
    return validate_file(ShardingPlan, path, read_yaml(path))


def plan_for(model: ModelConfig, devices: int, *, devices_per_chip: int = 1,
             intra_link: str = "ici", devices_per_host: int = 8) -> ShardingPlan:
    """The published plan for (model, devices) if there is one, else a generic plan."""
    base = model.name.partition("@")[0]
    stem = PUBLISHED_PLANS.get((base, devices))
    try:
        plan = load_plan(stem) if stem else generic_plan(
            model, devices, devices_per_chip=devices_per_chip, intra_link=intra_link,
            devices_per_host=devices_per_host)
        plan.check_against(model)
    except ValueError as error:
        if isinstance(error, InputError):
            raise
        raise InputError(f"model {model.name} on {devices} devices: {error}") from None
    return plan
