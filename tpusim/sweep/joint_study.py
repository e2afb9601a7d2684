"""The joint search's Optuna study: its journal file, a faster replay of it, and tells.

The study lives in Optuna's ``JournalStorage`` on a journal file (``study.journal``) that
:func:`flushed_journal` appends through the records' one writer and reads back from memory;
:func:`study_storage` replays it with a faster check of parameter records; :func:`tell` and
:func:`tell_known` tell trials without the deep copy ``study.tell`` returns. Each keeps what
Optuna would store, value for value (``tests/test_joint_sweep.py``). Optuna is imported on use.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from hwmodels.records.jsonl import COMPACT, LineAppender, record_line


def study_storage(backend: Any) -> Any:
    """Optuna's ``JournalStorage`` on ``backend``, replaying parameter records faster.

    Each parameter record Optuna replays is checked against the distribution the study's
    first trial with that parameter has (``check_distribution_compatibility``, comparing a
    categorical's choices one by one through ``isinstance``) and parsed from its JSON: 30 and
    5 of 267 s of a profiled budget-2000 K3 sweep's client. Here a record whose distribution
    has the same JSON text as every distribution recorded so far for that parameter skips the
    check (equal distributions are compatible whichever trial is first), and each JSON text is
    parsed once (distributions are never modified); any other record is replayed by Optuna's
    own code. The trials replayed are the same, value for value."""
    from optuna.distributions import distribution_to_json, json_to_distribution
    from optuna.storages import JournalStorage
    from optuna.storages.journal._storage import JournalStorageReplayResult

    class FastReplay(JournalStorageReplayResult):
        _texts: dict[str, set[str]]  # parameter -> the distribution JSON texts recorded
        _parsed: dict[str, Any]  # JSON text -> distribution

        def _apply_create_trial(self, log: dict[str, Any]) -> None:
            super()._apply_create_trial(log)
            for name, text in log.get("distributions", {}).items():  # a trial made whole (add_trial)
                self._texts.setdefault(name, set()).add(text)

        def _apply_set_trial_param(self, log: dict[str, Any]) -> None:
            trial_id, name, text = log["trial_id"], log["param_name"], log["distribution"]
            if self._texts.get(name) != {text}:
                super()._apply_set_trial_param(log)
                trial = self._trials.get(trial_id)
                if trial is not None and name in trial.distributions:
                    self._texts.setdefault(name, set()).add(text)
                return
            if not self._trial_exists_and_updatable(trial_id, log):
                return
            distribution = self._parsed.get(text)
            if distribution is None:
                distribution = self._parsed[text] = json_to_distribution(text)
            trial = copy.copy(self._trials[trial_id])
            trial.params = {**trial.params, name: distribution.to_external_repr(log["param_value_internal"])}
            trial.distributions = {**trial.distributions, name: distribution}
            self._trials[trial_id] = trial

    storage = JournalStorage(backend)  # replays the file (a resumed sweep) with Optuna's replay
    replay = storage._replay_result
    replay.__class__ = FastReplay
    replay._texts, replay._parsed = {}, {}
    for trial in replay._trials.values():  # what the file held
        for name, distribution in trial.distributions.items():
            replay._texts.setdefault(name, set()).add(distribution_to_json(distribution))
    return storage


def _flushed_journal_class() -> type:
    from optuna.storages.journal import JournalFileBackend

    class FlushedJournal(JournalFileBackend):
        """Optuna's journal file, appended by the records' one writer
        (:class:`hwmodels.records.jsonl.LineAppender`: one ``O_APPEND`` write a call on a file
        kept open, so a record survives the process being killed, as ``sweep.csv`` does)
        without the per-write ``fsync`` and lock file: only this client writes the study
        (measured: fsync took 68 of 500 s of a 60-simulation K3 sweep on the shared machine).
        Optuna's own compact format.

        Reading: Optuna's storage reads the logs after each of its writes and at each query
        (``_sync_with_backend``). The file is read once, when the storage first asks (a resumed
        sweep's study); after that the logs this process appends are handed back from memory,
        each parsed from the very line written (``json.loads``), so the storage replays what
        reading the file would give, without reopening it (a reader not in step with the
        writer is answered from the file)."""

        def __init__(self, file_path: str) -> None:
            super().__init__(file_path)
            self._appender = LineAppender(file_path)
            self._read: int | None = None  # logs handed out so far (None: the file not read yet)
            self._unread: list[dict[str, Any]] = []  # appended, not handed out yet

        def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
            if self._read is None:
                self._unread, self._read = list(super().read_logs(0)), 0
            if log_number_from != self._read:
                return super().read_logs(log_number_from)
            logs, self._unread = self._unread, []
            self._read += len(logs)
            return iter(logs)

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            lines = [record_line(log, separators=COMPACT) for log in logs]
            self._appender.append(lines)
            if self._read is not None:
                self._unread.extend(json.loads(line) for line in lines)

        def close(self) -> None:
            self._appender.close()

    return FlushedJournal


def flushed_journal(path: str) -> Any:  # a class made lazily: optuna is imported on use
    return _flushed_journal_class()(path)


def tell_known(study: Any, trial: Any, row: dict[str, Any]) -> None:
    import optuna

    if row["status"] == "simulated":
        tell(study, trial, row["predicted_ms"])
    else:
        tell(study, trial, state=optuna.trial.TrialState.PRUNED)


def tell(study: Any, trial: Any, value: float | None = None, state: Any = None) -> None:
    """``study.tell(trial, value, state)`` without the deep copy of the told trial it returns
    (nobody reads it here): Optuna's own telling, the same checks and records (measured: the
    copies, each trial's categorical choices included, took 24 of 267 s of a profiled budget-2000
    K3 sweep's client)."""
    try:
        from optuna.study._tell import _tell_with_warning
    except ImportError:  # pragma: no cover - another Optuna: its public call
        study.tell(trial, value, state=state)
        return
    _tell_with_warning(study=study, trial=trial, value_or_values=value, state=state)
