"""Speculative decoding: draft, verify, and accepted tokens per second.

One speculative step for a batch of ``B`` sequences:

1. the **drafter** (``kimi-k3-draft`` by default: 5 dense layers at K3 width) runs
   ``draft_tokens`` autoregressive steps of batch ``B`` (7 draft tokens after one anchor);
2. the **target** verifies every position at once: one decode step of ``B * (draft_tokens + 1)``
   rows (8 rows per sequence), each row routed independently;
3. on average ``a`` tokens per sequence are accepted — the *acceptance length*, accepted draft
   tokens + 1 bonus token, ``1 <= a <= draft_tokens + 1``.

Accepted tokens/s = ``B * a / (draft_tokens * t_draft + t_verify)``. Both step times come from
the same engine and hardware model as a plain decode step.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SpeculativeConfig(BaseModel):
    """A drafter and how many tokens it proposes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    draft_model: str = Field(default="kimi-k3-draft", description="model name of the drafter")
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


@dataclass(frozen=True)
class SpeculativeStep:
    """Timing of one speculative step (seconds)."""

    batch: int
    draft_step_s: float
    verify_step_s: float
    config: SpeculativeConfig

    @property
    def step_s(self) -> float:
        return self.config.draft_tokens * self.draft_step_s + self.verify_step_s

    @property
    def accepted_tokens_per_s(self) -> float:
        return self.batch * self.config.acceptance_length / self.step_s

    @property
    def draft_share(self) -> float:
        return self.config.draft_tokens * self.draft_step_s / self.step_s
