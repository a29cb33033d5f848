"""Helpers for the torch.compile tests: graph breaks found by ``torch._dynamo.explain``."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch._dynamo


def graph_breaks(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> list[str]:
    """Why dynamo breaks the graph while tracing ``fn(*args)``, one line each (with the code line
    where it happened); empty when ``fn`` compiles to one graph. Autograd functions count with their
    backward, which dynamo traces with the forward."""
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    reasons = []
    for reason in explanation.break_reasons:
        where = reason.user_stack[-1] if reason.user_stack else None
        place = f" at {where.filename.rsplit('/', 1)[-1]}:{where.lineno} {where.line}" if where else ""
        reasons.append(reason.reason.strip().splitlines()[0] + place)
    return reasons


def tensors(outputs) -> list[torch.Tensor]:
    """The tensors of a model's outputs (a tensor, or a dict, list or tuple of them, nested), in order."""
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, (dict, list, tuple)):
        return [t for value in (outputs.values() if isinstance(outputs, dict) else outputs) for t in tensors(value)]
    return []


def summed(outputs) -> torch.Tensor:
    """One scalar from all of a model's outputs, so that a backward pass reaches every one."""
    return sum(t.float().sum() for t in tensors(outputs) if t.is_floating_point())
