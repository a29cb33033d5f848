"""What every dense-prediction backbone shares: output naming, channel/stride tables, freezing, weight-decay
exemptions."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def norms_and_biases(module: nn.Module) -> set[str]:
    """Names of ``module``'s parameters of at most one dimension: norm scales and shifts, biases, layer scales."""
    return {name for name, param in module.named_parameters() if param.ndim <= 1}


def norms_and_biases_and(model: nn.Module, part: str) -> set[str]:
    """``model``'s norms and biases and what its sub-module ``part`` (e.g. ``"backbone"``) exempts from weight
    decay (its ``no_weight_decay()``), named from ``model``: the ``no_weight_decay`` of a composed model."""
    return norms_and_biases(model) | {f"{part}.{name}" for name in model.get_submodule(part).no_weight_decay()}


class Backbone(nn.Module):
    """Base class: a ``stem`` followed by ``stages`` (an ``nn.ModuleList``), stage ``i`` named ``res{i+2}``.

    Subclasses set ``self.stem`` and ``self.stages`` and call :meth:`_init_outputs` with the channels
    and strides of all stages; ``forward(images [N,3,H,W])`` returns an ordered dict with the
    ``out_features`` names, mapping to ``[N, C, H/stride, W/stride]`` maps. Stages after the last
    of ``out_indices`` are dropped (their weights in a checkpoint are reported as unused).
    """

    stem: nn.Module
    stages: nn.ModuleList

    def _init_outputs(
        self,
        stage_channels: Sequence[int],
        stage_strides: Sequence[int],
        out_indices: Sequence[int],
        frozen_stages: int,
    ) -> None:
        num = len(stage_channels)
        bad = [i for i in out_indices if not 0 <= i < num]
        if bad or not out_indices:
            raise ValueError(f"out_indices must be a non-empty subset of 0..{num - 1}, got {tuple(out_indices)}")
        self.out_indices = tuple(sorted(out_indices))
        # Stages after the last requested output would only cost time and hold parameters without
        # gradients (which DDP refuses), so they are not kept.
        self.stages = self.stages[: self.out_indices[-1] + 1]
        self.out_features = [f"res{i + 2}" for i in self.out_indices]
        self.out_channels = [int(stage_channels[i]) for i in self.out_indices]
        self.strides = [int(stage_strides[i]) for i in self.out_indices]
        self.frozen_stages = -1
        self.freeze_stages(frozen_stages)

    def freeze_stages(self, num_stages: int) -> None:
        """Freezes the stem and the first ``num_stages`` stages (``0``: stem only, ``-1``: nothing).

        Frozen parts stop needing gradients and stay in eval mode (no dropout, no BN updates); a
        later call with a smaller number unfreezes the rest.
        """
        parts = self.freezable_parts()
        if not -1 <= num_stages < len(parts):
            raise ValueError(f"frozen_stages must be in -1..{len(parts) - 1}, got {num_stages}")
        self.frozen_stages = num_stages
        for index, module in enumerate(parts):
            frozen = index <= num_stages
            for p in module.parameters():
                p.requires_grad_(not frozen)
            module.train(self.training and not frozen)

    def train(self, mode: bool = True) -> Backbone:
        super().train(mode)
        for module in self.freezable_parts()[: self.frozen_stages + 1]:
            module.eval()
        return self

    def no_weight_decay(self) -> set[str]:
        """Names of the parameters the optimiser does not decay (timm's convention): here the norms and biases;
        architectures with position tables or tokens add them."""
        return norms_and_biases(self)

    def freezable_parts(self) -> list[nn.Module]:
        """What ``freeze_stages(n)`` freezes the first ``n + 1`` of, in input-to-output order: the stem and the
        stages."""
        return [self.stem, *self.stages]
