"""Helpers shared by the tests of the command line's refusals."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

# A one-instance Trn2 training scenario without traces: the base the refusal tests change.
SMALL = {
    "name": "small", "hardware": "trn2", "duration": "1h", "cluster": {"instances": 1},
    "jobs": [{"name": "train", "model": "llama3-8b", "global_batch": 16,
              "parallelism": {"tp": 8, "dp": 8, "zero": 1}}],
    "trace": {"enabled": False},
}

_runner = CliRunner()


def invoke(*args: object):
    """The command line run in-process on `args` (each made a string)."""
    from clustersim.cli.app import app

    return _runner.invoke(app, [str(a) for a in args])


def write(folder: Path, mapping, name: str = "scenario.yaml") -> Path:
    """A scenario file (a mapping dumped as YAML, or text as it is) in `folder`."""
    path = folder / name
    path.write_text(mapping if isinstance(mapping, str) else yaml.safe_dump(mapping),
                    encoding="utf-8")
    return path


def refused(result, *words: str) -> None:
    """A command refused its input: exit 2, no traceback or internal error, and each of
    `words` in what it printed on stderr."""
    output = result.stdout + result.stderr
    assert result.exit_code == 2, output
    assert "Traceback" not in output and "internal error" not in output, output
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def set_key(raw: dict, path: str, value: object) -> None:
    """Set a dotted key path (list indices as digits) of a raw scenario mapping in place."""
    holder = raw
    keys = path.split(".")
    for key in keys[:-1]:
        holder = holder[int(key)] if key.isdigit() else holder[key]
    holder[keys[-1]] = value


def run_table_text(summary: dict) -> str:
    """What the run table's many-jobs rows say for `summary`, on one line."""
    from rich.console import Console
    from rich.table import Table

    from clustersim.cli.run import _summarise_many_jobs

    table = Table()
    table.add_column("key")
    table.add_column("value")
    _summarise_many_jobs(table, summary)
    console = Console(width=200, record=True)
    console.print(table)
    return " ".join(console.export_text().replace("│", " ").split())
