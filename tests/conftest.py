"""Shared fixtures: the real data under ../shared/data and deterministic seeding; reference imports.

Under ``CI=true`` (set by ``.ci/run``) nothing skips: a missing reference library, a reference that
raises, or missing ``../shared/data`` fails with one line naming it. Elsewhere these skip, saying why.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest
import torch

SHARED_DATA = Path(
    os.environ.get("VISION_TX_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data")
)


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Fails the test (or the module being collected) under CI, skips it elsewhere; ``reason`` says what is missing."""
    if IN_CI:
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_reference(module: str) -> ModuleType:
    """Imports the reference library ``module`` (from the ``test`` extra), or :func:`unavailable`."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        unavailable(
            f"reference library {module} cannot be imported ({err}); install the test extra: pip install -e '.[test]'"
        )


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker takes its share of torch's threads (workers that each take every core slow
    down), and so do the processes its tests start: a run killed and resumed in another process sums as this one."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, torch.get_num_threads() // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` beside the project; without it the tests that need it fail under CI, skip elsewhere."""
    if not SHARED_DATA.is_dir():
        unavailable(f"real fixtures not found at {SHARED_DATA} (set VISION_TX_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
