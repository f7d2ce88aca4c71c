"""The cells of a published cluster trace (clustersim.scenario.traces): its bytes, bounded;
its times (seconds, or dates with or without a zone), counts and text; a CSV table as
mappings of text. A problem is a TraceProblem naming the row and column (the reader adds
the file)."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

from clustersim.hardware import limits
from clustersim.scenario.reading import TooLarge, read_bounded, regular_file_problem

__all__ = ["TraceProblem", "trace_bytes", "cell_shown", "plain_number", "cell_seconds",
           "submitted_s", "cell_count", "csv_records", "cell_text"]


class TraceProblem(ValueError):
    """A problem of the trace; `file` names another file than the trace given (PAI's task
    table), `key` the scenario key of a problem of the mapping."""

    def __init__(self, message: str, file: Path | None = None, key: str | None = None):
        super().__init__(message)
        self.file = file
        self.key = key


def trace_bytes(path: Path) -> bytes:
    """A trace file's bytes, bounded by limits.MAX_TRACE_FILE_BYTES however the file says its
    size (a /proc file says 0); anything but a regular file is refused."""
    problem = regular_file_problem(path, limits.MAX_TRACE_FILE_BYTES, "a trace file")
    if problem is not None:
        raise TraceProblem(problem, path)
    try:
        return read_bounded(path, limits.MAX_TRACE_FILE_BYTES)
    except TooLarge as error:
        raise TraceProblem(str(error), path) from None
    except OSError as error:
        raise TraceProblem(f"cannot read it ({error.strerror or error})", path) from None


# A plain decimal number as text: what float() reads beyond it (digits of other scripts such
# as Arabic-Indic, `1_000`, `infinity`) is not a trace's number.
_PLAIN_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_FIRST_YEAR, _LAST_YEAR = limits.TRACE_FIRST_YEAR, limits.TRACE_LAST_YEAR
_DATE = re.compile(r"\s*[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(\s|T|$)")  # YYYY-MM-DD, then the time
_MISSING = ("None", "NaT", "nan", "NaN")  # a time not known: Philly's "None", pandas' marks


def cell_shown(value: Any) -> str:
    """A value for a message, at most 40 characters (a 400-digit number is not shown whole)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def plain_number(value: Any) -> float | None:
    """A number given as a number or as plain ASCII decimal text, else None (a boolean too:
    True is not 1 s or 1 GPU)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # a JSON integer of 400 digits: no finite number
            return math.inf
    if isinstance(value, str) and _PLAIN_NUMBER.fullmatch(value.strip()):
        return float(value)
    return None


def cell_seconds(value: Any, where: str, column: str) -> float | None:
    """A time as seconds: a number, or a date and time (with or without a zone)."""
    if (value is None or (isinstance(value, float) and math.isnan(value)) or value == ""
            or value in _MISSING):  # Philly writes a time it does not have as "None"
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TraceProblem(f"{where}, column {column}: {value!r} is not a time; expected "
                           "YYYY-MM-DD HH:MM:SS (optionally with a zone) or seconds")
    seconds = plain_number(value)  # seconds, written as a number or as text (PAI's tables)
    if seconds is not None:
        if not math.isfinite(seconds):
            raise TraceProblem(f"{where}, column {column}: {cell_shown(value)} is not a finite time")
        return seconds
    if not _DATE.match(value):  # pandas reads "now" and "today" as the clock's time
        raise TraceProblem(f"{where}, column {column}: {value!r} is not a time; expected "
                           "YYYY-MM-DD HH:MM:SS (optionally with a zone) or seconds")
    import pandas as pd

    try:
        stamp = pd.Timestamp(str(value))
        if stamp is pd.NaT:
            return None
        if not _FIRST_YEAR <= stamp.year <= _LAST_YEAR:
            raise TraceProblem(f"{where}, column {column}: {value!r} is in the year {stamp.year}; "
                               f"expected a time from {_FIRST_YEAR} to {_LAST_YEAR}")
        if stamp.tzinfo is not None:
            stamp = stamp.tz_convert("UTC").tz_localize(None)
        return stamp.value / 1e9
    except (ValueError, TypeError, OverflowError) as error:
        if isinstance(error, TraceProblem):
            raise
        raise TraceProblem(f"{where}, column {column}: {value!r} is not a time; expected "
                           "YYYY-MM-DD HH:MM:SS (optionally with a zone) or seconds") from None


def submitted_s(value: Any, where: str, column: str) -> float:
    """A job's submission time, which every row needs: it orders the trace and starts its
    clock (one missing was read as 1970, decades before the others)."""
    seconds = cell_seconds(value, where, column)
    if seconds is None:
        raise TraceProblem(f"{where}, column {column}: {cell_shown(value)}; expected the job's submission "
                           "time (YYYY-MM-DD HH:MM:SS or seconds)")
    return seconds


def cell_count(value: Any, where: str, column: str) -> float:
    number = plain_number(value)
    if number is None:
        raise TraceProblem(f"{where}, column {column}: {value!r} is not a number")
    if not math.isfinite(number) or number < 0:
        raise TraceProblem(f"{where}, column {column}: {value!r}; expected a finite count >= 0")
    return number


def csv_records(path: Path, columns: tuple[str, ...], header: bool | None = True):
    """The rows of a CSV file as mappings of text; `header` None: a header row when the
    first field is the first column's name (PAI's tables are published without one)."""
    import pandas as pd

    data = trace_bytes(path)
    what = "task" if "task_name" in columns else "job"
    if not data.removeprefix(b"\xef\xbb\xbf").strip():  # (pandas read it as no rows)
        raise TraceProblem(f"empty (no header, no rows): no job can come of it; expected a "
                           f"row a {what} with the columns {', '.join(columns)}", path)
    if header is None:  # (past a byte-order mark and quotes, as pandas reads the header)
        first = data.removeprefix(b"\xef\xbb\xbf").split(b"\n", 1)[0].split(b",")[0]
        header = first.strip().strip(b'"').strip() == columns[0].encode()
    try:
        frame = pd.read_csv(io.BytesIO(data), header=0 if header else None, dtype=str,
                            keep_default_na=False, names=None if header else list(columns))
    except Exception as error:  # pandas raises many kinds for a damaged file
        raise TraceProblem(f"cannot read it as CSV ({type(error).__name__}: {error})", path) from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise TraceProblem(f"column {missing[0]} missing; expected the columns "
                           f"{', '.join(columns)}", path)
    if len(frame) > limits.MAX_TRACE_ROWS:
        raise TraceProblem(f"{len(frame):,} rows; expected at most {limits.MAX_TRACE_ROWS:,} "
                           "(docs/limits.md)", path)
    if frame.empty:  # (a job table without jobs, or a task table without GPUs for any)
        raise TraceProblem("a header and no rows: no job can come of it; expected a row a "
                           f"{what}", path)
    return frame.to_dict("records")


def cell_text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)
