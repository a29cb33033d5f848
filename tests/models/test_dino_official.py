"""IDEA-Research/DINO's checkpoint layouts (4-scale R50 and Swin-L) load into vision_tx's DINO.

The key names and shapes come from ``tests/fixtures/official_keys/`` (written from the official
model definitions, models/dino/*.py), never from vision_tx's own state dict. Each test fills them
with random values, loads them through ``load_weights`` and checks every tensor landed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vision_tx.backbones import build_backbone, load_weights
from vision_tx.models import DINO

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "official_keys"
NUM_CLASSES = 91


def official_state(name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """The fixture ``name`` filled with random values (index buffers get indices, variances are positive)."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for line in (FIXTURES / f"{name}.txt").read_text().splitlines():
        if line.startswith("#"):
            continue
        key, shape = line.split()
        size = tuple(int(n) for n in shape.split(","))
        if key.endswith("relative_position_index"):
            state[key] = torch.randint(0, 10, size, generator=generator)
        elif key.endswith("running_var"):
            state[key] = 0.5 + torch.rand(size, generator=generator)
        else:
            state[key] = 0.1 * torch.randn(size, generator=generator)
    # The decoder layers share one class and one box head officially: the same tensors under every layer.
    for key in list(state):
        if key.startswith(
            ("class_embed.", "bbox_embed.", "transformer.decoder.class_embed.", "transformer.decoder.bbox_embed.")
        ):
            prefix, _, rest = key.partition("_embed.")
            state[key] = state[f"{prefix.removeprefix('transformer.decoder.')}_embed.0.{rest.partition('.')[2]}"]
    return state


def build_dino(backbone: str, device: str = "cpu", **backbone_kwargs) -> DINO:
    with torch.device(device):
        return DINO.build(build_backbone(backbone, out_indices=(1, 2, 3), **backbone_kwargs), NUM_CLASSES)


def check_loaded(model: DINO, official: dict[str, torch.Tensor]):
    report = load_weights(model, official)
    assert report.missing_keys == []
    assert report.unexpected_keys == []
    return report


def test_r50_checkpoint_loads_every_tensor_and_runs() -> None:
    official = official_state("dino_4scale_r50")
    model = build_dino("resnet50")
    check_loaded(model, official)
    state = model.state_dict()
    # Spot checks of the renames that change meaning, not only names.
    torch.testing.assert_close(state["query_embed.weight"], official["transformer.tgt_embed.weight"])
    torch.testing.assert_close(state["neck.level_embed"], official["transformer.level_embed"])
    torch.testing.assert_close(state["denoising.label_embed.weight"], official["label_enc.weight"][:NUM_CLASSES])
    torch.testing.assert_close(state["class_embed.6.weight"], official["transformer.enc_out_class_embed.weight"])
    torch.testing.assert_close(
        state["bbox_embed.6.layers.2.bias"], official["transformer.enc_out_bbox_embed.layers.2.bias"]
    )
    for layer in range(6):
        torch.testing.assert_close(state[f"class_embed.{layer}.bias"], official["class_embed.0.bias"])
    decoder = "transformer.decoder.layers.3."
    torch.testing.assert_close(
        state["decoder.layers.3.norm1.weight"], official[decoder + "norm2.weight"]
    )  # after self-attention
    torch.testing.assert_close(
        state["decoder.layers.3.norm2.weight"], official[decoder + "norm1.weight"]
    )  # after cross-attention
    torch.testing.assert_close(state["decoder.layers.3.ffn.norm.bias"], official[decoder + "norm3.bias"])
    torch.testing.assert_close(
        state["encoder.layers.5.ffn.linear2.weight"], official["transformer.encoder.layers.5.linear2.weight"]
    )
    torch.testing.assert_close(
        state["backbone.stages.3.2.conv3.weight"], official["backbone.0.body.layer4.2.conv3.weight"]
    )

    model.eval()
    with torch.no_grad():
        outputs = model(torch.randn(1, 3, 192, 256))  # 1020 tokens: at least 900 proposals
    assert outputs["pred_logits"].shape == (1, 900, NUM_CLASSES) and outputs["pred_boxes"].shape == (1, 900, 4)
    assert torch.isfinite(outputs["pred_logits"]).all() and torch.isfinite(outputs["pred_boxes"]).all()


def test_ref_point_head_reads_the_official_sine_order() -> None:
    """Officially the query position reads sin/cos of (y, x, w, h); here of (x, y, w, h)."""
    official = official_state("dino_4scale_r50")
    model = build_dino("resnet50")
    load_weights(model, official)
    weight = official["transformer.decoder.ref_point_head.layers.0.weight"]
    loaded = model.decoder.ref_point_head.layers[0].weight
    torch.testing.assert_close(loaded[:, :128], weight[:, 128:256])  # x
    torch.testing.assert_close(loaded[:, 128:256], weight[:, :128])  # y
    torch.testing.assert_close(loaded[:, 256:], weight[:, 256:])  # w, h


def test_swin_l_checkpoint_loads_every_tensor() -> None:
    """Swin-L (window 12, 384-pixel pretraining, as ``checkpoint0029_4scale_swin.pth``): names and shapes
    on the meta device (the full model is 200M parameters)."""
    official = official_state("dino_4scale_swin_l")
    model = build_dino("swin_l", device="meta", window_size=12, drop_path_rate=0.0)
    report = check_loaded(model, official)
    assert "backbone.stages.2.blocks.17.attn.relative_position_bias_table" in report.loaded_keys
    assert {f"backbone.stages.{i}.out_norm.weight" for i in (1, 2, 3)} <= set(report.loaded_keys)


def test_mis_shaped_official_tensor_is_named() -> None:
    official = official_state("dino_4scale_r50")
    official["transformer.enc_out_class_embed.weight"] = torch.zeros(80, 256)
    with pytest.raises(Exception, match="class_embed.6.weight"):
        load_weights(build_dino("resnet50", device="meta"), official)


def test_convert_weights_tool_writes_a_native_checkpoint(tmp_path) -> None:
    from vision_tx.models.convert import convert_checkpoint

    official = official_state("dino_4scale_r50")
    torch.save({"model": official}, tmp_path / "checkpoint0011_4scale.pth")
    report = convert_checkpoint("dino_resnet50", tmp_path / "checkpoint0011_4scale.pth", tmp_path / "dino_r50.pth")
    assert report.missing_keys == [] and report.unexpected_keys == []
    native = torch.load(tmp_path / "dino_r50.pth", weights_only=True)["model"]
    torch.testing.assert_close(native["query_embed.weight"], official["transformer.tgt_embed.weight"])
