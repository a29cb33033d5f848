"""``resize_concat_conv2d`` against what it replaces: ``F.interpolate`` of each map, ``torch.cat``, ``F.conv2d``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vision_tx.ops.resize_concat_conv import resize_concat_conv2d


def dense(maps: list[torch.Tensor], weight: torch.Tensor, size: tuple[int, int], align_corners: bool) -> torch.Tensor:
    resized = [
        m if tuple(m.shape[-2:]) == size else F.interpolate(m, size, mode="bilinear", align_corners=align_corners)
        for m in maps
    ]
    return F.conv2d(torch.cat(resized, dim=1), weight, padding=weight.shape[-1] // 2)


def pyramid(sizes: list[tuple[int, int]], channels: list[int]) -> list[torch.Tensor]:
    return [torch.randn(2, c, *s, dtype=torch.float64, requires_grad=True) for c, s in zip(channels, sizes)]


CASES = {
    # UperNet's pyramid: strides 4 to 32 of a 100x132 image, odd sizes and unequal factors per axis
    "upernet odd sizes": ([(25, 33), (13, 17), (7, 9), (4, 5)], (25, 33)),
    "square powers of two": ([(16, 16), (8, 8), (4, 4), (2, 2)], (16, 16)),
    "no map at the output size": ([(6, 5), (3, 3)], (11, 9)),
    "a map larger than the output (downsampled)": ([(9, 9), (20, 15)], (9, 9)),
    "a 1x1 map": ([(5, 7), (1, 1)], (5, 7)),
}


@pytest.mark.parametrize("kernel", [1, 3, 5])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_output_and_gradients_are_the_dense_convolutions(case: str, align_corners: bool, kernel: int) -> None:
    sizes, size = CASES[case]
    channels = [3, 4, 5, 2][: len(sizes)]
    torch.manual_seed(0)
    maps = pyramid(sizes, channels)
    weight = torch.randn(6, sum(channels), kernel, kernel, dtype=torch.float64, requires_grad=True)
    expected = dense(maps, weight, size, align_corners)
    actual = resize_concat_conv2d(maps, weight, size, align_corners)
    assert actual.shape == (2, 6, *size)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)  # float64: measured ~3e-14
    upstream = torch.randn_like(expected)
    wanted = torch.autograd.grad(expected, [*maps, weight], upstream)
    got = torch.autograd.grad(actual, [*maps, weight], upstream)
    for g, w in zip(got, wanted):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-11)


def test_float32_pyramid_at_upernet_width_agrees_to_float_rounding() -> None:
    torch.manual_seed(0)
    maps = [torch.randn(1, 64, s, s) for s in (32, 16, 8, 4)]
    weight = torch.randn(16, 256, 3, 3) / 48
    actual = resize_concat_conv2d(maps, weight, (32, 32))
    expected = dense([m.double() for m in maps], weight.double(), (32, 32), False)
    torch.testing.assert_close(actual.double(), expected, rtol=0, atol=1e-5)  # values ~3; float32 rounding


def test_bad_kernels_and_channel_counts_are_refused() -> None:
    maps = [torch.randn(1, 2, 4, 4), torch.randn(1, 3, 2, 2)]
    with pytest.raises(ValueError, match="odd square kernel"):
        resize_concat_conv2d(maps, torch.randn(4, 5, 2, 2), (4, 4))
    with pytest.raises(ValueError, match="odd square kernel"):
        resize_concat_conv2d(maps, torch.randn(4, 5, 3, 1), (4, 4))
    with pytest.raises(ValueError, match=r"5 channels in all \(\[2, 3\]\); the weight takes 6"):
        resize_concat_conv2d(maps, torch.randn(4, 6, 3, 3), (4, 4))
