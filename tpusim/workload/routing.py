"""Routing models: which experts the tokens of a batch pick, layer by layer.

A routing model draws, for every MoE layer and every row of the batch, the ``top_k``
distinct experts that row selects. From that follow the *distinct* experts each expert
group (and so each device) must load, which is what sets the routed-expert bytes at batch
B > 1.

- ``uniform``: every row picks ``top_k`` distinct experts uniformly at random.
- ``identical``: every row picks the same experts (the published benchmarks used identical
  prompts, so only ``top_k`` distinct experts were loaded at every batch size).
- ``zipf[:s]``: expert popularity follows a Zipf law with exponent ``s`` (default 1.0) over
  a random permutation per layer; rows sample ``top_k`` without replacement (Gumbel top-k).
- grouped top-k (DeepSeek-V3: 8 groups of 32 experts, 4 groups per token) restricts each
  row of the three drawn kinds to its best groups (see :func:`_gumbel_topk`).
- ``trace:PATH``: a recorded trace, JSON ``{"layers": [[[e, ...], ...], ...]}`` indexed
  ``[moe_layer][row][k]``; rows and layers cycle if the trace is shorter than asked.

Closed form (uniform): a group owning ``G`` of ``E`` experts loads in expectation
``G * (1 - (1 - k/E) ** B)`` distinct experts at batch ``B``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hwmodels.errors import InputError

ROUTING_KINDS = ("uniform", "identical", "zipf", "trace")


@dataclass(frozen=True)
class RoutingModel:
    kind: str
    zipf_exponent: float = 1.0
    trace_path: Path | None = None

    @property
    def label(self) -> str:
        if self.kind == "zipf":
            return f"zipf:{self.zipf_exponent:g}"
        if self.kind == "trace":
            return f"trace:{self.trace_path}"
        return self.kind


def parse_routing(spec: str) -> RoutingModel:
    """Parse ``uniform``, ``identical``, ``zipf[:s]`` or ``trace:PATH``."""
    kind, _, arg = spec.partition(":")
    if kind == "uniform" or kind == "identical":
        if arg:
            raise InputError(f"--routing {spec}: {kind} takes no argument")
        return RoutingModel(kind)
    if kind == "zipf":
        try:
            exponent = float(arg) if arg else 1.0
        except ValueError:
            raise InputError(f"--routing {spec}: zipf exponent must be a number") from None
        if exponent <= 0:
            raise InputError(f"--routing {spec}: zipf exponent must be > 0")
        return RoutingModel("zipf", zipf_exponent=exponent)
    if kind == "trace":
        path = Path(arg)
        if not arg or not path.exists():
            raise InputError(f"--routing {spec}: trace file not found")
        return RoutingModel("trace", trace_path=path)
    raise InputError(f"--routing {spec}: unknown routing model; use one of uniform, identical, zipf[:s], trace:PATH")


def _gumbel_topk(log_weights: np.ndarray, top_k: int, rng: np.random.Generator, groups: int = 1,
                 groups_per_token: int = 1) -> np.ndarray:
    """Sample top_k without replacement along the last axis (Gumbel top-k trick).

    Grouped top-k (``groups_per_token < groups``, DeepSeek-V3's ``n_group``/``topk_group``):
    the experts form ``groups`` consecutive groups, a group scores the sum of its two best
    perturbed expert scores (DeepSeek-V3's ``noaux_tc`` rule), and a row picks its experts
    only from its ``groups_per_token`` best groups.
    """
    keys = log_weights + rng.gumbel(size=log_weights.shape)
    if groups_per_token < groups:
        grouped = keys.reshape(*keys.shape[:-1], groups, keys.shape[-1] // groups)
        best_two = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)
        keep = np.argpartition(-best_two, groups_per_token - 1, axis=-1)[..., :groups_per_token]
        dropped = np.ones(best_two.shape, dtype=bool)
        np.put_along_axis(dropped, keep, False, axis=-1)
        keys = np.where(dropped[..., None], -np.inf, grouped).reshape(keys.shape)
    return np.argpartition(-keys, top_k - 1, axis=-1)[..., :top_k]


def _load_trace(path: Path, num_experts: int, top_k: int) -> list[list[list[int]]]:
    try:
        data = json.loads(path.read_text())
        layers = data["layers"]
        if not layers or not all(isinstance(rows, list) and rows for rows in layers):
            raise ValueError("layers must be a non-empty list of non-empty row lists")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InputError(f"{path}: invalid routing trace: {error}") from None
    for li, rows in enumerate(layers):
        for ri, row in enumerate(rows):
            if len(set(row)) != top_k or not all(isinstance(e, int) and 0 <= e < num_experts for e in row):
                raise InputError(
                    f"{path}: layers[{li}][{ri}]: expected {top_k} distinct expert ids in 0..{num_experts - 1}"
                )
    return layers


def draw_routing(
    routing: RoutingModel, *, num_moe_layers: int, batch: int, num_experts: int, top_k: int, seed: int,
    groups: int = 1, groups_per_token: int = 1,
) -> np.ndarray:
    """Expert choices, int32[num_moe_layers, batch, top_k] (grouped top-k when
    ``groups_per_token < groups``; a trace is taken as recorded)."""
    rng = np.random.default_rng(seed)
    shape = (num_moe_layers, batch, num_experts)
    grouping = {"groups": groups, "groups_per_token": groups_per_token}
    if routing.kind == "uniform":
        return _gumbel_topk(np.zeros(shape), top_k, rng, **grouping).astype(np.int32)
    if routing.kind == "identical":
        one = _gumbel_topk(np.zeros((num_moe_layers, 1, num_experts)), top_k, rng, **grouping)
        return np.repeat(one, batch, axis=1).astype(np.int32)
    if routing.kind == "zipf":
        ranks = np.arange(1, num_experts + 1, dtype=np.float64)
        log_p = -routing.zipf_exponent * np.log(ranks)
        perms = np.argsort(rng.random((num_moe_layers, num_experts)), axis=1)
        log_w = np.empty((num_moe_layers, num_experts))
        np.put_along_axis(log_w, perms, np.broadcast_to(log_p, (num_moe_layers, num_experts)), axis=1)
        log_w = np.broadcast_to(log_w[:, None, :], shape)
        return _gumbel_topk(log_w, top_k, rng, **grouping).astype(np.int32)
    assert routing.trace_path is not None
    layers = _load_trace(routing.trace_path, num_experts, top_k)
    out = np.empty((num_moe_layers, batch, top_k), dtype=np.int32)
    for layer in range(num_moe_layers):
        rows = layers[layer % len(layers)]
        for row in range(batch):
            out[layer, row] = rows[row % len(rows)]
    return out


def distinct_per_group(choices: np.ndarray, num_experts: int, groups: int) -> np.ndarray:
    """Distinct experts each group loads: int[num_moe_layers, groups]."""
    layers = choices.shape[0]
    picked = np.zeros((layers, num_experts), dtype=bool)
    layer_idx = np.repeat(np.arange(layers), choices.shape[1] * choices.shape[2])
    picked[layer_idx, choices.reshape(-1)] = True
    return picked.reshape(layers, groups, num_experts // groups).sum(axis=2)


def tokens_per_expert(choices: np.ndarray, num_experts: int) -> np.ndarray:
    """Rows routed to each expert: int[num_moe_layers, num_experts]."""
    layers = choices.shape[0]
    counts = np.zeros((layers, num_experts), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(layers), choices.shape[1] * choices.shape[2]), choices.reshape(-1)), 1)
    return counts


def expected_distinct_uniform(num_experts: int, top_k: int, batch: int, group_size: int) -> float:
    """Closed form: expected distinct experts a group of ``group_size`` loads (uniform)."""
    return group_size * (1.0 - (1.0 - top_k / num_experts) ** batch)


def expected_distinct(routing: RoutingModel, num_experts: int, top_k: int, batch: int, group_size: int,
                      *, grouped: bool = False) -> float | None:
    """Closed-form expectation where one exists (uniform, identical), else None. Grouped
    top-k routing (``grouped``) has none for uniform routing: it concentrates a row's
    experts in a few groups."""
    if routing.kind == "uniform" and not grouped:
        return expected_distinct_uniform(num_experts, top_k, batch, group_size)
    if routing.kind == "identical":
        return group_size * top_k / num_experts
    return None
