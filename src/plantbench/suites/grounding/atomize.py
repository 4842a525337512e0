"""Atomic sentences of a response: the units CK and PK count.

The twins' contexts are already atomic (one fact or detail per line); a response is cut at line
breaks and sentence ends (``.``, ``!``, ``?`` then a space), list markers are dropped, and a
piece of fewer than :data:`MIN_WORDS` words is not a statement. A response cut by the length
limit loses its unfinished last piece (a sentence the twin had not finished saying).
"""

from __future__ import annotations

import re

MIN_WORDS = 3
_SPLIT = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"\w+")


def atomize(text: str, *, truncated: bool = False) -> list[str]:
    """The atomic sentences of ``text``, in order."""
    pieces = []
    for line in text.split("\n"):
        line = line.strip().removeprefix("- ").removeprefix("* ").strip()
        pieces += [p.strip() for p in _SPLIT.split(line) if p.strip()]
    if truncated and pieces and not pieces[-1].endswith((".", "!", "?")):
        pieces = pieces[:-1]
    return [p for p in pieces if len(_WORD.findall(p)) >= MIN_WORDS]
