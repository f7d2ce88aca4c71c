"""Compare two sets of run folders, to show that a change is a pure refactor.

    python scripts/compare_runs.py BEFORE AFTER

BEFORE and AFTER are folders of `clustersim run` outputs, one subfolder per scenario (or two
run folders). For every scenario in both: summary.json must be identical apart from wall
time (`wall_s`, at any depth), every Parquet table equal as a DataFrame (pandas `equals`:
same columns, dtypes and values, NaN equal to NaN), and the files' key-value metadata equal.
Prints one line per scenario and exits 1 if anything differs (or a scenario is only on one
side), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

VOLATILE = {"wall_s"}


def strip_volatile(node: Any) -> Any:
    """The summary without its wall-clock figures."""
    if isinstance(node, dict):
        return {k: strip_volatile(v) for k, v in node.items() if k not in VOLATILE}
    if isinstance(node, list):
        return [strip_volatile(v) for v in node]
    return node


def run_folders(root: Path) -> dict[str, Path]:
    """Scenario name -> run folder: ROOT itself if it is a run, else its subfolders that are."""
    if (root / "summary.json").exists():
        return {root.name: root}
    return {p.name: p for p in sorted(root.iterdir()) if (p / "summary.json").exists()}


def compare_run(before: Path, after: Path) -> list[str]:
    """What differs between two run folders (empty when they agree)."""
    problems = []
    old = strip_volatile(json.loads((before / "summary.json").read_text()))
    new = strip_volatile(json.loads((after / "summary.json").read_text()))
    if old != new:
        problems.append("summary.json differs beyond wall_s")
    tables_before = {p.name for p in before.glob("*.parquet")}
    tables_after = {p.name for p in after.glob("*.parquet")}
    for name in sorted(tables_before ^ tables_after):
        problems.append(f"{name} only in {'before' if name in tables_before else 'after'}")
    for name in sorted(tables_before & tables_after):
        if not pd.read_parquet(before / name).equals(pd.read_parquet(after / name)):
            problems.append(f"{name}: tables differ")
        meta_before = pq.read_schema(before / name).metadata or {}
        meta_after = pq.read_schema(after / name).metadata or {}
        if meta_before != meta_after:
            keys = sorted(k.decode() for k in set(meta_before) ^ set(meta_after)) or sorted(
                k.decode() for k in meta_before if meta_before[k] != meta_after.get(k))
            problems.append(f"{name}: metadata differs ({', '.join(keys)})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    before, after = run_folders(args.before), run_folders(args.after)
    failed = False
    for name in sorted(before.keys() | after.keys()):
        if name not in before or name not in after:
            print(f"{name}: only in {'before' if name in before else 'after'}")
            failed = True
            continue
        problems = compare_run(before[name], after[name])
        tables = len(list(before[name].glob("*.parquet")))
        print(f"{name}: " + ("; ".join(problems) if problems else
                             f"identical (summary.json apart from wall_s, {tables} tables)"))
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
