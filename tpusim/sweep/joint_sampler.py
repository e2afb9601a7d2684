"""The joint sweep's sampler: Optuna's TPE over a bounded history (the best and the latest trials).

Optuna's TPE rebuilds its two Parzen estimators from *every* finished trial at every ask, so
an ask costs time proportional to the study's length and a study costs its square. A joint
sweep of 2,000 full simulations asks about 10,000 trials (most are told *pruned*: invalid or
screened out), and at 1,200 trials one ask already took 106 ms of CPU (measured on the
project's 2-core machine, ``/tmp/speed_ask.py`` in issue 26's note) — more than the engine's
72 ms for a whole K3 step.

:func:`bounded_tpe` is TPE with the same defaults, seeded, reading a *view* of the study:

1. the ``KEEP_BEST`` completed trials with the smallest values (ties by trial number), and
2. the latest ``HISTORY`` trials of the states TPE reads (complete, pruned, and running when
   ``constant_liar`` is on),

in trial-number order. *Invariant:* TPE's "below" set (the good trials, ``gamma(n) <= 25`` of
them; ``KEEP_BEST >= 25``) is the same as with the whole history once the view holds at
least 250 trials; only the "above" set (the rest, which TPE's default weights already fade
from 1/n for the oldest to 1 for the latest 25) is windowed. An ask then costs a bounded time
whatever the study's length. The view is a function of the study alone, so the search stays
deterministic for a seed and independent of how many workers evaluate it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

HISTORY = 400  # latest trials TPE reads (measured: the ask cost stops growing with the study)
KEEP_BEST = 25  # best completed trials always read (>= TPE's largest "below" set, 25)


class _BoundedStudy:
    """A study as TPE sees it: ``_get_trials`` returns the bounded view, the rest delegates."""

    def __init__(self, study: Any, history: int, keep_best: int) -> None:
        self._study, self._history, self._keep_best = study, history, keep_best

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list[Any]:
        from optuna.trial import TrialState

        trials = self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache)
        if len(trials) <= self._history + self._keep_best:
            return trials
        latest = trials[-self._history:]
        older = [t for t in trials[:-self._history] if t.state == TrialState.COMPLETE]
        older.sort(key=lambda t: (t.value, t.number))
        best = older[:self._keep_best]
        return sorted([*best, *latest], key=lambda t: t.number)


def bounded_tpe(*, seed: int, n_startup_trials: int, history: int = HISTORY, keep_best: int = KEEP_BEST,
                feasible: Callable[[dict[str, Any]], bool] | None = None) -> Any:
    """An Optuna ``TPESampler`` (seeded, Optuna's defaults otherwise) over the bounded view above.

    ``feasible`` (params -> bool; a pure function of the parameters TPE samples jointly) makes
    the ask constraint-aware: TPE draws ``n_ei_candidates`` (24) candidates from its "good"
    estimator and takes the one of highest expected improvement; here a candidate ``feasible``
    rejects is only taken when every candidate is rejected. A joint sweep passes its static
    VMEM check (:func:`tpusim.sweep.joint_candidates.relative_feasibility`): without it three
    trials in four overflowed VMEM (measured, K3 budget 200), since the best schedules sit at
    the capacity's edge and TPE perturbs each knob on its own. Optuna's ``constraints_func``
    does not help there: in a single-objective study it only sorts infeasible trials within
    the "bad" set, where they already are (and it is deprecated in Optuna 5)."""
    import optuna
    from optuna.distributions import distribution_to_json
    from optuna.trial import TrialState

    class BoundedTPESampler(optuna.samplers.TPESampler):
        _space: dict[str, tuple[str, Any]] | None = None  # name -> (JSON, distribution)
        _seen: set[int] | None = None  # trial numbers already intersected

        _drawing: dict[str, Any] | None = None  # the search space of the draw in progress
        _internal: dict[tuple[tuple[str, str], ...], dict[int, tuple[Any, ...]]] | None = None  # space -> rows

        def _get_internal_repr(self, trials: list[Any], search_space: dict[str, Any], study: Any) -> dict[str, Any]:
            """TPE's observations (Optuna's, value for value), each finished trial's row of
            parameters converted once per search space (its names and distributions' JSON): a
            finished trial's parameters never change, and a categorical's conversion searches
            its choices (every ask converts the whole bounded history twice: 45.7 of 267 s of a
            profiled budget-2000 K3 sweep's client, before). A row is empty when the trial lacks
            one of the parameters (Optuna leaves such a trial out)."""
            import numpy as np

            memo = self._internal = self._internal if self._internal is not None else {}
            rows = memo.setdefault(tuple((name, distribution_to_json(d)) for name, d in search_space.items()), {})
            columns: list[list[Any]] = [[] for _ in search_space]
            for done in trials:
                number = done.number
                row = rows.get(number)
                if row is None:
                    params = self._get_params(done, study)
                    row = (tuple(d.to_internal_repr(params[name]) for name, d in search_space.items())
                           if search_space.keys() <= params.keys() else ())
                    if done.state.is_finished():
                        rows[number] = row
                for column, value in zip(columns, row, strict=False):  # an empty row adds nothing
                    column.append(value)
            return {name: np.asarray(column) for name, column in zip(search_space, columns, strict=True)}

        def _sample(self, study: Any, trial: Any, search_space: dict[str, Any]) -> dict[str, Any]:
            self._drawing = search_space
            try:
                return super()._sample(_BoundedStudy(study, history, keep_best), trial, search_space)
            finally:
                self._drawing = None

        def _compute_acquisition_func(self, samples: dict[str, Any], mpe_below: Any, mpe_above: Any) -> Any:
            """TPE's expected improvement, -inf for the candidates ``feasible`` rejects (unless it
            rejects them all: then TPE's own choice stands and the validator prunes it)."""
            import numpy as np

            values = super()._compute_acquisition_func(samples, mpe_below, mpe_above)
            space = self._drawing
            if feasible is None or space is None or not samples:
                return values
            names = sorted(samples)
            ok = np.array([feasible({name: space[name].to_external_repr(samples[name][i].item()) for name in names})
                           for i in range(len(values))])
            return np.where(ok, values, -np.inf) if ok.any() else values

        def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
            """Optuna's (multivariate, ungrouped): the parameters every finished (complete or
            pruned) trial has with one distribution, leaving out single-valued ones. Each trial
            is read once and distributions compare by their JSON: Optuna's own rescans every
            trial after the oldest running one at each ask, comparing categorical choices one
            by one (measured: a quarter of the client's CPU with two rounds in flight)."""
            if self._group or not self._is_multivariate(study):
                return super().infer_relative_search_space(study, trial)
            seen = self._seen = self._seen if self._seen is not None else set()
            for done in study._get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED),
                                          use_cache=True):
                if done.number in seen:
                    continue
                seen.add(done.number)
                mine = {name: (distribution_to_json(d), d) for name, d in done.distributions.items()}
                if self._space is None:
                    self._space = mine
                else:
                    self._space = {name: known for name, known in self._space.items()
                                   if name in mine and mine[name][0] == known[0]}
            return {name: d for name, (_json, d) in sorted((self._space or {}).items()) if not d.single()}

    return BoundedTPESampler(seed=seed, n_startup_trials=n_startup_trials)
