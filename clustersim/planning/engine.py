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

__all__ = ["Engine", "ENGINES", "EngineUnavailable", "start_ray"]

ENGINES = ("local", "ray")
RAY_CONNECT_S = 5.0  # a reachable head answers a TCP connect at once; Ray itself retries ~minutes


class EngineUnavailable(RuntimeError):
    """The Ray engine cannot start: Ray not installed, or no Ray cluster at the address (the
    user's setup, exit 2)."""


def start_ray(address: str | None) -> Any:
    """`ray`, initialised: joined to the cluster at `address` (host:port, ray://host:port or
    auto) or a local one started. An address with nothing listening is refused after a
    RAY_CONNECT_S connect, where Ray would wait for minutes (a GCS address) or 35 s (a Ray
    Client one) before its own error."""
    try:
        import ray
    except ImportError:
        raise EngineUnavailable("--engine ray needs Ray: pip install -e '.[ray]'") from None
    if address not in (None, "auto", "local"):
        _check_reachable(address)
    try:
        ray.init(address=address, ignore_reinit_error=True, include_dashboard=False,
                 log_to_driver=False)
    except (ConnectionError, ValueError) as error:
        raise EngineUnavailable(
            f"--address {address!r}: cannot join a Ray cluster there ({str(error)[:200]}); "
            "start one with `ray start --head`, or leave out --address for a local one") from None
    return ray


def _check_reachable(address: str) -> None:
    import socket

    where = address.removeprefix("ray://").split("/", 1)[0]
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EngineUnavailable(f"--address {address!r}: expected HOST:PORT, ray://HOST:PORT "
                                "or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_S):
            pass
    except OSError as error:
        raise EngineUnavailable(f"--address {address!r}: no Ray cluster answers there "
                                f"({error}); start one with `ray start --head`, or leave out "
                                "--address for a local one") from None


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
            # Always wait, even after terminating them: the pool's manager thread then closes
            # its wake-up pipe before we return. Left running (wait=False), it could close the
            # pipe while the interpreter's exit hook was writing to it, which printed an
            # "OSError: Bad file descriptor" traceback after the CLI's own error. The workers
            # are already gone, so the wait is short.
            self._pool.shutdown(wait=True, cancel_futures=True)
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
        ray = self.start()
        return ray.get(self.submit(fn, tasks))

    def start(self) -> Any:
        """`ray`, joined to the engine's cluster (Ray engine only)."""
        if self._ray is None:
            self._ray = (start_ray(self.address), {})
        return self._ray[0]

    def submit(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        """Ray object references of `fn` over the tasks, in task order, not waited for (the
        caller works meanwhile, then `ray.get`s them)."""
        ray = self.start()
        remotes = self._ray[1]
        # One remote per function: the serving planner maps its candidates' searches, then
        # their capacity searches, on one engine (the first function was once kept for both).
        if fn not in remotes:
            remotes[fn] = ray.remote(fn)
        return [remotes[fn].remote(task) for task in tasks]
