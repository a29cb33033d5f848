"""Sharpness-Aware Minimization (Foret et al., 2021) and its adaptive form ASAM (Kwon et al., 2021)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer


class SAM(Optimizer):
    """Two-pass step around ``base_optimizer(params, **base_kwargs)``, driven by a closure.

    ``step(closure)``: the closure computes the gradient ``g`` at the weights ``w``; the weights move
    to ``w + e`` with ``e = rho * g / ||g||`` (the norm over all parameters; with ``adaptive=True``
    ``e = rho * |w|^2 g / || |w| g ||``); the closure runs again, and the base optimiser steps from
    ``w`` with that second gradient. Under DDP the closure's backward all-reduces the gradients,
    so every process ascends the same way. When the first pass leaves no gradient (a non-finite loss
    skipped by ``NonFiniteLossGuard``) nothing moves. ``param_groups`` and the state are the base
    optimiser's: schedulers, gradient clipping and checkpoints see the base optimiser.
    """

    def __init__(
        self,
        params: Iterable[Any],
        base_optimizer: Callable[..., Optimizer],
        rho: float = 0.05,
        adaptive: bool = False,
        **base_kwargs: Any,
    ) -> None:
        if rho < 0:
            raise ValueError(f"SAM: rho must be >= 0, got {rho}")
        self.base_optimizer = base_optimizer(params, **base_kwargs)
        super().__init__(self.base_optimizer.param_groups, {})
        self.param_groups = self.base_optimizer.param_groups
        self.state = self.base_optimizer.state
        self.rho = rho
        self.adaptive = adaptive

    @classmethod
    def wrapping(cls, optimizer: Optimizer, rho: float = 0.05, adaptive: bool = False) -> SAM:
        """SAM around an optimiser already built (sharing its parameter groups and state)."""
        return cls(optimizer.param_groups, lambda _params: optimizer, rho=rho, adaptive=adaptive)

    @torch.no_grad()
    def ascent(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Moves every parameter with a gradient by ``e(w)``; returns the ``(parameter, e)`` pairs."""
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return []
        scaled = [p.grad * p.abs() if self.adaptive else p.grad for p in params]
        norm = torch.linalg.vector_norm(
            torch.stack(
                [torch.linalg.vector_norm(g, dtype=torch.promote_types(g.dtype, torch.float32)) for g in scaled]
            )
        )
        factor = self.rho / norm.clamp_min(1e-12)
        moves = []
        for p, g in zip(params, scaled):
            e = (g * p.abs() if self.adaptive else g) * factor.to(g.dtype)
            p.add_(e)
            moves.append((p, e))
        return moves

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        if closure is None:
            raise RuntimeError(
                "SAM.step needs a closure that recomputes the loss and its gradients (with fp16 mixed precision "
                "Lightning's GradScaler steps without one: use precision bf16-mixed or 32)"
            )
        closure = torch.enable_grad()(closure)
        loss = closure()
        moves = self.ascent()
        if not moves:
            return loss
        self.zero_grad(set_to_none=True)
        closure()
        for p, e in moves:
            p.sub_(e)
        self.base_optimizer.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return self.base_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.base_optimizer.load_state_dict(state_dict)
        self.param_groups = self.base_optimizer.param_groups
        self.state = self.base_optimizer.state

    def __repr__(self) -> str:
        return f"SAM(rho={self.rho}, adaptive={self.adaptive}, base={self.base_optimizer!r})"
