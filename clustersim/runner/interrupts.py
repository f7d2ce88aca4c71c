"""Interruption: SIGINT and SIGTERM stop a run the same way, and worker pools stop at once.

`interruptible()` turns SIGINT and SIGTERM into :class:`Interrupted` (a KeyboardInterrupt,
as Ctrl-C raises), so every `except BaseException` clean-up (the staging folder of an output,
the workers of a pool) runs for both, and remembers them: the timeline checks every 1% of
its horizon, so a signal whose exception simpy swallowed still stops the run.
`worker_pool()` is a process pool whose workers ignore Ctrl-C (the parent decides) and are
terminated, queued work dropped, when the parent is interrupted or stops reading results;
none is left alive.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
from collections.abc import Iterator
from multiprocessing.pool import Pool

__all__ = ["Interrupted", "interruptible", "exit_status", "raise_if_interrupted", "interrupt_handled",
           "worker_pool"]


class Interrupted(KeyboardInterrupt):
    """Stopped by a signal; `signum` says which (SIGINT for Ctrl-C)."""

    def __init__(self, signum: int = signal.SIGINT):
        # args is (signum,): simpy and pickling rebuild an exception as type(e)(*e.args).
        super().__init__(int(signum))
        self.signum = int(signum)

    def __str__(self) -> str:
        return signal.Signals(self.signum).name


def exit_status(interrupt: BaseException) -> int:
    """128 + the signal's number, as a shell reports a process a signal stopped (130, 143)."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


# Signals received inside `interruptible()`. Python swallows an exception raised where it
# cannot propagate (a signal landing in an import lock's weakref callback prints "Exception
# ignored" and carries on), so the signal is also remembered and checked before committing.
_received: list[int] = []


def _raise_interrupted(signum: int, _frame: object) -> None:
    _received.append(signum)
    raise Interrupted(signum)


def interrupt_handled() -> None:
    """The caller caught the Interrupted and decides what to write (a sweep's partial table)."""
    _received.clear()


def raise_if_interrupted() -> None:
    """Raise Interrupted if a signal arrived whose exception may have been swallowed."""
    if _received:
        raise Interrupted(_received[-1])


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """While inside, SIGINT, SIGTERM and SIGHUP raise Interrupted in the main thread and are
    remembered (a KeyboardInterrupt that lands inside a simpy process is turned into a
    failed event there and may never surface: `raise_if_interrupted` raises it again); the
    previous handlers come back on the way out. Elsewhere than the main thread it does
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    previous: dict[int, object] = {}
    try:  # a signal between two installs still restores the ones installed
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _raise_interrupted)
        yield
        raise_if_interrupted()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # The signal has been raised by now (or another exception is on its way): forget it,
        # or every later run in this process (the Python API, a test session) would stop.
        _received.clear()


def _worker_start() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # terminate() from the parent ends it
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@contextlib.contextmanager
def worker_pool(workers: int) -> Iterator[Pool]:
    """A pool of `workers` processes, closed normally on success and terminated (queued
    tasks dropped, running ones killed) on any exception, Ctrl-C and SIGTERM included."""
    pool = multiprocessing.get_context().Pool(workers, initializer=_worker_start)
    try:
        yield pool
    except BaseException:
        pool.terminate()
        pool.join()
        raise
    pool.close()
    pool.join()
