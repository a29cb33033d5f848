"""UperNet segmentor: a backbone, the UperNet decode head and an FCN auxiliary head, with the training
loss and whole-image, sliding-window and test-time-augmented inference of mmsegmentation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.backbones.base import Backbone, norms_and_biases_and
from vision_tx.heads.fcn import FCNHead
from vision_tx.heads.upernet import UperNetHead


class UperNetSegmentor(nn.Module):
    """``images [B, 3, H, W] -> {"logits": [B, C, H/4, W/4], "aux_logits": [B, C, H/16, W/16]}``.

    Works on any :class:`Backbone` (it reads ``out_channels``); the strides are the backbone's, so
    "H/4" is the finest output stride. The auxiliary head reads backbone output ``aux_in_index``
    and runs only in training mode (it only feeds the loss); ``aux_loss_weight=0`` drops it.
    """

    class_keys = (r"^(decode|auxiliary)_head\.classifier\.",)  # a row per class (fine-tuning: load_weights)
    variants: dict[str, dict[str, Any]] = {"upernet": {}}  # named sizes (``SegmentationModule(head=...)``): the paper's

    def __init__(
        self,
        backbone: Backbone,
        num_classes: int,
        channels: int = 512,
        pool_scales: Sequence[int] = (1, 2, 3, 6),
        aux_channels: int = 256,
        aux_in_index: int = 2,
        aux_loss_weight: float = 0.4,
        dropout: float = 0.1,
        ignore_index: int = 255,
        align_corners: bool = False,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.align_corners = align_corners
        self.aux_loss_weight = aux_loss_weight
        self.aux_in_index = aux_in_index
        in_channels = list(backbone.out_channels)
        self.decode_head = UperNetHead(in_channels, num_classes, channels, pool_scales, dropout, align_corners)
        self.auxiliary_head = (
            FCNHead(in_channels[aux_in_index], num_classes, aux_channels, dropout=dropout)
            if aux_loss_weight > 0
            else None
        )

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        features = list(self.backbone(images).values())
        outputs = {"logits": self.decode_head(features)}
        if self.training and self.auxiliary_head is not None:
            outputs["aux_logits"] = self.auxiliary_head(features[self.aux_in_index])
        return outputs

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reads mmsegmentation's UperNet checkpoints (the official Swin and NAT ones): ``backbone.*``
        goes through the backbone's ``convert_state_dict`` and the heads' ``conv_seg`` is ``classifier``
        here; other modules (an mmdetection checkpoint's neck and heads) are dropped. A checkpoint without
        ``backbone.`` or head keys (a classifier's) is the backbone's."""
        heads = ("decode_head.", "auxiliary_head.")
        whole = any(key.startswith(("backbone.", *heads)) for key in state_dict)
        backbone_state = {
            k.removeprefix("backbone."): v for k, v in state_dict.items() if k.startswith("backbone.") or not whole
        }
        head_state = {
            k.replace(".conv_seg.", ".classifier."): v for k, v in state_dict.items() if whole and k.startswith(heads)
        }
        convert_backbone = getattr(self.backbone, "convert_state_dict", None)
        if convert_backbone is not None:
            backbone_state = convert_backbone(backbone_state)
        return {**{f"backbone.{k}": v for k, v in backbone_state.items()}, **head_state}

    def _resize(self, x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
        return F.interpolate(x, tuple(size), mode="bilinear", align_corners=self.align_corners)

    def loss(self, outputs: dict[str, torch.Tensor], labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """Cross-entropy of the logits upsampled to ``labels`` ``[B, H, W]`` (int64, ``ignore_index`` skipped).

        As in mmsegmentation 0.x (the Swin and NAT papers' code), each loss is the sum over labelled
        pixels divided by all pixels of the label map; ``loss`` is ``loss_ce + aux_loss_weight * loss_aux``.
        """

        def cross_entropy(logits: torch.Tensor) -> torch.Tensor:
            # Resized channels-last and read as [B*H*W, C] rows: the log-softmax then reduces contiguous
            # memory (1.5x faster, forward and backward, than over NCHW's strided channels on a CPU).
            logits = self._resize(logits.contiguous(memory_format=torch.channels_last), labels.shape[-2:])
            pixels = logits.permute(0, 2, 3, 1).flatten(0, 2)
            return F.cross_entropy(pixels, labels.flatten(), ignore_index=self.ignore_index, reduction="none").mean()

        losses = {"loss_ce": cross_entropy(outputs["logits"])}
        total = losses["loss_ce"]
        if "aux_logits" in outputs:
            losses["loss_aux"] = cross_entropy(outputs["aux_logits"])
            total = total + self.aux_loss_weight * losses["loss_aux"]
        losses["loss"] = total
        return losses

    def no_weight_decay(self) -> set[str]:
        """Names of the parameters the optimiser does not decay (timm's convention): norms, biases and the backbone's
        exemptions."""
        return norms_and_biases_and(self, "backbone")

    def _logits(self, images: torch.Tensor) -> torch.Tensor:
        return self._resize(self(images)["logits"], images.shape[-2:])

    @torch.no_grad()
    def inference(
        self,
        images: torch.Tensor,
        mode: str = "whole",
        crop_size: Sequence[int] = (512, 512),
        stride: Sequence[int] = (341, 341),
    ) -> torch.Tensor:
        """Logits ``[B, C, H, W]`` at the input size.

        ``mode="whole"`` runs the image at once; ``mode="slide"`` runs ``crop_size`` windows every
        ``stride`` pixels (the last window of a row or column aligned to the border, the whole side
        where the image is smaller) and averages the logits where windows overlap.
        """
        if mode == "whole":
            return self._logits(images)
        if mode != "slide":
            raise ValueError(f"inference mode must be 'whole' or 'slide', got {mode!r}")
        batch, _, height, width = images.shape
        (crop_h, crop_w), (stride_h, stride_w) = crop_size, stride
        rows = max(height - crop_h + stride_h - 1, 0) // stride_h + 1
        cols = max(width - crop_w + stride_w - 1, 0) // stride_w + 1
        logits = images.new_zeros(batch, self.num_classes, height, width)
        counts = images.new_zeros(1, 1, height, width)
        for row in range(rows):
            for col in range(cols):
                bottom = min(row * stride_h + crop_h, height)
                right = min(col * stride_w + crop_w, width)
                top, left = max(bottom - crop_h, 0), max(right - crop_w, 0)
                logits[:, :, top:bottom, left:right] += self._logits(images[:, :, top:bottom, left:right])
                counts[:, :, top:bottom, left:right] += 1
        return logits / counts

    @torch.no_grad()
    def predict(
        self,
        images: torch.Tensor,
        mode: str = "whole",
        crop_size: Sequence[int] = (512, 512),
        stride: Sequence[int] = (341, 341),
        scales: Sequence[float] = (1.0,),
        flip: bool = False,
    ) -> torch.Tensor:
        """Class probabilities ``[B, C, H, W]`` at the input size, averaged over test-time augmentations.

        Each scale resizes the (already resized) input by that factor; with ``flip`` each scale also
        runs on the horizontally flipped image. Softmax outputs are averaged, as mmsegmentation's
        ``aug_test``.
        """
        size = images.shape[-2:]
        total = images.new_zeros(images.shape[0], self.num_classes, *size)
        for scale in scales:
            scaled = images if scale == 1 else self._resize(images, [int(s * scale + 0.5) for s in size])
            for flipped in (False, True) if flip else (False,):
                x = scaled.flip(-1) if flipped else scaled
                logits = self.inference(x, mode, crop_size, stride)
                logits = logits.flip(-1) if flipped else logits
                total += self._resize(logits, size).softmax(dim=1)
        return total / (len(scales) * (2 if flip else 1))
