"""The joint sweep's polish (tpusim.sweep.joint_polish): one-parameter neighbours of the best
trial, enqueued a round at a time once TPE has had its share of the budget."""

from __future__ import annotations

from typing import Any

import optuna

from tpusim.sweep.joint_polish import POLISH, Polish

CHOICES = {"a": ["x", "y", "z"], "b": [1, 2, 3, 4]}


def _study_with(values: list[tuple[dict[str, Any], float]]) -> tuple[Any, dict[str, dict[str, Any]]]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    rows: dict[str, dict[str, Any]] = {}
    for params, value in values:
        study.enqueue_trial(params)
        trial = study.ask()
        for name, choices in CHOICES.items():
            trial.suggest_categorical(name, choices)
        study.tell(trial, value)
        rows[f"h{trial.number}"] = {"trial": trial.number, "hash": f"h{trial.number}", "status": "simulated",
                                    "predicted_ms": value}
    rows["baseline"] = {"trial": -1, "hash": "baseline", "status": "simulated", "predicted_ms": 0.5}
    return study, rows


def test_neighbours_of_the_best_trial_differ_in_one_parameter_and_come_a_round_at_a_time() -> None:
    study, rows = _study_with([({"a": "x", "b": 1}, 3.0), ({"a": "y", "b": 3}, 2.0)])
    polish = Polish(share=0.5, budget=10)
    assert polish.enqueue(study, rows, 4, count=16) == 0  # TPE's half of the budget first
    assert polish.enqueue(study, rows, 5, count=3) == 3
    assert polish.enqueue(study, rows, 5, count=16) == 2  # 2 + 3 neighbours in all (the baseline has none)
    assert polish.enqueue(study, rows, 5, count=16) == 0  # exhausted: TPE asks again
    asked = [study.ask() for _ in range(5)]
    params = [{name: t.suggest_categorical(name, choices) for name, choices in CHOICES.items()} for t in asked]
    # nearest first, round-robin across parameters: a=x, b=2, a=z, b=4, b=1 (b's list: 1 2 [3] 4)
    assert params == [{"a": "x", "b": 3}, {"a": "y", "b": 2}, {"a": "z", "b": 3}, {"a": "y", "b": 4},
                      {"a": "y", "b": 1}]
    assert all(t.user_attrs["source"] == POLISH for t in asked)


def test_a_better_trial_restarts_the_walk_around_it_and_share_zero_turns_it_off() -> None:
    study, rows = _study_with([({"a": "x", "b": 1}, 3.0)])
    polish = Polish(share=0.5, budget=2)
    assert polish.enqueue(study, rows, 1, count=2) == 2  # around trial 0: a=y, a=z
    for _ in range(2):
        study.ask()
    study2, rows2 = _study_with([({"a": "x", "b": 1}, 3.0), ({"a": "z", "b": 4}, 1.0)])
    assert polish.enqueue(study2, rows2, 1, count=16) == 5  # a new best: all of its 5 neighbours
    assert Polish(share=0.0, budget=2).enqueue(study, rows, 2, count=16) == 0
    capped = Polish(share=0.5, budget=2000, explore_max=500)  # TPE's share capped: polish from 500 on
    assert capped.enqueue(study, rows, 499, count=1) == 0 and capped.enqueue(study, rows, 500, count=1) == 1


def test_neighbours_the_sweep_can_answer_are_skipped_and_the_round_is_filled_with_others() -> None:
    study, rows = _study_with([({"a": "y", "b": 3}, 2.0)])
    polish = Polish(share=0.5, budget=2)
    asked_about: list[dict[str, Any]] = []

    def wanted(params: dict[str, Any]) -> bool:
        asked_about.append(params)
        return params["b"] != 2 and params["a"] != "x"  # as if b=2 were known and a=x invalid

    assert polish.enqueue(study, rows, 1, count=2, wanted=wanted) == 2
    # the order is the walk's (a=x, b=2, a=z, b=4, b=1): the first two are skipped, not counted
    assert asked_about == [{"a": "x", "b": 3}, {"a": "y", "b": 2}, {"a": "z", "b": 3}, {"a": "y", "b": 4}]
    asked = [study.ask() for _ in range(2)]
    assert [{n: t.suggest_categorical(n, c) for n, c in CHOICES.items()} for t in asked] == \
        [{"a": "z", "b": 3}, {"a": "y", "b": 4}]
    assert polish.enqueue(study, rows, 1, count=16, wanted=wanted) == 1  # b=1 left; then exhausted
    assert polish.enqueue(study, rows, 1, count=16, wanted=wanted) == 0
