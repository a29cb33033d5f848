"""The planted-bug list (``scripts/mutants.py``) stays runnable: each mutant's line occurs exactly once in its file
(a mutant whose line was edited away would be reported as not applied only when the slow run reaches it), its
replacement differs, and each test it names exists."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


@pytest.fixture(scope="module")
def mutants() -> list[Any]:
    sys.path.insert(0, str(SCRIPTS))
    try:
        return runpy.run_path(str(SCRIPTS / "mutants.py"))["MUTANTS"]
    finally:
        sys.path.remove(str(SCRIPTS))


def test_every_mutated_line_occurs_exactly_once_and_changes(mutants: list[Any]) -> None:
    texts: dict[str, str] = {}
    wrong = []
    for mutant in mutants:
        text = texts.setdefault(mutant.path, (ROOT / mutant.path).read_text() if (ROOT / mutant.path).is_file() else "")
        if text.count(mutant.before) != 1 or mutant.before == mutant.after:
            wrong.append(f"{mutant.name}: {mutant.path} has its line {text.count(mutant.before)} times")
    assert len(mutants) > 400 and not wrong, "\n".join(wrong)


def test_mutant_names_are_unique_and_their_tests_exist(mutants: list[Any]) -> None:
    names = [mutant.name for mutant in mutants]
    assert len(set(names)) == len(names), sorted({n for n in names if names.count(n) > 1})
    missing = set()
    for mutant in mutants:
        for test in mutant.tests:
            path, _, name = test.partition("::")
            function = re.sub(r"\[.*\]$", "", name.split("::")[-1])
            if not (ROOT / path).is_file() or function and not re.search(rf"def {function}\b", (ROOT / path).read_text()):
                missing.add(test)
    assert not missing, sorted(missing)
