"""A convolution of bilinearly resized, concatenated maps, without building the resized maps.

UperNet fuses its pyramid by upsampling every level to the finest, concatenating them (4 x 512
channels at a quarter of the image's resolution) and applying a 3x3 convolution; at 512x512 that one
convolution costs more than the whole Swin-T backbone. Bilinear resizing acts on each channel alone
and the convolution's channel mixing on each pixel alone, so the two commute: each of the kernel's
``k x k`` taps mixes the channels on the coarse map, and only its result is resized and shifted into
place. For a level upsampled ``s`` times, the products cost ``1 / s^2`` of the dense convolution's;
the resizing is two small matrix products with ``F.interpolate``'s own weights (bilinear is the
product of two linear interpolations). Exact in real arithmetic: results differ from the dense
convolution's by float rounding only (the sums run in another order).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def resize_concat_conv2d(
    maps: Sequence[torch.Tensor], weight: torch.Tensor, size: Sequence[int], align_corners: bool = False
) -> torch.Tensor:
    """``conv2d(cat([interpolate(m, size, "bilinear") for m in maps], 1), weight, padding=k // 2)``, the resize with
    ``align_corners`` as ``interpolate``'s.

    ``maps``: ``[B, C_i, h_i, w_i]``; ``weight``: ``[O, sum(C_i), k, k]`` with ``k`` odd, no bias,
    stride 1. Maps already of ``size`` are convolved directly. Returns ``[B, O, *size]``.
    """
    kernel = weight.shape[-1]
    if weight.shape[-2] != kernel or kernel % 2 == 0:
        raise ValueError(f"resize_concat_conv2d needs an odd square kernel, got {tuple(weight.shape[-2:])}")
    channels = [m.shape[1] for m in maps]
    if sum(channels) != weight.shape[1]:
        raise ValueError(
            f"the maps have {sum(channels)} channels in all ({channels}); the weight takes {weight.shape[1]}"
        )
    size = tuple(size)
    output = None
    for x, w in zip(maps, weight.split(channels, dim=1)):
        if tuple(x.shape[-2:]) == size:
            part = F.conv2d(x, w, padding=kernel // 2)
        else:
            part = _conv_of_resized(x, w, size, align_corners)
        output = part if output is None else output + part
    return output


def _conv_of_resized(x: torch.Tensor, weight: torch.Tensor, size: tuple[int, int], align_corners: bool) -> torch.Tensor:
    """``conv2d(interpolate(x, size, "bilinear"), weight, padding=k // 2)``: ``[B, C, h, w] -> [B, O, *size]``."""
    batch, _, height, width = x.shape
    out_channels, in_channels, kernel, _ = weight.shape
    # Every tap's channel mixing on the coarse map, laid out [B, h, w, tx, ty, O] (a channels-last 1x1
    # convolution, oneDNN's fastest layout for it) so that both resizing products below read plain views.
    tap_weight = weight.permute(3, 2, 0, 1).reshape(kernel * kernel * out_channels, in_channels, 1, 1)
    taps = F.conv2d(x.contiguous(memory_format=torch.channels_last), tap_weight).permute(0, 2, 3, 1)
    taps = taps.reshape(batch, height, width * kernel, kernel * out_channels)
    columns = _shifted_interpolation(width, size[1], kernel, align_corners, x)  # [W, (x, tx)]
    rows = _shifted_interpolation(height, size[0], kernel, align_corners, x)  # [H, (y, ty)]
    wide = taps.transpose(-1, -2) @ columns.T  # sum over (x, tx): [B, h, (ty, O), W]
    out = rows @ wide.reshape(batch, height * kernel, out_channels * size[1])  # sum over (y, ty): [B, H, (O, W)]
    return out.view(batch, size[0], out_channels, size[1]).transpose(1, 2)


def _shifted_interpolation(
    length: int, size: int, kernel: int, align_corners: bool, like: torch.Tensor
) -> torch.Tensor:
    """``[size, length * kernel]``, column ``j * kernel + t``: for tap ``t``, fine position ``i`` reads the
    linear interpolation at fine position ``i + t - kernel // 2`` from coarse position ``j``, and zero
    outside the fine map (the convolution's zero padding)."""
    eye = torch.eye(length, dtype=like.dtype, device=like.device).unsqueeze(1)
    interpolation = (
        F.interpolate(eye, size=size, mode="linear", align_corners=align_corners).squeeze(1).T
    )  # [size, length]
    padded = F.pad(interpolation, (0, 0, kernel // 2, kernel // 2))
    return torch.stack([padded[t : t + size] for t in range(kernel)], dim=-1).reshape(size, length * kernel)
