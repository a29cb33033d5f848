"""The README's "Backbones in your own project" examples run as written, with the shapes they state."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from vision_tx.backbones import build_classifier

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks(section: str) -> list[str]:
    text = README.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_backbone_examples_run_as_written(tmp_path, monkeypatch) -> None:
    blocks = _python_blocks("Backbones in your own project")
    assert len(blocks) == 3  # build and load, na2d, FasterRCNN
    monkeypatch.chdir(tmp_path)
    torch.save({"model": build_classifier("nat_tiny").state_dict()}, tmp_path / "nat_tiny.pth")
    namespace: dict = {"q": torch.randn(1, 9, 11, 2, 16), "k": torch.randn(1, 9, 11, 2, 16), "v": torch.randn(1, 9, 11, 2, 16)}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    feats = namespace["feats"]
    assert [tuple(f.shape) for f in feats.values()] == [(2, 96, 128, 171), (2, 192, 64, 86), (2, 384, 32, 43), (2, 768, 16, 22)]
    assert (namespace["backbone"].out_channels, namespace["backbone"].strides) == ([96, 192, 384, 768], [4, 8, 16, 32])
    assert not namespace["report"].missing_keys and not namespace["report"].unexpected_keys
    assert namespace["out"].shape == (1, 9, 11, 2, 16)
    assert namespace["model"].backbone.out_channels == 256
