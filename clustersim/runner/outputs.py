"""Output directories written whole or not at all.

A run writes into a temporary sibling of OUT and renames it into place at the end, so a
failed or interrupted run leaves no half-written OUT. An existing non-empty OUT is replaced
only with `force`, or when it holds nothing but an earlier clustersim run of the same
scenario (`replaces`: so the README's tour works in order on a fresh clone). Folders are
created with the permissions the umask allows, as `mkdir` would.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["OutputDirError", "atomic_output_dir", "check_output_dir", "earlier_run_of"]

# What `clustersim run` writes into OUT (and `clustersim report` adds): a folder holding only
# these, with a summary.json and scenario.yaml of the same scenario, is an earlier run.
RUN_FILES = frozenset({"summary.json", "scenario.yaml", "report"} | {
    f"{table}.parquet" for table in ("chips", "jobs", "intervals", "events", "allocations",
                                     "utilisation", "cluster_state", "requests")})


class OutputDirError(Exception):
    """OUT cannot be used (exists and is not empty without force, or is a file)."""


def earlier_run_of(out: Path, scenario: str | None) -> bool:
    """Whether `out` holds only the outputs of an earlier `clustersim run` of `scenario`."""
    if scenario is None or not out.is_dir():
        return False
    names = {p.name for p in out.iterdir()}
    if not names <= RUN_FILES or not {"summary.json", "scenario.yaml"} <= names:
        return False
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("scenario") == scenario


def check_output_dir(out: Path, force: bool, replaces: str | None = None) -> None:
    """Refuse before any work is done, so a long run does not fail at its end. `replaces`
    names the scenario whose earlier run OUT may hold without `force`."""
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"{out}: exists and is not a directory")
    here = Path.cwd().resolve()
    if out.resolve() == here or out.resolve() in here.parents:
        raise OutputDirError(f"{out}: is the current directory or holds it; expected a folder "
                             "for this run's outputs, e.g. results/NAME")
    if out.is_dir() and any(out.iterdir()) and not force and not earlier_run_of(out, replaces):
        what = (f"holds more than an earlier run of {replaces}" if replaces
                else "exists and is not empty")
        raise OutputDirError(f"{out}: {what}; use --force to replace it, or -o elsewhere")
    # OUT is staged beside itself: the nearest existing ancestor must take new folders.
    ancestor = out.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputDirError(f"{out}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputDirError(f"{out}: cannot write in {ancestor} (permission denied)")


@contextlib.contextmanager
def atomic_output_dir(out: Path, force: bool = False, replaces: str | None = None
                      ) -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success it becomes `out`."""
    out = Path(out)
    check_output_dir(out, force, replaces)
    out = out.resolve()  # `a/..` and the like: stage beside the folder really meant
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        staging.chmod(0o777 & ~_umask())  # mkdtemp makes it 0700 whatever the umask
    except OSError as error:
        raise OutputDirError(f"{out}: cannot write there ({error.strerror})") from None
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        old.rmdir()
        out.rename(old)
    staging.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
