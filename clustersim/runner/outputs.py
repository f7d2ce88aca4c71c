"""Output directories written whole or not at all.

A run writes into a temporary sibling of OUT and renames it into place at the end, so a
failed or interrupted run leaves no half-written OUT. An existing non-empty OUT is replaced
only with `force`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["OutputDirError", "atomic_output_dir", "check_output_dir"]


class OutputDirError(Exception):
    """OUT cannot be used (exists and is not empty without force, or is a file)."""


def check_output_dir(out: Path, force: bool) -> None:
    """Refuse before any work is done, so a long run does not fail at its end."""
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"{out}: exists and is not a directory")
    here = Path.cwd().resolve()
    if out.resolve() == here or out.resolve() in here.parents:
        raise OutputDirError(f"{out}: is the current directory or holds it; expected a folder "
                             "for this run's outputs, e.g. results/NAME")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise OutputDirError(f"{out}: exists and is not empty; use --force to replace it")
    # OUT is staged beside itself: the nearest existing ancestor must take new folders.
    ancestor = out.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputDirError(f"{out}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputDirError(f"{out}: cannot write in {ancestor} (permission denied)")


@contextlib.contextmanager
def atomic_output_dir(out: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success it becomes `out`."""
    out = Path(out)
    check_output_dir(out, force)
    out = out.resolve()  # `a/..` and the like: stage beside the folder really meant
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
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
