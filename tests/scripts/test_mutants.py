"""The planted-bug list (``tests/mutants/``, run by ``scripts/mutants.py``) stays runnable: each mutant's line occurs
exactly once in its file (a mutant whose line was edited away would be reported as not applied only when the slow run
reaches it), its replacement differs, and each test it names exists."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

from tests.mutants import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]


def test_every_mutated_line_occurs_exactly_once_and_changes() -> None:
    texts: dict[str, str] = {}
    wrong = []
    for mutant in MUTANTS:
        text = texts.setdefault(mutant.path, (ROOT / mutant.path).read_text() if (ROOT / mutant.path).is_file() else "")
        if text.count(mutant.before) != 1 or mutant.before == mutant.after:
            wrong.append(f"{mutant.name}: {mutant.path} has its line {text.count(mutant.before)} times")
    assert len(MUTANTS) > 400 and not wrong, "\n".join(wrong)


def test_mutant_names_are_unique_and_their_tests_exist() -> None:
    names = [mutant.name for mutant in MUTANTS]
    assert len(set(names)) == len(names), sorted({n for n in names if names.count(n) > 1})
    missing = set()
    for mutant in MUTANTS:
        for test in mutant.tests:
            path, _, name = test.partition("::")
            function = re.sub(r"\[.*\]$", "", name.split("::")[-1])
            if (
                not (ROOT / path).is_file()
                or function
                and not re.search(rf"def {function}\b", (ROOT / path).read_text())
            ):
                missing.add(test)
    assert not missing, sorted(missing)


def test_the_runner_plants_the_whole_list() -> None:
    runner = runpy.run_path(str(ROOT / "scripts" / "mutants.py"), run_name="mutants")
    assert runner["MUTANTS"] is MUTANTS and all(isinstance(m, Mutant) for m in MUTANTS)
