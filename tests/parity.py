"""Weights for parity tests: every parameter and statistic moved off its initial value.

A freshly built model hides mapping bugs: LayerNorms are the identity, biases are zero, bias tables
and layer scales are tiny, so a swapped norm, an unloaded bias or a transposed table changes nothing.
``perturb_`` moves each of them far enough that such a bug changes the output, while keeping every
activation at the scale a trained network has.
"""

from __future__ import annotations

import re

import torch

# Learned tables and tokens that start near zero and carry position or a role: moved by O(1) so that a transposed,
# flipped or unloaded table is visible in the output.
TABLES = re.compile(
    r"relative_position_bias_table|(^|\.)rpb$|pos_embed|position_embedding|query_embed|level_embed|cls_token|dist_token"
)
# Float buffers that are derived, not learned (masks, index grids): never touched.
DERIVED = re.compile(r"attn_mask$|_index$|relative_coords_table$")


def perturb_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Moves every floating parameter and persistent buffer of ``model`` off its initialisation, in place.

    Deterministic in ``seed`` and the state dict's order (the global RNG is untouched), so that two
    runs, or two models whose state dicts list the same tensors in the same order, get the same values.

    - ``running_var``: uniform in [0.5, 1.5]; ``running_mean``, norm weights and biases, biases and
      layer scales (every other 1-D tensor): each element moved by 0.1 to 0.3 in a random direction,
      so norm weights end in [0.7, 0.9] or [1.1, 1.3] and biases and layer scales are never ~0;
    - relative-position bias tables, position / query / level embeddings and class / distillation
      tokens (timm draws tokens at std 1e-6): plus N(0, 0.5^2) each;
    - every other tensor (linear and conv weights): each element scaled by a factor in [0.8, 1.2] plus
      noise at a tenth of the tensor's spread, so that activations keep their scale;
    - masks and index buffers (``attn_mask``, ``*_index``) are left alone.

    Returns ``model``.
    """
    generator = torch.Generator().manual_seed(seed)
    seen: set[int] = set()

    def uniform(shape: torch.Size) -> torch.Tensor:
        return torch.rand(shape, generator=generator, dtype=torch.float64)

    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if not tensor.is_floating_point() or DERIVED.search(name) or tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            values = tensor.detach().to(torch.float64).cpu()
            if name.endswith("running_var"):
                values = 0.5 + uniform(values.shape)
            elif TABLES.search(name):
                values = values + 0.5 * torch.randn(values.shape, generator=generator, dtype=torch.float64)
            elif values.dim() <= 1:
                sign = torch.where(uniform(values.shape) < 0.5, -1.0, 1.0)
                values = values + sign * (0.1 + 0.2 * uniform(values.shape))
            else:
                spread = float(values.std()) if values.numel() > 1 and float(values.std()) > 0 else 0.02
                factor = 0.8 + 0.4 * uniform(values.shape)
                noise = torch.randn(values.shape, generator=generator, dtype=torch.float64)
                values = values * factor + 0.1 * spread * noise
            tensor.data.copy_(values.to(tensor.dtype))
    return model
