"""One planted bug: a line of a file replaced, and the tests that must then fail."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the checkout
    before: str  # must occur exactly once in the file
    after: str
    tests: tuple[str, ...]  # pytest node ids: only these run
