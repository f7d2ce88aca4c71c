"""The native job table (`workload.file`, and `workload.trace` with `format: native`): a CSV
or Parquet file of one job a row, read strictly. Its columns are the ones a job takes, and a
column that is not one of them is refused (`runfor` for `run_for` left the job running to the
horizon); a CSV row with more or fewer fields than the header is refused (with one more,
pandas took the first column as the index and read every cell one column over); so is a
file with no header, or a header and no rows (no job can come of it), and a run time under
limits.MIN_TRACE_RUN_S. The native format reads no `workload.mapping` key: its rows give
sizes and templates as written.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustersim.hardware import limits
from clustersim.scenario.errors import WorkloadError
from clustersim.scenario.reading import TooLarge, read_bounded

if TYPE_CHECKING:
    import pandas as pd


__all__ = ["REQUIRED", "OPTIONAL", "read_job_table", "unread_mapping_key"]

REQUIRED = ("submit", "instances", "template")
OPTIONAL = ("run_for", "steps", "priority", "name", "team")
_EXPECTED = "expected submit, instances, template (run_for, steps, priority, name, team optional)"


def read_job_table(path: Path, key: str) -> pd.DataFrame:
    """The rows of a native job table, every column known (WorkloadError under `key`, naming
    the file, and the row and its line for a CSV row of the wrong field count)."""
    import pandas as pd

    try:  # bounded: a /proc file behind a link says 0 bytes and may never end
        data = read_bounded(path, limits.MAX_TRACE_FILE_BYTES)
    except (TooLarge, OSError) as error:
        raise WorkloadError(key, f"{path}: "
                            f"{error if isinstance(error, TooLarge) else 'cannot read it'}"
                            ) from None
    parquet = path.suffix == ".parquet"
    if not parquet and not data.removeprefix(b"\xef\xbb\xbf").strip():
        raise WorkloadError(key, f"{path}: empty (no header, no rows): no job can come of "
                            f"it; {_EXPECTED}, a header row and a row a job")
    if not parquet:  # (before pandas, which would warn of the data lost)
        _check_fields(data, path, key)
    try:
        # Names as written: "007" and "1e3" are names, not the numbers 7.0 and 1000.0;
        # index_col False: a row with a field more than the header is not an index.
        frame = (pd.read_parquet(io.BytesIO(data)) if parquet else
                 pd.read_csv(io.BytesIO(data), dtype={"name": str, "team": str,
                                                      "template": str},
                             keep_default_na=False, na_values=[""], index_col=False))
    except Exception as error:  # pandas and pyarrow raise many kinds for a damaged file
        raise WorkloadError(key, f"{path}: cannot read it as "
                            f"{'Parquet' if parquet else 'CSV'} "
                            f"({type(error).__name__}: {error})") from None
    if len(frame) > limits.MAX_TRACE_ROWS:
        raise WorkloadError(key, f"{path}: {len(frame):,} rows; expected at most "
                            f"{limits.MAX_TRACE_ROWS:,} (docs/limits.md)")
    columns = [str(c) for c in frame.columns]
    missing = set(REQUIRED) - set(columns)
    if missing:
        raise WorkloadError(key, f"{path}: missing columns {', '.join(sorted(missing))}; "
                            f"{_EXPECTED}")
    unknown = [c for c in columns if c not in REQUIRED + OPTIONAL]
    if unknown:  # (a misspelt optional column was read by nothing)
        raise WorkloadError(key, f"{path}: unknown column{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(repr(c) for c in unknown[:5])}; the columns are "
                            f"{', '.join(REQUIRED + OPTIONAL)}")
    if frame.empty:
        raise WorkloadError(key, f"{path}: a header and no rows: no job can come of it; "
                            "expected a row a job")
    return frame


def _check_fields(data: bytes, path: Path, key: str) -> None:
    """Every CSV row has the header's field count (blank lines skipped, as pandas skips
    them): with one more, pandas took the first column as the index and read each cell one
    column over ("unknown template '1h'"); with one fewer, the last column was empty."""
    reader = csv.reader(io.StringIO(data.decode("utf-8-sig", errors="replace"), newline=""))
    try:
        expected = len(next(reader, []))
        number = 0
        for fields in reader:
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue  # a blank line
            number += 1
            if len(fields) != expected:
                raise WorkloadError(key, f"{path}, row {number} (line {reader.line_num}): "
                                    f"{len(fields)} fields; expected {expected}, one for "
                                    "each column of the header")
    except csv.Error:
        return  # not CSV as the csv module reads it: pandas says what is wrong


def unread_mapping_key(workload: Any) -> None:
    """Refuse `workload.mapping` keys where no published trace reads them: the native format
    and `workload.file` give sizes, templates and teams in their rows. (`workload`: a
    jobmix.WorkloadSpec, not imported: jobmix imports this module.)"""
    given = [k for k in ("rule", "gpus_per_instance", "gpu", "template", "team")
             if k in workload.mapping.model_fields_set]
    if not given or (workload.trace is not None and workload.format != "native"):
        return
    what = ("the native format" if workload.trace is not None else
            "a workload without a published trace")
    raise WorkloadError(f"workload.mapping.{given[0]}",
                        f"{getattr(workload.mapping, given[0])!r}: {what} reads no mapping "
                        "(it maps a published trace's GPU jobs; native rows give instances, "
                        "template and team as written); expected no mapping key")
