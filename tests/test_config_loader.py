"""Every shipped config means what it meant when ``tests/fixtures/resolved_configs.json`` was written (a recipe changed
on purpose rewrites it: ``python -m vision_tx.config_loader --all > tests/fixtures/resolved_configs.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vision_tx.config_loader import resolved_configs

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "resolved_configs.json").read_text())
RESOLVED = resolved_configs()


def test_the_fixture_names_every_config_and_no_other() -> None:
    assert len(FIXTURE) == 47 and sorted(RESOLVED) == sorted(FIXTURE)


@pytest.mark.parametrize("name", sorted(FIXTURE))
def test_each_config_resolves_to_the_fixture(name: str) -> None:
    """Compared as sorted JSON, so that 1 and 1.0, or 1 and true, differ."""
    assert json.dumps(RESOLVED[name], sort_keys=True, indent=1) == json.dumps(FIXTURE[name], sort_keys=True, indent=1)
