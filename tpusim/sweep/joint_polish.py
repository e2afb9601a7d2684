"""The joint sweep's polish: coordinate descent around the best trial, after TPE has explored.

Why: TPE models each parameter on its own (a family's ``distance/chunk/buffers`` triple is one
categorical of up to ~100 values, and most combinations overflow VMEM), so it finds the right
region but rarely the best point in it. Measured on K3 at batch 1 (tpu-v7 x16, published chip
figures, simulated): a budget-200 TPE sweep's best was 1.192x the published design; changing
one parameter at a time from it (full simulations, the same validation) reached 1.336x — the
kda projections as whole tensors prefetched 16 ops ahead, the router and shared expert as
whole tensors, 8 DMAs in flight (``docs/joint-search.md``).

What it does, given the study and the rows so far (:meth:`Polish.enqueue`, called before each
round is asked):

1. **When**: once ``(1 - share)`` of the budget, at most ``explore_max`` simulations, is
   simulated or in flight (:attr:`tpusim.sweep.joint_candidates.JointSpace.polish_share` and
   ``explore_max_simulations``; share 0 turns it off). Why a cap: TPE's asks cost the client
   far more than the polish's (fixed parameters), and on K3 at batch 1 the exploration it needs
   does not grow with the budget: budget 2000 (no screen, ``--jobs 2``, idle machine) with
   1,000 TPE simulations found 1.350x in 216 s, with 500 found 1.314x in 170 s; budget 200
   with 100 TPE simulations 1.243x, with 50 1.109x.
2. **Around what**: the simulated row with the smallest ``(predicted_ms, hash)`` that came from
   a trial (the baselines have no parameters to vary).
3. **Neighbours**: that trial's parameters with *one* changed, over the trial's own categorical
   distributions: each parameter's other choices nearest first (by position in its list),
   taken round-robin across the parameters in the order the trial drew them (plan,
   algorithms, pools, each family's triple, the global knobs).
   Generic over the define-by-run space: nothing here names a parameter. A neighbour whose
   plan lacks one of the base's algorithm parameters ignores it; one whose plan adds some draws
   them from the sampler.
4. **How**: the sweep first answers each neighbour it can without Optuna (``wanted``): one
   evaluated before or in flight is skipped, one that validation refuses (VMEM, the kernel
   rule, ...) gets its ``pruned`` row (trial ``-1``: never asked) and is skipped. Up to one
   round (``count``) of the rest is enqueued (Optuna's ``enqueue_trial``, marked
   ``source: polish``) and asked, screened and simulated like any trial. Why: on K3 at
   batch 1 (budget 2000) 1,295 of 3,376 trials were such neighbours, each a full ask, two
   dozen journal writes and a tell in the client for no simulation. A neighbour whose plan
   adds parameters is always enqueued (the sampler draws them).
5. **Move**: when a round makes another trial the best, the walk restarts around it (first
   improvement, at the granularity of a round); when every neighbour of the best has been
   enqueued, the best is a local optimum of this neighbourhood and TPE asks again until it
   finds something better (then the walk restarts there).

Deterministic: the rows and the study are the same for every executor (the sweep's rounds lag
the same way for all of them), and this walk reads only those, so ``--jobs 1``, ``--jobs N`` and
Dask still give the same study. On ``--resume`` the walk restarts from the best row; neighbours
evaluated before are told their rows' values and never simulated again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

POLISH = "polish"  # the source column of a polish trial's row (and its user attribute)


class Polish:
    """The walk's state: the base trial, its neighbours and how many were enqueued."""

    def __init__(self, share: float, budget: int, explore_max: int | None = None) -> None:
        explore = budget - int(share * budget)
        if explore_max is not None:
            explore = min(explore, explore_max)
        self.start = explore if share > 0 else None  # simulations (done or in flight) before it starts
        self.base: int | None = None  # trial number the neighbours are around
        self.neighbours: list[dict[str, Any]] = []
        self.next = 0

    def enqueue(self, study: Any, rows: dict[str, dict[str, Any]], done_or_in_flight: int, count: int,
                wanted: Callable[[dict[str, Any]], bool] | None = None) -> int:
        """Enqueue up to ``count`` neighbours of the best trial (see the module docstring);
        returns how many (0: not due yet, no trial simulated, or this neighbourhood is done).

        ``wanted(params)`` (optional) is asked first for each neighbour: ``False`` skips it
        without a trial (the sweep answers it from what it knows: evaluated or in flight
        already, or refused by validation, which it records); the round is filled with
        neighbours it wants."""
        if self.start is None or done_or_in_flight < self.start:
            return 0
        best = _best_trial_row(rows)
        if best is None:
            return 0
        if best["trial"] != self.base:
            self.base = int(best["trial"])
            self.neighbours = _neighbours(study, self.base)
            self.next = 0
        enqueued = 0
        while enqueued < count and self.next < len(self.neighbours):
            params = self.neighbours[self.next]
            self.next += 1
            if wanted is None or wanted(params):
                study.enqueue_trial(params, user_attrs={"source": POLISH})
                enqueued += 1
        return enqueued


def _best_trial_row(rows: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    simulated = [r for r in rows.values() if r["status"] == "simulated" and int(r["trial"]) >= 0
                 and r.get("predicted_ms") is not None]
    return min(simulated, key=lambda r: (r["predicted_ms"], r["hash"])) if simulated else None


def _neighbours(study: Any, number: int) -> list[dict[str, Any]]:
    """One-parameter neighbours of trial ``number`` over its own categorical distributions:
    each parameter's other choices nearest first (by position in its choice list: a triple's
    list is ordered by distance, chunk, buffers), taken round-robin across the parameters, so
    that one round tries many parameters (measured: walking plan choices first spent a
    budget-200 sweep's polish on new deployments before any schedule knob moved)."""
    trial = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    moves: list[list[Any]] = []
    for name, value in trial.params.items():
        choices = list(getattr(trial.distributions[name], "choices", ()))
        here = choices.index(value) if value in choices else 0
        others = sorted((i for i, choice in enumerate(choices) if choice != value), key=lambda i: (abs(i - here), i))
        moves.append([(name, choices[i]) for i in others])
    out = []
    for rank in range(max((len(m) for m in moves), default=0)):
        out.extend({**trial.params, name: choice} for name, choice in (m[rank] for m in moves if rank < len(m)))
    return out
