"""Checkpoint reading: every bad file is an error that names it, and nothing in a file is executed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from vision_tx.checkpoint import CheckpointError, read_checkpoint, read_training_checkpoint


class _Payload:
    """Pickled as a call that writes a file: loading the checkpoint must not make that call."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "executed"))


def _training_checkpoint(path: Path, state_dict: dict[str, torch.Tensor]) -> Path:
    torch.save({"state_dict": state_dict, "pytorch-lightning_version": "2.6.0", "epoch": 0}, path)
    return path


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such checkpoint file"),
        (b"", "the file is empty"),
        (b"<html>Not Found</html>", "not a readable PyTorch checkpoint, corrupt or truncated"),
        ("half", "not a readable PyTorch checkpoint, corrupt or truncated"),
    ],
)
@pytest.mark.parametrize("mmap", [False, True])
def test_bad_checkpoint_file_names_the_file(
    tmp_path: Path, content: bytes | str | None, problem: str, mmap: bool
) -> None:
    path = tmp_path / "model.ckpt"
    if content == "half":
        torch.save({"state_dict": {"w": torch.zeros(1000)}}, path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=rf"{path}: {problem}"):
        read_checkpoint(path, mmap=mmap)


def test_mapped_read_gives_the_same_tensors(tmp_path: Path) -> None:
    model = nn.Linear(2, 3)
    path = _training_checkpoint(tmp_path / "good.ckpt", model.state_dict())
    mapped = read_training_checkpoint(path, model, mmap=True)
    for name, value in model.state_dict().items():
        assert torch.equal(mapped["state_dict"][name], value)


def test_untrusted_checkpoint_is_refused_and_not_executed(tmp_path: Path) -> None:
    path, marker = tmp_path / "untrusted.ckpt", tmp_path / "marker.txt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "extra": _Payload(marker)}, path)
    with pytest.raises(
        CheckpointError, match=rf"{path}: refused: .* would execute code \(.*Unsupported global: GLOBAL getattr"
    ):
        read_checkpoint(path)
    assert not marker.exists()


def test_training_checkpoint_must_hold_a_training_state(tmp_path: Path) -> None:
    path = tmp_path / "weights.pth"
    torch.save({"model": nn.Linear(2, 3).state_dict()}, path)
    with pytest.raises(
        CheckpointError, match=rf"{path}: not a training checkpoint written by tools/train.py .* holds \['model'\]"
    ):
        read_training_checkpoint(path)


def test_training_checkpoint_must_fit_the_model(tmp_path: Path) -> None:
    model = nn.Linear(2, 3)
    good = _training_checkpoint(tmp_path / "good.ckpt", model.state_dict())
    assert torch.equal(read_training_checkpoint(good, model)["state_dict"]["weight"], model.weight)
    variant = _training_checkpoint(tmp_path / "variant.ckpt", nn.Linear(2, 5).state_dict())
    with pytest.raises(
        CheckpointError,
        match=rf"{variant}: shapes differ from this Linear, .*: weight \(checkpoint \(5, 2\), model \(3, 2\)\)",
    ):
        read_training_checkpoint(variant, model)
    partial = _training_checkpoint(tmp_path / "partial.ckpt", {"weight": model.weight.detach()})
    with pytest.raises(CheckpointError, match=rf"{partial}: does not fit this Linear, .*: 1 missing keys \(bias\)"):
        read_training_checkpoint(partial, model)
    foreign = _training_checkpoint(tmp_path / "foreign.ckpt", {"conv.weight": torch.zeros(1)})
    with pytest.raises(CheckpointError, match=rf"{foreign}: none of its 1 tensors match this Linear"):
        read_training_checkpoint(foreign, model)
