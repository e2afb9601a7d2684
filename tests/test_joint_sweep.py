"""The joint sweep (``--space joint``): the algorithm vocabulary, deployments in schedule files,
validation rows, determinism across executors, resume after a real SIGINT."""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from hwmodels.catalog import make_system
from tpusim.app.cli import main
from tpusim.schedule.schema import Deployment, Schedule, load_schedule, save_schedule
from tpusim.sweep.joint import run_joint_sweep
from tpusim.sweep.search import SweepInterrupted
from tpusim.workload.collectives import Topology, cannot_run, same_messages
from tpusim.workload.model_catalog import load_model, plan_for

NANO = dict(model="kimi-k3-nano", hardware="tpu-v7", chips=4)


def _nano(out: Path, **kwargs: Any):
    return run_joint_sweep(load_model("kimi-k3-nano"), make_system("tpu-v7", 4, calibrated=False), 1,
                           out_dir=out, quiet=True, plots=False, **kwargs)


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_cannot_run_rules() -> None:
    top = Topology(32, 8, 2)
    assert cannot_run("one_shot_two_level", "all_reduce", "all", top) == ""
    assert cannot_run("direct_all_gather", "reduce_scatter", "all", top) == ""
    assert "needs a group of 2" in cannot_run("pair_exchange", "exchange", "host", top)
    assert "cannot run a all_gather" in cannot_run("one_shot_two_level", "all_gather", "all", top)
    assert "unknown" in cannot_run("ring", "all_reduce", "all", top)
    assert same_messages("direct_all_gather", "pair_exchange", "sibling", top)  # one candidate, not two
    assert not same_messages("direct_all_gather", "one_shot_two_level", "all", top)


def test_with_algorithms_changes_only_the_named_collectives() -> None:
    model = load_model("kimi-k3")
    plan = plan_for(model, 32, devices_per_chip=2)
    changed = plan.with_algorithms({"mlp.allreduce": "reduce_scatter_all_gather"})
    mlp = changed.mlp_collectives[0]
    assert mlp.algorithm == "reduce_scatter_all_gather" and [s.peers for s in mlp.stages] == [31, 31]
    assert changed.attention_collectives == plan.attention_collectives
    with pytest.raises(ValueError, match=r"attn\.partial_reduce: pair_exchange cannot run"):
        plan.with_algorithms({"attn.partial_reduce": "pair_exchange"})
    with pytest.raises(ValueError, match="no collective"):
        plan.with_algorithms({"nope": "direct_all_gather"})
    generic = plan_for(model, 32, devices_per_chip=2, choice="expert_groups=8,expert_tp=4")
    moe = generic.with_algorithms({"moe.routed_reduce": "one_shot_two_level"}).moe_collectives
    assert [s.algorithm for s in moe if s.name == "moe.routed_reduce"] == ["one_shot_two_level"]


def test_a_schedule_without_deployment_keeps_its_hash_and_file(tmp_path: Path) -> None:
    published = load_schedule("published")
    assert "deployment" not in json.loads((Path(__file__).parents[1] / "tpusim/schedules/published.json").read_text())
    save_schedule(published, tmp_path / "p.json")
    assert "deployment" not in json.loads((tmp_path / "p.json").read_text())
    deployed = published.model_copy(update={"deployment": Deployment(plan="auto", collectives={"a": "b"})})
    assert deployed.content_hash() != published.content_hash()
    save_schedule(deployed, tmp_path / "d.json")
    assert Schedule.model_validate_json((tmp_path / "d.json").read_text()) == deployed


@pytest.mark.slow  # a nano joint sweep and a simulate, ~10 s
def test_joint_sweep_rows_best_file_and_simulate_reproduces_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = _nano(tmp_path, budget=8)
    rows = _csv(tmp_path / "sweep.csv")
    assert len({r["hash"] for r in rows}) == len(rows)  # one row per candidate
    assert all(r["reason"] for r in rows if r["status"] == "pruned")
    assert result.published_row is not None and result.simulated >= 8
    best = load_schedule(str(tmp_path / "best.json"))
    assert best.deployment is not None and best.deployment.plan == result.best_row["plan"]
    assert best.content_hash() == result.best_row["hash"]
    code = main(["simulate", "--model", "kimi-k3-nano", "--hardware", "tpu-v7", "--chips", "4", "--batch", "1",
                 "--uncalibrated", "--schedule", str(tmp_path / "best.json"), "--format", "json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step_ms"] == pytest.approx(result.best_row["predicted_ms"], rel=1e-9)
    assert (tmp_path / "summary.md").read_text().count("published") >= 1


@pytest.mark.slow  # a local Dask cluster of 2 workers and two small sweeps, ~30 s
def test_dask_two_workers_gives_the_same_best_as_one_job(tmp_path: Path) -> None:
    one = _nano(tmp_path / "one", budget=24, seed=3)
    two = _nano(tmp_path / "dask", budget=24, seed=3, executor="dask", workers=2)
    assert two.best_row["hash"] == one.best_row["hash"]
    assert two.best_row["predicted_ms"] == one.best_row["predicted_ms"]
    key = ("hash", "status", "predicted_ms")
    assert [[r[k] for k in key] for r in _csv(tmp_path / "one/sweep.csv")] == \
        [[r[k] for k in key] for r in _csv(tmp_path / "dask/sweep.csv")]


@pytest.mark.slow  # two small sweeps, ~15 s
def test_resume_after_a_real_sigint_loses_and_repeats_nothing(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    def interrupt(row: dict[str, Any]) -> None:
        seen.append(row)
        if len(seen) == 12:
            os.kill(os.getpid(), signal.SIGINT)  # a real signal, delivered to this (the main) thread

    with pytest.raises(SweepInterrupted):
        _nano(tmp_path, budget=24, on_row=interrupt)
    before = _csv(tmp_path / "sweep.csv")
    assert len(before) >= 12
    result = _nano(tmp_path, budget=24, resume=True)
    after = _csv(tmp_path / "sweep.csv")
    assert after[: len(before)] == before  # nothing lost
    hashes = [r["hash"] for r in after]
    assert len(hashes) == len(set(hashes))  # nothing evaluated twice
    assert result.simulated >= 24


def test_what_changed_reads_zero_as_a_value_and_a_resumed_row_the_same() -> None:
    """A knob at 0 (a distance) is a value, not '-'; a row read back from sweep.csv on --resume
    (strings) compares equal to the same row made in the run (found: a resumed report said 0 where
    the first run said '-')."""
    from tpusim.sweep.joint_report import _changes

    assert _changes({"lm_head.distance": 0, "plan": "auto"}, {"lm_head.distance": 4, "plan": "auto"}) == [
        "lm_head.distance: 4 → 0"]
    assert _changes({"lm_head.distance": "0", "x": ""}, {"lm_head.distance": 0, "x": None}) == []


@pytest.mark.slow  # a K3 sweep of 40 simulations, ~12 s
def test_polish_neighbours_refused_by_validation_get_rows_but_no_trial(tmp_path: Path) -> None:
    """K3 at batch 1 is where neighbours overflow VMEM (nano's never do): they are answered with
    a pruned row before Optuna is asked, so no asked polish trial is a VMEM refusal."""
    result = run_joint_sweep(load_model("kimi-k3"), make_system("tpu-v7", 16, calibrated=False), 1,
                             out_dir=tmp_path, budget=40, quiet=True, plots=False)
    rows = _csv(tmp_path / "sweep.csv")
    refused = [r for r in rows if r["source"] == "polish" and int(r["trial"]) < 0]
    assert refused and all(r["status"] == "pruned" and r["name"] == "neighbour" for r in refused)
    usable_mib = make_system("tpu-v7", 16, calibrated=False).chip.staging_memory.usable_bytes / 2**20
    for row in refused:
        if row["reason"].startswith("vmem:"):
            assert float(row["vmem_static_mib"]) > usable_mib
    asked = [r for r in rows if r["source"] == "polish" and int(r["trial"]) >= 0]
    assert asked and not any(r["reason"].startswith("vmem:") for r in asked)
    assert result.simulated >= 40


def _trial_facts(trials: list[Any]) -> list[tuple[Any, ...]]:
    return [(t.number, t.state, t.values, t.params, {k: repr(d) for k, d in t.distributions.items()}, t.user_attrs,
             t.system_attrs, t.intermediate_values, t.datetime_start, t.datetime_complete) for t in trials]


def test_study_storage_replays_what_optunas_journal_storage_reads(tmp_path: Path) -> None:
    """The sweep's storage (journal kept open, logs read back from memory, parameter records
    replayed on a fast path) holds the trials a plain JournalStorage reads from its file, and
    resumes from that file (a dynamic parameter, enqueued, pruned and failed trials)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from tpusim.sweep.joint_study import flushed_journal, study_storage, tell

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = tmp_path / "study.journal"

    def run(trials: int, storage: Any) -> Any:
        study = optuna.create_study(study_name="joint", storage=storage, load_if_exists=True,
                                    sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=3))
        study.enqueue_trial({"plan": "b", "knob": 3}, user_attrs={"source": "polish"})
        for _ in range(trials):
            trial = study.ask()
            plan = trial.suggest_categorical("plan", ["a", "b", "c"])
            knob = trial.suggest_categorical("knob", list(range(20)))
            if plan == "c":
                trial.suggest_categorical("alg.x", ["plan", "ring", "tree"])
            if knob % 5 == 0:
                tell(study, trial, state=optuna.trial.TrialState.PRUNED)
            elif knob % 7 == 0:
                tell(study, trial, state=optuna.trial.TrialState.FAIL)
            else:
                tell(study, trial, float(knob) + (plan == "a"))
        return study

    backend = flushed_journal(str(path))
    live = run(40, study_storage(backend))
    plain = JournalStorage(JournalFileBackend(str(path)))
    assert _trial_facts(live.get_trials(deepcopy=False)) == \
        _trial_facts(plain.get_all_trials(plain.get_study_id_from_name("joint"), deepcopy=False))
    backend.close()
    resumed = run(10, study_storage(flushed_journal(str(path))))
    plain = JournalStorage(JournalFileBackend(str(path)))
    assert len(resumed.get_trials(deepcopy=False)) == 50  # each enqueued trial is one of the asks
    assert resumed._storage._replay_result._parsed  # the fast path ran
    assert _trial_facts(resumed.get_trials(deepcopy=False)) == \
        _trial_facts(plain.get_all_trials(plain.get_study_id_from_name("joint"), deepcopy=False))
