"""The fuzz's harness: one case run in a forked process with a time and memory budget, and
what it did classified (scripts/fuzz.py draws the cases; tests/test_fuzz.py runs them in the
suite through fuzz.py, which re-exports these names)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import resource
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUTCOMES = ("ok", "refused", "differs", "harness", "internal-error", "traceback", "timeout",
            "killed", "bad-json", "leftover", "inconsistent")

PASSES = ("ok", "refused", "differs")  # differs: `check` found a figure moved (exit 1)


@dataclass
class Outcome:
    kind: str
    exit_code: int | None
    detail: str = ""
    args: list[str] = field(default_factory=list)


def _mapped_bytes() -> int:
    """This process's virtual size (Linux's /proc; 0 where it is not there)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _child(args: list[str], folder: Path, memory_bytes: int, write_fd: int) -> None:
    """In the forked process: limits, then the command in-process (typer's runner)."""
    from typer.testing import CliRunner

    from clustersim.cli.app import app

    # The budget is on top of what the forked parent already maps: a long pytest process
    # (pyarrow's and Ray's reservations) can map gigabytes it never touches, and a fixed cap
    # then fails a case's first allocation as a MemoryError of the harness, not the input.
    limit_bytes = _mapped_bytes() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    os.chdir(folder)
    result = CliRunner().invoke(app, args, env={"COLUMNS": "100", "CLUSTERSIM_DEBUG": ""})
    exception = result.exception
    escaped = exception is not None and not isinstance(exception, SystemExit)
    payload = {"exit_code": result.exit_code, "stdout": result.stdout[-200_000:],
               "stderr": result.stderr[-20_000:],
               "escaped": f"{type(exception).__name__}: {exception}" if escaped else ""}
    with os.fdopen(write_fd, "wb") as pipe:
        pipe.write(pickle.dumps(payload))


def run_case(case: dict[str, Any], timeout_s: float = 30.0, memory_bytes: int = 4 * 2**30
             ) -> Outcome:
    """Run one case in a forked child in a fresh folder; classify what it did."""
    args = [str(a) for a in case["args"]]
    with tempfile.TemporaryDirectory(prefix="clustersim-fuzz-") as tmp:
        folder = Path(tmp)
        for name, content in case["files"].items():
            write_case_file(folder / name, content)
        (folder / "ro").mkdir(mode=0o500)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child never returns into the caller
            code = 0
            try:
                os.close(read_fd)
                os.setpgid(0, 0)
                _child(args, folder, memory_bytes, write_fd)
            except BaseException:  # noqa: BLE001 - reported through the pipe's absence
                code = 3
            finally:
                os._exit(code)
        os.close(write_fd)
        payload, status = _collect(pid, read_fd, timeout_s)
        if status == "timeout":
            return Outcome("timeout", None, f"no answer in {timeout_s:.0f} s", args)
        if payload is None:
            return Outcome("killed", None, status, args)
        return classify(payload, folder, args, case["files"])


def write_case_file(path: Path, content: Any) -> None:
    """Text, bytes, a named pipe (`{"__fifo__": True}`) or a Parquet file built from cells
    (`{"__parquet__": {"columns", "rows", "typed"}}`: typed converts cells to numbers)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, dict) and "__fifo__" in content:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.mkfifo(path)
    elif isinstance(content, dict) and "__parquet__" in content:
        spec = content["__parquet__"]

        def cell(text: str) -> Any:
            if not spec["typed"]:
                return text
            for kind in (int, float):
                with contextlib.suppress(ValueError):
                    return kind(text)
            return {"true": True, "false": False}.get(text, text)

        columns = {f"{name}{'_' * index}": [cell(r[index]) for r in spec["rows"]]
                   for index, name in enumerate(spec["columns"])}
        try:
            table = pa.table(columns)
            if len(set(spec["columns"])) < len(spec["columns"]):  # duplicated names, as asked
                table = table.rename_columns(spec["columns"])
            pq.write_table(table, path)
        except (pa.ArrowException, OverflowError, ValueError, TypeError):
            path.write_bytes(b"PAR1 not parquet")
    else:
        path.write_text(content, encoding="utf-8")


def _collect(pid: int, read_fd: int, timeout_s: float) -> tuple[dict | None, str]:
    deadline = time.monotonic() + timeout_s
    chunks = []
    os.set_blocking(read_fd, False)
    with os.fdopen(read_fd, "rb") as pipe:
        while True:
            with contextlib.suppress(BlockingIOError):
                data = pipe.read()
                if data:
                    chunks.append(data)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                with contextlib.suppress(BlockingIOError, TypeError):
                    rest = pipe.read()
                    if rest:
                        chunks.append(rest)
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None, "timeout"
            time.sleep(0.005)
    # Any worker processes of the case go with it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    raw = b"".join(chunks)
    if not raw:
        how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit {os.WEXITSTATUS(status)}")
        return None, f"no result ({how}; out of memory?)"
    return pickle.loads(raw), "done"  # noqa: S301 - our own child's bytes


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"bare {name}")

    return json.loads(text, parse_constant=refuse)


def _unchanged(path: Path, folder: Path, given: dict[str, Any] | None) -> bool:
    content = (given or {}).get(str(path.relative_to(folder)))
    if content is None or not isinstance(content, str | bytes):
        return False
    data = content.encode() if isinstance(content, str) else content
    return path.stat().st_size == len(data) and path.read_bytes() == data


def classify(payload: dict[str, Any], folder: Path, args: list[str],
             given: dict[str, Any] | None = None) -> Outcome:
    code = payload["exit_code"]
    output = payload["stdout"] + payload["stderr"]
    if payload["escaped"] or "Traceback" in output:
        return Outcome("traceback", code, payload["escaped"] or output[-2000:], args)
    moved = (args[:1] == ["check"] and code == 1 and "moved beyond the tolerance"
             in payload["stderr"] and "internal error" not in payload["stderr"])
    if code not in (0, 2) and not moved:  # `check` exits 1 when a figure moved: its answer
        return Outcome("internal-error", code, payload["stderr"][-2000:], args)
    left = [str(p.relative_to(folder)) for p in folder.rglob("*")
            if ".tmp-" in p.name or ".old-" in p.name or p.name.endswith(".lock")]
    if left:
        return Outcome("leftover", code, ", ".join(left), args)
    if code == 0 and "--json" in args:
        try:
            _strict(payload["stdout"])
        except ValueError as error:
            return Outcome("bad-json", code, f"stdout: {error}", args)
    for summary_path in folder.rglob("summary.json"):
        if not summary_path.is_file():  # a named pipe a case planted: reading it would block
            continue
        if _unchanged(summary_path, folder, given):
            continue  # the case's own (damaged) input, not something the command wrote
        try:
            summary = _strict(summary_path.read_text(encoding="utf-8"))
        except ValueError as error:
            return Outcome("bad-json", code, f"{summary_path.name}: {error}", args)
        problem = inconsistency(summary)
        if problem:
            return Outcome("inconsistent", code, problem, args)
    return Outcome("differs" if moved else "ok" if code == 0 else "refused", code, "", args)


def inconsistency(summary: dict[str, Any]) -> str:
    """What is contradictory in a run's summary, or ''."""
    for name, job in (summary.get("jobs") or {}).items():
        useful, wall = job.get("useful_s"), job.get("wall_s")
        if useful is None or wall is None or "ettr" not in job:
            continue  # a serving deployment or a figure set without them
        if not (-1e-6 <= useful <= wall * (1 + 1e-9) + 1e-6):
            return f"job {name}: useful_s {useful} outside 0..wall_s {wall}"
        if job.get("steps_completed", 1) == 0 and useful > 1e-6:
            return f"job {name}: useful_s {useful} with no completed step"
        expected = useful / wall if wall > 0 else 0.0
        if "ettr_ci95" not in job and not math.isclose(job["ettr"], expected, rel_tol=1e-6,
                                                       abs_tol=1e-9):
            return f"job {name}: ettr {job['ettr']} is not useful_s / wall_s = {expected}"
        if not 0 <= job["ettr"] <= 1 + 1e-9:
            return f"job {name}: ettr {job['ettr']} outside 0..1"
    return ""


# ---------------------------------------------------------------------------------------------
# The long run
