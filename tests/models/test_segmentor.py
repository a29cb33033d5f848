"""UperNetSegmentor: output shapes, loss, and sliding-window against whole-image inference."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.backbones.base import Backbone
from vision_tx.models.segmentor import UperNetSegmentor


class TinyBackbone(Backbone):
    """A four-stage conv backbone (strides 4, 8, 16, 32) standing in for Swin/NAT in fast tests."""

    def __init__(
        self, channels: tuple[int, ...] = (8, 16, 24, 32), out_indices: tuple[int, ...] = (0, 1, 2, 3)
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels[0], 4, stride=4), nn.GELU())
        self.stages = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=1 if i == 0 else 2, padding=1), nn.GELU())
            for i, (c_in, c_out) in enumerate(zip((channels[0], *channels[:-1]), channels))
        )
        self._init_outputs(channels, (4, 8, 16, 32), out_indices, frozen_stages=-1)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.stem(images)
        outputs: dict[str, torch.Tensor] = OrderedDict()
        for index, stage in enumerate(self.stages):
            x = stage(x)
            if index in self.out_indices:
                outputs[f"res{index + 2}"] = x
        return outputs


def make_segmentor(num_classes: int = 5, **kwargs) -> UperNetSegmentor:
    return UperNetSegmentor(TinyBackbone(), num_classes, channels=16, aux_channels=8, **kwargs)


def test_output_shapes_train_and_eval() -> None:
    model = make_segmentor()
    images = torch.randn(2, 3, 64, 96)
    out = model(images)
    assert out["logits"].shape == (2, 5, 16, 24)
    assert out["aux_logits"].shape == (2, 5, 4, 6)
    model.eval()
    assert set(model(images)) == {"logits"}  # the auxiliary head only feeds the training loss


def test_loss_matches_hand_computation() -> None:
    model = make_segmentor()
    images = torch.randn(2, 3, 64, 64)
    labels = torch.randint(0, 5, (2, 64, 64))
    labels[:, :10] = 255
    out = model(images)
    losses = model.loss(out, labels)

    def by_hand(logits: torch.Tensor) -> torch.Tensor:
        up = F.interpolate(logits, (64, 64), mode="bilinear", align_corners=False)
        per_pixel = -up.log_softmax(1).gather(1, labels.clamp(max=4)[:, None])[:, 0]
        return (per_pixel * (labels != 255)).sum() / labels.numel()  # mmseg 0.x: divided by all pixels

    torch.testing.assert_close(losses["loss_ce"], by_hand(out["logits"]))
    torch.testing.assert_close(losses["loss_aux"], by_hand(out["aux_logits"]))
    torch.testing.assert_close(losses["loss"], losses["loss_ce"] + 0.4 * losses["loss_aux"])
    logits = [out["logits"], out["aux_logits"]]
    expected = torch.autograd.grad(by_hand(logits[0]) + 0.4 * by_hand(logits[1]), logits, retain_graph=True)
    for actual, wanted in zip(torch.autograd.grad(losses["loss"], logits, retain_graph=True), expected):
        torch.testing.assert_close(actual, wanted)
    losses["loss"].backward()
    assert model.auxiliary_head.classifier.weight.grad.abs().sum() > 0


def test_without_auxiliary_head() -> None:
    model = make_segmentor(aux_loss_weight=0.0)
    assert model.auxiliary_head is None
    out = model(torch.randn(2, 3, 32, 32))  # two images: BatchNorm after 1x1 pooling needs more than one value
    assert set(model.loss(out, torch.zeros(2, 32, 32, dtype=torch.long))) == {"loss_ce", "loss"}


def test_slide_equals_whole_when_one_window_covers_the_image() -> None:
    model = make_segmentor().eval()
    images = torch.randn(2, 3, 64, 96)
    whole = model.inference(images, "whole")
    assert whole.shape == (2, 5, 64, 96)
    torch.testing.assert_close(model.inference(images, "slide", crop_size=(64, 96), stride=(32, 32)), whole)
    # A window larger than the image is clipped to it: one window again.
    torch.testing.assert_close(model.inference(images, "slide", crop_size=(128, 128), stride=(85, 85)), whole)


def test_slide_covers_every_pixel_and_averages_overlaps() -> None:
    model = make_segmentor().eval()
    images = torch.randn(1, 3, 96, 136)
    crop, stride = (64, 64), (43, 43)
    slide = model.inference(images, "slide", crop_size=crop, stride=stride)
    # Rebuild the average by hand from the window positions (rows 0, 32; columns 0, 43, 72).
    total, count = torch.zeros_like(slide), torch.zeros(96, 136)
    for top in (0, 32):
        for left in (0, 43, 72):
            total[..., top : top + 64, left : left + 64] += model.inference(
                images[..., top : top + 64, left : left + 64]
            )
            count[top : top + 64, left : left + 64] += 1
    assert count.min() >= 1  # every pixel is covered
    torch.testing.assert_close(slide, total / count)


def test_predict_with_flip_and_scales() -> None:
    model = make_segmentor().eval()
    images = torch.randn(1, 3, 64, 64)
    probs = model.predict(images, scales=(0.75, 1.0), flip=True)
    assert probs.shape == (1, 5, 64, 64)
    torch.testing.assert_close(probs.sum(1), torch.ones(1, 64, 64))
    plain = model.predict(images)
    torch.testing.assert_close(plain, model.inference(images).softmax(1))
    # Flip TTA of a mirrored image is the mirror of flip TTA of the image.
    torch.testing.assert_close(model.predict(images.flip(-1), flip=True), model.predict(images, flip=True).flip(-1))


def test_unknown_inference_mode() -> None:
    with pytest.raises(ValueError, match="'whole' or 'slide'"):
        make_segmentor().eval().inference(torch.randn(1, 3, 32, 32), "tiles")
