"""Output directories written whole or not at all, by one run at a time.

A run writes into a temporary sibling of OUT and renames it into place at the end, so a
failed or interrupted run leaves no half-written OUT. An existing non-empty OUT is replaced
only with `force`, or when it holds nothing but an earlier clustersim run of the same
scenario and settings (`replaces`, earlier_runs.py: the outputs would be the same, so the
README's tour works in order on a fresh clone). Folders are created with the permissions
the umask allows, as `mkdir` would.

Every check is made on the resolved path (`precious/typo/..` is `precious`), while holding
a lock on OUT (an `flock` on `.OUT.lock` beside it), so two runs into the same OUT cannot
both write it: the second is refused with the first one's process id. Temporaries are named
`.OUT.tmp-PID-XXXX` (and `.OUT.old-PID-XXXX` while an old OUT is swapped out); a later run
into the same OUT removes those whose process is gone (killed with SIGKILL, or power lost).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from clustersim.runner.earlier_runs import (
    RUN_FILES,
    RunSettings,
    earlier_report,
    earlier_run_of,
    holds_golden,
    run_differences,
)
from clustersim.runner.interrupts import raise_if_interrupted

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["OutputDirError", "MAX_NAME_BYTES", "atomic_output_dir", "check_output_dir",
           "earlier_run_of", "earlier_report", "RunSettings", "RUN_FILES", "output_lock",
           "remove_stale_temporaries",
           "resolve_output_dir", "check_output_file", "atomic_output_file"]

# A folder name of at most 255 bytes is what Linux and macOS file systems hold; the staging
# sibling `.NAME.tmp-PID-XXXXXXXX` needs about 30 more.
MAX_NAME_BYTES = 200


class OutputDirError(Exception):
    """OUT cannot be used (exists and is not empty without force, is a file, is locked...)."""


def resolve_output_dir(out: str | Path) -> Path:
    """OUT as an absolute path with `..`, `.` and symbolic links resolved, so that every check
    is made on the folder really meant; refuses a name no file system can hold."""
    try:
        resolved = Path(os.path.realpath(Path(out).expanduser()))
    except (OSError, ValueError) as error:
        raise OutputDirError(f"{out}: not a usable path ({error})") from None
    if resolved == resolved.parent:
        raise OutputDirError(f"{out}: is the root folder; expected a folder for this run's "
                             "outputs, e.g. results/NAME")
    if len(os.fsencode(resolved.name)) > MAX_NAME_BYTES:
        raise OutputDirError(f"{out}: the folder name is {len(os.fsencode(resolved.name))} "
                             f"bytes long; expected at most {MAX_NAME_BYTES}")
    if len(os.fsencode(str(resolved))) > 3800:
        raise OutputDirError(f"{out}: the path is longer than 3,800 bytes")
    return resolved


def _nearest_existing(path: Path) -> Path:
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    return ancestor


def check_output_dir(out: str | Path, force: bool, replaces: RunSettings | None = None,
                     ours: Callable[[Path], bool] | None = None,
                     inputs: Iterable[str | Path] = (), instead: str = "-o elsewhere") -> Path:
    """Refuse before any work is done, so a long run does not fail at its end; returns the
    resolved OUT. A non-empty OUT needs `force`, unless it holds only an earlier run of the
    same scenario and settings as `replaces` (or, with `ours`, what that predicate says this command
    wrote). OUT holding one of `inputs` (the scenario, its traces) is refused even with
    `force`: replacing OUT would delete them. `instead`: the other way out a refusal
    offers (a folder the command names itself, as report's, has no -o)."""
    given = out
    out = resolve_output_dir(out)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"{given}: exists and is not a directory")
    here = Path.cwd().resolve()
    if out == here or out in here.parents:
        raise OutputDirError(f"{given}: is the current directory or holds it; expected a folder "
                             "for this run's outputs, e.g. results/NAME")
    for source in inputs:
        try:
            held = Path(os.path.realpath(Path(source).expanduser()))
        except (OSError, ValueError):
            continue
        if out == held or out in held.parents:  # (a trace given as its folder: PAI's)
            raise OutputDirError(f"{given}: holds {source}, an input of this command; "
                                 "replacing it would delete it (even with --force); expected "
                                 "a folder for this run's outputs, e.g. results/NAME")
    if (out.is_dir() and not force and _has_entries(out) and not earlier_run_of(out, replaces)
            and not (ours is not None and ours(out))):
        differs = run_differences(out, replaces)
        what = (f"holds an earlier run of {replaces.name} with other settings: "
                + "; ".join(differs) if replaces and differs
                else "holds a golden summary (as clustersim check --update writes it)"
                if replaces and holds_golden(out)
                else f"holds more than an earlier run of {replaces.name}" if replaces
                else "holds files this command did not write" if ours is not None
                else "exists and is not empty")
        shown = "" if str(given) == str(out) else f" (it resolves to {out})"
        raise OutputDirError(f"{given}: {what}{shown}; use --force to replace it, or "
                             f"{instead}")
    # OUT is staged beside itself: the nearest existing ancestor must take new folders.
    ancestor = _nearest_existing(out.parent)
    if not ancestor.is_dir():
        raise OutputDirError(f"{given}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputDirError(f"{given}: cannot write in {ancestor} (permission denied)")
    return out


def _has_entries(folder: Path) -> bool:
    try:
        return any(folder.iterdir())
    except OSError as error:
        raise OutputDirError(f"{folder}: cannot read it ({error.strerror})") from None


# ---------------------------------------------------------------------------------------------
# The lock

_held: dict[Path, int] = {}  # resolved OUT -> how many times this process holds its lock


def _lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


@contextlib.contextmanager
def output_lock(out: str | Path) -> Iterator[Path]:
    """Hold the lock on OUT (re-entrant within a process); yields the resolved OUT. A second
    process asking for it is refused at once, with the holder's process id. Missing parent
    folders are created (and removed again if the run writes nothing)."""
    out = resolve_output_dir(out)
    if out in _held:
        _held[out] += 1
        try:
            yield out
        finally:
            _held[out] -= 1
        return
    created = _make_parents(out)
    try:
        fd = _acquire(out)
    except BaseException:
        _remove_empty(created)
        raise
    _held[out] = 1
    try:
        yield out
    finally:
        del _held[out]
        # Unlink before unlocking: a process waiting on this file then sees it replaced.
        with contextlib.suppress(OSError):
            os.unlink(_lock_path(out))
        os.close(fd)
        if not out.exists():
            _remove_empty(created)


def _make_parents(out: Path) -> list[Path]:
    missing = []
    parent = out.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputDirError(f"{out}: cannot create {out.parent} ({error.strerror})") from None
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        with contextlib.suppress(OSError):
            folder.rmdir()


def _acquire(out: Path) -> int:
    path = _lock_path(out)
    for _ in range(20):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise OutputDirError(f"{out}: cannot lock it in {out.parent} "
                                 f"({error.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who = f" (process {holder})" if holder.isdigit() else ""
                raise OutputDirError(f"{out}: another clustersim run{who} is writing it; wait "
                                     "for it to finish or choose another -o") from None
            raise OutputDirError(f"{out}: cannot lock it ({error.strerror})") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file its last holder unlinked as we opened it
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            return fd
        os.close(fd)
    raise OutputDirError(f"{out}: cannot lock it (its lock file keeps being replaced)")


# ---------------------------------------------------------------------------------------------
# Temporaries


def _temporary_pattern(out: Path) -> re.Pattern[str]:
    return re.compile(rf"^\.{re.escape(out.name)}\.(?:tmp|old)-(\d+)-[^/]+$")


def remove_stale_temporaries(out: Path) -> list[Path]:
    """Remove `.OUT.tmp-PID-*` and `.OUT.old-PID-*` beside OUT whose process is gone (call
    with OUT's lock held); returns what was removed."""
    pattern = _temporary_pattern(out)
    removed = []
    try:
        siblings = list(out.parent.iterdir())
    except OSError:
        return removed
    for path in siblings:
        match = pattern.match(path.name)
        if match is None or not path.is_dir() or path.is_symlink():
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or _pid_alive(pid):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _temporary(out: Path, kind: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.{kind}-{os.getpid()}-", dir=out.parent))


@contextlib.contextmanager
def atomic_output_dir(out: str | Path, force: bool = False,
                      replaces: RunSettings | None = None,
                      ours: Callable[[Path], bool] | None = None,
                      inputs: Iterable[str | Path] = (),
                      instead: str = "-o elsewhere") -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success it becomes `out`. OUT is locked
    for the whole time, checked again under the lock, and stale temporaries of earlier runs
    into it are removed first."""
    given = out
    check_output_dir(given, force, replaces, ours, inputs, instead)  # before the lock: a refusal
    with output_lock(out) as resolved:  # leaves nothing
        # Again: another run may have written OUT meanwhile.
        check_output_dir(given, force, replaces, ours, inputs, instead)
        remove_stale_temporaries(resolved)
        try:
            staging = _temporary(resolved, "tmp")
            staging.chmod(0o777 & ~_umask())  # mkdtemp makes it 0700 whatever the umask
        except OSError as error:
            raise OutputDirError(f"{given}: cannot write there ({error.strerror})") from None
        try:
            yield staging
            raise_if_interrupted()  # a signal whose exception was swallowed still stops it
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _swap_into_place(staging, resolved)


def _swap_into_place(staging: Path, out: Path) -> None:
    old = None
    try:
        if out.exists():
            old = _temporary(out, "old")
            old.rmdir()
            out.rename(old)
        staging.rename(out)
    except BaseException:
        if old is not None and old.exists() and not out.exists():
            old.rename(out)  # put the previous OUT back
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------------------------------------
# Single files (`plan --write-scenario`): the same rules as folders


def check_output_file(path: str | Path, force: bool, what: str = "the file") -> Path:
    """Refuse an output file before any work: an existing one without `force`, anything but
    a regular file (a folder, a named pipe, a device), a missing or unwritable folder.
    Returns the resolved path."""
    given = path
    try:
        resolved = Path(os.path.realpath(Path(path).expanduser()))
    except (OSError, ValueError) as error:
        raise OutputDirError(f"{given}: not a usable path ({error})") from None
    if len(os.fsencode(resolved.name)) > MAX_NAME_BYTES:
        raise OutputDirError(f"{given}: the file name is {len(os.fsencode(resolved.name))} "
                             f"bytes long; expected at most {MAX_NAME_BYTES}")
    if resolved.exists() or resolved.is_symlink():
        if not resolved.is_file():
            raise OutputDirError(f"{given}: exists and is not a regular file; expected a path "
                                 f"for {what}")
        if not force:
            raise OutputDirError(f"{given}: exists; use --force to replace it")
    parent = resolved.parent
    if not parent.is_dir():
        raise OutputDirError(f"{given}: no folder {parent}; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputDirError(f"{given}: cannot write in {parent} (permission denied)")
    return resolved


@contextlib.contextmanager
def atomic_output_file(path: str | Path, force: bool = False, what: str = "the file",
                       suffix: str = "") -> Iterator[tuple[Path, Callable[[], None]]]:
    """Hold a lock on an output file for the whole work (a second command writing it is
    refused at once) and yield (a temporary path beside it, commit). `commit()` moves the
    temporary into place: without `force` only if the file still does not exist (a hard
    link, which fails on an existing name), so nothing the user made meanwhile is
    replaced. On an exception the temporary goes and, if committed, the file too. `suffix`
    ends the temporary's name (a plotting library picks the format by it)."""
    given = path
    check_output_file(given, force, what)
    with output_lock(path) as resolved:
        check_output_file(given, force, what)
        fd, name = tempfile.mkstemp(prefix=f".{resolved.name}.tmp-{os.getpid()}-",
                                    suffix=suffix, dir=resolved.parent)
        os.close(fd)
        temporary = Path(name)
        temporary.chmod(0o666 & ~_umask())  # mkstemp makes it 0600 whatever the umask
        committed: list[bool] = []

        def commit() -> None:
            raise_if_interrupted()
            try:
                if force:
                    os.replace(temporary, resolved)
                else:
                    os.link(temporary, resolved)
                    temporary.unlink()
            except FileExistsError:
                raise OutputDirError(f"{given}: was created while this command ran; use "
                                     "--force to replace it") from None
            except OSError as error:
                raise OutputDirError(f"{given}: cannot write it ({error.strerror})") from None
            committed.append(True)

        try:
            yield temporary, commit
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            if committed:
                with contextlib.suppress(OSError):
                    resolved.unlink()
            raise
        with contextlib.suppress(OSError):
            temporary.unlink()


def write_serving_table(folder: Path, name: str, table: pa.Table, metadata: dict) -> None:
    """One serving table as Parquet (zstd) with the trace metadata."""
    import pyarrow.parquet as pq

    from clustersim.analysis.trace import table_metadata

    folder.mkdir(parents=True, exist_ok=True)
    table = table.replace_schema_metadata(table_metadata(name, **metadata))
    pq.write_table(table, folder / f"{name}.parquet", compression="zstd")
