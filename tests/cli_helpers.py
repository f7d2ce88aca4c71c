"""Helpers shared by the tests of the command line's refusals."""

from __future__ import annotations


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
