"""Released checkpoint layouts (``tests/fixtures/official_keys/<checkpoint>.txt``, written from the
official model definitions by ``generate.py`` there) and random fills of them for parity tests."""

from __future__ import annotations

from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "official_keys"
# Buffers of the official files that vision_tx recomputes instead of loading (documented in
# SwinTransformer.convert_state_dict): they are dropped, never reported as unused.
RECOMPUTED = ("relative_position_index", "attn_mask")


def read_layout(name: str) -> dict[str, tuple[int, ...]]:
    """``name shape`` lines of ``<name>.txt`` -> ``{name: shape}`` (``scalar``: shape ``()``)."""
    layout = {}
    for line in (FIXTURES / f"{name}.txt").read_text().splitlines():
        key, shape = line.split()
        layout[key] = () if shape == "scalar" else tuple(int(size) for size in shape.split("x"))
    return layout


def random_state(layout: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Values well away from any initialisation at activation-preserving scales (float64): norm weights
    and statistics in [0.5, 1.5], biases ~ N(0, 0.2), bias tables ~ N(0, 1), other weights uniform at the
    fan-in scale. Recomputed buffers are zeros (both loaders ignore them)."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in layout.items():
        if key.endswith(RECOMPUTED):
            state[key] = torch.zeros(shape, dtype=torch.long)
        elif key.endswith("relative_position_bias_table"):
            state[key] = torch.randn(shape, generator=generator, dtype=torch.float64)
        elif key.endswith("bias"):
            state[key] = 0.2 * torch.randn(shape, generator=generator, dtype=torch.float64)
        elif len(shape) == 1:
            state[key] = 0.5 + torch.rand(shape, generator=generator, dtype=torch.float64)
        else:
            fan_in = torch.Size(shape[1:]).numel()
            state[key] = (2 * torch.rand(shape, generator=generator, dtype=torch.float64) - 1) * (3 / fan_in) ** 0.5
    return state
