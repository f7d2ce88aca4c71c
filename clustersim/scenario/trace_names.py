"""Names from a trace's ids, users and virtual clusters: team and job names (letters,
digits, . _ -), one-to-one with the names written."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["clean_name", "TraceNames"]


def clean_name(text: str | None) -> str | None:
    """A trace's user or virtual cluster as a team name (letters, digits, . _ -): a
    non-ASCII character as its code point (研 as u7814), another as _."""
    if text is None:
        return None
    text = "".join(c if c.isascii() else f"u{ord(c):04x}" for c in text.strip())
    name = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:128]
    return name if name and name[0].isalnum() else f"t{name}"[:128]


class TraceNames:
    """`clean_name` kept one-to-one over a trace's names (`raws`, all of them, given first):
    a name already clean keeps itself; another cleaned to a name taken ('a b' beside 'a_b')
    takes -2, -3, ... in the order met (two teams or jobs were merged, or refused as one
    name). Surrounding spaces are not part of a name."""

    def __init__(self, raws: Iterable[str | None] = ()) -> None:
        self.given: dict[str, str] = {}
        self.taken: set[str] = set()
        for raw in raws:  # (first: a clean name is never renamed for an unclean one)
            if raw is not None and clean_name(raw) == raw.strip():
                self.given[raw.strip()] = raw.strip()
                self.taken.add(raw.strip())

    def __call__(self, raw: str | None) -> str | None:
        if raw is None:
            return None
        key = raw.strip()
        if key not in self.given:
            name = base = clean_name(raw) or "t"
            n = 1
            while name in self.taken:
                n += 1
                name = f"{base[:120]}-{n}"
            self.given[key] = name
            self.taken.add(name)
        return self.given[key]
