"""Speculative decoding: draft, verify, and accepted tokens per second, for two drafter kinds.

One speculative step for a batch of ``B`` sequences proposing ``k`` draft tokens each:

1. the **drafter** proposes ``k`` tokens per sequence:

   - ``autoregressive`` (MTP, EAGLE): ``k`` drafter forwards, one row per sequence each —
     ``draft = k x t_draft(B rows)``;
   - ``parallel`` (DFlash, DSpark): one drafter forward over the anchor row plus ``k`` mask
     rows per sequence, conditioned on the target's hidden features —
     ``draft = t_draft(B x (k + 1) rows)``;

2. the **target** verifies every position at once: one decode step of ``B x (k + 1)`` rows
   (the routing of ``k + 1`` rows of one sequence per sequence);
3. on average ``a`` tokens per sequence are accepted — the *acceptance length*, accepted draft
   tokens + 1 bonus token, ``1 <= a <= k + 1``.

Accepted tokens/s = ``B x a / (draft + verify)``. Both step times come from the same engine
and hardware model as a plain decode step. Drafters are data: ``tpusim/models/drafters/*.yaml``
(:class:`DrafterSpec`): ``kimi-k3-dspark`` (the published K3 drafter, parallel),
``kimi-k3-eagle`` (the same layers run autoregressively) and ``mtp`` (the target's own MTP
layers, ``num_nextn_predict_layers`` of a DeepSeek-V3-style ``config.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hwmodels.errors import InputError
from tpusim.workload.modelconfig import ModelConfig

DRAFTERS_DIR = Path(__file__).resolve().parents[1] / "models" / "drafters"
TARGET_MTP = "target-mtp"  # a drafter model built from the target's MTP layers
DEFAULT_DRAFTERS = {"kimi-k3": "kimi-k3-dspark"}  # target (without variant) -> default drafter
DrafterKind = Literal["autoregressive", "parallel"]


class DrafterSpec(BaseModel):
    """A drafter: which model it runs, how (kind) and how many tokens it proposes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="drafter name (its file stem)")
    kind: DrafterKind = Field(description="autoregressive: k forwards of 1 row per sequence; "
                              "parallel: one forward of k + 1 rows per sequence")
    model: str = Field(description=f"model config of the drafter's layers, or {TARGET_MTP!r}")
    draft_tokens: int = Field(ge=1, le=32, description="draft tokens proposed per step (default k)")
    source: str = Field(min_length=1, description="where the drafter's facts come from")


class SpeculativeConfig(BaseModel):
    """A drafter kind, how many tokens it proposes and how many are accepted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: DrafterKind = Field(default="parallel", description="drafter kind")
    draft_tokens: int = Field(default=7, ge=1, le=32, description="draft tokens proposed per step")
    acceptance_length: float = Field(
        ge=1.0, description="accepted draft tokens + 1 bonus token, per sequence per step"
    )

    @model_validator(mode="after")
    def _check(self) -> SpeculativeConfig:
        if self.acceptance_length > self.draft_tokens + 1:
            raise ValueError(
                f"acceptance_length {self.acceptance_length} exceeds draft_tokens + 1 = {self.draft_tokens + 1}"
            )
        return self

    @property
    def verify_rows_per_sequence(self) -> int:
        return self.draft_tokens + 1

    @property
    def draft_rows_per_sequence(self) -> int:
        """Rows per sequence in one drafter forward (parallel: anchor + k mask rows)."""
        return self.draft_tokens + 1 if self.kind == "parallel" else 1

    @property
    def draft_forwards(self) -> int:
        """Drafter forwards per step (autoregressive: k; parallel: 1)."""
        return self.draft_tokens if self.kind == "autoregressive" else 1


@dataclass(frozen=True)
class SpeculativeStep:
    """Timing of one speculative step (seconds): ``draft_forward_s`` is one drafter forward
    (of ``draft_rows_per_sequence`` rows per sequence), ``verify_step_s`` the target's."""

    batch: int
    draft_forward_s: float
    verify_step_s: float
    config: SpeculativeConfig

    @property
    def draft_s(self) -> float:
        return self.config.draft_forwards * self.draft_forward_s

    @property
    def step_s(self) -> float:
        return self.draft_s + self.verify_step_s

    @property
    def accepted_tokens_per_s(self) -> float:
        return self.batch * self.config.acceptance_length / self.step_s

    @property
    def draft_share(self) -> float:
        return self.draft_s / self.step_s


def speculative_tpot_s(*, draft_forward_s: float, draft_forwards: int, verify_step_s: float,
                       acceptance_length: float) -> float:
    """Time per *accepted* output token of one sequence at batch ``B``, seconds: the step (every
    sequence's drafts and its verification run together) over the tokens it accepts::

        TPOT = (draft_forwards x draft_forward_s + verify_step_s) / acceptance_length

    ``draft_forward_s``: one drafter forward over the batch (an autoregressive MTP/EAGLE drafter:
    ``B`` rows, ``draft_forwards`` = its num-steps); ``verify_step_s``: the target's step over
    ``B x (draft_tokens + 1)`` rows (every proposed token and the bonus position of every
    sequence; SGLang's ``--speculative-num-draft-tokens`` counts those ``draft_tokens + 1``);
    ``acceptance_length``: accepted draft tokens + 1 bonus token per sequence per step.

    The published TPOT of a speculative row is this figure: "With MTP, TPOT is per *accepted*
    output token" (shared/reference/gpu-batch-scaling.md, Read this first; InferenceX and
    SGLang's bench_serving both divide a request's decode time by its output tokens).
    """
    if draft_forwards < 0 or draft_forward_s < 0.0 or verify_step_s <= 0.0:
        raise ValueError("draft and verify times must be >= 0 (verify > 0), draft_forwards >= 0")
    if acceptance_length < 1.0:
        raise ValueError(f"acceptance_length {acceptance_length} < 1: a step accepts at least its bonus token")
    return (draft_forwards * draft_forward_s + verify_step_s) / acceptance_length


def list_drafters() -> list[str]:
    return sorted(path.stem for path in DRAFTERS_DIR.glob("*.yaml"))


def load_drafter(name: str) -> DrafterSpec:
    """The drafter ``name`` from ``tpusim/models/drafters/``."""
    path = DRAFTERS_DIR / f"{name}.yaml"
    if not path.exists():
        raise InputError(f"unknown drafter {name!r}; known: {', '.join(list_drafters())}")
    try:
        return DrafterSpec.model_validate(yaml.safe_load(path.read_text()))
    except (ValidationError, yaml.YAMLError) as error:
        raise InputError(f"{path}: invalid drafter: {str(error).splitlines()[0]}") from None


def default_drafter(target: ModelConfig, mtp_layers: int = 0) -> str:
    """The drafter a target uses unless told otherwise: its published one (K3: DSpark), else
    its own MTP layers when it has some."""
    base = target.name.partition("@")[0]
    if base in DEFAULT_DRAFTERS:
        return DEFAULT_DRAFTERS[base]
    if mtp_layers:
        return "mtp"
    raise InputError(f"model {target.name} has no default drafter (no MTP layers); pass --drafter "
                     f"({', '.join(list_drafters())})")


def mtp_layers(model_argument: str) -> int:
    """``num_nextn_predict_layers`` of a Hugging Face ``config.json`` target (0 otherwise)."""
    path = Path(model_argument.partition("@")[0])
    if path.suffix != ".json":
        return 0
    try:
        return int(json.loads(path.read_text()).get("num_nextn_predict_layers", 0) or 0)
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: cannot read num_nextn_predict_layers: {error}") from None


def mtp_model(target: ModelConfig, layers: int) -> ModelConfig:
    """The target's MTP module as a model: ``layers`` decoder layers of the target's last-layer
    kind (MoE; DeepSeek-V3's MTP layer is an MoE layer) sharing its vocabulary head.

    Assumed: the MTP layer's ``eh_proj`` (a 2·hidden → hidden projection, 0.1 % of a
    DeepSeek-V3 MoE layer's bytes) is not modelled.
    """
    if layers < 1:
        raise InputError(f"model {target.name} has no MTP layers (num_nextn_predict_layers = 0)")
    data = target.model_dump()
    last = target.attention_kind(target.num_layers - 1)
    data.update(name=f"{target.name.partition('@')[0]}-mtp", num_layers=layers, dense_layers=[],
                description=f"{layers} MTP layer(s) of {target.name}",
                attention_pattern={"default": last, "rules": []})
    return ModelConfig.model_validate(data)
