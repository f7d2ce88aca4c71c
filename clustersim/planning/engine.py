"""Where the planner's simulations run: this process, a local process pool or Ray.

The engine only maps a function over tasks and returns the results in task order, so the
answer does not depend on which engine ran them (nor on how many workers).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

__all__ = ["Engine", "ENGINES"]

ENGINES = ("local", "ray")


def _worker_start() -> None:
    """Workers leave Ctrl-C to the parent (a terminal sends it to the whole process group:
    each worker printed a traceback) and end quietly when it terminates them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Engine:
    """Maps a picklable function over tasks, in order; a context manager owning its workers."""

    def __init__(self, kind: str = "local", workers: int | None = None,
                 address: str | None = None):
        if kind not in ENGINES:
            raise ValueError(f"unknown engine {kind!r}; expected one of {', '.join(ENGINES)}")
        self.kind = kind
        self.workers = workers if workers is not None else (os.cpu_count() or 1)
        self.address = address
        self._pool: ProcessPoolExecutor | None = None
        self._ray: Any = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self._pool is not None:
            if exc_type is not None:  # interrupted or failed: stop the workers at once
                for process in list((self._pool._processes or {}).values()):
                    process.terminate()
            self._pool.shutdown(wait=exc_type is None, cancel_futures=True)
            self._pool = None

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        if not tasks:
            return []
        if self.kind == "ray":
            return self._map_ray(fn, tasks)
        if self.workers <= 1 or len(tasks) == 1:
            return [fn(task) for task in tasks]
        if self._pool is None:
            # One process per core at most, as run and sweep do: more only competes for the
            # cores, and `--workers 100000` would otherwise fork a hundred thousand processes.
            processes = max(1, min(self.workers, os.cpu_count() or 1, len(tasks)))
            self._pool = ProcessPoolExecutor(max_workers=processes, initializer=_worker_start)
        return list(self._pool.map(fn, tasks))

    def _map_ray(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        if self._ray is None:
            try:
                import ray
            except ImportError:
                raise RuntimeError("the ray engine needs Ray: pip install -e '.[ray]'") from None
            ray.init(address=self.address, ignore_reinit_error=True, include_dashboard=False,
                     log_to_driver=False)
            self._ray = (ray, ray.remote(fn))
        ray, remote = self._ray
        return ray.get([remote.remote(task) for task in tasks])
