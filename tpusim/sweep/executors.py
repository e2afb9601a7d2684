"""Where a joint sweep's candidates are evaluated: in-process, a local process pool, or Dask.

An :class:`Executor` maps one top-level, pure function over a list of tasks and returns the
results *in task order* (never completion order), so the search that consumes them takes
the same decisions whatever executes them: the same seed gives the same best with
``--jobs 1``, ``--jobs 4`` or ``--executor dask --workers 2``.

- ``local`` (``jobs == 1``): a plain loop in this process;
- ``process`` (``jobs > 1``): a spawn ``ProcessPoolExecutor``; workers ignore SIGINT (the
  parent cancels what is queued on Ctrl-C);
- ``dask``: a ``distributed.Client`` on a ``LocalCluster`` of ``workers`` single-threaded
  worker processes, or on an existing scheduler (``scheduler="tcp://host:8786"``). The
  workers need ``tpusim`` importable (the same version); the study stays on the client.

Worker-side caches (programs, estimate contexts) live in module globals of the task
function's module, keyed by the workload, so a task ships only a schedule and its
deployment.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Literal

ExecutorKind = Literal["local", "dask"]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Executor:
    """Maps ``fn`` over tasks, results in task order (see the module docstring)."""

    def __init__(self, kind: ExecutorKind = "local", *, jobs: int = 1, workers: int = 2,
                 scheduler: str | None = None) -> None:
        self.kind = kind
        self.jobs = jobs
        self._pool: ProcessPoolExecutor | None = None
        self._client: Any = None
        self._cluster: Any = None
        if kind == "dask":
            from distributed import Client, LocalCluster

            if scheduler:
                self._client = Client(scheduler)
            else:
                self._cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                             dashboard_address=None)
                self._client = Client(self._cluster)
        elif jobs > 1:
            self._pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_ignore_sigint)

    @property
    def label(self) -> str:
        if self.kind == "dask":
            return f"dask ({len(self._client.scheduler_info().get('workers', {}))} workers)"
        return f"{self.jobs} process{'es' if self.jobs > 1 else ''}"

    def map(self, fn: Callable[..., Any], tasks: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``[fn(*task) for task in tasks]``, evaluated by this executor, in task order."""
        return self.submit(fn, tasks)()

    def submit(self, fn: Callable[..., Any], tasks: Sequence[tuple[Any, ...]]) -> Callable[[], list[Any]]:
        """Start ``map(fn, tasks)`` and return a call that waits for its results (in task order).

        Workers start at once and the caller may work meanwhile; in-process (``local``) the
        tasks run when the results are asked for. Tasks are pure, so the results do not depend
        on when they ran."""
        if not tasks:
            return list
        if self._client is not None:
            futures = [self._client.submit(fn, *task, pure=False) for task in tasks]
            return lambda: self._client.gather(futures)
        if self._pool is not None:
            pending = [self._pool.submit(fn, *task) for task in tasks]
            return lambda: [future.result() for future in pending]
        return lambda: [fn(*task) for task in tasks]

    def close(self, *, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
