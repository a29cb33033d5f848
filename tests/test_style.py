"""The code passes the project's lint and format rules (``[tool.ruff]`` in pyproject.toml), as CI requires."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff() -> list[str]:
    """The command that runs ruff: the installed executable, or the module of this interpreter."""
    found = shutil.which("ruff")
    if found:
        return [found]
    pytest.importorskip("ruff", reason="ruff comes with the test extra: pip install -e '.[test]'")
    return [sys.executable, "-m", "ruff"]


@pytest.mark.parametrize("command", [["check", "--no-fix"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_finds_nothing(command: list[str]) -> None:
    result = subprocess.run([*ruff(), *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, (
        f"ruff {' '.join(command)} . reports:\n{result.stdout[-4000:]}{result.stderr[-2000:]}"
    )
