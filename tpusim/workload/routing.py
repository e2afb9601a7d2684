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
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hwmodels import values
from hwmodels.errors import InputError
from hwmodels.textfile import read_user_text

ROUTING_KINDS = ("uniform", "identical", "zipf", "trace")
# The largest Zipf exponent taken: at s = 100 the second-ranked expert is already 2**-100 as
# likely as the first, so any larger s routes exactly as 100 does; nan and inf are refused too.
ZIPF_EXPONENT_MAX = 100.0
# Gumbel keys are float64: 2**23 of them is a 64 MiB chunk, whatever the batch.
KEY_CHUNK_ELEMENTS = 1 << 23
# Above this many keys (about 20 s of Gumbel draws on one core at ~13 M/s), a uniform draw
# switches to the O(top_k)-per-row rejection sampler: the same distribution, another stream.
REJECTION_ABOVE_KEYS = 1 << 28


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
        exponent = float(values.number(arg, f"--routing {spec}: zipf exponent", minimum=0.0, exclusive_minimum=True,
                                       maximum=ZIPF_EXPONENT_MAX)) if arg else 1.0
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


def _chunked_gumbel_topk(log_weights: np.ndarray, batch: int, top_k: int, rng: np.random.Generator,
                         groups: int = 1, groups_per_token: int = 1) -> np.ndarray:
    """Gumbel top-k over ``[layers, batch, experts]`` keys, ``KEY_CHUNK_ELEMENTS`` at a time.

    ``log_weights`` is ``[layers, experts]`` (one weight row per layer, shared by its rows).
    A Generator fills arrays in C order from one stream, so drawing the keys row block by
    row block gives exactly the values of the one-shot draw: results do not depend on the
    chunk size, and memory stays at one chunk however large the batch.
    """
    layers, experts = log_weights.shape
    out = np.empty((layers * batch, top_k), dtype=np.int32)
    rows_per_chunk = max(1, KEY_CHUNK_ELEMENTS // experts)
    for start in range(0, layers * batch, rows_per_chunk):
        stop = min(start + rows_per_chunk, layers * batch)
        weights = log_weights[np.arange(start, stop) // batch]
        out[start:stop] = _gumbel_topk(weights, top_k, rng, groups, groups_per_token)
    return out.reshape(layers, batch, top_k)


def _rejection_topk(shape: tuple[int, int], num_experts: int, top_k: int,
                    rng: np.random.Generator) -> np.ndarray:
    """Uniform ``top_k`` distinct experts per row in O(top_k) work per row.

    Each row draws ``top_k`` experts with replacement; rows with a repeat are drawn again.
    Conditioned on no repeat every ordered tuple of distinct experts is equally likely, so
    the accepted sets are exactly uniform over the ``top_k``-subsets, as the Gumbel draw's.
    """
    layers, batch = shape
    out = rng.integers(num_experts, size=(layers * batch, top_k), dtype=np.int32)
    redo = np.arange(layers * batch)
    while redo.size:
        ordered = np.sort(out[redo], axis=1)
        redo = redo[(ordered[:, 1:] == ordered[:, :-1]).any(axis=1)]
        out[redo] = rng.integers(num_experts, size=(redo.size, top_k), dtype=np.int32)
    return out.reshape(layers, batch, top_k)


def _distinct_probability(num_experts: int, top_k: int) -> float:
    """Chance that ``top_k`` draws with replacement from ``num_experts`` are all distinct."""
    return float(np.prod(1.0 - np.arange(top_k) / num_experts))


def available_memory_bytes() -> int:
    """Physical memory this host has free now (Linux/macOS ``sysconf``), bytes."""
    pages = os.sysconf("SC_AVPHYS_PAGES") if "SC_AVPHYS_PAGES" in os.sysconf_names else os.sysconf("SC_PHYS_PAGES")
    return int(pages) * int(os.sysconf("SC_PAGE_SIZE"))


def check_draw_size(*, num_moe_layers: int, batch: int, top_k: int) -> None:
    """Refuse a draw whose result, int32[layers, batch, top_k], would not fit free memory.

    The choices are the one array a draw must hold whole (the program reads them per layer);
    keys and counts are chunked. Half of the free memory is left for the rest of the run.
    """
    needed = num_moe_layers * batch * top_k * np.dtype(np.int32).itemsize
    available = available_memory_bytes() // 2
    if needed > available:
        limit = max(1, available // (num_moe_layers * top_k * np.dtype(np.int32).itemsize))
        raise InputError(
            f"batch {batch}: the routing draw holds {num_moe_layers} MoE layers x {batch} rows x top-{top_k} "
            f"expert choices ({needed / 1e9:.1f} GB), over half of this host's free memory "
            f"({available / 1e9:.1f} GB); the largest batch this host can draw is {limit}")


def _load_trace(path: Path, num_experts: int, top_k: int) -> list[list[list[int]]]:
    try:
        data = json.loads(read_user_text(path, kind="JSON"))
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
    check_draw_size(num_moe_layers=num_moe_layers, batch=batch, top_k=top_k)
    rng = np.random.default_rng(seed)
    grouping = {"groups": groups, "groups_per_token": groups_per_token}
    if routing.kind == "uniform":
        if (num_moe_layers * batch * num_experts > REJECTION_ABOVE_KEYS and groups_per_token >= groups
                and _distinct_probability(num_experts, top_k) >= 0.5):
            return _rejection_topk((num_moe_layers, batch), num_experts, top_k, rng)
        return _chunked_gumbel_topk(np.zeros((num_moe_layers, num_experts)), batch, top_k, rng, **grouping)
    if routing.kind == "identical":
        one = _gumbel_topk(np.zeros((num_moe_layers, 1, num_experts)), top_k, rng, **grouping)
        return np.repeat(one, batch, axis=1).astype(np.int32)
    if routing.kind == "zipf":
        ranks = np.arange(1, num_experts + 1, dtype=np.float64)
        log_p = -routing.zipf_exponent * np.log(ranks)
        perms = np.argsort(rng.random((num_moe_layers, num_experts)), axis=1)
        log_w = np.empty((num_moe_layers, num_experts))
        np.put_along_axis(log_w, perms, np.broadcast_to(log_p, (num_moe_layers, num_experts)), axis=1)
        return _chunked_gumbel_topk(log_w, batch, top_k, rng, **grouping)
    assert routing.trace_path is not None
    layers = _load_trace(routing.trace_path, num_experts, top_k)
    out = np.empty((num_moe_layers, batch, top_k), dtype=np.int32)
    for layer in range(num_moe_layers):
        rows = layers[layer % len(layers)]
        for row in range(batch):
            out[layer, row] = rows[row % len(rows)]
    return out


def distinct_per_group(choices: np.ndarray, num_experts: int, groups: int) -> np.ndarray:
    """Distinct experts each group loads: int[num_moe_layers, groups] (one layer at a time,
    so no temporary grows with layers x batch)."""
    layers = choices.shape[0]
    picked = np.zeros((layers, num_experts), dtype=bool)
    for layer in range(layers):
        picked[layer, choices[layer].reshape(-1)] = True
    return picked.reshape(layers, groups, num_experts // groups).sum(axis=2)


def tokens_per_expert(choices: np.ndarray, num_experts: int) -> np.ndarray:
    """Rows routed to each expert: int[num_moe_layers, num_experts]."""
    layers = choices.shape[0]
    counts = np.zeros((layers, num_experts), dtype=np.int64)
    for layer in range(layers):
        counts[layer] = np.bincount(choices[layer].reshape(-1), minlength=num_experts)
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
