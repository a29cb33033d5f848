"""Shared fixtures: the real data under ../shared/data and deterministic seeding."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(os.environ.get("VISION_TX_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` beside the project; tests that need it skip with the reason when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real fixtures not found at {SHARED_DATA} (set VISION_TX_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
