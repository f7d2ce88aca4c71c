"""Every job's figures as Arrow columns (job_summary.parquet's), made a block of jobs at a time.

`fleet.flat_job_columns` makes a column a Python list: a year's million jobs' hundred figures
were about 1 GB of Python objects, then as much again as the Arrow table written from them.
Here each block of `ROWS_PER_BLOCK` jobs is flattened, made Arrow arrays and its Python
objects dropped; a column's blocks are joined at the end with the type Arrow would have
given the whole column (so the table written is the same).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from clustersim.cluster.fleet import finite_or_none_column, flat_job_columns, missing_figure

__all__ = ["ROWS_PER_BLOCK", "ArrowRows", "arrow_job_columns"]

ROWS_PER_BLOCK = 65_536


def arrow_job_columns(jobs: Mapping[str, Mapping[str, Any]],
                      teams: Mapping[str, str] | None = None,
                      rows_per_block: int | None = None) -> dict[str, pa.Array]:
    """`flat_job_columns(jobs, teams)`'s columns as Arrow arrays, a NaN or an infinity as
    null (`finite_or_none`), in the same order; `rows_per_block` jobs flattened at a time
    (None: ROWS_PER_BLOCK)."""
    if rows_per_block is None:
        rows_per_block = ROWS_PER_BLOCK
    if rows_per_block < 1:
        raise ValueError(f"rows_per_block {rows_per_block}: expected at least 1")
    parts: dict[str, list[pa.Array]] = {}
    done = 0
    items = iter(jobs.items())
    while block := dict(itertools.islice(items, rows_per_block)):
        columns = flat_job_columns(block, teams)
        for name in parts.keys() - columns.keys():  # figures none of this block's jobs has
            columns[name] = [missing_figure(name)] * len(block)
        for name, values in columns.items():
            if name not in parts:  # first seen: the jobs before had none
                parts[name] = [pa.array([missing_figure(name)] * done)] if done else []
            parts[name].append(pa.array(finite_or_none_column(values)))
        done += len(block)
        del block, columns
    return {name: _joined(arrays) for name, arrays in parts.items()}


def _joined(arrays: list[pa.Array]) -> pa.Array:
    """A column's blocks as one array, of the type Arrow infers for all their values at once:
    nulls take the others' type, integers among floats become floats."""
    types = {array.type for array in arrays} - {pa.null()}
    if not types:
        target = pa.null()
    elif len(types) == 1:
        target = types.pop()
    elif types == {pa.int64(), pa.float64()}:
        target = pa.float64()
    else:
        raise TypeError(f"a job figure's values are of types {sorted(map(str, types))}")
    return pa.concat_arrays([array if array.type == target else array.cast(target)
                             for array in arrays])


class ArrowRows(Mapping):
    """The rows of Arrow job columns as mappings, by job name: what `fleet.team_figures`
    reads. A column is made a Python list when first read, one column at a time."""

    def __init__(self, columns: Mapping[str, pa.Array]):
        self.arrays = columns
        self.lists: dict[str, list[Any]] = {}

    def column(self, key: str) -> list[Any]:
        found = self.lists.get(key)
        if found is None:
            found = self.lists[key] = self.arrays[key].to_pylist()
        return found

    def __len__(self) -> int:
        return len(self.arrays["name"])

    def __iter__(self) -> Iterator[str]:
        return iter(self.column("name"))

    def __getitem__(self, name: str) -> Mapping[str, Any]:
        return _Row(self, self.column("name").index(name))

    def values(self) -> Iterator[Mapping[str, Any]]:  # type: ignore[override]
        return (_Row(self, index) for index in range(len(self)))


class _Row(Mapping):
    __slots__ = ("rows", "index")

    def __init__(self, rows: ArrowRows, index: int):
        self.rows = rows
        self.index = index

    def __getitem__(self, key: str) -> Any:
        return self.rows.column(key)[self.index]

    def __len__(self) -> int:
        return len(self.rows.arrays)

    def __iter__(self) -> Iterator[str]:
        return iter(self.rows.arrays)
