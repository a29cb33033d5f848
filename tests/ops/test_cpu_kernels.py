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
    with pytest.warns(UserWarning, match="did not build or load .*PyTorch versions run instead"):
        assert kernels.cpu_kernels.__wrapped__() is None
    assert list(tmp_path.iterdir()) == []  # the failed build's private folder is gone: nothing half-built is cached


def test_cache_follows_the_sources(tmp_path: Path) -> None:
    """An edited, added or renamed source builds into a new folder: a stale binary is never loaded."""
    one, two = tmp_path / "one.cpp", tmp_path / "two.cpp"
    one.write_text("// one")
    two.write_text("// two")
    first = kernels.build_directory([one, two])
    assert kernels.build_directory([one, two]) == first
    two.write_text("// two, edited")
    assert kernels.build_directory([one, two]) != first
    assert kernels.build_directory([one]) != kernels.build_directory([one, two])
    assert kernels.HEADERS and kernels.build_directory() != kernels.build_directory(kernels.SOURCES)  # headers count
    renamed = tmp_path / "renamed.cpp"
    renamed.write_text("// one")
    assert kernels.build_directory([renamed]) != kernels.build_directory([one])


def test_built_kernel_is_cached_and_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels the tests use were built (from every source in ``csrc``) into the cache folder, from which a new
    call loads them without compiling."""
    module = kernels.cpu_kernels()
    if module is None:
        unavailable("the C++ CPU kernel did not build (see the warning)")
    assert kernels._library(kernels.build_directory()).exists()
    monkeypatch.setattr(kernels, "_build", lambda directory: pytest.fail("compiled again"))
    sources = {"bindings.cpp", "ms_deform_attn_cpu.cpp", "depthwise_conv_cpu.cpp"}
    assert {path.name for path in kernels.SOURCES} >= sources
    loaded = kernels.cpu_kernels.__wrapped__()
    assert all(hasattr(loaded, name) for name in ("ms_deform_attn_forward", "depthwise_conv2d_weight_grad"))
