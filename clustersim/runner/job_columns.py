"""Every job's figures as Arrow columns (job_summary.parquet's), made a block of jobs at a time.

`fleet.flat_job_columns` makes a column a Python list: a year's million jobs' hundred figures
were about 1 GB of Python objects, then as much again as the Arrow table written from them.
Here each block of `ROWS_PER_BLOCK` jobs is flattened, made Arrow arrays and its Python
objects dropped; a column's blocks are joined at the end with the type Arrow would have
given the whole column (so the table written is the same).

A block is flattened a column at a time (`block_columns`), not a job at a time: a job's
hundred figures walked one by one were 7 of the 30-day slice's 212 profiled seconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from clustersim.cluster.fleet import (
    finite_or_none_column,
    flat_job_columns,
    flatten_into,
    missing_figure,
)

__all__ = ["ROWS_PER_BLOCK", "ArrowRows", "arrow_job_columns", "block_columns"]

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
        columns = block_columns(block, teams)
        for name in parts.keys() - columns.keys():  # figures none of this block's jobs has
            columns[name] = [missing_figure(name)] * len(block)
        for name, values in columns.items():
            if name not in parts:  # first seen: the jobs before had none
                parts[name] = [pa.array([missing_figure(name)] * done)] if done else []
            parts[name].append(_finite_array(values))
        done += len(block)
        del block, columns
    return {name: _joined(arrays) for name, arrays in parts.items()}


def _finite_array(values: list[Any]) -> pa.Array:
    """`pa.array(finite_or_none_column(values))`, looking for a NaN or an infinity in Arrow:
    only a float column can hold one, and hardly any does (then the Python lists' way, whose
    type can differ: integers beside a NaN become an integer column)."""
    try:
        array = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # a NaN beside strings, say: as before
        return pa.array(finite_or_none_column(values))
    if pa.types.is_floating(array.type) and not pc.all(pc.is_finite(array)).as_py():
        array = pa.array(finite_or_none_column(values))
    return array


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


class _Missing:
    """Where a job has no figure (in place of a value; `get` as an empty mapping's)."""

    __slots__ = ()

    def get(self, key: Any, default: Any = None) -> Any:
        return default


_MISSING = _Missing()


class _Irregular(Exception):
    """Two figures of a job flatten to one name (a key with a dot beside its nesting)."""


def block_columns(jobs: Mapping[str, Mapping[str, Any]],
                  teams: Mapping[str, str] | None = None) -> dict[str, list[Any]]:
    """`fleet.flat_job_columns(jobs, teams)`, made a column at a time: the values under a
    key gathered for every job at once, a mapping or list shared by several jobs (their
    shape's figures) flattened once. The columns are in the order of the row by row walk:
    by the first job having each, then its place in that job's row."""
    names = list(jobs)
    rows = list(jobs.values())
    columns: dict[str, list[Any]] = {"name": names}
    if teams is not None:
        columns["team"] = [teams.get(name, "-") for name in names]
    found: dict[str, list[Any]] = {}
    try:
        _gather("", rows, found)
    except _Irregular:
        return flat_job_columns(jobs, teams)
    for name, values in found.items():
        base = columns.get(name)
        columns[name] = values if base is None else [  # a figure `name` or `team`: it wins
            mine if mine is not _MISSING else theirs
            for mine, theirs in zip(values, base, strict=True)]
    first = {name: next(i for i, value in enumerate(values) if value is not _MISSING)
             for name, values in columns.items()}
    places: dict[int, dict[str, int]] = {}
    for job in sorted(set(first.values())):  # the row of each job that has a column first
        row: dict[str, Any] = dict.fromkeys(("name", "team") if teams is not None else ("name",))
        flatten_into("", rows[job], row)
        places[job] = {name: place for place, name in enumerate(row)}
    order = sorted(columns, key=lambda name: (first[name], places[first[name]][name]))
    out = {}
    for name in order:
        values = columns[name]
        if _MISSING in values:  # (compared by identity first: no figure equals it)
            missing = missing_figure(name)
            values = [missing if value is _MISSING else value for value in values]
        out[name] = values
    return out


def _gather(prefix: str, values: list[Any], out: dict[str, list[Any]]) -> None:
    """Add to `out` the columns under `prefix` of `values` (one a job, `_MISSING` where a job
    has nothing there), named as `fleet.flatten_into` names them."""
    kinds: dict[type, str] = {}
    for kind in set(map(type, values)):
        kinds[kind] = ("missing" if kind is _Missing else "mapping" if issubclass(kind, Mapping)
                       else "sequence" if issubclass(kind, list | tuple) else "leaf")
    present = set(kinds.values())
    if present <= {"leaf", "missing"}:
        if "leaf" in present:
            if prefix in out:
                raise _Irregular(prefix)
            out[prefix] = values
        return
    if "leaf" in present:
        if prefix in out:
            raise _Irregular(prefix)
        out[prefix] = [v if kinds[type(v)] == "leaf" else _MISSING for v in values]
    distinct = {id(v): v for v in values if kinds[type(v)] in ("mapping", "sequence")}
    if len(distinct) * 2 <= len(values):
        # Shared by several jobs (a shape's figures): each object's columns once, then
        # repeated for the jobs holding it.
        slot = {key: index for index, key in enumerate(distinct)}
        index = [slot.get(id(v), -1) for v in values]  # -1: the _MISSING put last
        inner: dict[str, list[Any]] = {}
        _gather(prefix, list(distinct.values()), inner)
        for name, column in inner.items():
            if name in out:
                raise _Irregular(name)
            column.append(_MISSING)
            out[name] = [column[i] for i in index]
        return
    if "mapping" in present:
        maps = [v if kinds[type(v)] == "mapping" else _MISSING for v in values]
        for key in set().union(*(v for v in maps if v is not _MISSING)):
            _gather(f"{prefix}.{key}" if prefix else str(key),
                    [v.get(key, _MISSING) for v in maps], out)
    if "sequence" in present:
        seqs = [v if kinds[type(v)] == "sequence" else () for v in values]
        for index in range(max(map(len, seqs))):
            _gather(f"{prefix}.{index}",
                    [v[index] if index < len(v) else _MISSING for v in seqs], out)


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
