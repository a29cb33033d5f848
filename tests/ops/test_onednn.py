"""``vision_tx.ops.onednn``: where the training step's products run on oneDNN (not on Intel CPUs with MKL)."""

from __future__ import annotations

import pytest

from vision_tx.ops import onednn

INTEL = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n"
AMD = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"


@pytest.mark.parametrize(
    "cpuinfo, mkl, keeps_up",
    [
        (INTEL, True, True),
        (INTEL, False, False),  # a torch build without MKL: its products are another BLAS's
        (AMD, True, False),
        ("Intel64 Family 6 Model 143 Stepping 8, GenuineIntel", True, True),  # Windows' platform.processor()
        ("", True, False),  # unknown: oneDNN, which picks its kernels from the CPU's features
    ],
)
def test_mkl_keeps_up_only_on_intel_cpus_with_mkl(cpuinfo: str, mkl: bool, keeps_up: bool) -> None:
    assert onednn.mkl_products_keep_up(cpuinfo, mkl) is keeps_up


@pytest.mark.parametrize("value, enabled", [("1", True), ("true", True), ("0", False), ("False", False)])
def test_the_environment_variable_overrides_the_cpu(monkeypatch: pytest.MonkeyPatch, value: str, enabled: bool) -> None:
    monkeypatch.setenv("VISION_TX_ONEDNN_TRAINING", value)
    assert onednn._training_default() is enabled
    monkeypatch.setenv("VISION_TX_ONEDNN_TRAINING", "yes please")
    with pytest.raises(ValueError, match="VISION_TX_ONEDNN_TRAINING must be 0 or 1"):
        onednn._training_default()


def test_the_default_follows_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VISION_TX_ONEDNN_TRAINING", raising=False)
    monkeypatch.setattr(onednn, "mkl_products_keep_up", lambda: True)
    assert onednn._training_default() is False
    monkeypatch.setattr(onednn, "mkl_products_keep_up", lambda: False)
    assert onednn._training_default() is True


def test_set_onednn_training_switches_the_path() -> None:
    default = onednn.onednn_training_enabled()
    try:
        onednn.set_onednn_training(False)
        assert not onednn.onednn_training_enabled()
        onednn.set_onednn_training(True)
        assert onednn.onednn_training_enabled() is (onednn._ONEDNN_LINEAR is not None)
    finally:
        onednn.set_onednn_training(default)
