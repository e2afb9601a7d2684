"""The GPU batch-growth fit on public Blackwell sweeps (calibration.sources.gpu_batch_sweeps):
which rows it uses, that its engine cache is the engine's, that its figures live in the one
parameter table and its held-out figures are the core's procedure, and the held-out guard."""

from __future__ import annotations

import pytest

from calibration.core import PARAMETERS, fit, leave_one_group_out
from calibration.sources import gpu_batch_data as data
from calibration.sources import gpu_batch_sweeps as sweeps
from hwmodels.catalog import load_chip
from tpusim.app.cli import main
from tpusim.engine import simulate
from tpusim.engine.gpu_batch import batch_terms, host_bound_s
from tpusim.schedule.schema import load_schedule


def test_only_fixed_deployment_plain_decode_tpot_rows_are_used():
    rows = sweeps.load_rows()
    used = [p for p in sweeps.points()]
    for point in used:
        row = rows[point.row_id]
        assert row["tpot_ms"] == point.tpot_ms and row["concurrency"] == point.concurrency
        assert bool(row["disaggregated"]) == point.sweep.disaggregated
        assert "on" not in str(row["spec_decoding"]).lower().split()
        assert row["source_id"] == point.sweep.source_id and row["gpu_type"].lower() == point.sweep.chip
    for sweep in sweeps.SWEEPS:
        deployments = {rows[i]["parallelism"] for i in sweep.rows}
        assert len(deployments) == 1, sweep.key  # one deployment along the sweep
    assert {"S1a", "S2", "S3", "S5", "S6", "S7"} <= set(data.EXCLUDED)
    assert len({s.chip for s in sweeps.SWEEPS}) >= 2  # B200 and GB200


def test_the_gb200_decode_workers_follow_from_the_published_throughput():
    """20-22 GPUs at concurrency 4-32 (Little's law, an upper bound): at most five TP4 workers, so one
    prefill and four decode workers; at 128 the GPU count changes (left out)."""
    rows = sweeps.load_rows()
    gb200 = next(s for s in sweeps.SWEEPS if s.chip == "gb200")
    assert gb200.decode_workers == data.GB200_DECODE_WORKERS == 4 and gb200.disaggregated
    for i in gb200.rows:
        assert 20.0 <= data.derived_gpus(rows[i]) < 24.0, i
    assert data.derived_gpus(rows[30]) > 30.0 and 30 not in gb200.rows
    assert [p.rows for p in sweeps.points() if p.sweep is gb200] == [1, 2, 4, 8]


def test_roles_anchor_lowest_fit_named_and_the_rest_held_out():
    by_sweep: dict[str, list] = {}
    for point in sweeps.points():
        by_sweep.setdefault(point.sweep.key, []).append(point)
    for key, these in by_sweep.items():
        lowest = min(these, key=lambda p: p.concurrency)
        assert lowest.role == "anchor", key
        assert all(p.role in ("fit", "held-out") for p in these if p is not lowest)
    fit = [p for p in sweeps.points() if p.role == "fit"]
    assert {p.sweep.stack for p in fit} == {"vllm", "sglang"} and len(fit) == 10  # the frozen split's


def test_the_cache_is_the_engine():
    """Two cached points re-simulated: the step without batch terms and the terms per unit figure."""
    for key in ("k25-b200-tp4ep4@4", "dsr1-b200-1k8k@16", "k25-gb200-disagg@16"):
        point = next(p for p in sweeps.points() if p.key == key)
        program = sweeps.decode_program(point)
        cached = sweeps.baseline()[key]
        assert simulate(program, load_schedule("naive"), sweeps.sweep_chip(point.sweep)).step_s == pytest.approx(
            cached["step_s"], rel=1e-9)
        for figure in sweeps.STEP_FIGURES:
            chip = sweeps.sweep_chip(point.sweep, {figure.path: 1.0})
            assert sum(batch_terms(chip, program).values()) == pytest.approx(
                cached["terms_per_unit_s"][figure.name], rel=1e-9)


def test_the_cached_prefill_is_the_engine_and_its_host_wait_is_the_engine_rule():
    """A short prompt's prefill (Qwen3 1k/1k at 16): the cached seconds and launches are the
    engine's, and the fit's host wait is tpusim.engine.gpu_batch's rule on a chip with the figure."""
    point = next(p for p in sweeps.points() if p.key == "qwen3-b200-1k1k@16")
    cached = sweeps.baseline()[point.key]
    model = sweeps.load_model(str(sweeps.MODELS_DIR / point.sweep.model))
    plan = sweeps.plan_for(model, 8, devices_per_chip=1, intra_link="nvlink", choice=point.sweep.plan)
    program = sweeps.build_prefill_program(model, plan, tokens=round(point.isl), prefix_tokens=0)
    host = 50e-6
    chip = sweeps.sweep_chip(point.sweep, {sweeps.HOST_FIGURE.path: host})
    result = simulate(program, load_schedule("naive"), chip)
    assert (result.step_s, result.launch_count) == (pytest.approx(cached["prefill_s"], rel=1e-9),
                                                    cached["prefill_launches"])
    wait = sweeps.model_s(point, {sweeps.HOST_FIGURE.name: host}) - sweeps.model_s(point, {})
    assert wait > 0 and wait == pytest.approx((point.concurrency - 1) * host_bound_s(chip, result) / point.osl)


def test_the_figures_are_declared_in_the_one_table_and_explained_for_b200(capsys: pytest.CaptureFixture[str]):
    assert all(figure in PARAMETERS for figure in sweeps.PARAMETERS)  # the table's own declarations
    for figure in sweeps.PARAMETERS:
        assert figure.name == figure.path.rsplit(".", 1)[1] and figure.unit == "s"
        assert figure.prior is not None and figure.prior_source.startswith("prior (assumed")
        lower, upper = figure.bounds_for(load_chip("b200", calibrated=False))
        assert lower <= figure.prior <= upper
    assert main(["calibrate", "--explain", "--hardware", "b200"]) == 0
    out = capsys.readouterr().out
    for figure in sweeps.PARAMETERS:
        assert f"| {figure.name} | s | {figure.path} | " in out
    assert "| 5e-07 (declared in the table; not in the catalog) | prior (assumed): one grouped-GEMM" in out


def test_held_out_figures_are_the_core_leave_one_group_out_of_the_shipped_fit():
    """The held-out fold refits the shipped problem with the shipped options without the held-out
    points: its figures are the shipped fit's, and its predictions are the table's."""
    result = sweeps.calibrate()
    problem = sweeps.batch_problem()
    fit_points = [i for i in problem.indices if problem.groups["role"][i] == "fit"]
    assert result.solution.value_map() == fit(problem.only(fit_points), sweeps.OPTIONS).value_map()
    (fold,) = leave_one_group_out(problem, sweeps.OPTIONS, folds=[sweeps.HELD_OUT_FOLD])
    assert fold.values == result.held_out.values == result.solution.value_map()
    after = {(r["sweep"], r["concurrency"]): r["after_ms"] for r in sweeps.table(result.values)}
    judged = sweeps.judged_points()
    assert [judged[i].role for i in fold.points] == ["held-out"] * len(fold.points)
    assert fold.predicted == pytest.approx([after[(judged[i].sweep.key, judged[i].concurrency)] for i in fold.points],
                                           rel=1e-12)
    from_fold, from_table = sweeps.fold_summary(fold), sweeps.held_out_summary(sweeps.table(result.values))
    assert from_fold.pop("gpu_types") == from_table.pop("gpu_types") and from_fold == pytest.approx(from_table)
    assert set(result.values) == {f.name for f in sweeps.PARAMETERS}
    assert result.values["attention_sequence_s"] == sweeps.PARAMETERS[2].prior  # held at its declared prior
    assert result.values["eager_host_op_s"] == sweeps.HOST_FIGURE.prior  # held at its TTFT-derived value


def test_the_host_figure_is_what_the_concurrency_1_ttfts_imply():
    """eager_host_op_s is declared from the published TTFTs at concurrency 1 (not the TPOTs judged):
    both models agree within 25 % and the declared value is their mean to 0.5 us; with it the
    short prompts' prefills are host-bound and the long ones GPU-bound, as the derivation assumes."""
    implied = sweeps.ttft_host_op_s()
    assert max(implied.values()) < 1.35 * min(implied.values()), implied
    assert abs(sweeps.HOST_FIGURE.prior - sum(implied.values()) / len(implied)) < 0.5e-6
    cache = sweeps.baseline()
    for family in implied:
        short, long = cache[f"{family}-b200-1k1k@1"], cache[f"{family}-b200-8k1k@1"]
        assert short["prefill_launches"] * sweeps.HOST_FIGURE.prior > short["prefill_s"]  # host-bound
        assert long["prefill_launches"] * sweeps.HOST_FIGURE.prior < long["prefill_s"]  # GPU-bound


def test_held_out_error_stays_within_the_documented_figure():
    """The guard: the fit through the calibration core, judged on the points it did not see."""
    result = sweeps.calibrate()
    chip = load_chip("b200", calibrated=False)
    for figure in sweeps.PARAMETERS:
        lower, upper = figure.bounds_for(chip)
        assert lower <= result.values[figure.name] <= upper
    summary = sweeps.fold_summary(result.held_out)
    documented = sweeps.DOCUMENTED_HELD_OUT
    assert summary["points"] >= documented["points"] and summary["sweeps"] >= documented["sweeps"]
    assert len(summary["gpu_types"]) >= documented["gpu_types"], summary
    assert summary["mape"] <= documented["mape"] + sweeps.GUARD_MARGIN, summary
    assert summary["max_abs_error"] <= documented["max_abs_error"] + 2 * sweeps.GUARD_MARGIN, summary
    assert result.model_error.points == summary["points"] and result.model_error.exact
    assert result.model_error.in_range_rel <= documented["model_error"] + 2 * sweeps.GUARD_MARGIN, result.model_error


def test_the_batch_terms_improve_the_held_out_error():
    rows = sweeps.table(sweeps.fit())
    assert sweeps.held_out_summary(rows)["mape"] < sweeps.held_out_summary(rows, "before_error")["mape"]
