"""Loading model configs and sharding plans from YAML, with one-line errors.

``load_model("kimi-k3")`` reads ``tpusim/models/kimi-k3.yaml``; ``load_model("muse-spark@int4+bf16")``
selects a format variant; a path to a ``.yaml`` file or a Hugging Face ``config.json`` loads
that file, and a folder its ``config.json``.

Which sharding plan a model gets on a system is decided in one place, :func:`plan_for`
(:func:`plan_for_system` for a chip and chip count; every command calls it): the ``--plan``
choice when given (a published plan's name, a plan YAML file, ``generic``, or a SPEC such as
``tp=8,expert_groups=2,expert_tp=4``; see :mod:`tpusim.workload.plan_spec`), else the
published plan when model and device count match one (``k3-tp32`` for K3 on 32 devices,
``muse-tp8`` for Muse Spark on 8), else :func:`tpusim.workload.sharding.generic_plan`.
Whatever is chosen is checked against the model; a plan that does not divide it is one
:class:`InputError` line.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hwmodels.errors import InputError
from hwmodels.schema import Chip
from hwmodels.textfile import read_user_text
from hwmodels.validation import describe_validation_error
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.plan_spec import is_plan_spec, parse_plan_spec, plan_from_spec
from tpusim.workload.sharding import ShardingPlan, generic_plan

T = TypeVar("T", bound=BaseModel)

MODELS_DIR = Path(__file__).resolve().parents[1] / "models"

# (model name without variant, devices) -> published plan file stem
PUBLISHED_PLANS = {("kimi-k3", 32): "plan-k3-tp32", ("muse-spark", 8): "plan-muse-tp8",
                   ("kimi-k3-nano", 8): "plan-k3-nano-tp8", ("kimi-k3-nano", 32): "plan-k3-nano-tp32"}


def format_validation_error(path: Path | str, error: ValidationError, data: Any = None,
                            schema: str | None = None) -> str:
    """One line listing every problem (:func:`hwmodels.validation.describe_validation_error`)."""
    return describe_validation_error(str(path), error, data, schema=schema)


def read_yaml(path: Path) -> Any:
    text = read_user_text(path, kind="YAML")
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
        topic = {"ModelConfig": "model", "ShardingPlan": "plan"}.get(cls.__name__)
        raise InputError(format_validation_error(path, error, data, topic)) from None


def list_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml") if not p.stem.startswith("plan-"))


def load_model(name: str) -> ModelConfig:
    """Load a model by catalog name (optionally ``name@variant``) or by file path."""
    base, _, variant = name.partition("@")
    path = Path(base)
    if path.is_dir():  # a checkpoint folder: its config.json
        path = path / "config.json"
        if not path.is_file():
            raise InputError(f"{base}: a folder without a config.json (give a model name, a model YAML, "
                             "a config.json or a folder holding one)")
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
    stat = path.stat()
    return _load_plan_file(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=64)
def _load_plan_file(path: str, mtime_ns: int, size: int) -> ShardingPlan:
    """A plan file parsed and validated, remembered per (path, modification time, size): the
    plan is frozen and a pure function of the file's text, and a joint sweep asks for the same
    few files once per candidate plan (measured: 122 YAML parses, 3.6 s of a budget-60 K3
    sweep). A file rewritten in between has a new time or size and is read again."""
    del mtime_ns, size  # part of the cache key only
    return validate_file(ShardingPlan, Path(path), read_yaml(Path(path)))


def intra_link_for(chip: Chip) -> str:
    """The link a plan's collectives name on ``chip``: NVLink on GPUs, ICI otherwise."""
    return "nvlink" if chip.kind == "gpu" else "ici"


def plan_for(model: ModelConfig, devices: int, *, devices_per_chip: int = 1, intra_link: str = "ici",
             devices_per_host: int = 8, choice: str | None = None) -> ShardingPlan:
    """The plan ``model`` runs on ``devices`` devices (see the module docstring)."""
    base = model.name.partition("@")[0]
    where = f"model {model.name} on {devices} devices"
    try:
        if choice and is_plan_spec(choice):
            spec = parse_plan_spec(choice)
            stem = PUBLISHED_PLANS.get((base, devices)) if spec.base == "published" else None
            plan = plan_from_spec(model, spec, devices, devices_per_chip=devices_per_chip,
                                  intra_link=intra_link, devices_per_host=devices_per_host,
                                  published=load_plan(stem) if stem else None)
        elif choice and choice not in ("auto", "generic"):
            plan = load_plan(choice)
            if plan.devices != devices:
                raise InputError(f"{where}: plan {plan.name} is for {plan.devices} devices")
        else:
            stem = PUBLISHED_PLANS.get((base, devices)) if choice != "generic" else None
            plan = load_plan(stem) if stem else generic_plan(
                model, devices, devices_per_chip=devices_per_chip, intra_link=intra_link,
                devices_per_host=devices_per_host)
        plan.check_against(model)
    except ValueError as error:
        if isinstance(error, InputError):
            raise
        raise InputError(f"{where}: {error}") from None
    return plan


def deployment_plan(model: ModelConfig, chip: Chip, chips: int, plan_choice: str,
                    collectives: dict[str, str]) -> ShardingPlan:
    """The plan of a deployment (a joint sweep's ``best.json``): :func:`plan_for_system` with
    ``plan_choice``, its collectives run by the chosen algorithms
    (:meth:`ShardingPlan.with_algorithms`); InputError saying which collective cannot."""
    plan = plan_for_system(model, chip, chips, plan_choice)
    try:
        return plan.with_algorithms(collectives)
    except ValueError as error:
        raise InputError(f"model {model.name} on {chips} x {chip.name}, plan {plan_choice}: {error}") from None


def plan_devices(choice: str | None) -> int | None:
    """Devices a ``--plan`` choice names by itself (a SPEC's ``tp``, a plan file's
    ``devices``), or None when it leaves them to the system."""
    if not choice or choice in ("auto", "generic"):
        return None
    if is_plan_spec(choice):
        return parse_plan_spec(choice).tp
    return load_plan(choice).devices


def plan_for_system(model: ModelConfig, chip: Chip, chips: int, choice: str | None = None) -> ShardingPlan:
    """:func:`plan_for` on ``chips`` x ``chip`` (devices and collective link from the chip)."""
    return plan_for(model, chips * chip.devices_per_chip, devices_per_chip=chip.devices_per_chip,
                    intra_link=intra_link_for(chip), choice=choice)


COLLECTIVE_LIST_FIELDS = ("attention_collectives", "moe_collectives", "mlp_collectives", "head_collectives")


def shard_plan(model: ModelConfig, plan_name: str) -> ShardingPlan:
    """One device's program of plan ``plan_name`` (a published plan's name or a plan file),
    run alone on one chip: the plan's per-device widths, weight formats, local experts and
    routing, with **no collectives** (nothing to exchange with). ``simulate``/``sweep``
    ``--shard-of k3-tp32`` and the kernel's chip runs (``run-kernel --shard-of``) both take
    this plan, so the simulator models exactly the program that ran. The name says so:
    ``shard-of:<plan>``."""
    plan = load_plan(plan_name)
    if plan.model is not None and plan.model != model.name.partition("@")[0]:
        raise InputError(f"--shard-of {plan_name}: that plan is for {plan.model}, not {model.name}")
    shard = plan.model_copy(update={**{name: [] for name in COLLECTIVE_LIST_FIELDS},
                                    "name": f"shard-of:{plan.name}",
                                    "description": f"one device of {plan.name}, alone on one chip (no collectives)"})
    try:
        return ShardingPlan.model_validate(shard.model_dump())
    except ValidationError as error:
        raise InputError(format_validation_error(f"--shard-of {plan_name}", error)) from None
