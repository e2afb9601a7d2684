"""The joint sweep's sampler (:mod:`tpusim.sweep.joint_sampler`): TPE told which candidates
step 3 would prune (issue 26: three trials in four overflowed VMEM before)."""

from __future__ import annotations

from typing import Any

import optuna

from hwmodels.catalog import make_system
from tpusim.sweep import joint_candidates
from tpusim.sweep.joint_candidates import (
    JointWorkload,
    _suggest,
    _Validator,
    default_joint_space,
    present_families,
    relative_feasibility,
)
from tpusim.sweep.joint_sampler import bounded_tpe
from tpusim.workload.model_catalog import load_model

CHOICES = list(range(10))


def _infeasible_after_startup(feasible: Any, trials: int = 60, startup: int = 10) -> int:
    """A toy study whose best lies on a constraint's edge (maximise x + y with x + y <= 9, an
    infeasible trial told pruned as the joint sweep tells it): infeasible trials TPE proposed."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=bounded_tpe(seed=0, n_startup_trials=startup, feasible=feasible))
    bad = 0
    for number in range(trials):
        trial = study.ask()
        x, y = trial.suggest_categorical("x", CHOICES), trial.suggest_categorical("y", CHOICES)
        if x + y > 9:
            bad += number >= startup
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, -(x + y))
    return bad


def test_the_filter_steers_tpe_away_from_infeasible_candidates() -> None:
    unfiltered = _infeasible_after_startup(None)
    filtered = _infeasible_after_startup(lambda params: params.get("x", 0) + params.get("y", 0) <= 9)
    assert filtered < unfiltered / 2, (filtered, unfiltered)


def test_relative_feasibility_is_step_3_and_waits_for_undrawn_knobs(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(joint_candidates, "FEASIBLE_MEMO", 1)  # the memo is forgotten at every new candidate
    model = load_model("kimi-k3")
    system = make_system("tpu-v7", 16, calibrated=False)
    workload = JointWorkload(model, system, 1)
    space = default_joint_space(model, system.devices)
    staging = system.chip.staging_memory
    space = space.model_copy(update={"schedule": space.schedule.with_capacity(staging.usable_bytes, "usable")})
    validator = _Validator(workload, space)
    families = present_families(model, workload.program(validator.base_plan("auto")))
    feasible = relative_feasibility(space, validator, families)

    class Last:  # every knob at its last choice (the deepest prefetch, the most buffers)
        number = 0

        def __init__(self) -> None:
            self.params: dict[str, Any] = {}

        def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
            self.params[name] = choices[-1]
            return choices[-1]

    trial = Last()
    reason = validator.check(_suggest(trial, space, validator, families))
    drawn = {name: value for name, value in trial.params.items() if not name.startswith("alg.")}
    assert reason.startswith("vmem:")  # the most buffers overflow
    assert not feasible(drawn)
    assert feasible({name: value for name, value in drawn.items() if name != "kv_buffers"})  # not judged yet
    assert not feasible(drawn)  # judged again after the memo was forgotten


def test_a_candidate_fits_or_not_by_its_own_vmem_total() -> None:
    """Step 3 judges the candidate's static VMEM with *its* collectives' send/receive buffers
    (the plan's own were checked before, so a candidate whose algorithms need smaller buffers
    could be refused, and a refusal quoted another total than its row's): the total equals
    ``vmem_plan`` on the plan with those algorithms, and ``vmem:`` refusals are exactly the
    candidates past the usable bytes."""
    import random

    from tpusim.schedule.vmem import vmem_plan

    model = load_model("kimi-k3")
    system = make_system("tpu-v7", 16, calibrated=False)
    workload = JointWorkload(model, system, 1)
    usable = system.chip.staging_memory.usable_bytes
    space = default_joint_space(model, system.devices)
    space = space.model_copy(update={"schedule": space.schedule.with_capacity(usable, "usable")})
    validator = _Validator(workload, space)
    families = present_families(model, workload.program(validator.base_plan("auto")))
    draw = random.Random(7)

    class Random:  # knobs drawn at random (a family's triple from its shallower quarter: most others overflow)
        number = 0

        def __init__(self) -> None:
            self.params: dict[str, Any] = {}

        def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
            pool = choices[: max(1, len(choices) // 4)] if name.endswith(".triple") else choices
            self.params[name] = draw.choice(pool)
            return self.params[name]

    checked = refused = with_algorithms = 0
    while checked < 24:
        proposal = _suggest(Random(), space, validator, families)
        reason = validator.check(proposal)
        if proposal.static_mib is None or proposal.schedule is None:
            continue  # refused before VMEM (the plan, the kernel rule, the schema)
        base = validator.base_plan(proposal.plan_choice)
        assert not isinstance(base, str)
        total = vmem_plan(proposal.schedule, model, base.with_algorithms(proposal.algorithms), 1).total_bytes
        assert proposal.static_mib * 2**20 == total
        if not reason.startswith("dmas:"):
            assert reason.startswith("vmem:") == (total > usable), (reason, total / 2**20)
        if reason.startswith("vmem:") and "schedule needs" in reason:
            assert f"needs {total / 2**20:.2f} MiB" in reason
        checked += 1
        refused += reason.startswith("vmem:")
        with_algorithms += bool(proposal.algorithms)
    assert 0 < refused < checked and with_algorithms > 0  # both verdicts, and other algorithms, were seen


def test_remembered_observations_equal_optunas() -> None:
    """The sampler's observations (each finished trial's row remembered) equal Optuna's own
    conversion, value and dtype, before and after more trials, on a dynamic parameter too."""
    import numpy as np

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = bounded_tpe(seed=0, n_startup_trials=5)
    study = optuna.create_study(sampler=sampler)

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_categorical("x", CHOICES)
        if x % 2:
            trial.suggest_categorical("odd", ["a", "b"])
        return float(x)

    for count in (20, 15):
        study.optimize(objective, n_trials=count)
        trials = study.get_trials(deepcopy=False)
        for space in ({"x": optuna.distributions.CategoricalDistribution(CHOICES)},
                      {"odd": optuna.distributions.CategoricalDistribution(["a", "b"]),
                       "x": optuna.distributions.CategoricalDistribution(CHOICES)}, {}):
            for _ in range(2):  # the second reads the remembered rows
                ours = sampler._get_internal_repr(trials, space, study)
                theirs = optuna.samplers.TPESampler._get_internal_repr(sampler, trials, space, study)
                assert ours.keys() == theirs.keys()
                for name in ours:
                    assert ours[name].dtype == theirs[name].dtype and np.array_equal(ours[name], theirs[name])
