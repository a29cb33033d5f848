"""Building and loading the C++ CPU kernels: cached once, and the PyTorch version where they cannot build."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import unavailable
from vision_tx.ops import cpu_kernels as kernels


def test_switched_off_builds_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    assert kernels.cpu_kernels.__wrapped__() is None
    assert list(tmp_path.iterdir()) == []


def test_without_a_compiler_warns_and_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.warns(UserWarning, match="did not build or load .*PyTorch version runs instead"):
        assert kernels.cpu_kernels.__wrapped__() is None
    assert list(tmp_path.iterdir()) == []  # the failed build's private folder is gone: nothing half-built is cached


def test_cache_follows_the_source(tmp_path: Path) -> None:
    """An edited source builds into a new folder: a stale binary is never loaded."""
    source = tmp_path / "kernel.cpp"
    source.write_text("// one")
    first = kernels.build_directory(source)
    source.write_text("// two")
    assert kernels.build_directory(source) != first
    assert kernels.build_directory(source) == kernels.build_directory(source)


def test_built_kernel_is_cached_and_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel the tests use was built into the cache folder, from which a new call loads it without compiling."""
    module = kernels.cpu_kernels()
    if module is None:
        unavailable("the C++ CPU kernel did not build (see the warning)")
    assert kernels._library(kernels.build_directory()).exists()
    monkeypatch.setattr(kernels, "_build", lambda directory: pytest.fail("compiled again"))
    assert hasattr(kernels.cpu_kernels.__wrapped__(), "forward")
