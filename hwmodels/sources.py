"""Source tags and their full citations: what ``[GC]`` or ``[INF]`` in a figure's source means.

A catalog figure's ``source`` starts with one or more tags in brackets (``[GC, TI]``) followed
by what the source says. The tags are defined once, in ``hwmodels/sources.yaml``;
:data:`SOURCES` maps each tag to a :class:`Source` and :func:`tags_in` finds the tags a
source string cites (``tpusim sources`` prints them all).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

SOURCES_FILE = Path(__file__).resolve().parent / "sources.yaml"
_TAG_GROUP = re.compile(r"\[([A-Z0-9, -]+)\]")


class Source(BaseModel):
    """One cited source: a short title and the full citation (with a link where public)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    title: str = Field(min_length=1, description="short name")
    citation: str = Field(min_length=1, description="what it is, what it states, where to find it")


def load_sources(path: Path = SOURCES_FILE) -> dict[str, Source]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {tag: Source.model_validate(entry) for tag, entry in data.items()}


SOURCES: dict[str, Source] = load_sources()


def tags_in(source: str) -> list[str]:
    """The tags a figure's source cites, in order: ``"[GC, TI] 7.4 TB/s"`` → ``["GC", "TI"]``."""
    tags: list[str] = []
    for group in _TAG_GROUP.findall(source):
        tags.extend(tag.strip() for tag in group.split(",") if tag.strip())
    return tags
