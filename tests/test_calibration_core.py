"""The one calibration core: one solver call, one parameter table, held-out refits of the
shipped problem, and the linearised folds the CI guard uses (calibration.core)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from calibration.core import (
    PARAMETERS,
    Problem,
    SolverOptions,
    fit,
    leave_one_group_out,
    linearised_folds,
    parameters,
)
from calibration.core.parameters import Bound, Parameter, chip_with, figure_value
from hwmodels.catalog import load_chip
from hwmodels.schema import Chip
from tpusim.app.cli import main

ROOT = Path(__file__).resolve().parents[1]
V7 = load_chip("tpu-v7", calibrated=False)
LATENCY, STEP = "links.ici.latency_s", "execution.per_step_overhead_s"
XS = np.array([1.0, 2.0, 3.0, 5.0, 8.0, 13.0])


def _linear(chip: Chip, points: Sequence[int]) -> np.ndarray:
    return figure_value(chip, LATENCY) * XS[list(points)] + figure_value(chip, STEP)


def _problem(truth: dict[str, float], **kwargs: object) -> Problem:
    measured = _linear(chip_with(V7, truth), range(len(XS)))
    specs = tuple(Parameter(p, p, "s", {"tpu": Bound(0.01, 100.0, relative=True)}, "synthetic") for p in (LATENCY, STEP))
    return Problem("synthetic", V7, V7, specs, _linear, measured,
                   groups={"x": tuple(f"x{i // 2}" for i in range(len(XS)))}, **kwargs)  # type: ignore[arg-type]


def test_the_project_has_one_least_squares_call() -> None:
    pattern = re.compile(r"least_squares|minimize\(")
    hits = [f"{path.relative_to(ROOT)}:{n}" for folder in ("calibration", "tpusim") for path in (ROOT / folder).rglob("*.py")
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert [h.split(":")[0] for h in hits] == ["calibration/core/solver.py"] * 2, hits  # the import and the call


def test_every_calibratable_figure_is_declared_once_and_read_from_the_table() -> None:
    paths = [p.path for p in PARAMETERS]
    assert len(paths) == len(set(paths))
    # no source writes bounds of its own: the table's Bound is constructed in the core alone
    owners = {path.relative_to(ROOT).as_posix() for path in (ROOT / "calibration").rglob("*.py")
              if "Bound(" in path.read_text(encoding="utf-8")}
    assert owners == {"calibration/core/parameters.py"}, owners


@pytest.mark.parametrize("transform", ["linear", "log"])
def test_fit_recovers_a_linear_model_in_either_transform(transform: str) -> None:
    truth = {LATENCY: 3e-6, STEP: 60e-6}
    solution = fit(_problem(truth, transform=transform), SolverOptions(max_nfev=200, xtol=1e-12))
    for path, value in truth.items():
        assert solution.value_map()[path] == pytest.approx(value, rel=1e-4)


def test_prior_pull_moves_a_fit_toward_the_start_values() -> None:
    truth = {LATENCY: 3e-6, STEP: 60e-6}
    free = fit(_problem(truth, transform="log"), SolverOptions(max_nfev=200, uncertainty="none"))
    pulled = fit(_problem(truth, transform="log", prior_weight=1.0), SolverOptions(max_nfev=200, uncertainty="none"))
    start = figure_value(V7, STEP)
    assert abs(np.log(pulled.value_map()[STEP] / start)) < abs(np.log(free.value_map()[STEP] / start))


def test_held_out_folds_refit_the_shipped_problem_with_the_shipped_options() -> None:
    truth = {LATENCY: 3e-6, STEP: 60e-6}
    problem = _problem(truth)
    options = SolverOptions(max_nfev=200, xtol=1e-12)
    folds = leave_one_group_out(problem, options)
    assert [f.name for f in folds] == ["x=x0", "x=x1", "x=x2"]
    for fold in folds:  # exact model: every held point predicted exactly by a fit that never saw it
        assert fold.predicted == pytest.approx(fold.measured, rel=1e-4)
        kept = [i for i in problem.indices if i not in fold.points]
        assert fold.values == pytest.approx(fit(problem.only(kept), options).value_map())
    # a truncated solve is part of the procedure: the refits are truncated the same way
    short = replace(options, max_nfev=2)
    assert leave_one_group_out(problem, short)[0].values == fit(problem.only([2, 3, 4, 5]), short).value_map()


def test_linearised_folds_equal_the_refits_for_a_linear_model() -> None:
    rng = np.random.default_rng(7)
    problem = _problem({LATENCY: 3e-6, STEP: 60e-6})
    noisy = replace(problem, measured=problem.measured * (1 + 0.01 * rng.standard_normal(len(XS))))
    options = SolverOptions(max_nfev=200, xtol=1e-12, ftol=1e-14, gtol=1e-14)
    refits = leave_one_group_out(noisy, options)
    linear = linearised_folds(fit(noisy, options))
    for a, b in zip(refits, linear, strict=True):
        assert b.predicted == pytest.approx(a.predicted, rel=2e-3)


def test_hold_weak_holds_what_the_data_cannot_see() -> None:
    flat = replace(_problem({LATENCY: 3e-6, STEP: 60e-6}), predict=lambda chip, points: _linear(chip, [0] * len(points)))
    solution = fit(flat, SolverOptions(max_nfev=100, drop_at_bound=False, hold_weak=True))
    assert len(solution.held) == 1 and "not seen by the data" in next(iter(solution.held.values()))


def test_table_covers_every_source_parameter_set() -> None:
    from calibration.sources.gpu_micro import parameter_paths
    from calibration.sources.gpu_stack import FITTED as STACK
    from calibration.sources.k3_b300 import FITTED as K3
    from calibration.sources.tpu_calibration import E2E_PARAMETERS
    from calibration.sources.tpu_stages import PART_PARAMETERS

    used = {*STACK, *K3, *parameter_paths(load_chip("h200", calibrated=False)).values(),
            *(p.path for p in E2E_PARAMETERS), *(p.path for stage in PART_PARAMETERS.values() for p in stage)}
    assert used <= {p.path for p in PARAMETERS}
    assert parameters(*K3)[0].bounds_for(load_chip("b300", calibrated=False)) == (5e-8, 5e-5)


def test_explain_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--explain", "--hardware", "b300"]) == 0
    out = capsys.readouterr().out
    assert "| graph_gap | s | execution.gpu.kernel_gap_s | 5e-08 .. 5e-05" in out
    assert "prior" in out and "[MEAS]" in out  # the prior's value with its catalog source


def test_calibrate_without_data_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--hardware", "tpu-v7"]) == 2
    assert "--measurements and --out" in capsys.readouterr().err


def test_held_out_folds_over_chosen_dimensions_only() -> None:
    from types import SimpleNamespace

    from calibration.sources.step_times import held_out_folds

    problem = _problem({LATENCY: 3e-6, STEP: 60e-6})
    problem = replace(problem, groups={**problem.groups, "y": tuple("ab"[i % 2] for i in range(len(XS)))})
    result = SimpleNamespace(problem=problem, solver=SolverOptions(max_nfev=20, uncertainty="none"))
    every = held_out_folds(result, spread=False)  # type: ignore[arg-type]
    only = held_out_folds(result, spread=False, dimensions=["y"])  # type: ignore[arg-type]
    assert [f.name for f in every] == ["x=x0", "x=x1", "x=x2", "y=a", "y=b"]
    assert [f.name for f in only] == ["y=a", "y=b"]
    assert only[0].predicted == every[3].predicted  # the same refit, only fewer of them
